//! Helpers shared by the CPU test binaries of nccl-dist.

use std::time::{SystemTime, UNIX_EPOCH};

use nccl_dist::nccl_safe::UniqueId;

/// Bytes that differ from run to run (no GPU, no NCCL: the id is only
/// carried), so a test cannot pass by luck on a constant.
pub fn random_id() -> UniqueId {
    let mut x = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
        | 1;
    let mut bytes = [0u8; UniqueId::BYTES];
    for b in &mut bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    UniqueId::from_bytes(bytes)
}
