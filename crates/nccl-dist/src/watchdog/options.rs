//! How a watchdog behaves: [`WatchdogOptions`], in code or from the
//! environment.

use std::time::Duration;

use crate::env::{
    CHECK_CALLS_ENV, FLIGHT_RECORDER_ENV, WATCHDOG_ENV, WATCHDOG_POLL_ENV, WATCHDOG_TIMEOUT_ENV,
};
use crate::error::{Error, Result};

/// How a [`Watchdog`](super::Watchdog) behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchdogOptions {
    pub(super) timeout: Duration,
    pub(super) history: usize,
    pub(super) poll: Duration,
    pub(super) print: bool,
    pub(super) check_calls: bool,
}

impl Default for WatchdogOptions {
    fn default() -> Self {
        WatchdogOptions::new()
    }
}

impl WatchdogOptions {
    /// Timeout 300 s, the last 64 operations kept, polled every 2 ms,
    /// printed to stderr on failure.
    pub fn new() -> WatchdogOptions {
        WatchdogOptions {
            timeout: Duration::from_secs(300),
            history: 64,
            poll: Duration::from_millis(2),
            print: true,
            check_calls: false,
        }
    }

    /// How long an operation may stay unfinished before its communicator
    /// is aborted.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many operations the flight recorder keeps per communicator
    /// (at least 1).
    pub fn history(mut self, entries: usize) -> Self {
        self.history = entries.max(1);
        self
    }

