//! The variables this crate reads, named in one place.

/// NCCL's own fixed bootstrap address; while it is set, a fresh id is
/// refused (as nccl-safe refuses it).
pub(crate) const COMM_ID_ENV: &str = "NCCL_COMM_ID";
/// Set to `1` to allow [`COMM_ID_ENV`] anyway.
pub(crate) const ALLOW_COMM_ID_ENV: &str = "NCCL_RS_ALLOW_COMM_ID";
