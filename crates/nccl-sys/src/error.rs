//! Errors of loading libnccl. A missing symbol's error, [`SymbolError`],
//! lives beside the symbol table in [`crate::functions`].

use std::error::Error;
use std::fmt;
use std::path::PathBuf;

use crate::search::Source;
use crate::types::ncclResult_t;
use crate::version::Version;

/// Why one candidate library could not be used.
#[derive(Debug)]
#[non_exhaustive]
pub enum AttemptFailure {
    /// The path does not exist.
    Missing,
    /// `dlopen` failed (not a shared object, wrong architecture, a missing
    /// dependency, or the name is unknown to the system loader).
    Open(libloading::Error),
    /// The shared object loaded but has no `ncclGetVersion`: it is not NCCL.
    NotNccl,
    /// `ncclGetVersion` returned an error.
    VersionQuery(ncclResult_t),
    /// `ncclGetVersion` reported a code that is not a version.
    BadVersion(i32),
    /// The library is older than [`Version::MIN_SUPPORTED`].
    TooOld(Version),
}

impl fmt::Display for AttemptFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptFailure::Missing => f.write_str("no such file"),
            AttemptFailure::Open(e) => {
                // libloading keeps the loader's own words in `source()`.
                write!(f, "could not be loaded: {e}")?;
                match e.source() {
                    Some(reason) => write!(f, ": {reason}"),
                    None => Ok(()),
                }
            }
            AttemptFailure::NotNccl => {
                f.write_str("loaded, but it has no ncclGetVersion: not an NCCL library")
            }
            AttemptFailure::VersionQuery(r) => write!(f, "ncclGetVersion failed with {r:?}"),
            AttemptFailure::BadVersion(code) => {
                write!(
                    f,
                    "ncclGetVersion reported {code}, which is not a version code"
                )
            }
            AttemptFailure::TooOld(v) => write!(
                f,
                "is NCCL {v}, older than {}, the oldest release these bindings support",
                Version::MIN_SUPPORTED
            ),
        }
    }
}

/// One candidate that was tried, and why it failed.
#[derive(Debug)]
pub struct Attempt {
    /// The search rule that produced the candidate.
    pub source: Source,
    /// The path or file name handed to `dlopen`.
    pub target: PathBuf,
    /// Why it was not used.
    pub failure: AttemptFailure,
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.target.display(),
            self.source,
            self.failure
        )
    }
}

/// Loading libnccl failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// The one library named by `NCCL_LIBRARY` or by [`crate::Nccl::open`]
    /// is unusable. There is no fallback to other candidates: a wrong
    /// explicit choice must not be papered over by another copy.
    Rejected(Box<Attempt>),
    /// Every candidate of the search order failed; each is listed.
    NotFound {
        /// Every candidate tried, in order, with its failure.
        attempts: Vec<Attempt>,
    },
}

impl LoadError {
    /// Every candidate tried, in order.
    pub fn attempts(&self) -> &[Attempt] {
        match self {
            LoadError::Rejected(attempt) => std::slice::from_ref(attempt),
            LoadError::NotFound { attempts } => attempts,
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Rejected(attempt) => write!(f, "cannot use NCCL library {attempt}"),
            LoadError::NotFound { attempts } => {
                write!(
                    f,
                    "no usable NCCL library found; tried {} places:",
                    attempts.len()
                )?;
                for (i, attempt) in attempts.iter().enumerate() {
                    write!(f, "\n  {}. {attempt}", i + 1)?;
                }
                write!(
                    f,
                    "\nset NCCL_LIBRARY to the path of libnccl.so.2, or install NCCL \
                     (for example `pip install nvidia-nccl-cu12`)"
                )
            }
        }
    }
}

impl Error for LoadError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            LoadError::Rejected(attempt) => match &attempt.failure {
                AttemptFailure::Open(e) => Some(e),
                _ => None,
            },
            LoadError::NotFound { .. } => None,
        }
    }
}

pub use crate::functions::SymbolError;

/// `Result` with this crate's [`LoadError`] unless another error is named
/// (a symbol lookup answers [`SymbolError`]: `Result<T, SymbolError>`).
pub type Result<T, E = LoadError> = std::result::Result<T, E>;
