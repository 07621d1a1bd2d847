//! Liveness: who in the job is still there, and telling every survivor
//! at once when a rank is lost.
//!
//! This module owns the liveness channel: the [`Liveness`] handle every
//! rank holds, its background thread (named `nccl-liveness`, one per
//! process), the [`LivenessOptions`] and the authenticated messages on the
//! wire. [`crate::rendezvous::serve_live`] and
//! [`crate::rendezvous::join_live`] make the channel out of the
//! rendezvous connections; [`Liveness::in_process`] makes one for a thread
//! per GPU in one process, with no sockets.
//!
//! # Topology
//!
//! Rank 0 is the hub: every other rank (a member) keeps its authenticated
//! rendezvous connection to it open. The hub learns of a member's loss
//! when that connection closes without a goodbye (the kernel closes the
//! socket of a killed process at once), when a valid frame is followed by
//! garbage, or when nothing arrives for the silence limit (a stopped
//! process), and sends `Lost { rank, cause }` to every other member.
//! Members learn of the hub's loss from their own connection. Both sides
//! send heartbeats every [`LivenessOptions::heartbeat`] so silence is
//! noticed. Each survivor runs its hooks ([`Liveness::on_loss`]) once per
//! lost rank, typically a few milliseconds after the death.
//!
//! Once the channel is up, its steady state (heartbeats sent and received
//! on either side, idle rounds of the thread) makes no heap allocation:
//! frames are sealed into and cut out of buffers each link keeps. Only
//! rare events (an attach, a loss, a goodbye, a takeover) allocate.
//!
//! # Wire protocol
//!
//! After the rendezvous handshake (see [`crate::rendezvous`]; its bytes
//! are unchanged, protocol version 1), both sides derive a session key
//!
//! `K = HMAC-SHA256(secret, "nccl-rs liveness key" ‖ nonce_s ‖ nonce_c ‖ rank ‖ world)`
//!
//! (fresh for every connection, because both nonces are). Every later
//! frame has the rendezvous framing (`NCRV`, version, kind, length, at most
//! 1 KiB of payload) with the payload `counter u64 ‖ body ‖ tag`, where
//! `tag = HMAC-SHA256(K, "nccl-rs liveness frame" ‖ direction ‖ kind ‖ counter ‖ body)`,
//! `direction` is 0 from the hub and 1 to it, and each direction's counter
//! starts at 0 and goes up by one per frame. A receiver accepts exactly the
//! next counter: replays, reordering and gaps are refused, as are unknown
//! kinds and kinds that do not belong to that direction.
//!
//! | kind | name      | direction | body |
//! |------|-----------|-----------|------|
//! | 16   | Attach    | member → hub | keep this connection as my liveness channel; my takeover address as text, or none |
//! | 17   | Attached  | hub → member | none: kept |
//! | 18   | Heartbeat | both      | none |
//! | 19   | Lost      | hub → member | a loss |
//! | 20   | Report    | member → hub | a loss found by the member (its own panic) |
//! | 21   | Goodbye   | both      | none: a clean end, the close that follows is not a loss |
//! | 22   | Roster    | hub → member | `count u8 ‖ (rank u32 ‖ len u8 ‖ address as text)*`, at most 12 entries a frame |
//! | 23   | Left      | hub → member | `rank u32`: that rank said goodbye (not a loss, not a takeover candidate) |
//!
//! A loss is `rank u32 ‖ seen_by u32 ‖ cause u8 ‖ detail`: cause 0 (the
//! connection closed, no detail), 1 (silent; milliseconds as u64), 2
//! (panicked; UTF-8 text) or 3 (exited; UTF-8 text), text cut to 512 bytes.
//!
//! # Takeover
//!
//! Each member listens (any port, on the interface it reached rank 0 by;
//! on every interface if that was loopback) and sends that address in its
//! `Attach`; when the rendezvous is over, rank 0 sends every member the
//! roster of those addresses (a loopback one replaced by the address
//! remote members reached rank 0's host by, when there is one). A member that
//! loses its hub (closed, silent or corrupted connection; not a goodbye,
//! which means the job is ending) names it lost, then connects to the
//! lowest rank it does not count as lost or gone (`Left`): the same handshake as the
//! rendezvous (the member proves the secret, the new hub proves the secret
//! and the job's id), then `Attach`/`Attached` with a session key from the
//! new nonces. The lowest live rank itself simply starts accepting. A
//! candidate that cannot be reached within a second counts as lost too
//! (`Exited`, with the reason), and the next is tried, so the survivors
//! agree on the same hub. Each member tells the new hub the losses it
//! knows (`Report`) and the hub tells it those it missed (`Lost`); later
//! losses are seen as before. Rank 0 never rejoins.
//!
//! # Trust
//!
//! Only a peer that proved it knows the secret in the handshake ever gets
//! a session; a stranger is refused there and cannot make anyone count as
//! lost. On an authenticated connection a frame that fails its check can
//! only come from someone in the middle: the connection is closed and its
//! peer counted as lost, with the reason, since the channel to it can no
//! longer be trusted.

use std::time::Duration;

mod engine;
pub(crate) mod link;
mod options;
pub(crate) mod wire;

pub use engine::{EXCHANGE_WAIT, Exchanger, TailSource, gate_members};
pub use engine::{ExitHolder, Liveness};
pub(crate) use engine::{Takeover, start_hub, start_member};
pub use options::{HEARTBEAT_ENV, LIVENESS_ENV, LIVENESS_TIMEOUT_ENV, LivenessOptions};
pub use wire::KEY_MAX as GATE_KEY_MAX;

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
