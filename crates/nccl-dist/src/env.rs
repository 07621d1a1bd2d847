//! Every `NCCL_RS_*` variable of this crate, named in one place, and the
//! parsers they share, so a duration means the same thing in each. The
//! modules that read them re-export their names.
//!
//! | variable | meaning | default | read by |
//! |---|---|---|---|
//! | `NCCL_RS_PORT` | the rendezvous port, over the launcher's | the launcher's (`MASTER_PORT + 1` under torchrun) | `World::init` |
//! | `NCCL_RS_TIMEOUT` | the operation timeout, seconds | 300 | `World`, the watchdog |
//! | `NCCL_RS_WATCHDOG` | `0`/`off` turns the watchdog off | on | `WatchdogOptions::from_env` |
//! | `NCCL_RS_WATCHDOG_TIMEOUT` | the watchdog's timeout, seconds (over `NCCL_RS_TIMEOUT`) | the operation timeout | `WatchdogOptions::from_env` |
//! | `NCCL_RS_WATCHDOG_POLL_MS` | how often the watchdog thread looks, milliseconds (0.1 to 1000) | 2 | `WatchdogOptions::from_env` |
//! | `NCCL_RS_FLIGHT_RECORDER` | operations the flight recorder keeps | the default history | `WatchdogOptions::from_env` |
//! | `NCCL_RS_CHECK_CALLS` | `1`/`on` compares every call on the world's communicator across the ranks before launch | off | `WatchdogOptions::from_env` |
//! | `NCCL_RS_ENCRYPTION` | `psk` encrypts NCCL's sockets (NCCL 2.32+) | none | `World` |
//! | `NCCL_RS_PSK` | the key for `NCCL_RS_ENCRYPTION=psk` | none | `World` |
//! | `NCCL_RS_RECOVER_BY_SHRINK` | on: a world's communicators park on a loss and `World::recover` shrinks them (NCCL 2.27+); `0`/`off`: the old world is aborted and given up | on | `World` |
//!
//! The control plane's variables (the secret, the liveness channel) are
//! named in `nccl-control`'s `env` module, whose duration parser this
//! crate shares; nccl-safe has one of its own, `NCCL_RS_ALLOW_COMM_ID`
//! (lets a set `NCCL_COMM_ID` through), named in its `secrecy` module.

use std::time::Duration;

/// The rendezvous port, overriding the launcher's (see
/// [`crate::WorldOptions::port`]).
pub const PORT_ENV: &str = "NCCL_RS_PORT";
/// The operation timeout in seconds.
pub const TIMEOUT_ENV: &str = "NCCL_RS_TIMEOUT";
/// `1` turns the watchdog on (the default), `0` off.
pub const WATCHDOG_ENV: &str = "NCCL_RS_WATCHDOG";
/// The watchdog's timeout in seconds.
pub const WATCHDOG_TIMEOUT_ENV: &str = "NCCL_RS_WATCHDOG_TIMEOUT";
/// How often the watchdog thread looks, in milliseconds (fractional, 0.1
/// to 1000).
pub const WATCHDOG_POLL_ENV: &str = "NCCL_RS_WATCHDOG_POLL_MS";
/// The flight recorder's length.
pub const FLIGHT_RECORDER_ENV: &str = "NCCL_RS_FLIGHT_RECORDER";
/// `1` compares every call on the world's communicator across the ranks
/// before launch (the call check); `0` or unset leaves it off.
pub const CHECK_CALLS_ENV: &str = "NCCL_RS_CHECK_CALLS";
/// `psk` encrypts NCCL's sockets with the key in [`PSK_ENV`]; `none` or
/// unset leaves them as NCCL has them.
pub const ENCRYPTION_ENV: &str = "NCCL_RS_ENCRYPTION";
/// The pre-shared key for [`ENCRYPTION_ENV`].
pub const PSK_ENV: &str = "NCCL_RS_PSK";
/// Unset or `1`: a world's communicators park on a loss so that
/// [`crate::World::recover`] shrinks them
/// ([`crate::WorldOptions::recover_by_shrink`]); `0`: they are aborted,
/// and a recovery gives the old world up.
pub const RECOVER_BY_SHRINK_ENV: &str = "NCCL_RS_RECOVER_BY_SHRINK";

use nccl_safe::{Encryption, PresharedKey};

pub(crate) use nccl_control::env::{BadValue, seconds};

/// An on/off variable `var` (`1`/`on`/`true`/`yes` or
/// `0`/`off`/`false`/`no`): `None` when unset or empty; anything else is
/// an error naming the variable.
pub(crate) fn switch(
    lookup: impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<bool>, BadValue> {
    match lookup(var).as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some("1" | "on" | "true" | "yes") => Ok(Some(true)),
        Some("0" | "off" | "false" | "no") => Ok(Some(false)),
        Some(other) => Err(BadValue {
            var,
            reason: format!("{other:?} is not 1/on/true or 0/off/false"),
        }),
    }
}

/// The operation timeout from [`TIMEOUT_ENV`] (seconds), `None` when
/// unset.
pub(crate) fn op_timeout(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<Duration>, BadValue> {
    lookup(TIMEOUT_ENV)
        .map(|v| seconds(TIMEOUT_ENV, &v))
        .transpose()
}

/// The encryption [`ENCRYPTION_ENV`] and [`PSK_ENV`] ask for: `None` when
/// they ask for none. `psk` without a usable key is an error, never
/// plaintext.
pub(crate) fn encryption(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<Encryption>, BadValue> {
    let bad = |reason: String| BadValue {
        var: ENCRYPTION_ENV,
        reason,
    };
    match lookup(ENCRYPTION_ENV).as_deref().map(str::trim) {
        None | Some("" | "none") => Ok(None),
        Some("psk") => {
            let key = lookup(PSK_ENV)
                .filter(|k| !k.is_empty())
                .ok_or_else(|| bad(format!("psk encryption needs the key in {PSK_ENV}")))?;
            let key = PresharedKey::new(key).map_err(|e| bad(format!("{PSK_ENV}: {e}")))?;
            Ok(Some(Encryption::Psk(key)))
        }
        Some(other) => Err(bad(format!("{other:?} is not `psk` or `none`"))),
    }
}
