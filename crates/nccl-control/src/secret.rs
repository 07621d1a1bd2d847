//! The shared secret every rank of a job proves it knows before rank 0
//! hands out the unique id.
//!
//! A secret is bytes, end to end: the environment variable's bytes are
//! taken as they are (no UTF-8 conversion, which would make two different
//! non-UTF-8 secrets equal and pad a short one past the minimum), and
//! [`Secret::to_env_value`] gives the same bytes back for a child's
//! environment.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

pub use crate::env::{SECRET_ENV, SECRET_FILE_ENV};
/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;
/// Longest secret file read, in bytes: a secret file path that names
/// something endless (`/dev/zero`) is refused instead of eating memory.
pub const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// A shared secret. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

/// Why no usable secret was found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// Neither variable is set.
    #[error("no shared secret: set {SECRET_ENV} or {SECRET_FILE_ENV}")]
    Missing,
    /// Shorter than [`MIN_SECRET_BYTES`].
    #[error(
        "the shared secret from {source_name} has {len} bytes; at least {MIN_SECRET_BYTES} are needed"
    )]
    TooShort {
        /// Where it came from.
        source_name: String,
        /// Its length.
        len: usize,
    },
    /// The secret file holds more than [`MAX_SECRET_FILE_BYTES`].
    #[error("the secret file {path} holds more than {MAX_SECRET_FILE_BYTES} bytes")]
    TooLong {
        /// The file.
        path: String,
    },
    /// The secret file could not be read.
    #[error("reading the secret file {path}: {error}")]
    File {
        /// The file.
        path: String,
        /// The error.
        error: std::io::Error,
    },
    /// No randomness for a new secret.
    #[error("no randomness for a new secret: {0}")]
    Random(String),
}

