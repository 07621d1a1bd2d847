//! What the control plane's tests share.

use nccl_control::nccl_sys::{NCCL_UNIQUE_ID_BYTES, ncclUniqueId};

/// A unique id of random bytes (the control plane never looks inside).
pub fn random_id() -> ncclUniqueId {
    let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
    getrandom::fill(&mut bytes).expect("the OS random source");
    ncclUniqueId::from_bytes(bytes)
}
