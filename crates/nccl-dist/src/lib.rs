//! Device meshes, launch bootstrap and fault handling on top of
//! [`nccl_safe`].
//!
//! This layer adds what a training or inference framework needs around
//! communicators: reading torchrun, Slurm and Open MPI launch conventions,
//! an authenticated rendezvous that hands rank 0's unique id to every rank,
//! an N-D `DeviceMesh` with named axes and one communicator per axis, and a
//! watchdog that turns hangs into `Timeout`/`Aborted` errors. Moving bytes
//! between GPUs stays NCCL's job, through `nccl-safe`.
//!
//! Status: not implemented yet. The crate exists so the workspace has its
//! final shape; see `docs/architecture.md` and the project's issues.

pub use nccl_safe;
