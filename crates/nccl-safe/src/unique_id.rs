//! The id every rank of a new communicator shares.

use std::fmt;

use nccl_sys::{NCCL_UNIQUE_ID_BYTES, ncclUniqueId};

use crate::Result;
use crate::library::Library;

/// An NCCL unique id: 128 opaque bytes made by one rank and handed to the
/// others (over a rendezvous of your choice) before `Comm::init_rank`.
///
/// It names the creating rank's bootstrap socket, so anyone holding it can
/// try to join the communicator: treat it as a secret. `Debug` prints only a
/// short digest, never the bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId(ncclUniqueId);

impl UniqueId {
    /// Size of the id in bytes.
    pub const BYTES: usize = NCCL_UNIQUE_ID_BYTES;

    /// A fresh id from `ncclGetUniqueId`. Needs no GPU. Refused while
    /// `NCCL_COMM_ID` is set, unless `NCCL_RS_ALLOW_COMM_ID=1` (see
    /// [`crate::COMM_ID_ENV`]).
    pub fn new() -> Result<UniqueId> {
        crate::secrecy::check_comm_id_env("ncclGetUniqueId")?;
        let lib = Library::get()?;
        let get = lib.raw().ncclGetUniqueId()?;
        let mut id = ncclUniqueId::zeroed();
        // SAFETY: `ncclGetUniqueId` writes one ncclUniqueId through a valid
        // pointer.
        let code = unsafe { get(&mut id) };
        lib.check("ncclGetUniqueId", code, std::ptr::null_mut())?;
        Ok(UniqueId(id))
    }

    /// The id received from another rank.
    pub const fn from_bytes(bytes: [u8; NCCL_UNIQUE_ID_BYTES]) -> UniqueId {
        UniqueId(ncclUniqueId::from_bytes(bytes))
    }

    /// The bytes to send to the other ranks.
    pub const fn as_bytes(&self) -> &[u8; NCCL_UNIQUE_ID_BYTES] {
        self.0.as_bytes()
    }

    /// The raw id.
    pub const fn raw(&self) -> ncclUniqueId {
        self.0
    }

    /// A 32-bit FNV-1a digest, enough to tell ids apart in logs without
    /// revealing them.
    pub fn digest(&self) -> u32 {
        self.as_bytes().iter().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
        })
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId(digest {:08x})", self.digest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        let mut bytes = [0u8; 128];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let id = UniqueId::from_bytes(bytes);
        assert_eq!(id.as_bytes(), &bytes);
        assert_eq!(UniqueId::from_bytes(*id.as_bytes()), id);
    }

    #[test]
    fn debug_shows_a_digest_not_the_bytes() {
        let id = UniqueId::from_bytes([0xab; 128]);
        let text = format!("{id:?}");
        assert!(text.starts_with("UniqueId(digest "), "{text}");
        assert!(!text.contains("abab"), "{text}");
        assert!(!text.contains("171"), "{text}");
        assert_ne!(UniqueId::from_bytes([0; 128]).digest(), id.digest());
    }
}
