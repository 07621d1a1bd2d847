//! The file rendezvous: rank 0 writes the unique id to a path on a file
//! system every rank sees; the others wait for it.
//!
//! # File format (version 2)
//!
//! Integers are big-endian; `K` is the shared secret and `H(k, m)` is
//! HMAC-SHA256 keyed by `k`. The file is exactly [`FILE_BYTES`] (210)
//! bytes:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 8 | magic `NCRVFILE` |
//! | 8 | 2 | file format version, [`FILE_FORMAT_VERSION`] (2) |
//! | 10 | 8 | when it was written, Unix seconds |
//! | 18 | 32 | a random nonce, fresh per file |
//! | 50 | 128 | the unique id, encrypted: `id ⊕ S`, where the 32-byte block `i` (0..4) of `S` is `H(H(K, "nccl-rs file v2 stream key"), nonce ‖ i as u8)` |
//! | 178 | 32 | the tag: `H(K, "nccl-rs file v2" ‖ bytes 0..178)` |
//!
//! The tag binds every byte before it to the secret, so a file written
//! without the secret (planted by another user of a shared directory, or
//! left by a job with another secret) is refused, and so is any change to
//! a real one. The id is encrypted (encrypt-then-MAC, with a key derived
//! from the secret) so that a reader who can see the file but does not
//! hold the secret learns nothing, on top of the file's mode 0600.
//!
//! # Freshness
//!
//! A file whose tag checks is still refused when it was written more than
//! [`MAX_FILE_AGE`] ago (a file left at the same path by an earlier job
//! with the same secret) or is dated more than [`MAX_FILE_CLOCK_SKEW`] in
//! the reader's future (clocks of the nodes sharing the file system may
//! differ by that much). A job that reuses both path and secret within
//! [`MAX_FILE_AGE`] can still read the earlier job's id: use a fresh path
//! or a fresh secret per job (`cargo xtask launch` makes a random secret).
//!
//! # What is read
//!
//! Only a regular file: the path is first looked at without following a
//! symbolic link, then opened with `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`
//! and checked again on the open descriptor (the path may change between
//! the two). A symbolic link at the path (to `/dev/zero`, to a file of an
//! attacker's), a FIFO (which would block the reader forever), a device,
//! a socket or a directory is refused without reading from it, and at
//! most [`MAX_FILE_BYTES`] are ever read.
//!
//! # Waiting
//!
//! [`wait_file`] polls the path until its deadline. Anything at the path
//! that is refused (not a regular file, too large, not this format, a bad
//! tag, stale) may be an attacker's or another job's, and rank 0's rename
//! may still replace it, so the wait goes on; when the deadline passes,
//! the error is the last refusal (e.g. [`RendezvousError::BadSecret`] for
//! a file that failed authentication), not a bare timeout. A path where
//! nothing ever appeared ends in [`RendezvousError::Timeout`].

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use nccl_sys::ncclUniqueId as UniqueId;
use sha2::Sha256;

use super::RendezvousError;
use crate::secret::Secret;

type Result<T, E = RendezvousError> = std::result::Result<T, E>;

/// Version of the rendezvous file format (independent of the TCP
/// protocol's version).
pub const FILE_FORMAT_VERSION: u16 = 2;
/// Size of a version 2 rendezvous file, in bytes.
pub const FILE_BYTES: usize = AT_TAG + TAG;
/// Most bytes ever read from the rendezvous path; anything larger is
/// refused unread.
pub const MAX_FILE_BYTES: u64 = 4096;
/// Oldest rendezvous file accepted: one written longer ago is stale.
pub const MAX_FILE_AGE: Duration = Duration::from_secs(600);
/// How far in the reader's future a file's timestamp may be (clock skew
/// between nodes).
pub const MAX_FILE_CLOCK_SKEW: Duration = Duration::from_secs(60);

const FILE_MAGIC: &[u8; 8] = b"NCRVFILE";
const NONCE: usize = 32;
const TAG: usize = 32;
const AT_VERSION: usize = FILE_MAGIC.len();
const AT_TIME: usize = AT_VERSION + 2;
const AT_NONCE: usize = AT_TIME + 8;
const AT_ID: usize = AT_NONCE + NONCE;
const AT_TAG: usize = AT_ID + nccl_sys::NCCL_UNIQUE_ID_BYTES;
const TAG_DOMAIN: &[u8] = b"nccl-rs file v2";
const STREAM_KEY_LABEL: &[u8] = b"nccl-rs file v2 stream key";
/// Pause between two looks at the path.
const POLL: Duration = Duration::from_millis(20);

