//! Sound, typed, RAII NCCL on top of [`nccl_sys`] and cudarc.
//!
//! This layer owns what `nccl-sys` leaves out:
//!
//! - [`Comm`]: an owned communicator, `Send` but not `Sync` (NCCL allows
//!   one thread at a time per communicator), with an [`AbortHandle`] for
//!   other threads; `Drop` finalizes and destroys, falls back to abort,
//!   and never panics.
//! - Collectives that check lengths, devices, ranks, aliasing and overflow
//!   before any FFI call and answer with typed [`Error`]s that carry the
//!   offending values; NCCL failures carry `ncclGetLastError`'s text.
//! - Groups ([`GroupGuard`], [`group`]) that hold the borrowed buffers until
//!   NCCL launches the work, `PreMulSum`, fp8, [`NcclMemory`], buffer
//!   [`Registration`] and symmetric [`Window`]s.
//! - [`copy_peer`]: copies between the memory of two GPUs (which GPUs
//!   reach which, and NVLink islands, are `nccl-dist`'s placement).
//! - [`Capabilities`] from the loaded library's version and symbols, so a
//!   feature an older NCCL lacks is [`Error::Unsupported`], not a crash.
//!
//! It leaves device meshes, launch bootstrap and watchdogs to `nccl-dist`.
//!
//! # Example: one process, every local GPU
//!
//! ```no_run
//! use cudarc::driver::CudaContext;
//! use nccl_safe::{Comm, Config, ReduceOp, group};
//!
//! // cudarc panics without the driver: ask first, to get an error.
//! nccl_safe::require_cuda_driver()?;
//! let n = CudaContext::device_count()? as usize;
//! let devices: Vec<usize> = (0..n).collect();
//! let comms = Comm::init_all(&devices, &Config::new())?;
//! let mut grads = comms
//!     .iter()
//!     .map(|c| c.stream().clone_htod(&vec![1.0f32; 1 << 20]))
//!     .collect::<Result<Vec<_>, _>>()?;
//! // One thread drives every GPU, so the calls go in one group.
//! group(|g| {
//!     for (comm, grad) in comms.iter().zip(grads.iter_mut()) {
//!         g.on(comm).all_reduce_in_place(grad, ReduceOp::Avg)?;
//!     }
//!     Ok(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod abort;
mod buffer;
mod capabilities;
mod capture;
mod capture_state;
mod comm;
mod completion;
mod config;
mod dtype;
mod error;
mod group;
mod library;
mod memory;
mod observe;
mod one_shot;
mod ops;
mod peer;
pub mod prelude;
mod reduce_op;
mod secrecy;
#[doc(hidden)]
pub mod segments;
mod symmetric;
mod unique_id;
mod validate;

pub use abort::{AbortCause, AbortSignal};
pub use buffer::{Access, DeviceBuffer, DeviceBufferMut, RawBuffer};
pub use capabilities::{Capabilities, FP8_REDUCTION_MIN_CC, Feature};
pub use capture::{
    Captured, CapturedGraph, CapturedGroup, Capturing, CapturingGroup, Opened, allow_capture,
    capture, capture_group,
};
pub use comm::{
    ABORT_ALLOWANCE, AbortHandle, Comm, CommStatus, ExitHold, KeptComm, WeakAbortHandle,
    drop_together, require_cuda_driver, require_gpus,
};
pub use completion::Completion;
pub use config::{Config, DEFAULT_TIMEOUT, SYMMETRIC_MIN_CTAS};
pub use dtype::NcclType;
pub use error::{CUDA_OP, Error, Result, Role, UniqueIdError};
pub use group::{GroupGuard, group, take_dropped_group_error};
pub use library::Library;
pub use memory::{NcclMemory, Registration, Window};
pub use observe::{CheckError, ObservedStream, OpInfo, OpObserver};
#[doc(hidden)]
pub use one_shot::OneShot;
pub use one_shot::{
    CAPTURED_NCCL_MAX_BYTES, MAX_RANKS as ONE_SHOT_MAX_RANKS, max_bytes as one_shot_max_bytes,
};
pub use ops::OnStream;
pub use peer::{copy_peer, copy_peer_async};
pub use reduce_op::{PreMulSum, ReduceOp, Reduction};
pub use secrecy::{
    ALLOW_COMM_ID_ENV, COMM_ID_ENV, Encryption, MIN_PSK_BYTES, PresharedKey, set_encryption,
};
pub use symmetric::SymmetricBuffer;
pub use unique_id::UniqueId;

pub use cudarc;
/// The `float8` crate of [`NcclType`]'s fp8 types.
pub use float8;
/// The `half` crate of [`NcclType`]'s `f16` and `bf16`.
pub use half;
pub use nccl_sys;
