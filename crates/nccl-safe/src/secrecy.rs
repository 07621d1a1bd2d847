//! Keeping a job closed to strangers: socket encryption with a pre-shared
//! key (`ncclSetEncryption`, NCCL 2.32+) and the refusal of
//! `NCCL_COMM_ID`.
//!
//! NCCL's bootstrap and socket transport are plaintext TCP unless told
//! otherwise. Anyone who can reach a rank's port and knows the unique id
//! can join; with `NCCL_COMM_ID` the id is an address plus a magic that is
//! the same for every job, so only the address is secret. This crate
//! therefore refuses `NCCL_COMM_ID` unless the user opts in with
//! `NCCL_RS_ALLOW_COMM_ID=1`, and offers [`set_encryption`] where the
//! loaded library has it. A request for encryption on a library without
//! it is an error, never a silent fall back to plaintext.

use std::ffi::CString;

use nccl_sys::{ncclEncryptionConfig_t, ncclEncryptionMode_t};

use crate::library::Library;
use crate::{Error, Feature, Result};

/// The variable that names a fixed bootstrap address for every job.
pub const COMM_ID_ENV: &str = "NCCL_COMM_ID";
/// Set to `1` to allow [`COMM_ID_ENV`] anyway.
pub const ALLOW_COMM_ID_ENV: &str = "NCCL_RS_ALLOW_COMM_ID";

/// The shortest pre-shared key accepted, in bytes.
pub const MIN_PSK_BYTES: usize = 16;

/// A pre-shared key for NCCL's socket encryption: text of at least
/// [`MIN_PSK_BYTES`] bytes without NUL. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct PresharedKey(CString);

impl std::fmt::Debug for PresharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PresharedKey({} bytes)", self.0.as_bytes().len())
    }
}

impl PresharedKey {
    /// Checks and wraps `key`.
    pub fn new(key: impl Into<Vec<u8>>) -> Result<PresharedKey> {
        const OP: &str = "PresharedKey::new";
        let key = key.into();
        if key.len() < MIN_PSK_BYTES {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the key is shorter than 16 bytes",
            });
        }
        CString::new(key)
            .map(PresharedKey)
            .map_err(|_| Error::InvalidArgument {
                op: OP,
                reason: "the key contains a NUL byte",
            })
    }
}

/// What [`set_encryption`] asks of NCCL.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Encryption {
    /// Plaintext sockets (NCCL's default).
    Plaintext,
    /// Sockets encrypted with this pre-shared key; every rank must use the
    /// same one.
    Psk(PresharedKey),
}

/// `ncclSetEncryption`: encrypt NCCL's TCP socket traffic (bootstrap and
/// the socket transport) of the communicators created afterwards in this
/// process. NCCL 2.32+; on an older library this is
/// [`Error::Unsupported`], and a library built without TLS support answers
/// with its NCCL error. In neither case does anything fall back to
/// plaintext silently: the caller gets the error.
///
/// ```no_run
/// use nccl_safe::{Encryption, PresharedKey, set_encryption};
/// let key = PresharedKey::new(std::env::var("MY_JOB_PSK")?)?;
/// set_encryption(&Encryption::Psk(key))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn set_encryption(encryption: &Encryption) -> Result<()> {
    const OP: &str = "ncclSetEncryption";
    let lib = Library::get()?;
    lib.capabilities().require(Feature::Encryption)?;
    let set = lib.raw().ncclSetEncryption()?;
    let mut config = ncclEncryptionConfig_t::default();
    match encryption {
        Encryption::Plaintext => {
            config.mode = ncclEncryptionMode_t::NCCL_ENCRYPTION_MODE_NONE.0 as i32;
        }
        Encryption::Psk(key) => {
            config.mode = ncclEncryptionMode_t::NCCL_ENCRYPTION_MODE_PSK.0 as i32;
            config.psk = key.0.as_ptr();
        }
    }
    let _span = tracing::debug_span!(
        "nccl.set_encryption",
        psk = matches!(encryption, Encryption::Psk(_))
    )
    .entered();
    // SAFETY: a fully initialised config of the 2.32 layout; the key
    // outlives the call (NCCL copies what it keeps).
    let code = unsafe { set(&config) };
    lib.check(OP, code, std::ptr::null_mut())
}

/// Refuses `NCCL_COMM_ID` unless [`ALLOW_COMM_ID_ENV`] is `1`.
pub(crate) fn check_comm_id_env(op: &'static str) -> Result<()> {
    check_comm_id(op, |k| {
        std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
    })
}

fn check_comm_id(op: &'static str, lookup: impl Fn(&str) -> Option<String>) -> Result<()> {
    let set = lookup(COMM_ID_ENV).is_some_and(|v| !v.trim().is_empty());
    let allowed = lookup(ALLOW_COMM_ID_ENV).is_some_and(|v| v.trim() == "1");
    if set && !allowed {
        return Err(Error::InvalidArgument {
            op,
            reason: "NCCL_COMM_ID is set: its id is a fixed address with a constant magic, so \
                     anyone who can reach that address can join; unset it (nccl-dist hands out \
                     a fresh id over an authenticated rendezvous) or set NCCL_RS_ALLOW_COMM_ID=1",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_id_is_refused_unless_allowed() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(check_comm_id("t", env(&[])).is_ok());
        assert!(matches!(
            check_comm_id("t", env(&[("NCCL_COMM_ID", "10.0.0.1:5000")])),
            Err(Error::InvalidArgument { op: "t", .. })
        ));
        assert!(
            check_comm_id(
                "t",
                env(&[
                    ("NCCL_COMM_ID", "10.0.0.1:5000"),
                    ("NCCL_RS_ALLOW_COMM_ID", "1")
                ])
            )
            .is_ok()
        );
        assert!(
            check_comm_id(
                "t",
                env(&[
                    ("NCCL_COMM_ID", "10.0.0.1:5000"),
                    ("NCCL_RS_ALLOW_COMM_ID", "yes")
                ])
            )
            .is_err()
        );
        assert!(check_comm_id("t", env(&[("NCCL_COMM_ID", " ")])).is_ok());
    }

    #[test]
    fn keys_are_checked_and_never_printed() {
        assert!(matches!(
            PresharedKey::new("short"),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            PresharedKey::new("sixteen-bytes\0xx"),
            Err(Error::InvalidArgument { .. })
        ));
        let key = PresharedKey::new("a-long-enough-secret-key").unwrap();
        let shown = format!("{key:?} {:?}", Encryption::Psk(key.clone()));
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("24 bytes"), "{shown}");
    }
}