// The reasons a file is refused, as `RendezvousError::Malformed` carries
// them.
const NOT_A_FILE: &str = "not a rendezvous file";
const UNKNOWN_VERSION: &str = "unknown rendezvous file format version";
const WRONG_LENGTH: &str = "wrong length for a version 2 rendezvous file";
const STALE: &str = "the rendezvous file is stale (written more than MAX_FILE_AGE ago)";
const FUTURE: &str = "the rendezvous file is dated more than MAX_FILE_CLOCK_SKEW in the future";
const SYMLINK: &str = "the rendezvous path is a symbolic link";
const NOT_REGULAR: &str =
    "the rendezvous path is not a regular file (a FIFO, device, socket or directory)";
const OVERSIZED: &str = "the rendezvous file is over the size cap (MAX_FILE_BYTES)";
const NO_FILE_NAME: &str = "the rendezvous path names no file";
const CLOCK: &str = "the system clock is before 1970";

fn hmac(key: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut m =
        <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC-SHA256 takes a key of any length");
    for p in parts {
        m.update(p);
    }
    m
}

/// XORs `data` with the keystream for `nonce` (encrypts and decrypts).
fn apply_stream(secret: &Secret, nonce: &[u8], data: &mut [u8]) {
    let key = hmac(secret.bytes(), &[STREAM_KEY_LABEL])
        .finalize()
        .into_bytes();
    for (i, chunk) in data.chunks_mut(32).enumerate() {
        // At most 4 blocks for a 128-byte id, so the counter fits a byte.
        let block = hmac(&key, &[nonce, &[i as u8]]).finalize().into_bytes();
        for (d, s) in chunk.iter_mut().zip(block.iter()) {
            *d ^= s;
        }
    }
}

/// The file's bytes for `id`, written at `written_secs`, with `nonce`.
pub(super) fn seal(
    id: &UniqueId,
    secret: &Secret,
    written_secs: u64,
    nonce: &[u8; NONCE],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(FILE_BYTES);
    out.extend_from_slice(FILE_MAGIC);
    out.extend_from_slice(&FILE_FORMAT_VERSION.to_be_bytes());
    out.extend_from_slice(&written_secs.to_be_bytes());
    out.extend_from_slice(nonce);
    let mut sealed = *id.as_bytes();
    apply_stream(secret, nonce, &mut sealed);
    out.extend_from_slice(&sealed);
    let tag = hmac(secret.bytes(), &[TAG_DOMAIN, &out])
        .finalize()
        .into_bytes();
    out.extend_from_slice(&tag);
    out
}

