//! Sound, typed, RAII NCCL on top of [`nccl_sys`] and cudarc.
//!
//! This layer owns what `nccl-sys` leaves out: communicators as RAII values
//! (`Send` but not `Sync`, because NCCL allows one thread at a time per
//! communicator), collectives that validate lengths, devices, ranks and
//! aliasing before any FFI call, typed errors that carry NCCL's last-error
//! text, group guards, PreMulSum, fp8 and CUDA-graph capture. It leaves
//! device meshes, launch bootstrap and watchdogs to `nccl-dist`.
//!
//! Status: not implemented yet. The crate exists so the workspace has its
//! final shape; see `docs/architecture.md` and the project's issues for
//! what lands here next. Until then use [`nccl_sys`] directly.

pub use nccl_sys;
