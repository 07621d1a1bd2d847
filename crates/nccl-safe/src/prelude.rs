//! What most programs on this crate use, in one import:
//! `use nccl_safe::prelude::*;`.
//!
//! Communicators and their configuration, the reductions, the dtype and
//! buffer traits a framework implements for its tensors, groups, and this
//! crate's [`Error`] and [`Result`] (whose error type defaults to
//! [`Error`], so `Result<T, OtherError>` still means what it says).
//!
//! ```no_run
//! use nccl_safe::prelude::*;
//!
//! fn average(comm: &Comm, grads: &mut impl DeviceBufferMut<f32>) -> Result<()> {
//!     comm.all_reduce_in_place(grads, ReduceOp::Avg)
//! }
//!
//! require_cuda_driver()?; // before the first cudarc call of the program
//! let comms = Comm::init_all(&[0, 1], &Config::new())?;
//! let mut grads = comms
//!     .iter()
//!     .map(|c| c.stream().clone_htod(&[1.0f32; 8]))
//!     .collect::<std::result::Result<Vec<_>, _>>()?;
//! group(|g| {
//!     for (comm, grad) in comms.iter().zip(grads.iter_mut()) {
//!         g.on(comm).all_reduce_in_place(grad, ReduceOp::Avg)?;
//!     }
//!     Ok(())
//! })?;
//! # Ok::<(), Error>(())
//! ```

pub use crate::abort::{AbortCause, AbortSignal};
pub use crate::buffer::{DeviceBuffer, DeviceBufferMut};
pub use crate::comm::{AbortHandle, Comm, require_cuda_driver, require_gpus};
pub use crate::config::Config;
pub use crate::dtype::NcclType;
pub use crate::error::{Error, Result};
pub use crate::group::{GroupGuard, group};
pub use crate::reduce_op::{PreMulSum, ReduceOp, Reduction};
pub use crate::unique_id::UniqueId;