fn unix_secs(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut n = [0u8; N];
    getrandom::fill(&mut n)
        .map_err(|e| RendezvousError::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

/// Rank 0 publishes `id` at `path` for the other ranks on a shared file
/// system, in the rendezvous file format version 2 (the date, a random
/// nonce, the id encrypted with a key derived from `secret`, and an
/// HMAC-SHA256 tag over all of it keyed by `secret`; the layout is in
/// `docs/rendezvous-protocol.md`, for other languages). It is
/// written to a new temporary file (mode 0600, a random name, never
/// through a symbolic link) in the same directory, then renamed into
/// place, so readers see all or nothing, and whatever was at `path` (a
/// planted file, a link, a FIFO) is replaced rather than written through.
pub fn publish_file(path: &Path, id: &UniqueId, secret: &Secret) -> Result<()> {
    let now = unix_secs(SystemTime::now()).ok_or(RendezvousError::Malformed(CLOCK))?;
    let bytes = seal(id, secret, now, &random()?);
    let name = path
        .file_name()
        .ok_or(RendezvousError::Malformed(NO_FILE_NAME))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // A random part, so that nobody can claim the name first.
    let suffix: String = random::<8>()?.iter().map(|b| format!("{b:02x}")).collect();
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.{suffix}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        let written = f.write_all(&bytes).and_then(|()| f.sync_all());
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
    }
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(())
}

/// Decodes and checks the contents of a rendezvous file read at `now`:
/// the format, then the tag (a file written without `secret`, or changed,
/// is [`RendezvousError::BadSecret`]), then the freshness (stale or dated
/// in the future is [`RendezvousError::Malformed`]). Pure; never panics.
pub fn decode_file(bytes: &[u8], secret: &Secret, now: SystemTime) -> Result<UniqueId> {
    if bytes.len() < AT_TIME || &bytes[..AT_VERSION] != FILE_MAGIC {
        return Err(RendezvousError::Malformed(NOT_A_FILE));
    }
    if u16::from_be_bytes([bytes[AT_VERSION], bytes[AT_VERSION + 1]]) != FILE_FORMAT_VERSION {
        return Err(RendezvousError::Malformed(UNKNOWN_VERSION));
    }
    if bytes.len() != FILE_BYTES {
        return Err(RendezvousError::Malformed(WRONG_LENGTH));
    }
    let (body, tag) = bytes.split_at(AT_TAG);
    // Nothing in the body is believed before the tag checks (in constant
    // time).
    hmac(secret.bytes(), &[TAG_DOMAIN, body])
        .verify_slice(tag)
        .map_err(|_| RendezvousError::BadSecret)?;
    let mut time = [0u8; 8];
    time.copy_from_slice(&body[AT_TIME..AT_NONCE]);
    let written = u64::from_be_bytes(time);
    let now = unix_secs(now).unwrap_or(0);
    if written > now.saturating_add(MAX_FILE_CLOCK_SKEW.as_secs()) {
        return Err(RendezvousError::Malformed(FUTURE));
    }
    if now.saturating_sub(written) > MAX_FILE_AGE.as_secs() {
        return Err(RendezvousError::Malformed(STALE));
    }
    let mut id = [0u8; nccl_sys::NCCL_UNIQUE_ID_BYTES];
    id.copy_from_slice(&body[AT_ID..AT_TAG]);
    apply_stream(secret, &body[AT_NONCE..AT_ID], &mut id);
    Ok(UniqueId::from_bytes(id))
}

/// The bytes at `path` if it is a regular file of at most
/// [`MAX_FILE_BYTES`]; `None` while nothing is there.
fn read_regular(path: &Path) -> Result<Option<Vec<u8>>> {
    let refused = |why| Err(RendezvousError::Malformed(why));
    // Look first without opening: a FIFO or a device already at the path
    // is never opened at all.
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => return refused(SYMLINK),
        Ok(m) if !m.file_type().is_file() => return refused(NOT_REGULAR),
        Ok(m) if m.len() > MAX_FILE_BYTES => return refused(OVERSIZED),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    // The path may have changed since: O_NOFOLLOW fails on a link,
    // O_NONBLOCK keeps a FIFO's open from blocking, and the descriptor is
    // checked again.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return refused(SYMLINK),
        // A socket (or a FIFO opened for writing) answers ENXIO.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return refused(NOT_REGULAR),
        Err(e) => return Err(e.into()),
    };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return refused(NOT_REGULAR);
    }
    if meta.len() > MAX_FILE_BYTES {
        return refused(OVERSIZED);
    }
    // The file may grow after the check: one byte past the cap tells.
    let mut bytes = Vec::with_capacity(FILE_BYTES + 1);
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return refused(OVERSIZED);
    }
    Ok(Some(bytes))
}

