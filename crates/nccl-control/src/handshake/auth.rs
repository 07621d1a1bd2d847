//! The handshake's messages and their cryptography: the payload of every
//! handshake frame as a pure function of the secret, the claims and both
//! nonces (`docs/rendezvous-protocol.md` specifies each byte, and its test
//! vectors are recomputed from these functions), the MACs that prove the
//! secret, the AEAD that carries the id, the authenticated reject, and
//! the fresh nonces the two sides draw.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use nccl_sys::ncclUniqueId as UniqueId;
use sha2::Sha256;

use crate::loss::LivenessError;

use crate::frame::{NONCE, RendezvousError, Result, SEALED_ID, TAG};
use crate::secret::Secret;

/// Bytes of what a joining rank claims: `rank u32 ‖ world u32`.
pub(crate) const CLAIMS: usize = 8;
/// Bytes of a hello's payload: the claims and the joining rank's nonce.
pub(crate) const HELLO: usize = CLAIMS + NONCE;
/// Bytes of a challenge's payload: rank 0's nonce and its proof.
pub(crate) const CHALLENGE: usize = NONCE + TAG;
/// Bytes of a reject's body (`code u8 ‖ a u32 ‖ b u32`), before its tag.
const REJECT_BODY: usize = 9;
/// Bytes of a reject's payload.
pub(crate) const REJECT: usize = REJECT_BODY + TAG;
/// The AEAD nonce of the sealed id: fixed, because its key is fresh for
/// every connection.
const ID_NONCE: [u8; 12] = [0; 12];

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

/// A fresh random nonce: each side draws one per connection.
pub(crate) fn nonce() -> Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n)
        .map_err(|e| RendezvousError::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

/// `rank u32 ‖ world u32`, big-endian: bound into every MAC and key of
/// the connection.
pub(crate) fn claims(rank: usize, world: usize) -> [u8; CLAIMS] {
    let mut c = [0u8; CLAIMS];
    c[..4].copy_from_slice(&(rank as u32).to_be_bytes());
    c[4..].copy_from_slice(&(world as u32).to_be_bytes());
    c
}

/// The claims in a hello's payload, and the joining rank's nonce.
pub(crate) fn read_hello(payload: &[u8]) -> Option<(usize, usize, &[u8], &[u8])> {
    if payload.len() != HELLO {
        return None;
    }
    let rank = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
    let world = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]) as usize;
    let (claims, nonce_c) = payload.split_at(CLAIMS);
    Some((rank, world, claims, nonce_c))
}

/// Step 1, the joining rank's `Hello`: `claims ‖ nonce_c`.
pub(crate) fn hello(claims: &[u8; CLAIMS], nonce_c: &[u8; NONCE]) -> [u8; HELLO] {
    let mut h = [0u8; HELLO];
    h[..CLAIMS].copy_from_slice(claims);
    h[CLAIMS..].copy_from_slice(nonce_c);
    h
}

/// Step 2, rank 0's `Challenge`: `nonce_s ‖ H("nccl-rs server v2" ‖
/// nonce_c ‖ nonce_s ‖ claims)`.
pub(crate) fn challenge(
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8; NONCE],
    claims: &[u8],
) -> Result<Vec<u8>> {
    let mut c = Vec::with_capacity(CHALLENGE);
    c.extend_from_slice(nonce_s);
    c.extend_from_slice(
        &server_proof(secret, nonce_c, nonce_s, claims)?
            .finalize()
            .into_bytes(),
    );
    Ok(c)
}

/// Step 3, the joining rank's `Proof`: `H("nccl-rs proof v2" ‖ nonce_s ‖
/// nonce_c ‖ claims)`.
pub(crate) fn proof(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    claims: &[u8],
) -> Result<[u8; TAG]> {
    Ok(client_proof(secret, nonce_s, nonce_c, claims)?
        .finalize()
        .into_bytes()
        .into())
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

fn reject_tag(
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8],
    body: &[u8],
) -> Result<Hmac<Sha256>> {
    mac(secret, &[b"nccl-rs reject v2", nonce_c, nonce_s, body])
}

/// Step 4, rank 0's `Reject`: `code u8 ‖ a u32 ‖ b u32 ‖ H("nccl-rs
/// reject v2" ‖ nonce_c ‖ nonce_s ‖ code ‖ a ‖ b)`.
pub(crate) fn reject(
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8],
    why: &RendezvousError,
) -> Result<Vec<u8>> {
    let (code, a, b) = reject_code(why);
    let mut r = Vec::with_capacity(REJECT);
    r.push(code);
    r.extend_from_slice(&a.to_be_bytes());
    r.extend_from_slice(&b.to_be_bytes());
    let tag = reject_tag(secret, nonce_c, nonce_s, &r)?
        .finalize()
        .into_bytes();
    r.extend_from_slice(&tag);
    Ok(r)
}