    /// How often the watchdog thread looks: from 100 µs to 1 s (a value
    /// outside is brought to the nearer end). A timeout is noticed up to
    /// one poll late, and a communicator's drop waits for the watch in
    /// steps of a few polls, so a longer poll would only slow those.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll.clamp(Duration::from_micros(100), Duration::from_secs(1));
        self
    }

    /// Whether a failure prints the flight recorder to stderr (it is
    /// always logged with `tracing` at error level and kept in the error).
    pub fn print_on_failure(mut self, print: bool) -> Self {
        self.print = print;
        self
    }

    /// Whether every call on the world's communicator is compared across
    /// the ranks before launch (off by default; see
    /// [`WorldOptions::check_calls`](crate::WorldOptions::check_calls)).
    pub fn check_calls(mut self, on: bool) -> Self {
        self.check_calls = on;
        self
    }

    /// The configured timeout.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// Reads `NCCL_RS_WATCHDOG` (`1`/`on`/`true` or `0`/`off`/`false`;
    /// on when unset), the timeout from `NCCL_RS_WATCHDOG_TIMEOUT`, else
    /// `NCCL_RS_TIMEOUT` (seconds, fractional, at least 0.001), else 300 s,
    /// `NCCL_RS_WATCHDOG_POLL_MS` (milliseconds, fractional, 0.1 to 1000;
    /// 2 when unset), `NCCL_RS_FLIGHT_RECORDER` (entries) and `NCCL_RS_CHECK_CALLS`
    /// (`1` turns the call check on; off when unset). `Ok(None)` only when the
    /// watchdog is turned off; a value that does not parse is an error,
    /// never ignored.
    pub fn from_env() -> Result<Option<WatchdogOptions>> {
        WatchdogOptions::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`WatchdogOptions::from_env`], reading variables from `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<WatchdogOptions>> {
        let bad = |name: &'static str, reason: String| Error::InvalidArgument { op: name, reason };
        // On by default.
        if !crate::env::switch(&lookup, WATCHDOG_ENV)?.unwrap_or(true) {
            return Ok(None);
        }
        let mut options = WatchdogOptions::new();
        if let Some(on) = crate::env::switch(&lookup, CHECK_CALLS_ENV)? {
            options = options.check_calls(on);
        }
        if let Some(t) = crate::env::op_timeout(&lookup)? {
            options = options.timeout(t);
        }
        if let Some(v) = lookup(WATCHDOG_TIMEOUT_ENV) {
            options = options.timeout(crate::env::seconds(WATCHDOG_TIMEOUT_ENV, &v)?);
        }
        if let Some(v) = lookup(WATCHDOG_POLL_ENV) {
            let ms: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|ms: &f64| (0.1..=1000.0).contains(ms))
                .ok_or_else(|| {
                    bad(
                        WATCHDOG_POLL_ENV,
                        format!("{v:?} is not a number of milliseconds from 0.1 to 1000"),
                    )
                })?;
            options = options.poll_interval(Duration::from_secs_f64(ms / 1000.0));
        }
        if let Some(v) = lookup(FLIGHT_RECORDER_ENV) {
            let n: usize = v.trim().parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                bad(
                    FLIGHT_RECORDER_ENV,
                    format!("{v:?} is not a positive number of entries"),
                )
            })?;
            options = options.history(n);
        }
        Ok(Some(options))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_env as env;

    #[test]
    fn the_environment_turns_it_on_with_checked_values() {
        assert_eq!(
            WatchdogOptions::from_lookup(env(&[])).unwrap(),
            Some(WatchdogOptions::new()),
            "on by default"
        );
        let from_op_timeout = WatchdogOptions::from_lookup(env(&[("NCCL_RS_TIMEOUT", "7")]))
            .unwrap()
            .unwrap();
        assert_eq!(from_op_timeout.get_timeout(), Duration::from_secs(7));
        assert_eq!(
            WatchdogOptions::from_lookup(env(&[("NCCL_RS_WATCHDOG", "0")])).unwrap(),
            None
        );
        let on = WatchdogOptions::from_lookup(env(&[("NCCL_RS_WATCHDOG_TIMEOUT", "2.5")]))
            .unwrap()
            .unwrap();
        assert_eq!(on.get_timeout(), Duration::from_millis(2500));
        // Found by the launch_env fuzzer: a tiny positive value used to
        // become a zero timeout.
        for bad in ["1e-10", "0", "-1", "nan", "inf", "soon"] {
            let pairs = [("NCCL_RS_WATCHDOG_TIMEOUT", bad)];
            assert!(WatchdogOptions::from_lookup(env(&pairs)).is_err(), "{bad}");
        }
        assert!(WatchdogOptions::from_lookup(env(&[("NCCL_RS_FLIGHT_RECORDER", "0")])).is_err());
        assert!(WatchdogOptions::from_lookup(env(&[("NCCL_RS_WATCHDOG", "perhaps")])).is_err());
        let checking = WatchdogOptions::from_lookup(env(&[("NCCL_RS_CHECK_CALLS", "1")]));
        assert_eq!(
            checking.unwrap(),
            Some(WatchdogOptions::new().check_calls(true))
        );
        assert!(WatchdogOptions::from_lookup(env(&[("NCCL_RS_CHECK_CALLS", "2")])).is_err());
        let slow = WatchdogOptions::from_lookup(env(&[("NCCL_RS_WATCHDOG_POLL_MS", "50")]));
        assert_eq!(
            slow.unwrap(),
            Some(WatchdogOptions::new().poll_interval(Duration::from_millis(50)))
        );
        let fine = WatchdogOptions::from_lookup(env(&[("NCCL_RS_WATCHDOG_POLL_MS", " 0.25 ")]));
        assert_eq!(fine.unwrap().unwrap().poll, Duration::from_micros(250));
        let slowest = WatchdogOptions::from_lookup(env(&[("NCCL_RS_WATCHDOG_POLL_MS", "1000")]));
        assert_eq!(slowest.unwrap().unwrap().poll, Duration::from_secs(1));
        assert_eq!(
            WatchdogOptions::new()
                .poll_interval(Duration::from_secs(60))
                .poll,
            Duration::from_secs(1),
            "brought to the longest poll"
        );
        for bad in [
            "0.05", "0", "-2", "1000.5", "60000", "nan", "inf", "often", "",
        ] {
            let pairs = [("NCCL_RS_WATCHDOG_POLL_MS", bad)];
            assert!(
                WatchdogOptions::from_lookup(env(&pairs)).is_err(),
                "{bad:?}"
            );
        }
    }
}
