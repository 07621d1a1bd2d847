//! The one error type of this crate.
//!
//! NCCL failures carry the result code, the operation and the text of
//! `ncclGetLastError` captured at the moment of failure. Local validation
//! failures are their own variants with the offending values, so callers can
//! match on them and tests can assert them exactly.

use std::path::PathBuf;
use std::time::Duration;

use nccl_sys::{LoadError, SymbolError, Version, ncclResult_t};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which buffer of an operation an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// The input buffer.
    Send,
    /// The output buffer.
    Recv,
    /// The single buffer of an in-place operation.
    InPlace,
    /// A device-resident scalar (PreMulSum).
    Scalar,
    /// The stream an operation was asked to run on.
    Stream,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Send => "send buffer",
            Role::Recv => "receive buffer",
            Role::InPlace => "buffer",
            Role::Scalar => "scalar",
            Role::Stream => "stream",
        })
    }
}

/// Everything that can go wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libnccl could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),

    /// The loaded libnccl lacks a function this call needs.
    #[error(transparent)]
    Symbol(#[from] SymbolError),

    /// NCCL returned an error.
    #[error("{op} failed: {code:?} ({message})")]
    Nccl {
        /// The NCCL function that failed.
        op: &'static str,
        /// Its result code.
        code: ncclResult_t,
        /// `ncclGetLastError` (or `ncclGetErrorString`) at failure time.
        message: String,
    },

    /// A CUDA driver call made on NCCL's behalf failed.
    #[error("{op}: CUDA error: {source}")]
    Cuda {
        /// What we were doing.
        op: &'static str,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },

    /// A feature or dtype the loaded library or the GPU does not support.
    #[error("{what} is not supported: it needs {requires}, found {found}")]
    Unsupported {
        /// The feature.
        what: &'static str,
        /// What it needs, e.g. "NCCL 2.24" or "compute capability 9.0".
        requires: String,
        /// What is there.
        found: String,
    },

    /// A buffer is too short (or, for receive-only ranks, has the wrong
    /// length) for the operation.
    #[error("{op}: {role} holds {given} elements, needs {needed}")]
    Length {
        /// The operation.
        op: &'static str,
        /// Which buffer.
        role: Role,
        /// Elements the operation needs.
        needed: usize,
        /// Elements the buffer has.
        given: usize,
    },

    /// A buffer lives on another GPU than the communicator.
    #[error("{op}: {role} is on device {found}, the communicator on device {expected}")]
    WrongDevice {
        /// The operation.
        op: &'static str,
        /// Which buffer.
        role: Role,
        /// The communicator's device.
        expected: usize,
        /// The buffer's device.
        found: usize,
    },

    /// A root or peer rank outside `0..size`.
    #[error("{op}: {what} {rank} is out of range for a communicator of {size} ranks")]
    RankOutOfRange {
        /// The operation.
        op: &'static str,
        /// "root" or "peer".
        what: &'static str,
        /// The rank given.
        rank: usize,
        /// The communicator's size.
        size: usize,
    },

    /// Send and receive buffers overlap without being the exact in-place
    /// layout NCCL defines for the operation.
    #[error(
        "{op}: send and receive buffers overlap partially ({send:#x}+{send_bytes} vs {recv:#x}+{recv_bytes})"
    )]
    PartialAlias {
        /// The operation.
        op: &'static str,
        /// Send buffer address.
        send: u64,
        /// Send buffer size in bytes.
        send_bytes: usize,
        /// Receive buffer address.
        recv: u64,
        /// Receive buffer size in bytes.
        recv_bytes: usize,
    },

    /// A count whose byte size, or whose product with the number of ranks,
    /// does not fit the address space.
    #[error("{op}: {count} elements x {factor} overflows")]
    Overflow {
        /// The operation.
        op: &'static str,
        /// The count.
        count: usize,
        /// What it was multiplied by.
        factor: usize,
    },

    /// An argument is invalid for a reason the other variants do not name.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: &'static str,
    },

    /// A wait we own passed its deadline.
    #[error("{op} did not finish within {waited:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// How long we waited.
        waited: Duration,
    },

    /// The stream is being captured into a CUDA graph outside
    /// [`crate::allow_capture`]: a launch of the graph could outlive the
    /// call's buffers and communicator.
    #[error(
        "{op}: the stream is being captured into a CUDA graph; capture inside nccl_safe::allow_capture, whose contract keeps the buffers and the communicator alive for every launch"
    )]
    Capturing {
        /// The operation refused.
        op: &'static str,
    },

    /// The communicator's observer refused the call before its launch
    /// ([`crate::OpObserver::before`], such as nccl-dist's cross-rank call
    /// check): nothing was launched and the communicator stays usable.
    /// `source` is the observer's own error (downcast it).
    #[error("{op}: refused before launch: {source}")]
    CheckFailed {
        /// The operation refused.
        op: &'static str,
        /// The observer's reason.
        source: crate::observe::CheckError,
    },

    /// The communicator was aborted (by [`crate::AbortHandle`], an
    /// [`crate::AbortSignal`] or after a failure) and can no longer be used.
    #[error("{op}: the communicator was aborted ({cause})")]
    Aborted {
        /// The operation that found it aborted.
        op: &'static str,
        /// Why it was aborted.
        cause: crate::AbortCause,
    },

    /// The communicator was finalized or destroyed and can no longer be
    /// used.
    #[error("{op}: the communicator is finalized")]
    Finalized {
        /// The operation that found it finalized.
        op: &'static str,
    },

    /// A unique id from outside (bytes, hex text or a file) that is not
    /// one: found before any NCCL call.
    #[error(transparent)]
    BadUniqueId(#[from] UniqueIdError),
}

