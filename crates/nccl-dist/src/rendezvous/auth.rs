//! The handshake's cryptography: the MACs that prove the secret, the
//! fresh nonces, the AEAD that carries the id, and the authenticated
//! reject.

use chacha20poly1305::aead::KeyInit;
use chacha20poly1305::{ChaCha20Poly1305, Key};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::liveness::LivenessError;

use crate::rendezvous::proto::{NONCE, RendezvousError, Result};
use crate::secret::Secret;
fn mac(secret: &Secret, parts: &[&[u8]]) -> Result<Hmac<Sha256>> {
    // HMAC-SHA256 accepts keys of any length; the error is carried rather
    // than unwrapped all the same.
    let mut m =
        <Hmac<Sha256> as Mac>::new_from_slice(secret.bytes()).map_err(|_| LivenessError::Crypto)?;
    for p in parts {
        m.update(p);
    }
    Ok(m)
}

pub(crate) fn nonce() -> Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n)
        .map_err(|e| RendezvousError::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

pub(crate) fn be32(v: usize) -> [u8; 4] {
    (v as u32).to_be_bytes()
}

/// Why rank 0 refuses a rank, as numbers on the wire.
pub(crate) fn reject_code(e: &RendezvousError) -> (u8, u32, u32) {
    match e {
        RendezvousError::BadSecret => (1, 0, 0),
        RendezvousError::WorldSizeMismatch { expected, got } => (2, *expected as u32, *got as u32),
        RendezvousError::DuplicateRank { rank } => (3, *rank as u32, 0),
        RendezvousError::RankOutOfRange { rank, world } => (4, *rank as u32, *world as u32),
        RendezvousError::NotAccepting => (5, 0, 0),
        _ => (6, 0, 0),
    }
}

/// The joining rank's reading of an authenticated reject: rank 0's view.
pub(crate) fn reject_reason(code: u8, a: u32, b: u32) -> RendezvousError {
    match code {
        1 => RendezvousError::BadSecret,
        2 => RendezvousError::WorldSizeMismatch {
            expected: a as usize,
            got: b as usize,
        },
        3 => RendezvousError::DuplicateRank { rank: a as usize },
        4 => RendezvousError::RankOutOfRange {
            rank: a as usize,
            world: b as usize,
        },
        5 => RendezvousError::NotAccepting,
        _ => RendezvousError::Malformed("rank 0 refused this rank for a reason it did not name"),
    }
}

pub(crate) fn reject_tag(
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8],
    body: &[u8],
) -> Result<Hmac<Sha256>> {
    mac(secret, &[b"nccl-rs reject v2", nonce_c, nonce_s, body])
}

/// The AEAD that carries the id over one connection: its key is fresh
/// for every connection (both nonces), so the AEAD nonce can be fixed.
pub(crate) fn id_cipher(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    hello: &[u8],
) -> Result<ChaCha20Poly1305> {
    let mut salt = Vec::with_capacity(nonce_s.len() + nonce_c.len());
    salt.extend_from_slice(nonce_s);
    salt.extend_from_slice(nonce_c);
    let hk = Hkdf::<Sha256>::new(Some(&salt), secret.bytes());
    let mut info = b"nccl-rs id key v2".to_vec();
    info.extend_from_slice(hello);
    let mut key = [0u8; 32];
    hk.expand(&info, &mut key)
        .map_err(|_| LivenessError::Crypto)?;
    Ok(ChaCha20Poly1305::new(Key::from_slice(&key)))
}

pub(crate) fn id_aad(hello: &[u8]) -> Vec<u8> {
    let mut aad = b"nccl-rs id v2".to_vec();
    aad.extend_from_slice(hello);
    aad
}

pub(crate) fn server_proof(
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8],
    hello: &[u8],
) -> Result<Hmac<Sha256>> {
    mac(secret, &[b"nccl-rs server v2", nonce_c, nonce_s, hello])
}

pub(crate) fn client_proof(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    hello: &[u8],
) -> Result<Hmac<Sha256>> {
    mac(secret, &[b"nccl-rs proof v2", nonce_s, nonce_c, hello])
}
