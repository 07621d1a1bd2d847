//! The control plane of an NCCL job, in pure Rust: what the ranks say to
//! each other outside NCCL. No CUDA and no GPU: a rank's host side, a
//! launcher or a Python process can use it alone.
//!
//! - [`rendezvous`]: handing NCCL's unique id to every rank over TCP or a
//!   shared file, each rank proving it knows the job's [`secret`].
//! - [`liveness`]: the authenticated connections kept after the
//!   rendezvous (or an in-process channel for a thread per GPU), which
//!   name a lost rank to every survivor, carry the call checks, the
//!   connection gates and the flight-record exchange, and take a lost
//!   hub's place.
//! - [`culprit`]: the calls the ranks compare, as plain values, and the
//!   analysis that names the first rank and field where they diverge.
//!
//! What it leaves to the layer above (`nccl-dist`): communicators, the
//! watchdog that decides when to exchange or check, and what a loss does
//! to the job (the hooks it registers with [`liveness::Liveness::on_loss`]).
//!
//! The unique id is NCCL's 128 bytes, [`nccl_sys::ncclUniqueId`]; nothing
//! here loads libnccl.

// Bottom-up: a module imports only modules above it in this list.
pub mod culprit;
pub mod env;
mod frame;
mod handshake;
mod link;
pub mod liveness;
mod loss;
pub mod rendezvous;
pub mod secret;
pub mod wait;
mod wire;

pub use culprit::{Call, Divergence, Field, Tail, analyze};
pub use env::BadValue;
pub use liveness::{Liveness, LivenessError, LivenessOptions, LossCause, PeerLoss};
pub use rendezvous::RendezvousError;
pub use secret::{Secret, SecretError};

pub use nccl_sys;