/// A reject's payload as the joining rank reads it:
/// [`RendezvousError::Rejected`] with rank 0's reason when its tag
/// checks, else `Malformed` (an unauthenticated reject is not believed).
pub(crate) fn open_reject(
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8],
    payload: &[u8],
) -> RendezvousError {
    const FORGED: RendezvousError = RendezvousError::Malformed("an unauthenticated reject");
    if payload.len() != REJECT {
        return FORGED;
    }
    let (body, tag) = payload.split_at(REJECT_BODY);
    match reject_tag(secret, nonce_c, nonce_s, body).map(|m| m.verify_slice(tag)) {
        Ok(Ok(())) => {
            let a = u32::from_be_bytes([body[1], body[2], body[3], body[4]]);
            let b = u32::from_be_bytes([body[5], body[6], body[7], body[8]]);
            RendezvousError::Rejected(Box::new(reject_reason(body[0], a, b)))
        }
        Ok(Err(_)) => FORGED,
        Err(e) => e,
    }
}

/// The key of the AEAD that carries the id over one connection:
/// `HKDF-SHA256(salt = nonce_s ‖ nonce_c, ikm = secret, info = "nccl-rs
/// id key v2" ‖ claims)`, 32 bytes. Fresh for every connection (both
/// nonces), hence the fixed AEAD nonce.
pub(crate) fn id_key(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    claims: &[u8],
) -> Result<[u8; 32]> {
    let mut salt = Vec::with_capacity(nonce_s.len() + nonce_c.len());
    salt.extend_from_slice(nonce_s);
    salt.extend_from_slice(nonce_c);
    let hk = Hkdf::<Sha256>::new(Some(&salt), secret.bytes());
    let mut info = b"nccl-rs id key v2".to_vec();
    info.extend_from_slice(claims);
    let mut key = [0u8; 32];
    hk.expand(&info, &mut key)
        .map_err(|_| LivenessError::Crypto)?;
    Ok(key)
}

fn id_cipher(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    claims: &[u8],
) -> Result<ChaCha20Poly1305> {
    let key = id_key(secret, nonce_s, nonce_c, claims)?;
    Ok(ChaCha20Poly1305::new(Key::from_slice(&key)))
}

/// The sealed id's associated data: `"nccl-rs id v2" ‖ claims`.
fn id_aad(claims: &[u8]) -> Vec<u8> {
    let mut aad = b"nccl-rs id v2".to_vec();
    aad.extend_from_slice(claims);
    aad
}

/// Step 4, rank 0's `Id`: the id sealed with ChaCha20-Poly1305 under
/// [`id_key`], nonce 0, aad `"nccl-rs id v2" ‖ claims`; ciphertext then
/// the 16-byte tag.
pub(crate) fn seal_id(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    claims: &[u8],
    id: &UniqueId,
) -> Result<Vec<u8>> {
    Ok(id_cipher(secret, nonce_s, nonce_c, claims)?
        .encrypt(
            Nonce::from_slice(&ID_NONCE),
            Payload {
                msg: id.as_bytes(),
                aad: &id_aad(claims),
            },
        )
        .map_err(|_| LivenessError::Crypto)?)
}

/// An `Id` payload opened by the joining rank.
pub(crate) fn open_id(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    claims: &[u8],
    sealed: &[u8],
) -> Result<UniqueId> {
    const FAILED: RendezvousError = RendezvousError::Malformed("the id failed authentication");
    if sealed.len() != SEALED_ID {
        return Err(FAILED);
    }
    let opened = id_cipher(secret, nonce_s, nonce_c, claims)?
        .decrypt(
            Nonce::from_slice(&ID_NONCE),
            Payload {
                msg: sealed,
                aad: &id_aad(claims),
            },
        )
        .map_err(|_| FAILED)?;
    let bytes: [u8; nccl_sys::NCCL_UNIQUE_ID_BYTES] =
        opened.as_slice().try_into().map_err(|_| FAILED)?;
    Ok(UniqueId::from_bytes(bytes))
}

pub(crate) fn server_proof(
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8],
    claims: &[u8],
) -> Result<Hmac<Sha256>> {
    mac(secret, &[b"nccl-rs server v2", nonce_c, nonce_s, claims])
}

pub(crate) fn client_proof(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    claims: &[u8],
) -> Result<Hmac<Sha256>> {
    mac(secret, &[b"nccl-rs proof v2", nonce_s, nonce_c, claims])
}
