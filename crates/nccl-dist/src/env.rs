//! Reading `NCCL_RS_*` values: the parsers every variable of this crate
//! shares, so a duration means the same thing in each.

use std::time::Duration;

use crate::error::{Error, Result};

/// A duration in seconds from the variable `var` (fractions allowed, at
/// least 1 ms, finite); anything else is an error naming the variable.
pub(crate) fn seconds(var: &'static str, value: &str) -> Result<Duration> {
    value
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.001 && *s < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| Error::InvalidArgument {
            op: var,
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
                matches!(
                    seconds("X", bad),
                    Err(Error::InvalidArgument { op: "X", .. })
                ),
                "{bad:?}"
            );
        }
    }
}
