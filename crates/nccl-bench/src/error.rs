//! The bench's error type: any error, with what was being done.

use nccl_dist::nccl_safe::cudarc::driver::result as cuda;

/// Any error of the bench (they end the run with their message).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T, E = BoxError> = std::result::Result<T, E>;

/// Turns a CUDA driver error into one that says what was being done.
pub fn cuda_err(what: &'static str) -> impl Fn(cuda::DriverError) -> BoxError {
    move |e| format!("{what}: {e}").into()
}
