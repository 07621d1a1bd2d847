//! What a framework on this crate uses, in one import:
//! `use nccl_dist::prelude::*;`.
//!
//! The world and its options, device meshes, the object-safe
//! [`Communicator`] with its [`DType`] tags, host collectives and
//! streams, the watchdog, this crate's [`Error`] and [`Result`] (whose
//! error type defaults to [`Error`]), and from `nccl-safe` what every
//! collective call names: [`Comm`], [`Config`], [`ReduceOp`],
//! [`NcclType`], the buffer traits and groups. `nccl-safe`'s own error is
//! left out (it converts into [`Error`]); name it as
//! `nccl_dist::nccl_safe::Error` where needed.
//!
//! ```no_run
//! use nccl_dist::prelude::*;
//!
//! fn step(world: World) -> Result<f32> {
//!     let mesh = DeviceMesh::new(&world, &[("dp", world.size())])?;
//!     let stream = world.comm().stream();
//!     let mut grads = stream.clone_htod(&[1.0f32; 8])?;
//!     mesh.all_reduce_in_place("dp", &mut grads, ReduceOp::Avg)?;
//!     Ok(stream.clone_dtoh(&grads)?[0])
//! }
//!
//! let averages = World::spawn_local(2, step)?;
//! println!("{averages:?}");
//! # Ok::<(), Error>(())
//! ```

pub use crate::communicator::{Communicator, DType};
pub use crate::device_mesh::{DeviceMesh, SubMesh};
pub use crate::error::{Error, Result};
pub use crate::host::{CommStream, HostCollectives};
pub use crate::launch::Launch;
pub use crate::watchdog::{Watchdog, WatchdogOptions};
pub use crate::world::{World, WorldOptions};
pub use nccl_safe::prelude::{
    AbortSignal, Comm, Config, DeviceBuffer, DeviceBufferMut, GroupGuard, NcclType, ReduceOp,
    Reduction, UniqueId, group, require_cuda_driver, require_gpus,
};
