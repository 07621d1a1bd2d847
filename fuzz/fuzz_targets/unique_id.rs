//! `UniqueId`: bytes round-trip, `Debug` never reveals the id, the digest
//! is the documented FNV-1a and tells ids that differ in one byte apart.
//!
//! Input: 128 id bytes, then optionally a byte index and an xor mask for a
//! one-byte variant of the id.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nccl_dist::nccl_safe::UniqueId;

const N: usize = UniqueId::BYTES;
const HEX: &[u8; 16] = b"0123456789abcdef";

/// 32-bit FNV-1a, written out from its definition.
fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn check_debug(id: &UniqueId, bytes: &[u8; N]) {
    let text = format!("{id:?}");
    let digest = format!("{:08x}", id.digest());
    // Exactly the digest, nothing else: short, whatever the id.
    assert_eq!(text, format!("UniqueId(digest {digest})"));
    assert!(text.len() <= 32, "Debug output too long: {text}");
    let raw = format!("{:?}", id.raw());
    assert_eq!(raw, "ncclUniqueId { .. }");
    // No run of 4 id bytes (8 hex digits, either case) appears: every
    // 8-character hex substring of the output is checked against the id's
    // hex at every byte offset. The digest itself is 8 hex digits, so a
    // window equal to it is a coincidence, not a leak.
    let mut hex = [0u8; 2 * N];
    for (i, b) in bytes.iter().enumerate() {
        hex[2 * i] = HEX[usize::from(b >> 4)];
        hex[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    for shown in [&text, &raw] {
        for s in shown.as_bytes().windows(8) {
            if !s.iter().all(u8::is_ascii_hexdigit) || s == digest.as_bytes() {
                continue;
            }
            let leaked = (0..=N - 4).any(|i| hex[2 * i..2 * i + 8].eq_ignore_ascii_case(s));
            assert!(
                !leaked,
                "{shown} shows id bytes {}",
                String::from_utf8_lossy(s)
            );
        }
    }
    // Nor the bytes in decimal: any rendering of several bytes as numbers
    // (`[171, 171, ..]`, `171, 171`) needs a separator and brackets that a
    // digest never has.
    for shown in [&text, &raw] {
        assert!(!shown.contains(", ") && !shown.contains('['), "{shown}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(head) = data.get(..N) else {
        return;
    };
    let bytes: [u8; N] = head.try_into().expect("N bytes");
    let id = UniqueId::from_bytes(bytes);

    // Round trips.
    assert_eq!(id.as_bytes(), &bytes);
    assert_eq!(id.raw().as_bytes(), &bytes);
    let again = UniqueId::from_bytes(*id.as_bytes());
    assert_eq!(again, id);

    // The digest: deterministic, the same for equal ids, and FNV-1a.
    let d = id.digest();
    assert_eq!(d, id.digest());
    assert_eq!(d, again.digest());
    let copy = id;
    assert_eq!(d, copy.digest());
    assert_eq!(d, fnv1a(&bytes));

    check_debug(&id, &bytes);

    // A one-byte change makes a different id with a different digest
    // (each FNV-1a step is a bijection of the state, so it must).
    if let [index, mask, ..] = data[N..]
        && mask != 0
    {
        let mut other = bytes;
        other[usize::from(index) % N] ^= mask;
        let other_id = UniqueId::from_bytes(other);
        assert_ne!(other_id, id);
        assert_ne!(other_id.digest(), d, "one-byte change kept the digest");
        assert_ne!(format!("{other_id:?}"), format!("{id:?}"));
        check_debug(&other_id, &other);
    }
});
