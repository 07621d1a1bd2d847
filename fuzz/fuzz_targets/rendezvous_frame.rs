//! The rendezvous wire format: frame headers and the rendezvous file.
//!
//! Properties checked, for arbitrary bytes:
//! - `decode_header` is a total function that accepts exactly the 11-byte
//!   headers with the magic `NCRV`, protocol version 1 and a length of at
//!   most `MAX_PAYLOAD`, returning the kind byte and the big-endian length;
//!   every other input is the specific error for what is wrong with it (in
//!   particular, a length over the cap is always refused);
//! - `encode_frame(kind, payload)` (payload up to 1 KiB) is the 11-byte
//!   header followed by the payload, and the header decodes back to
//!   `(kind, payload.len())`;
//! - `decode_file(bytes, secret, now)` never panics on arbitrary bytes, and
//!   answers `BadSecret` only for 210 bytes with the magic `NCRVFILE` and
//!   file format version 2 (everything else is `Malformed`): an input
//!   cannot pass the HMAC tag without the secret;
//! - a real file (written once by `publish_file`) decodes to its id within
//!   the documented freshness window (60 s before its timestamp to 600 s
//!   after) and is `Malformed` outside it; with any byte changed, or read
//!   with another secret, it is refused.

#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use nccl_control::nccl_sys::{NCCL_UNIQUE_ID_BYTES, ncclUniqueId as UniqueId};
use nccl_control::{RendezvousError, Secret};
use nccl_control::rendezvous::{
    MAX_PAYLOAD, PROTOCOL_VERSION, decode_file, decode_header, encode_frame, publish_file,
};

const MAGIC: &[u8; 4] = b"NCRV";
const HEADER: usize = 11;
const FILE_MAGIC: &[u8; 8] = b"NCRVFILE";
/// The documented file layout: magic, version 2, timestamp, nonce, id, tag.
const FILE_VERSION: u16 = 2;
const FILE_LEN: usize = FILE_MAGIC.len() + 2 + 8 + 32 + NCCL_UNIQUE_ID_BYTES + 32;
/// The documented freshness window (`MAX_FILE_AGE`, `MAX_FILE_CLOCK_SKEW`).
const MAX_AGE_SECS: u64 = 600;
const MAX_SKEW_SECS: u64 = 60;

fn file_secret() -> Secret {
    Secret::from_bytes(b"the fuzz target's shared secret".to_vec(), "fuzz").expect("long enough")
}

fn file_id() -> UniqueId {
    UniqueId::from_bytes([0xa5; NCCL_UNIQUE_ID_BYTES])
}

/// A real rendezvous file, written once per process by `publish_file`.
fn real_file() -> &'static [u8] {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("nccl-fuzz-rvfile-{}", std::process::id()));
        publish_file(&path, &file_id(), &file_secret()).expect("publishing a rendezvous file");
        let bytes = std::fs::read(&path).expect("reading it back");
        let _ = std::fs::remove_file(&path);
        bytes
    })
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn file_header_ok(data: &[u8]) -> bool {
    data.len() == FILE_LEN
        && &data[..8] == FILE_MAGIC
        && u16::from_be_bytes([data[8], data[9]]) == FILE_VERSION
}

/// What `decode_header` must answer for `header`, from the documented
/// format: `Ok((kind, len))` or the error's description.
fn expected_header(header: &[u8]) -> Result<(u8, u32), String> {
    if header.len() != HEADER {
        return Err("malformed: short header".into());
    }
    if &header[..4] != MAGIC {
        return Err("malformed: bad magic".into());
    }
    let version = u16::from_be_bytes([header[4], header[5]]);
    if version != PROTOCOL_VERSION {
        return Err(format!("version {version}"));
    }
    let len = u32::from_be_bytes([header[7], header[8], header[9], header[10]]);
    if len > MAX_PAYLOAD {
        return Err("malformed: payload over the size cap".into());
    }
    Ok((header[6], len))
}

fn describe(e: &RendezvousError) -> String {
    match e {
        RendezvousError::Malformed(what) => format!("malformed: {what}"),
        RendezvousError::Version { got } => format!("version {got}"),
        other => format!("unexpected error {other:?}"),
    }
}

