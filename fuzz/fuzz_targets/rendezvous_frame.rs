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
//! - `decode_file` accepts exactly `NCRVFILE` ‖ version 1 ‖ 128 id bytes
//!   (138 bytes), and the id it returns re-encodes to the input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nccl_dist::RendezvousError;
use nccl_dist::nccl_safe::UniqueId;
use nccl_dist::rendezvous::{
    MAX_PAYLOAD, PROTOCOL_VERSION, decode_file, decode_header, encode_frame,
};

const MAGIC: &[u8; 4] = b"NCRV";
const HEADER: usize = 11;
const FILE_MAGIC: &[u8; 8] = b"NCRVFILE";
const FILE_LEN: usize = FILE_MAGIC.len() + 2 + UniqueId::BYTES;

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

    // 4. The rendezvous file.
    let file = decode_file(data);
    match &file {
        Ok(id) => {
            assert_eq!(data.len(), FILE_LEN);
            assert_eq!(&data[..8], FILE_MAGIC);
            assert_eq!(u16::from_be_bytes([data[8], data[9]]), PROTOCOL_VERSION);
            // Re-encoding the id gives the input back.
            let mut again = FILE_MAGIC.to_vec();
            again.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
            again.extend_from_slice(id.as_bytes());
            assert_eq!(again, data);
        }
        Err(RendezvousError::Malformed(_)) => {
            assert!(data.len() != FILE_LEN || &data[..8] != FILE_MAGIC);
        }
        Err(RendezvousError::Version { got }) => {
            assert_eq!(data.len(), FILE_LEN);
            assert_eq!(*got, u16::from_be_bytes([data[8], data[9]]));
            assert_ne!(*got, PROTOCOL_VERSION);
        }
        Err(other) => panic!("decode_file: unexpected error {other:?}"),
    }

    // 5. A well-formed file around the input's bytes always decodes to them.
    let mut id = [0u8; UniqueId::BYTES];
    let n = data.len().min(UniqueId::BYTES);
    id[..n].copy_from_slice(&data[..n]);
    let mut good = FILE_MAGIC.to_vec();
    good.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    good.extend_from_slice(&id);
    let decoded = decode_file(&good).expect("a well-formed rendezvous file decodes");
    assert_eq!(decoded.as_bytes(), &id);
    // One byte short or long is refused.
    assert!(decode_file(&good[..FILE_LEN - 1]).is_err());
    good.push(0);
    assert!(decode_file(&good).is_err());
});
