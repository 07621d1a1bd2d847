//! Why a rank counts as lost, and why a liveness frame or session was
//! refused: the plain types every layer of the channel shares (the
//! frames carry them, the engine reports them, `nccl-dist` turns them into
//! its errors). Imports nothing from the crate.

use std::time::Duration;

/// Why a liveness frame or session was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LivenessError {
    /// The frame's MAC is wrong: not from the peer of this session.
    #[error("liveness frame of kind {kind} failed authentication")]
    BadTag {
        /// The kind in the frame's header.
        kind: u8,
    },
    /// A replayed, reordered or dropped frame.
    #[error("liveness frame out of order: expected counter {expected}, got {got}")]
    OutOfOrder {
        /// The counter that was due.
        expected: u64,
        /// The counter that came.
        got: u64,
    },
    /// A kind this protocol does not have.
    #[error("unknown liveness frame kind {kind}")]
    UnknownKind {
        /// The kind.
        kind: u8,
    },
    /// A kind that does not travel this way (a reflected frame).
    #[error("liveness frame of kind {kind} in the wrong direction")]
    WrongDirection {
        /// The kind.
        kind: u8,
    },
    /// A rank outside the world in a loss.
    #[error("rank {rank} is out of range for a world of {world}")]
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// The world size.
        world: usize,
    },
    /// Bytes that are not a liveness frame.
    #[error("malformed liveness frame: {0}")]
    Malformed(&'static str),
    /// Another protocol version.
    #[error("liveness frame of protocol version {got}")]
    Version {
        /// Theirs.
        got: u16,
    },
    /// The MAC could not be keyed (cannot happen with HMAC).
    #[error("the liveness MAC could not be keyed")]
    Crypto,
    /// The rendezvous succeeded but the other side did not keep the
    /// connection as a liveness channel (liveness is off there, or the
    /// connection broke right after the handshake).
    #[error("rank {rank}: no liveness channel after the rendezvous: {detail}")]
    NotAttached {
        /// The member's rank.
        rank: usize,
        /// What happened instead.
        detail: String,
    },
}

/// Why a rank counts as lost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossCause {
    /// Its liveness connection closed without a goodbye (the process was
    /// killed or exited without dropping its `World`).
    ConnectionClosed,
    /// Nothing arrived from it for this long (no heartbeat).
    Silent {
        /// How long it was silent.
        for_: Duration,
    },
    /// Its thread panicked (a thread per GPU in one process).
    Panicked {
        /// The panic message, where it was text.
        message: String,
    },
    /// Its thread or process ended with an error while the others ran.
    Exited {
        /// What it ended with.
        reason: String,
    },
    /// It was alive but never made a call the others were waiting in
    /// (one that makes a connection inside NCCL), within the operation
    /// timeout: the others gave up on it before entering NCCL.
    NeverCalled {
        /// The call and how long the others waited, in words.
        what: String,
    },
}

impl std::fmt::Display for LossCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossCause::ConnectionClosed => {
                f.write_str("its liveness connection closed without a goodbye")
            }
            LossCause::Silent { for_ } => write!(f, "nothing heard from it for {for_:?}"),
            LossCause::Panicked { message } => write!(f, "its thread panicked: {message}"),
            LossCause::Exited { reason } => write!(f, "it ended early: {reason}"),
            LossCause::NeverCalled { what } => {
                write!(f, "alive but silent: it never made {what}")
            }
        }
    }
}

/// A rank the job lost, as one survivor learned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLoss {
    /// The world rank that was lost.
    pub rank: usize,
    /// Why it counts as lost.
    pub cause: LossCause,
    /// The rank that saw it first (the hub, or this rank itself).
    pub seen_by: usize,
}

impl std::fmt::Display for PeerLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} was lost ({}; seen by rank {})",
            self.rank, self.cause, self.seen_by
        )
    }
}