/// Checks `decode_header` on `header` against [`expected_header`].
fn check_header(header: &[u8]) {
    let got = decode_header(header);
    let want = expected_header(header);
    match (&got, &want) {
        (Ok(g), Ok(w)) => assert_eq!(g, w, "header {header:02x?}"),
        (Err(g), Err(w)) => assert_eq!(&describe(g), w, "header {header:02x?}"),
        _ => panic!("decode_header({header:02x?}) = {got:?}, expected {want:?}"),
    }
    if let Ok((_, len)) = got {
        assert!(len <= MAX_PAYLOAD, "accepted a length over the cap: {len}");
    }
    // Whatever the rest says, a length over the cap is never accepted.
    if header.len() == HEADER {
        let len = u32::from_be_bytes([header[7], header[8], header[9], header[10]]);
        if len > MAX_PAYLOAD {
            assert!(got.is_err(), "length {len} over the cap accepted");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // 1. The raw input, and its first 11 bytes, as a header.
    check_header(data);
    if let Some(head) = data.get(..HEADER) {
        check_header(head);
    }

    // 2. A header with a valid magic and version, the kind and the length
    //    from the input: only the cap can refuse it.
    if data.len() >= 5 {
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
        header.extend_from_slice(&data[..5]);
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]);
        match decode_header(&header) {
            Ok((kind, got)) => {
                assert!(len <= MAX_PAYLOAD);
                assert_eq!((kind, got), (data[0], len));
            }
            Err(e) => {
                assert!(len > MAX_PAYLOAD, "valid header {header:02x?} refused: {e}");
                assert!(matches!(e, RendezvousError::Malformed(_)), "{e:?}");
            }
        }
        check_header(&header);
    }

    // 3. Round trip: (kind, payload up to 1 KiB) -> frame -> header.
    if let Some((&kind, rest)) = data.split_first() {
        let payload = &rest[..rest.len().min(MAX_PAYLOAD as usize)];
        let frame = encode_frame(kind, payload);
        assert_eq!(frame.len(), HEADER + payload.len());
        assert_eq!(&frame[HEADER..], payload);
        let (k, len) = decode_header(&frame[..HEADER]).expect("an encoded header decodes");
        assert_eq!((k, len as usize), (kind, payload.len()));
        // The whole frame is not a header (unless the payload is empty).
        assert_eq!(decode_header(&frame).is_ok(), payload.is_empty());
    }

    // 4. The rendezvous file, from arbitrary bytes: never accepted
    //    without the secret's tag, and the error says why. (Another
    //    secret than the real file's below: no file keyed by this one
    //    exists for the fuzzer to learn from.)
    let probe = Secret::from_bytes(b"a secret nothing here writes with".to_vec(), "fuzz")
        .expect("long enough");
    match decode_file(data, &probe, SystemTime::now()) {
        Ok(_) => panic!("decode_file accepted bytes that no holder of the secret wrote"),
        Err(RendezvousError::BadSecret) => assert!(file_header_ok(data)),
        Err(RendezvousError::Malformed(_)) => assert!(!file_header_ok(data)),
        Err(other) => panic!("decode_file: unexpected error {other:?}"),
    }

    // 5. A real file: fresh within the documented window only, and any
    //    change, or another secret, refuses it.
    let secret = file_secret();
    let good = real_file();
    assert_eq!(good.len(), FILE_LEN);
    let mut stamp = [0u8; 8];
    stamp.copy_from_slice(&good[10..18]);
    let written = u64::from_be_bytes(stamp);
    assert!(decode_file(good, &secret, at(written)).expect("fresh") == file_id());
    if data.len() >= 8 {
        let mut n = [0u8; 8];
        n.copy_from_slice(&data[..8]);
        let read_at = u64::from_be_bytes(n) % (written.saturating_mul(2).max(1));
        let fresh = read_at.saturating_add(MAX_SKEW_SECS) >= written
            && read_at.saturating_sub(written) <= MAX_AGE_SECS;
        match decode_file(good, &secret, at(read_at)) {
            Ok(id) => {
                assert!(fresh, "accepted at {read_at}, written at {written}");
                assert!(id == file_id(), "another id decoded");
            }
            Err(RendezvousError::Malformed(_)) => {
                assert!(!fresh, "refused at {read_at}, written at {written}")
            }
            Err(other) => panic!("decode_file at {read_at}: unexpected error {other:?}"),
        }
    }
    if let Some((&start, rest)) = data.split_first() {
        let mut flips = [0u8; FILE_LEN];
        for (i, b) in rest.iter().enumerate() {
            flips[(start as usize + i) % FILE_LEN] ^= b;
        }
        // Whether anything changed, decided from the flips alone (not by
        // comparing with the real file, which would teach it the fuzzer).
        let same = flips.iter().all(|f| *f == 0);
        let changed: Vec<u8> = good.iter().zip(flips).map(|(g, f)| g ^ f).collect();
        assert_eq!(decode_file(&changed, &secret, at(written)).is_ok(), same);
    }
    // HMAC pads a key of up to 64 bytes with zeros, so secrets that differ
    // only in trailing NUL bytes are one key (no environment variable can
    // hold a NUL; a secret file could).
    let key = |s: &Secret| {
        let b = s.bytes();
        b[..b.iter().rposition(|x| *x != 0).map_or(0, |i| i + 1)].to_vec()
    };
    if let Ok(other) = Secret::from_bytes(data.to_vec(), "fuzz") {
        if other.bytes().len() > 64 || key(&other) != key(&secret) {
            assert!(matches!(
                decode_file(good, &other, at(written)),
                Err(RendezvousError::BadSecret)
            ));
        }
    }
});