/// Why bytes, text or a file are not a unique id
/// ([`crate::UniqueId::from_slice`], [`crate::UniqueId::from_hex`],
/// [`crate::UniqueId::read_file`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UniqueIdError {
    /// Raw bytes of the wrong length.
    #[error("a unique id is {expected} bytes, found {found}")]
    Length {
        /// [`crate::UniqueId::BYTES`].
        expected: usize,
        /// The length given.
        found: usize,
    },
    /// Hex text with the wrong number of digits (surrounding whitespace
    /// not counted).
    #[error("a unique id in hex is {expected} digits, found {found}")]
    HexLength {
        /// Twice [`crate::UniqueId::BYTES`].
        expected: usize,
        /// The digits given.
        found: usize,
    },
    /// A character of hex text that is not a hex digit.
    #[error("a unique id in hex: {found:?} at position {position} is not a hex digit")]
    NotHex {
        /// Its position in the text given, in characters from 0.
        position: usize,
        /// The character.
        found: char,
    },
    /// The file could not be read (missing, not permitted, ...).
    #[error("unique id file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A file larger than any form of a unique id could be.
    #[error("unique id file {}: {size} bytes, more than the {limit} a unique id file may hold", path.display())]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The largest size read.
        limit: u64,
    },
    /// A file that holds neither the raw bytes nor hex text.
    #[error(
        "unique id file {}: {size} bytes that are neither the id's {} raw bytes nor its hex text",
        path.display(),
        nccl_sys::NCCL_UNIQUE_ID_BYTES
    )]
    FileContents {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: usize,
    },
}

impl Error {
    /// `Unsupported` for a feature that needs a newer NCCL.
    pub(crate) fn needs_version(what: &'static str, requires: Version, found: Version) -> Error {
        Error::Unsupported {
            what,
            requires: format!("NCCL {}.{}", requires.major, requires.minor),
            found: format!("NCCL {found}"),
        }
    }

    /// The NCCL result code, when NCCL reported the error.
    pub fn nccl_code(&self) -> Option<ncclResult_t> {
        match self {
            Error::Nccl { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The `op` of an [`Error::Cuda`] made by `From` (a `?` on the caller's
/// own cudarc call); this crate's own calls name the driver function.
pub const CUDA_OP: &str = "cuda";

impl From<cudarc::driver::DriverError> for Error {
    /// [`Error::Cuda`] with `op` [`CUDA_OP`], so that `?` works on cudarc
    /// calls in code that returns this crate's [`Result`].
    ///
    /// ```no_run
    /// fn upload(comm: &nccl_safe::Comm) -> nccl_safe::Result<()> {
    ///     let mut x = comm.stream().clone_htod(&[1.0f32; 4])?; // a DriverError
    ///     comm.all_reduce_in_place(&mut x, nccl_safe::ReduceOp::Sum)?;
    ///     Ok(())
    /// }
    /// ```
    fn from(source: cudarc::driver::DriverError) -> Error {
        Error::Cuda {
            op: CUDA_OP,
            source,
        }
    }
}
