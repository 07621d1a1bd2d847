//! The shared secret every rank of a job proves it knows before rank 0
//! hands out the unique id.

use std::fmt;
use std::path::Path;

/// Environment variable holding the secret itself.
pub const SECRET_ENV: &str = "NCCL_RS_SECRET";
/// Environment variable naming a file that holds the secret.
pub const SECRET_FILE_ENV: &str = "NCCL_RS_SECRET_FILE";
/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

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

    /// As [`Secret::from_env`], from any lookup.
    pub fn from_lookup(
        lookup: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Secret, SecretError> {
        if let Some(v) = lookup(SECRET_ENV).filter(|v| !v.is_empty()) {
            return Secret::from_bytes(v.to_string_lossy().into_owned().into_bytes(), SECRET_ENV);
        }
        if let Some(path) = lookup(SECRET_FILE_ENV).filter(|v| !v.is_empty()) {
            return Secret::from_file(Path::new(&path));
        }
        Err(SecretError::Missing)
    }

    /// The contents of `path`, trailing newline removed.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        let mut bytes = std::fs::read(path).map_err(|error| SecretError::File {
            path: path.display().to_string(),
            error,
        })?;
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        Secret::from_bytes(bytes, &path.display().to_string())
    }

    /// The raw bytes (the HMAC key).
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The secret as text, for handing to child processes in their
    /// environment.
    pub fn to_env_value(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
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
}
