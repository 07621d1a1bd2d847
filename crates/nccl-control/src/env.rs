//! Every `NCCL_RS_*` variable of this crate, named in one place, and the
//! parser of a duration that `nccl-dist` shares, so a number of seconds
//! means the same thing in both. The modules that read them re-export
//! their names.
//!
//! | variable | meaning | default | read by |
//! |---|---|---|---|
//! | `NCCL_RS_SECRET` | the job's shared secret (bytes, at least 16) | none: required for a rendezvous | `Secret::from_env` |
//! | `NCCL_RS_SECRET_FILE` | a file holding the secret (trailing newline dropped, at most 64 KiB) | none | `Secret::from_env` |
//! | `NCCL_RS_LIVENESS` | `0` turns the liveness channel off | on | `LivenessOptions::from_env` |
//! | `NCCL_RS_HEARTBEAT_MS` | heartbeat interval, milliseconds | 250 | `LivenessOptions::from_env` |
//! | `NCCL_RS_LIVENESS_TIMEOUT` | silence limit, seconds | 10 | `LivenessOptions::from_env` |

use std::time::Duration;

/// The job's shared secret itself.
pub const SECRET_ENV: &str = "NCCL_RS_SECRET";
/// A file that holds the secret.
pub const SECRET_FILE_ENV: &str = "NCCL_RS_SECRET_FILE";
/// `0` turns the liveness channel off, `1` (the default) on.
pub const LIVENESS_ENV: &str = "NCCL_RS_LIVENESS";
/// Heartbeat interval in milliseconds (default 250).
pub const HEARTBEAT_ENV: &str = "NCCL_RS_HEARTBEAT_MS";
/// Silence limit in seconds, fractions allowed (default 10).
pub const LIVENESS_TIMEOUT_ENV: &str = "NCCL_RS_LIVENESS_TIMEOUT";

/// A variable whose value cannot be used: which one, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {reason}")]
pub struct BadValue {
    /// The variable.
    pub var: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

/// A duration in seconds from the variable `var` (fractions allowed, at
/// least 1 ms, finite); anything else is an error naming the variable.
pub fn seconds(var: &'static str, value: &str) -> Result<Duration, BadValue> {
    value
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.001 && *s < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| BadValue {
            var,
            reason: format!("{value:?} is not a number of seconds from 0.001 on"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_take_fractions_and_refuse_the_rest() {
        assert_eq!(seconds("X", " 2.5 ").unwrap(), Duration::from_millis(2500));
        assert_eq!(seconds("X", "0.001").unwrap(), Duration::from_millis(1));
        for bad in ["", "0", "1e-10", "-1", "nan", "inf", "1e10", "soon"] {
            assert!(
                matches!(seconds("X", bad), Err(BadValue { var: "X", .. })),
                "{bad:?}"
            );
        }
    }
}
