//! Device meshes, launch bootstrap and fault handling on top of
//! [`nccl_safe`].
//!
//! This layer adds what a training or inference framework needs around
//! communicators:
//!
//! - [`launch`]: rank, world size, local rank and the rendezvous address
//!   from torchrun, Slurm or Open MPI conventions, or given in code;
//! - [`rendezvous`]: rank 0 hands its unique id to every rank over an
//!   authenticated TCP exchange (HMAC-SHA256 over a shared [`Secret`]) or a
//!   file on a shared file system;
//! - [`mesh`]: the arithmetic of an N-D device mesh with named axes
//!   (coordinates, per-axis split colors and keys, slicing, flattening).
//!
//! Moving bytes between GPUs stays NCCL's job, through `nccl-safe`.
//!
//! Status: launch detection, rendezvous and mesh arithmetic are here and
//! tested on CPUs; the GPU-backed `World` and `DeviceMesh`, the
//! `Communicator` trait and the watchdog are not yet.

pub mod launch;
pub mod mesh;
pub mod rendezvous;
pub mod secret;

pub use launch::{Launch, LaunchError, Launcher};
pub use mesh::{MeshError, MeshShape};
pub use rendezvous::RendezvousError;
pub use secret::{Secret, SecretError};

pub use nccl_safe;
