//! The error type of this crate: every failure of the layers below, plus
//! what only this layer can get wrong.

use crate::env::BadValue;
use crate::launch::LaunchError;
use crate::liveness::{LossCause, PeerLoss};
use crate::mesh::MeshError;
use crate::record::{Failure, FailureKind, OpRecord};
use crate::rendezvous::RendezvousError;
use crate::secret::SecretError;

/// Anything that can go wrong in `nccl-dist`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The launch environment cannot be used.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The shared secret is missing or unusable.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The unique-id exchange failed.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// A mesh shape, axis name or coordinate is wrong.
    #[error(transparent)]
    Mesh(#[from] MeshError),
    /// NCCL, CUDA or a check of `nccl-safe` failed. (A communicator
    /// aborted because a peer was lost converts to [`Error::PeerLost`]
    /// instead.)
    #[error(transparent)]
    Nccl(nccl_safe::Error),
    /// The watchdog aborted the communicator: which operation, what
    /// happened, and the flight recorder.
    #[error("{0}")]
    Watchdog(Box<Failure>),
    /// A peer of the job was lost (killed, exited, or its thread
    /// panicked): which rank, why, and what this rank was doing (the
    /// communicator, the oldest unfinished operation and its sequence
    /// number, the flight recorder). The communicators were aborted.
    #[error("peer rank {} was lost: {}", .0.rank, .0.failure)]
    PeerLost(Box<PeerLost>),
    /// A thread driving one rank panicked.
    #[error("the thread of rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The panic message, where it was text.
        message: String,
    },
    /// Arguments that do not fit together, found before any NCCL call.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The call.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// What [`Error::PeerLost`] carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLost {
    /// The lost world rank.
    pub rank: usize,
    /// How it was lost and who saw it.
    pub loss: PeerLoss,
    /// The communicator, operation and sequence number this rank was at,
    /// with its flight recorder (kind [`crate::FailureKind::PeerLost`]).
    pub failure: Failure,
}

impl Error {
    /// The lost rank, when this error is [`Error::PeerLost`].
    pub fn lost_rank(&self) -> Option<usize> {
        match self {
            Error::PeerLost(p) => Some(p.rank),
            _ => None,
        }
    }
}

impl From<nccl_safe::Error> for Error {
    /// Keeps the error, except that an abort whose cause is a lost peer
    /// becomes [`Error::PeerLost`] naming it, whichever path it came by.
    fn from(err: nccl_safe::Error) -> Error {
        match err {
            nccl_safe::Error::Aborted {
                op,
                cause: nccl_safe::AbortCause::PeerLost { rank, detail },
            } => peer_lost(loss_of(rank, detail), String::new(), op, 0, Vec::new()),
            other => Error::Nccl(other),
        }
    }
}

/// A loss known only from an abort's cause: the rank, and how the
/// detector put it.
pub(crate) fn loss_of(rank: usize, detail: String) -> PeerLoss {
    PeerLoss {
        rank,
        cause: LossCause::Exited { reason: detail },
        seen_by: rank,
    }
}

/// [`Error::PeerLost`] for `loss`, found by `op` (sequence number `seq`) on
/// the communicator `comm`, with its flight recorder.
pub(crate) fn peer_lost(
    loss: PeerLoss,
    comm: String,
    op: &'static str,
    seq: u64,
    history: Vec<OpRecord>,
) -> Error {
    Error::PeerLost(Box::new(PeerLost {
        rank: loss.rank,
        loss: loss.clone(),
        failure: Failure {
            comm,
            op,
            seq,
            kind: FailureKind::PeerLost(loss),
            after: std::time::Duration::ZERO,
            history,
        },
    }))
}

impl From<BadValue> for Error {
    /// A variable's value that cannot be used, named as the call.
    fn from(bad: BadValue) -> Error {
        Error::InvalidArgument {
            op: bad.var,
            reason: bad.reason,
        }
    }
}

impl From<cudarc::driver::DriverError> for Error {
    /// [`nccl_safe::Error::Cuda`] with `op` [`nccl_safe::CUDA_OP`], so that
    /// `?` works on cudarc calls in code that returns this crate's
    /// [`Result`] (this crate's own calls name the driver function).
    fn from(source: cudarc::driver::DriverError) -> Error {
        Error::Nccl(source.into())
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Maps a CUDA driver error of `op` into [`Error`].
pub(crate) fn cuda(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |source| Error::Nccl(nccl_safe::Error::Cuda { op, source })
}
