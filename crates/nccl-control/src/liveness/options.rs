//! Settings of the liveness channel, in code or from the environment.

use std::time::Duration;

use crate::env::BadValue;

pub use crate::env::{HEARTBEAT_ENV, LIVENESS_ENV, LIVENESS_TIMEOUT_ENV};

const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(250);
const DEFAULT_SILENCE: Duration = Duration::from_secs(10);
const MIN_HEARTBEAT: Duration = Duration::from_millis(1);

/// How the liveness channel runs. Every rank of a job must agree on
/// [`LivenessOptions::enabled`]; the intervals may differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivenessOptions {
    heartbeat: Duration,
    silence: Duration,
    enabled: bool,
}

impl Default for LivenessOptions {
    fn default() -> Self {
        LivenessOptions {
            heartbeat: DEFAULT_HEARTBEAT,
            silence: DEFAULT_SILENCE,
            enabled: true,
        }
    }
}

impl LivenessOptions {
    /// The defaults: on, a heartbeat every 250 ms, lost after 10 s of
    /// silence.
    pub fn new() -> Self {
        Self::default()
    }

    /// How often each side sends a heartbeat (at least 1 ms).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every.max(MIN_HEARTBEAT);
        self
    }

    /// A peer that sends nothing for this long (a stopped process, a cut
    /// network) is lost with [`crate::LossCause::Silent`]. Used as at least
    /// two heartbeats, so a live peer is never taken for a silent one.
    pub fn silence_limit(mut self, limit: Duration) -> Self {
        self.silence = limit;
        self
    }

    /// Turns the channel on or off.
    pub fn enabled(mut self, on: bool) -> Self {
        self.enabled = on;
        self
    }

    /// Whether the channel is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
    }

    /// The silence limit in effect (at least two heartbeats).
    pub fn silence(&self) -> Duration {
        self.silence.max(self.heartbeat * 2)
    }

    /// The defaults, overridden by [`LIVENESS_ENV`], [`HEARTBEAT_ENV`] and
    /// [`LIVENESS_TIMEOUT_ENV`] from the process environment.
    pub fn from_env() -> Result<Self, BadValue> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`LivenessOptions::from_env`], from any lookup. Empty values
    /// count as unset; anything else that does not parse, a zero interval,
    /// or a heartbeat not shorter than the silence limit is a
    /// [`BadValue`] naming the variable.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, BadValue> {
        let get = |k: &str| {
            lookup(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let bad = |var: &'static str, reason: String| BadValue { var, reason };
        let mut out = LivenessOptions::default();
        if let Some(v) = get(LIVENESS_ENV) {
            out.enabled = match v.as_str() {
                "1" => true,
                "0" => false,
                _ => return Err(bad(LIVENESS_ENV, format!("{v:?} is neither 0 nor 1"))),
            };
        }
        if let Some(v) = get(HEARTBEAT_ENV) {
            let ms: u64 = v.parse().map_err(|_| {
                bad(
                    HEARTBEAT_ENV,
                    format!("{v:?} is not a whole number of milliseconds"),
                )
            })?;
            if ms == 0 {
                return Err(bad(
                    HEARTBEAT_ENV,
                    "the heartbeat interval must be at least 1 ms".into(),
                ));
            }
            out.heartbeat = Duration::from_millis(ms);
        }
        if let Some(v) = get(LIVENESS_TIMEOUT_ENV) {
            out.silence = crate::env::seconds(LIVENESS_TIMEOUT_ENV, &v)?;
        }
        if out.heartbeat >= out.silence {
            return Err(bad(
                HEARTBEAT_ENV,
                format!(
                    "the heartbeat interval ({:?}) must be shorter than the silence limit ({:?})",
                    out.heartbeat, out.silence
                ),
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lookup of an environment holding only `pairs`.
    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        let vars: std::collections::HashMap<&str, &str> = pairs.iter().copied().collect();
        move |k| vars.get(k).map(|v| (*v).to_string())
    }

    #[test]
    fn defaults_and_overrides() {
        let d = LivenessOptions::from_lookup(env(&[])).unwrap();
        assert_eq!(d, LivenessOptions::new());
        assert!(d.is_enabled());
        assert_eq!(d.heartbeat_interval(), Duration::from_millis(250));
        assert_eq!(d.silence(), Duration::from_secs(10));
        let o = LivenessOptions::from_lookup(env(&[
            ("NCCL_RS_LIVENESS", "0"),
            ("NCCL_RS_HEARTBEAT_MS", "50"),
            ("NCCL_RS_LIVENESS_TIMEOUT", "1.5"),
        ]))
        .unwrap();
        assert!(!o.is_enabled());
        assert_eq!(o.heartbeat_interval(), Duration::from_millis(50));
        assert_eq!(o.silence(), Duration::from_millis(1500));
        let b = LivenessOptions::new()
            .heartbeat(Duration::ZERO)
            .silence_limit(Duration::ZERO);
        assert_eq!(b.heartbeat_interval(), Duration::from_millis(1));
        assert_eq!(b.silence(), Duration::from_millis(2));
    }

    #[test]
    fn bad_values_are_typed_errors_naming_the_variable() {
        for (pairs, var) in [
            (&[("NCCL_RS_LIVENESS", "yes")][..], LIVENESS_ENV),
            (&[("NCCL_RS_HEARTBEAT_MS", "0")], HEARTBEAT_ENV),
            (&[("NCCL_RS_HEARTBEAT_MS", "-5")], HEARTBEAT_ENV),
            (&[("NCCL_RS_HEARTBEAT_MS", "20000")], HEARTBEAT_ENV),
            (
                &[("NCCL_RS_LIVENESS_TIMEOUT", "soon")],
                LIVENESS_TIMEOUT_ENV,
            ),
            (&[("NCCL_RS_LIVENESS_TIMEOUT", "0")], LIVENESS_TIMEOUT_ENV),
            (&[("NCCL_RS_LIVENESS_TIMEOUT", "inf")], LIVENESS_TIMEOUT_ENV),
            (&[("NCCL_RS_LIVENESS_TIMEOUT", "-1")], LIVENESS_TIMEOUT_ENV),
        ] {
            let pairs: &'static [(&'static str, &'static str)] = pairs;
            match LivenessOptions::from_lookup(env(pairs)) {
                Err(BadValue { var: named, .. }) => assert_eq!(named, var, "{pairs:?}"),
                other => panic!("{pairs:?}: {other:?}"),
            }
        }
    }
}
