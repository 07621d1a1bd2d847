//! The rendezvous protocol's numbers, frames and errors: the frame
//! header, reading and writing whole frames by a deadline, and
//! [`RendezvousError`]. The liveness channel frames its messages the same
//! way.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::loss::LivenessError;

/// Protocol version on the wire.
pub const PROTOCOL_VERSION: u16 = 2;
/// Largest payload a frame may carry.
pub const MAX_PAYLOAD: u32 = 1024;

/// How long rank 0 gives one connection for its whole handshake.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long rank 0 waits for a new connection's first frame.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Handshakes rank 0 runs at once; a connection beyond them is closed at
/// once (a real rank retries).
pub const MAX_HANDSHAKES: usize = 64;
/// Refusals `serve` returns at most (a flood of strangers is not kept).
pub const MAX_REFUSED: usize = 256;

const MAGIC: &[u8; 4] = b"NCRV";
pub(crate) const NONCE: usize = 32;
pub(crate) const TAG: usize = 32;
/// Bytes of a sealed id: the id and the AEAD tag.
pub(crate) const SEALED_ID: usize = nccl_sys::NCCL_UNIQUE_ID_BYTES + 16;

/// What went wrong in a rendezvous, on the side that saw it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// The deadline passed.
    #[error("rendezvous timed out after {waited:?} while {phase}")]
    Timeout {
        /// What we were doing.
        phase: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The other side does not know the shared secret.
    #[error("the peer failed authentication (wrong shared secret)")]
    BadSecret,
    /// A second connection claimed a rank already served.
    #[error("rank {rank} joined twice")]
    DuplicateRank {
        /// The rank.
        rank: usize,
    },
    /// The peer expects another world size.
    #[error("world size mismatch: this side has {expected}, the peer {got}")]
    WorldSizeMismatch {
        /// Ours.
        expected: usize,
        /// Theirs.
        got: usize,
    },
    /// A rank outside the world.
    #[error("rank {rank} is out of range for a world of {world}")]
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// The world size.
        world: usize,
    },
    /// Bytes that are not our protocol.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    /// The peer speaks another protocol version.
    #[error("protocol version {got}, expected {PROTOCOL_VERSION}")]
    Version {
        /// Theirs.
        got: u16,
    },
    /// Rank 0 refused this rank, in a reject whose MAC proves it came
    /// from rank 0: the reason is what rank 0 saw.
    #[error("rank 0 refused this rank: {0}")]
    Rejected(Box<RendezvousError>),
    /// The listener at the address never proved that it holds the shared
    /// secret: a different secret on one side, or not this job's rank 0.
    #[error(
        "the listener never proved the shared secret within {waited:?} (a different secret on one side, or a stranger on the port)"
    )]
    Unauthenticated {
        /// How long this side tried.
        waited: Duration,
    },
    /// Rank 0 has served every rank and takes no more.
    #[error("rank 0 is not accepting ranks any more")]
    NotAccepting,
    /// A socket or file error.
    #[error("rendezvous I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Keeping the connection as the liveness channel failed.
    #[error(transparent)]
    Liveness(#[from] LivenessError),
}

pub(crate) type Result<T, E = RendezvousError> = std::result::Result<T, E>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Hello = 1,
    Challenge = 2,
    Proof = 3,
    Id = 4,
    Reject = 5,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Challenge,
            3 => Kind::Proof,
            4 => Kind::Id,
            5 => Kind::Reject,
            _ => return None,
        })
    }
}

/// Encodes one frame.
pub fn encode_frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(11 + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Decodes a frame header (11 bytes): kind and payload length. Public for
/// the fuzz targets; never panics.
pub fn decode_header(header: &[u8]) -> Result<(u8, u32)> {
    if header.len() != 11 {
        return Err(RendezvousError::Malformed("short header"));
    }
    if &header[..4] != MAGIC {
        return Err(RendezvousError::Malformed("bad magic"));
    }
    let version = u16::from_be_bytes([header[4], header[5]]);
    if version != PROTOCOL_VERSION {
        return Err(RendezvousError::Version { got: version });
    }
    let len = u32::from_be_bytes([header[7], header[8], header[9], header[10]]);
    if len > MAX_PAYLOAD {
        return Err(RendezvousError::Malformed("payload over the size cap"));
    }
    Ok((header[6], len))
}

/// `started + timeout`, without the overflow panic of a huge timeout (a
/// caller's `Duration::MAX`, a Python float): such a timeout waits a year.
pub(crate) fn deadline_after(started: Instant, timeout: Duration) -> Instant {
    started
        .checked_add(timeout)
        .or_else(|| started.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(started)
}

/// Refuses a rank or world size that the protocol's `u32` fields (and
/// NCCL's `int`) cannot carry, before anything is sent.
pub(crate) fn check_fits(rank: usize, world: usize) -> Result<()> {
    if world > i32::MAX as usize || rank > i32::MAX as usize {
        return Err(RendezvousError::Malformed(
            "a rank or world size over 2^31 - 1 (NCCL's int)",
        ));
    }
    Ok(())
}

pub(crate) fn deadline_left(deadline: Instant, phase: &str, started: Instant) -> Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| RendezvousError::Timeout {
            phase: phase.to_string(),
            waited: started.elapsed(),
        })
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

pub(crate) fn read_frame(
    stream: &mut TcpStream,
    until: Instant,
    phase: &str,
    started: Instant,
) -> Result<(Kind, Vec<u8>)> {
    let (kind, payload) = read_raw_frame(stream, until, phase, started)?;
    let kind = Kind::from_u8(kind).ok_or(RendezvousError::Malformed("unknown frame kind"))?;
    Ok((kind, payload))
}

/// One frame of any kind (the liveness kinds included).
pub(crate) fn read_raw_frame(
    stream: &mut TcpStream,
    until: Instant,
    phase: &str,
    started: Instant,
) -> Result<(u8, Vec<u8>)> {
    let mut header = [0u8; 11];
    read_exact_by(stream, &mut header, until, phase, started)?;
    let (kind, len) = decode_header(&header)?;
    let mut payload = vec![0u8; len as usize];
    read_exact_by(stream, &mut payload, until, phase, started)?;
    Ok((kind, payload))
}

fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    until: Instant,
    phase: &str,
    started: Instant,
) -> Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline_left(until, phase, started)?;
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(RendezvousError::Malformed("connection closed mid-frame")),
            Ok(n) => filled += n,
            Err(e) if is_timeout(&e) => {
                return Err(RendezvousError::Timeout {
                    phase: phase.to_string(),
                    waited: started.elapsed(),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub(crate) fn write_frame(
    stream: &mut TcpStream,
    kind: Kind,
    payload: &[u8],
    until: Instant,
) -> Result<()> {
    write_bytes(stream, &encode_frame(kind as u8, payload), until)
}

/// Writes all of `bytes` by `until`.
pub(crate) fn write_bytes(stream: &mut TcpStream, bytes: &[u8], until: Instant) -> Result<()> {
    let started = Instant::now();
    let left = deadline_left(until, "writing a frame", started)?;
    stream.set_write_timeout(Some(left))?;
    stream.write_all(bytes).map_err(|e| {
        if is_timeout(&e) {
            RendezvousError::Timeout {
                phase: "writing a frame".into(),
                waited: started.elapsed(),
            }
        } else {
            e.into()
        }
    })
}
