//! Handing rank 0's unique id ([`nccl_sys::ncclUniqueId`]) to every rank, over TCP or a shared file,
//! and (over TCP) keeping each authenticated connection as that rank's
//! liveness connection.
//!
//! # TCP protocol (version 2)
//!
//! A summary; `docs/rendezvous-protocol.md` in the repository specifies
//! every byte for other implementations, with test vectors.
//!
//! Every message is a frame: the magic `NCRV`, the protocol version (u16),
//! a kind (u8), a payload length (u32, at most [`MAX_PAYLOAD`]) and the
//! payload; integers are big-endian. `K` is the shared secret, `H` is
//! HMAC-SHA256 keyed by `K`, `hello` the 8 bytes `rank ‖ world` of step 1.
//!
//! 1. the joining rank sends `Hello { rank u32, world u32, nonce_c [32] }`;
//! 2. rank 0 answers `Challenge { nonce_s [32], H("nccl-rs server v2" ‖
//!    nonce_c ‖ nonce_s ‖ hello) }`: rank 0 proves the secret first, bound
//!    to the joining rank's fresh nonce, so a listener without the secret
//!    (another job's rank 0, a stranger on the port) is recognised before
//!    anything is sent to it;
//! 3. the joining rank sends `Proof { H("nccl-rs proof v2" ‖ nonce_s ‖
//!    nonce_c ‖ hello) }`;
//! 4. rank 0 checks the proof, the world size and that the rank is new,
//!    then sends `Id { ChaCha20-Poly1305(key, nonce 0, id, aad) }` with
//!    `key = HKDF-SHA256(salt = nonce_s ‖ nonce_c, ikm = K, info =
//!    "nccl-rs id key v2" ‖ hello)` (fresh per connection, hence the fixed
//!    AEAD nonce) and `aad = "nccl-rs id v2" ‖ hello`; or `Reject { code
//!    u8, a u32, b u32, H("nccl-rs reject v2" ‖ nonce_c ‖ nonce_s ‖ code ‖
//!    a ‖ b) }`. A reject carries numbers, never text, and the joining rank
//!    believes it only if its MAC checks.
//!
//! 5. with the liveness channel ([`serve_live`], [`join_live`]), the
//!    connection is not closed: the joining rank sends `Attach` and rank 0
//!    answers `Attached`, both already MACed with a session key derived
//!    from the secret and both nonces; from then on it carries heartbeats
//!    and losses. Those frames and the key derivation are described in
//!    [`crate::liveness`].
//!
//! What this gives: the id never crosses the wire in clear; neither side
//! sends anything that depends on the secret to a peer that has not proven
//! it (rank 0's challenge proof is bound to the joining rank's nonce, so
//! it cannot be replayed); a recorded session replays nowhere (both sides
//! contribute a fresh nonce); a frame changed in transit fails its MAC or
//! its AEAD tag. `docs/security.md` has the threat model.
//!
//! Rank 0 runs each handshake on its own thread, at most
//! [`MAX_HANDSHAKES`] at once, each with its own deadline ([`HELLO_TIMEOUT`]
//! for the first frame, [`PEER_TIMEOUT`] in all), so silent or slow
//! connections do not hold up the real ranks. A joining rank retries
//! until its deadline after anything that does not come from a holder of
//! the secret (a refused connection, garbage, an unauthenticated reject, a
//! listener that cannot prove the secret); only an authenticated reject
//! ends its join at once. Every read and write is bounded by the
//! deadline. Nothing here panics on bad input.

pub mod file;
mod join;
mod serve;
#[cfg(test)]
mod vectors;

pub use crate::frame::{
    HELLO_TIMEOUT, MAX_HANDSHAKES, MAX_PAYLOAD, MAX_REFUSED, PEER_TIMEOUT, PROTOCOL_VERSION,
    RendezvousError, decode_header, encode_frame,
};
pub use file::{
    FILE_BYTES, FILE_FORMAT_VERSION, MAX_FILE_AGE, MAX_FILE_BYTES, MAX_FILE_CLOCK_SKEW,
    decode_file, publish_file, wait_file,
};
pub use join::{join, join_live};
pub use serve::{serve, serve_live};
