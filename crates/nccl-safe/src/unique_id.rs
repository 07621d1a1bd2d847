//! The id every rank of a new communicator shares.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nccl_sys::{IdTextError, NCCL_UNIQUE_ID_BYTES, ncclUniqueId};

use crate::error::{Result, UniqueIdError};
use crate::library::Library;

/// The largest file [`UniqueId::read_file`] reads: the hex text with room
/// for whitespace, and nothing like a stray large file.
const MAX_FILE_BYTES: u64 = 4096;

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

    /// The id from bytes of any source (a Python peer, a message): exactly
    /// [`UniqueId::BYTES`] of them, else
    /// [`UniqueIdError::Length`].
    pub fn from_slice(bytes: &[u8]) -> Result<UniqueId> {
        let bytes: [u8; NCCL_UNIQUE_ID_BYTES] =
            bytes.try_into().map_err(|_| UniqueIdError::Length {
                expected: NCCL_UNIQUE_ID_BYTES,
                found: bytes.len(),
            })?;
        Ok(UniqueId::from_bytes(bytes))
    }

    /// The id from its hex text ([`UniqueId::to_hex`], Python's
    /// `bytes.hex()`): 256 hex digits of either case, whitespace around
    /// them allowed. A wrong number of digits is
    /// [`UniqueIdError::HexLength`]; any
    /// other character (whitespace inside included) is
    /// [`UniqueIdError::NotHex`] with its
    /// position in `text`.
    pub fn from_hex(text: &str) -> Result<UniqueId> {
        ncclUniqueId::from_hex(text).map(UniqueId).map_err(|e| {
            match e {
                IdTextError::NotHex { position, found } => {
                    UniqueIdError::NotHex { position, found }
                }
                IdTextError::Length { expected, found } => {
                    UniqueIdError::HexLength { expected, found }
                }
            }
            .into()
        })
    }

    /// The id as 256 lowercase hex digits, for a peer that takes text (a
    /// configuration, a command line). It is as secret as the id: whoever
    /// holds it can try to join the communicator, so keep it out of logs.
    pub fn to_hex(&self) -> String {
        self.0.to_hex()
    }

    /// The id from a file holding its [`UniqueId::BYTES`] raw bytes or its
    /// hex text ([`UniqueId::from_hex`]; a trailing newline is fine). A
    /// file of exactly [`UniqueId::BYTES`] bytes is the raw id unless every
    /// byte is a hex digit or whitespace (then it is short hex text).
    /// Typed errors ([`UniqueIdError`]): `Io` for a
    /// file that cannot be read (missing) or is not a regular file (a FIFO
    /// or device is refused without blocking), `FileTooLarge` over 4 KiB
    /// (nothing more is read), `FileContents` for binary contents of
    /// another size, and the hex errors for text.
    pub fn read_file(path: impl AsRef<Path>) -> Result<UniqueId> {
        let path = path.as_ref();
        let io = |source| UniqueIdError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Opened without blocking (a FIFO with no writer would block the
        // open forever), then refused unless it is a regular file.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(io)?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            ))
            .into());
        }
        let mut contents = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut contents)
            .map_err(io)?;
        if contents.len() as u64 > MAX_FILE_BYTES {
            let size = std::fs::metadata(path).map_or(contents.len() as u64, |m| m.len());
            return Err(UniqueIdError::FileTooLarge {
                path: path.to_path_buf(),
                size,
                limit: MAX_FILE_BYTES,
            }
            .into());
        }
        // 128 bytes are the raw id unless they are all hex digits and
        // whitespace (a raw id holds zero bytes; that is short hex text).
        let hex_text = contents
            .iter()
            .all(|b| b.is_ascii_hexdigit() || b.is_ascii_whitespace());
        if contents.len() == NCCL_UNIQUE_ID_BYTES && !hex_text {
            return UniqueId::from_slice(&contents);
        }
        // Text is printable ASCII and whitespace; anything else is binary
        // of the wrong size.
        match std::str::from_utf8(&contents) {
            Ok(text)
                if text
                    .bytes()
                    .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()) =>
            {
                UniqueId::from_hex(text)
            }
            _ => Err(UniqueIdError::FileContents {
                path: path.to_path_buf(),
                size: contents.len(),
            }
            .into()),
        }
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

impl From<ncclUniqueId> for UniqueId {
    /// The id a rendezvous handed over (`nccl-control` speaks the raw type).
    fn from(raw: ncclUniqueId) -> UniqueId {
        UniqueId(raw)
    }
}

