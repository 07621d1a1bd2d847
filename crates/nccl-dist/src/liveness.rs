//! Liveness: who in the job is still there.
//!
//! (Being written: the types below are the contract the rest of the crate
//! builds on.)

use std::time::Duration;

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
