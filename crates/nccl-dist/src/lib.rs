//! Device meshes, launch bootstrap and fault handling on top of
//! [`nccl_safe`].
//!
//! This layer adds what a training or inference framework needs around
//! communicators:
//!
//! - [`launch`]: rank, world size, local rank and the rendezvous address
//!   from torchrun, Slurm or Open MPI conventions, or given in code;
//! - [`rendezvous`], [`liveness`], [`secret`]: the job's control plane
//!   from [`nccl_control`] (re-exported): rank 0 hands its unique id to
//!   every rank over an authenticated TCP exchange (HMAC-SHA256 over a
//!   shared [`Secret`]) or a shared file, and the connections stay as the
//!   liveness channel;
//! - [`mesh`]: the arithmetic of an N-D device mesh with named axes
//!   (coordinates, per-axis split colors and keys, slicing, flattening);
//! - [`World`]: the world communicator, from a launcher (a process per
//!   GPU), a thread per GPU, or one thread driving every GPU;
//! - [`DeviceMesh`]: the world on named axes with a communicator per axis,
//!   optionally placed so inner axes stay inside an NVLink island;
//! - [`Communicator`]: an object-safe, dtype-tagged interface over raw
//!   device pointers for frameworks; [`HostCollectives`] for host slices
//!   and a barrier; [`CommStream`] for overlapping compute and
//!   communication.
//!
//! Moving bytes between GPUs stays NCCL's job, through `nccl-safe`; every
//! wait this crate owns has a deadline.
//!
//! # Example: data-parallel gradients, whatever launched the job
//!
//! ```no_run
//! use nccl_dist::{DeviceMesh, World};
//! use nccl_dist::nccl_safe::ReduceOp;
//!
//! // torchrun, srun, mpirun or `cargo xtask launch -n 4` set the
//! // environment; NCCL_RS_SECRET holds the shared secret.
//! let world = World::init()?;
//! let mesh = DeviceMesh::new(&world, &[("dp", world.size())])?;
//! let stream = world.comm().stream();
//! let mut grads = stream.clone_htod(&vec![1.0f32; 1 << 20])?;
//! mesh.all_reduce_in_place("dp", &mut grads, ReduceOp::Avg)?;
//! world.comm().synchronize(stream)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!

mod communicator;
mod device_mesh;
mod env;
mod error;
mod host;
pub mod launch;
pub mod mesh;
pub mod placement;
mod pointers;
pub mod prelude;
mod record;
pub mod watchdog;
mod world;

pub use communicator::{Communicator, DType};
pub use device_mesh::{DeviceMesh, FromWorldError, SubMesh};
pub use error::{Error, PeerLost, Result};
pub use host::{CommEvent, CommStream, HostCollectives};
pub use launch::{Launch, LaunchError, Launcher};
pub use liveness::{LossCause, PeerLoss};
pub use mesh::{MeshError, MeshShape};
pub use placement::{
    Gpu, Island, Link, NvmlStatus, PcieLevel, Placement, Topology, device_order, positions_on_host,
};
pub use rendezvous::RendezvousError;
pub use secret::{Secret, SecretError};
pub use watchdog::{
    Call, CheckFailure, Divergence, Failure, FailureKind, Field, OpRecord, OpState, Tail, Watchdog,
    WatchdogOptions, Watched, synchronize,
};
pub use world::{
    DEFAULT_OP_TIMEOUT, ENCRYPTION_ENV, PORT_ENV, PSK_ENV, RECOVER_BY_SHRINK_ENV, RendezvousMethod,
    TIMEOUT_ENV, World, WorldOptions, default_config, encryption_from_lookup, nonblocking_config,
    op_timeout_from_lookup,
};

/// The control plane (rendezvous, liveness channel, wire frames): this
/// crate's `rendezvous`, `liveness` and `secret` modules are its own.
pub use nccl_control;
pub use nccl_control::{liveness, rendezvous, secret};
pub use nccl_safe;

/// An environment lookup over fixed pairs, for the unit tests of the
/// `from_lookup` functions.
#[cfg(test)]
pub(crate) fn test_env<'a>(
    pairs: &'a [(&'a str, &'a str)],
) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}