impl From<UniqueId> for ncclUniqueId {
    fn from(id: UniqueId) -> ncclUniqueId {
        id.0
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

    fn sample() -> UniqueId {
        let mut bytes = [0u8; 128];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        UniqueId::from_bytes(bytes)
    }

    fn id_error(r: Result<UniqueId>) -> UniqueIdError {
        match r {
            Err(crate::Error::BadUniqueId(e)) => e,
            other => panic!("expected a unique id error, got {other:?}"),
        }
    }

    #[test]
    fn slices_of_128_bytes_and_no_other_length() {
        let id = sample();
        assert_eq!(UniqueId::from_slice(id.as_bytes()).unwrap(), id);
        for len in [0, 1, 127, 129, 256] {
            let e = id_error(UniqueId::from_slice(&vec![1u8; len]));
            assert!(
                matches!(e, UniqueIdError::Length { expected: 128, found } if found == len),
                "{e:?}"
            );
            assert!(
                e.to_string().contains(&format!("128 bytes, found {len}")),
                "{e}"
            );
        }
    }

    #[test]
    fn hex_round_trips_in_either_case_with_whitespace_around() {
        let id = sample();
        let hex = id.to_hex();
        assert_eq!(hex.len(), 256);
        assert!(hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        assert_eq!(&hex[..4], "0b30");
        assert_eq!(UniqueId::from_hex(&hex).unwrap(), id);
        assert_eq!(UniqueId::from_hex(&hex.to_uppercase()).unwrap(), id);
        assert_eq!(UniqueId::from_hex(&format!(" \t{hex}\r\n")).unwrap(), id);
    }

    #[test]
    fn bad_hex_names_the_length_or_the_position() {
        let hex = sample().to_hex();
        let e = id_error(UniqueId::from_hex(&hex[..255]));
        assert!(
            matches!(
                e,
                UniqueIdError::HexLength {
                    expected: 256,
                    found: 255
                }
            ),
            "{e:?}"
        );
        let e = id_error(UniqueId::from_hex(""));
        assert!(
            matches!(e, UniqueIdError::HexLength { found: 0, .. }),
            "{e:?}"
        );
        let mut bad = hex.clone();
        bad.replace_range(17..18, "g");
        let e = id_error(UniqueId::from_hex(&format!("  {bad}")));
        assert!(
            matches!(
                e,
                UniqueIdError::NotHex {
                    position: 19,
                    found: 'g'
                }
            ),
            "{e:?}"
        );
        // Whitespace inside is not allowed; a non-ASCII character counts
        // as one position.
        let e = id_error(UniqueId::from_hex(&format!(
            "{} {}",
            &hex[..128],
            &hex[128..]
        )));
        assert!(
            matches!(
                e,
                UniqueIdError::NotHex {
                    position: 128,
                    found: ' '
                }
            ),
            "{e:?}"
        );
        let e = id_error(UniqueId::from_hex(&format!("é{hex}")));
        assert!(
            matches!(
                e,
                UniqueIdError::NotHex {
                    position: 0,
                    found: 'é'
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn files_hold_raw_bytes_or_hex_text() {
        let dir = std::env::temp_dir().join(format!("nccl-safe-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let id = sample();
        let raw = dir.join("raw");
        std::fs::write(&raw, id.as_bytes()).unwrap();
        assert_eq!(UniqueId::read_file(&raw).unwrap(), id);
        let text = dir.join("hex");
        std::fs::write(&text, format!("{}\n", id.to_hex())).unwrap();
        assert_eq!(UniqueId::read_file(&text).unwrap(), id);

        let e = id_error(UniqueId::read_file(dir.join("missing")));
        assert!(
            matches!(&e, UniqueIdError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        let short = dir.join("short");
        std::fs::write(&short, [0u8, 0xff, 3]).unwrap();
        let e = id_error(UniqueId::read_file(&short));
        assert!(
            matches!(e, UniqueIdError::FileContents { size: 3, .. }),
            "{e:?}"
        );
        let big = dir.join("big");
        std::fs::write(&big, vec![b'a'; 5000]).unwrap();
        let e = id_error(UniqueId::read_file(&big));
        assert!(
            matches!(
                e,
                UniqueIdError::FileTooLarge {
                    size: 5000,
                    limit: 4096,
                    ..
                }
            ),
            "{e:?}"
        );
        let half = dir.join("half");
        std::fs::write(&half, &id.to_hex()[..100]).unwrap();
        let e = id_error(UniqueId::read_file(&half));
        assert!(
            matches!(e, UniqueIdError::HexLength { found: 100, .. }),
            "{e:?}"
        );
        // 128 bytes of hex text are short hex, not a raw id.
        let hex128 = dir.join("hex128");
        std::fs::write(&hex128, format!("{}\n", &id.to_hex()[..127])).unwrap();
        let e = id_error(UniqueId::read_file(&hex128));
        assert!(matches!(e, UniqueIdError::HexLength { .. }), "{e:?}");
        // A FIFO with no writer is refused at once instead of blocking.
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path and a mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = id_error(UniqueId::read_file(&fifo));
        assert!(
            matches!(&e, UniqueIdError::Io { source, .. } if source.kind() == std::io::ErrorKind::InvalidInput),
            "{e:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
