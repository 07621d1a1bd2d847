//! The file rendezvous: rank 0 writes the unique id to a path on a file
//! system every rank sees; the others wait for it.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use nccl_safe::UniqueId;

use super::{PROTOCOL_VERSION, RendezvousError, Result, deadline_left};

const FILE_MAGIC: &[u8; 8] = b"NCRVFILE";

/// Rank 0 publishes `id` at `path` for the other ranks on a shared file
/// system: written to a temporary file with mode 0600 in the same
/// directory, then renamed into place, so readers see all or nothing.
pub fn publish_file(path: &Path, id: &UniqueId) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(FILE_MAGIC)?;
        f.write_all(&PROTOCOL_VERSION.to_be_bytes())?;
        f.write_all(id.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(())
}

/// Decodes the contents of a rendezvous file. Never panics.
pub fn decode_file(bytes: &[u8]) -> Result<UniqueId> {
    if bytes.len() != FILE_MAGIC.len() + 2 + UniqueId::BYTES || &bytes[..8] != FILE_MAGIC {
        return Err(RendezvousError::Malformed("not a rendezvous file"));
    }
    let version = u16::from_be_bytes([bytes[8], bytes[9]]);
    if version != PROTOCOL_VERSION {
        return Err(RendezvousError::Version { got: version });
    }
    let mut id = [0u8; UniqueId::BYTES];
    id.copy_from_slice(&bytes[10..]);
    Ok(UniqueId::from_bytes(id))
}

/// The other ranks wait for the file at `path` until `timeout`.
pub fn wait_file(path: &Path, timeout: Duration) -> Result<UniqueId> {
    let started = Instant::now();
    loop {
        match std::fs::read(path) {
            Ok(bytes) => return decode_file(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                deadline_left(
                    started + timeout,
                    &format!("waiting for {}", path.display()),
                    started,
                )?;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}
