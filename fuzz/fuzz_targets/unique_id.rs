//! `UniqueId`: bytes round-trip, `Debug` never reveals the id, the digest
//! is the documented FNV-1a and tells ids that differ in one byte apart.
//!
//! Input: 128 id bytes, then optionally a byte index and an xor mask for a
//! one-byte variant of the id.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nccl_dist::nccl_safe::UniqueId;

const N: usize = UniqueId::BYTES;

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
    // No run of 4 id bytes (8 hex digits, either case) appears. The digest
    // itself is 8 hex digits, so a window equal to it is a coincidence, not
    // a leak.
    for w in bytes.windows(4) {
        let lower: String = w.iter().map(|b| format!("{b:02x}")).collect();
        if lower == digest {
            continue;
        }
        let upper = lower.to_ascii_uppercase();
        for shown in [&text, &raw] {
            assert!(
                !shown.contains(&lower) && !shown.contains(&upper),
                "{shown} shows id bytes {lower}"
            );
        }
    }
    // Nor the bytes in decimal, as a slice's Debug would print them.
    for w in bytes.windows(2) {
        let dec = format!("{}, {}", w[0], w[1]);
        assert!(
            !text.contains(&dec) && !raw.contains(&dec),
            "{text} shows {dec}"
        );
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
    if let [index, mask, ..] = data[N..] {
        if mask != 0 {
            let mut other = bytes;
            other[usize::from(index) % N] ^= mask;
            let other_id = UniqueId::from_bytes(other);
            assert_ne!(other_id, id);
            assert_ne!(other_id.digest(), d, "one-byte change kept the digest");
            assert_ne!(format!("{other_id:?}"), format!("{id:?}"));
            check_debug(&other_id, &other);
        }
    }
});
