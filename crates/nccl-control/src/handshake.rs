//! One connection's handshake: the cryptography of the rendezvous
//! (`auth.rs`), rank 0's side (`accept.rs`) and the joining side
//! (`connect.rs`), takeover variants included. Above the frames, the
//! liveness wire and the link; below the liveness engine (a takeover
//! runs a handshake) and the rendezvous (which serves and joins).

pub(crate) mod accept;
pub(crate) mod auth;
pub(crate) mod connect;