impl Secret {
    /// A secret from bytes you hold.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>, source_name: &str) -> Result<Secret, SecretError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort {
                source_name: source_name.to_string(),
                len: bytes.len(),
            });
        }
        Ok(Secret(bytes))
    }

    /// 32 random bytes, hex-encoded (for a launcher to hand its ranks).
    pub fn random() -> Result<Secret, SecretError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| SecretError::Random(e.to_string()))?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Secret(hex.into_bytes()))
    }

    /// `NCCL_RS_SECRET`, else the contents of `NCCL_RS_SECRET_FILE`
    /// (trailing newline removed).
    pub fn from_env() -> Result<Secret, SecretError> {
        Secret::from_lookup(&|k| std::env::var_os(k))
    }

    /// As [`Secret::from_env`], from any lookup. The variable's bytes are
    /// the secret, whatever their encoding.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<Secret, SecretError> {
        if let Some(v) = lookup(SECRET_ENV).filter(|v| !v.is_empty()) {
            return Secret::from_bytes(v.into_vec(), SECRET_ENV);
        }
        if let Some(path) = lookup(SECRET_FILE_ENV).filter(|v| !v.is_empty()) {
            return Secret::from_file(Path::new(&path));
        }
        Err(SecretError::Missing)
    }

    /// The contents of `path`, trailing newline removed. At most
    /// [`MAX_SECRET_FILE_BYTES`] are read. A pipe is fine (`<(echo ...)`
    /// in a shell): the file is the user's own configuration, so only
    /// its size is bounded.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        let io_error = |error| SecretError::File {
            path: path.display().to_string(),
            error,
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .map_err(io_error)?
            .take(MAX_SECRET_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io_error)?;
        if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
            return Err(SecretError::TooLong {
                path: path.display().to_string(),
            });
        }
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        Secret::from_bytes(bytes, &path.display().to_string())
    }

    /// The raw bytes (the HMAC key).
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The secret as an environment value for child processes: exactly
    /// its bytes, which [`Secret::from_lookup`] reads back unchanged.
    pub fn to_env_value(&self) -> OsString {
        OsStr::from_bytes(&self.0).to_os_string()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secrets_are_refused_and_debug_hides_the_bytes() {
        assert!(matches!(
            Secret::from_bytes(b"short".to_vec(), "test"),
            Err(SecretError::TooShort { len: 5, .. })
        ));
        let s = Secret::from_bytes(b"0123456789abcdef".to_vec(), "test").unwrap();
        assert_eq!(format!("{s:?}"), "Secret(16 bytes)");
        let r = Secret::random().unwrap();
        assert_eq!(r.bytes().len(), 64);
        assert_ne!(r, Secret::random().unwrap());
    }

    #[test]
    fn the_environment_and_files_are_read_in_order() {
        let none = |_: &str| None;
        assert!(matches!(
            Secret::from_lookup(&none),
            Err(SecretError::Missing)
        ));
        let dir = std::env::temp_dir().join(format!("nccl-dist-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "from-a-file-0123456789\n").unwrap();
        let f = file.clone();
        let lookup = move |k: &str| (k == SECRET_FILE_ENV).then(|| f.clone().into_os_string());
        assert_eq!(
            Secret::from_lookup(&lookup).unwrap().bytes(),
            b"from-a-file-0123456789"
        );
        let both = move |k: &str| match k {
            SECRET_ENV => Some("from-the-environment!".into()),
            _ => Some(file.clone().into_os_string()),
        };
        assert_eq!(
            Secret::from_lookup(&both).unwrap().bytes(),
            b"from-the-environment!"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn only_the_variable(value: OsString) -> impl Fn(&str) -> Option<OsString> {
        move |k: &str| (k == SECRET_ENV).then(|| value.clone())
    }

    #[test]
    fn two_different_non_utf8_secrets_stay_different() {
        // 0xff and 0xfe are invalid UTF-8; a lossy conversion turns both
        // into U+FFFD and the two secrets into one.
        let mut a = b"0123456789abcdef".to_vec();
        let mut b = a.clone();
        a.push(0xff);
        b.push(0xfe);
        let sa = Secret::from_lookup(&only_the_variable(OsString::from_vec(a.clone()))).unwrap();
        let sb = Secret::from_lookup(&only_the_variable(OsString::from_vec(b.clone()))).unwrap();
        assert_eq!(sa.bytes(), a.as_slice());
        assert_eq!(sb.bytes(), b.as_slice());
        assert_ne!(sa, sb);
    }

    #[test]
    fn a_short_non_utf8_secret_is_refused_with_its_own_length() {
        // Six bytes, each invalid UTF-8: lossily they were 18 bytes of
        // U+FFFD, past the 16-byte minimum.
        let short = OsString::from_vec(vec![0xff; 6]);
        match Secret::from_lookup(&only_the_variable(short)) {
            Err(SecretError::TooShort { source_name, len }) => {
                assert_eq!(len, 6);
                assert_eq!(source_name, SECRET_ENV);
            }
            other => panic!("expected TooShort, got {other:?}"),
        }
    }

    #[test]
    fn the_env_value_round_trips_every_byte() {
        let raw: Vec<u8> = (0u8..=255).filter(|b| *b != 0).collect();
        let secret = Secret::from_bytes(raw.clone(), "test").unwrap();
        let value = secret.to_env_value();
        assert_eq!(value.as_bytes(), raw.as_slice());
        let back = Secret::from_lookup(&only_the_variable(value)).unwrap();
        assert_eq!(back, secret);
        let random = Secret::random().unwrap();
        let again = Secret::from_lookup(&only_the_variable(random.to_env_value())).unwrap();
        assert_eq!(again, random);
    }

    #[test]
    fn an_endless_secret_file_is_refused_after_the_cap() {
        match Secret::from_file(Path::new("/dev/zero")) {
            Err(SecretError::TooLong { path }) => assert_eq!(path, "/dev/zero"),
            other => panic!("expected TooLong, got {other:?}"),
        }
    }
}
