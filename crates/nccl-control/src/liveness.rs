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

mod engine;
mod options;

pub use crate::loss::{LivenessError, LossCause, PeerLoss};
pub use crate::wire::KEY_MAX as GATE_KEY_MAX;
pub use engine::{EXCHANGE_WAIT, Exchanger, TailSource, gate_members};
pub use engine::{ExitHolder, Liveness};
pub(crate) use engine::{Takeover, start_hub, start_member};
pub use options::{HEARTBEAT_ENV, LIVENESS_ENV, LIVENESS_TIMEOUT_ENV, LivenessOptions};