/// The other ranks wait for rank 0's file at `path` until `timeout`
/// passes, and return the id once a file there is authentic (its tag
/// checks with `secret`) and fresh (written at most ten minutes ago, at
/// most 60 s in the future). Only a regular file is read, and at most
/// 4 KiB of it: a symbolic link, FIFO, device, socket or directory at the
/// path is refused unopened or unread. A refused file does not end the
/// wait (rank 0's rename may still replace it); at the deadline the error
/// is the last refusal ([`RendezvousError::BadSecret`] for a file that
/// failed authentication, [`RendezvousError::Malformed`] naming the
/// reason otherwise), or [`RendezvousError::Timeout`] if nothing ever
/// appeared. Never waits past the deadline, but for one read of a
/// regular file of at most 4 KiB.
pub fn wait_file(path: &Path, secret: &Secret, timeout: Duration) -> Result<UniqueId> {
    let started = Instant::now();
    // A timeout too large for an `Instant` means no deadline.
    let deadline = started.checked_add(timeout);
    let mut refusal: Option<RendezvousError> = None;
    loop {
        let looked = read_regular(path).and_then(|bytes| {
            bytes
                .map(|b| decode_file(&b, secret, SystemTime::now()))
                .transpose()
        });
        match looked {
            Ok(Some(id)) => return Ok(id),
            Ok(None) => {}
            Err(e) => {
                if refusal.as_ref().map(ToString::to_string) != Some(e.to_string()) {
                    tracing::warn!(
                        path = %path.display(),
                        error = %e,
                        "rendezvous file refused; waiting for rank 0's"
                    );
                }
                refusal = Some(e);
            }
        }
        let left = deadline.map_or(POLL, |d| d.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            return Err(refusal.unwrap_or_else(|| RendezvousError::Timeout {
                phase: format!("waiting for the rendezvous file {}", path.display()),
                waited: started.elapsed(),
            }));
        }
        std::thread::sleep(POLL.min(left));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(fill: u8) -> Secret {
        Secret::from_bytes(vec![fill; 32], "test").expect("long enough")
    }

    fn id() -> UniqueId {
        let mut bytes = [0u8; nccl_sys::NCCL_UNIQUE_ID_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(13).wrapping_add(5);
        }
        UniqueId::from_bytes(bytes)
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    const T: u64 = 1_700_000_000;

    #[test]
    fn a_sealed_file_decodes_and_hides_the_id() {
        let bytes = seal(&id(), &secret(1), T, &[9; NONCE]);
        assert_eq!(bytes.len(), FILE_BYTES);
        assert_eq!(FILE_BYTES, 210);
        assert_ne!(&bytes[AT_ID..AT_TAG], id().as_bytes());
        assert_eq!(decode_file(&bytes, &secret(1), at(T)).unwrap(), id());
        // Another nonce, another ciphertext.
        let other = seal(&id(), &secret(1), T, &[8; NONCE]);
        assert_ne!(&bytes[AT_ID..AT_TAG], &other[AT_ID..AT_TAG]);
    }

    #[test]
    fn every_changed_byte_and_another_secret_fail_the_tag() {
        let bytes = seal(&id(), &secret(1), T, &[9; NONCE]);
        assert!(matches!(
            decode_file(&bytes, &secret(2), at(T)),
            Err(RendezvousError::BadSecret)
        ));
        for i in AT_TIME..FILE_BYTES {
            let mut changed = bytes.clone();
            changed[i] ^= 0x01;
            assert!(
                matches!(
                    decode_file(&changed, &secret(1), at(T)),
                    Err(RendezvousError::BadSecret)
                ),
                "byte {i}"
            );
        }
    }

    #[test]
    fn freshness_has_the_documented_bounds() {
        let bytes = seal(&id(), &secret(1), T, &[9; NONCE]);
        let age = MAX_FILE_AGE.as_secs();
        let skew = MAX_FILE_CLOCK_SKEW.as_secs();
        assert!(decode_file(&bytes, &secret(1), at(T + age)).is_ok());
        assert!(matches!(
            decode_file(&bytes, &secret(1), at(T + age + 1)),
            Err(RendezvousError::Malformed(STALE))
        ));
        assert!(decode_file(&bytes, &secret(1), at(T - skew)).is_ok());
        assert!(matches!(
            decode_file(&bytes, &secret(1), at(T - skew - 1)),
            Err(RendezvousError::Malformed(FUTURE))
        ));
        // Extreme timestamps do not overflow.
        let far = seal(&id(), &secret(1), u64::MAX, &[9; NONCE]);
        assert!(decode_file(&far, &secret(1), at(T)).is_err());
        assert!(decode_file(&bytes, &secret(1), UNIX_EPOCH).is_err());
    }

    #[test]
    fn the_format_is_checked_before_the_tag() {
        let s = secret(1);
        let bytes = seal(&id(), &s, T, &[9; NONCE]);
        for (input, why) in [
            (&b"short"[..], NOT_A_FILE),
            (&bytes[..AT_TIME - 1], NOT_A_FILE),
            (&bytes[..FILE_BYTES - 1], WRONG_LENGTH),
        ] {
            match decode_file(input, &s, at(T)) {
                Err(RendezvousError::Malformed(got)) => assert_eq!(got, why),
                other => panic!("expected {why}, got {other:?}"),
            }
        }
        let mut v1 = bytes.clone();
        v1[AT_VERSION..AT_TIME].copy_from_slice(&1u16.to_be_bytes());
        assert!(matches!(
            decode_file(&v1, &s, at(T)),
            Err(RendezvousError::Malformed(UNKNOWN_VERSION))
        ));
    }
}
