//! Handing rank 0's [`UniqueId`] to every rank, over TCP or a shared file,
//! and (over TCP) keeping each authenticated connection as that rank's
//! liveness connection.
//!
//! # TCP protocol (version 2)
//!
//! Every message is a frame: the magic `NCRV`, the protocol version (u16),
//! a kind (u8), a payload length (u32, at most [`MAX_PAYLOAD`]) and the
//! payload; integers are big-endian. `K` is the shared secret, `H` is
//! HMAC-SHA256 keyed by `K`, `hello` the 8 bytes `rank ‖ world` of step 1.
//!
//! 1. the joining rank sends `Hello { rank u32, world u32, nonce_c [32] }`;
//! 2. rank 0 answers `Challenge { nonce_s [32], H("nccl-rs server v2" ‖
//!    nonce_c ‖ nonce_s ‖ hello) }`: rank 0 proves the secret first, bound
//!    to the joining rank's fresh nonce, so a listener without the secret
//!    (another job's rank 0, a stranger on the port) is recognised before
//!    anything is sent to it;
//! 3. the joining rank sends `Proof { H("nccl-rs proof v2" ‖ nonce_s ‖
//!    nonce_c ‖ hello) }`;
//! 4. rank 0 checks the proof, the world size and that the rank is new,
//!    then sends `Id { ChaCha20-Poly1305(key, nonce 0, id, aad) }` with
//!    `key = HKDF-SHA256(salt = nonce_s ‖ nonce_c, ikm = K, info =
//!    "nccl-rs id key v2" ‖ hello)` (fresh per connection, hence the fixed
//!    AEAD nonce) and `aad = "nccl-rs id v2" ‖ hello`; or `Reject { code
//!    u8, a u32, b u32, H("nccl-rs reject v2" ‖ nonce_c ‖ nonce_s ‖ code ‖
//!    a ‖ b) }`. A reject carries numbers, never text, and the joining rank
//!    believes it only if its MAC checks.
//!
//! 5. with the liveness channel ([`serve_live`], [`join_live`]), the
//!    connection is not closed: the joining rank sends `Attach` and rank 0
//!    answers `Attached`, both already MACed with a session key derived
//!    from the secret and both nonces; from then on it carries heartbeats
//!    and losses. Those frames and the key derivation are described in
//!    [`crate::liveness`].
//!
//! What this gives: the id never crosses the wire in clear; neither side
//! sends anything that depends on the secret to a peer that has not proven
//! it (rank 0's challenge proof is bound to the joining rank's nonce, so
//! it cannot be replayed); a recorded session replays nowhere (both sides
//! contribute a fresh nonce); a frame changed in transit fails its MAC or
//! its AEAD tag. `docs/security.md` has the threat model.
//!
//! Rank 0 runs each handshake on its own thread, at most
//! [`MAX_HANDSHAKES`] at once, each with its own deadline ([`HELLO_TIMEOUT`]
//! for the first frame, [`PEER_TIMEOUT`] in all), so silent or slow
//! connections do not hold up the real ranks. A joining rank retries
//! until its deadline after anything that does not come from a holder of
//! the secret (a refused connection, garbage, an unauthenticated reject, a
//! listener that cannot prove the secret); only an authenticated reject
//! ends its join at once. Every read and write is bounded by the
//! deadline. Nothing here panics on bad input.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use nccl_safe::UniqueId;
use sha2::Sha256;

use crate::liveness::wire::{Dir, Msg, Opener, Sealer, session_key};
use crate::liveness::{
    Link, Liveness, LivenessError, LivenessOptions, Takeover, start_hub, start_member,
};
use crate::secret::Secret;

pub mod file;
pub use file::{
    FILE_BYTES, FILE_FORMAT_VERSION, MAX_FILE_AGE, MAX_FILE_BYTES, MAX_FILE_CLOCK_SKEW,
    decode_file, publish_file, wait_file,
};

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
const NONCE: usize = 32;
const TAG: usize = 32;
/// Bytes of a sealed id: the id and the AEAD tag.
const SEALED_ID: usize = UniqueId::BYTES + 16;

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

type Result<T, E = RendezvousError> = std::result::Result<T, E>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
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

fn deadline_left(deadline: Instant, phase: &str, started: Instant) -> Result<Duration> {
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

fn read_frame(
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
fn read_raw_frame(
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

fn write_frame(stream: &mut TcpStream, kind: Kind, payload: &[u8], until: Instant) -> Result<()> {
    write_bytes(stream, &encode_frame(kind as u8, payload), until)
}

/// Writes all of `bytes` by `until`.
fn write_bytes(stream: &mut TcpStream, bytes: &[u8], until: Instant) -> Result<()> {
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

fn mac(secret: &Secret, parts: &[&[u8]]) -> Result<Hmac<Sha256>> {
    // HMAC-SHA256 accepts keys of any length; the error is carried rather
    // than unwrapped all the same.
    let mut m =
        <Hmac<Sha256> as Mac>::new_from_slice(secret.bytes()).map_err(|_| LivenessError::Crypto)?;
    for p in parts {
        m.update(p);
    }
    Ok(m)
}

fn nonce() -> Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n)
        .map_err(|e| RendezvousError::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

fn be32(v: usize) -> [u8; 4] {
    (v as u32).to_be_bytes()
}

/// Rank 0's side: accepts the other `world - 1` ranks on `listener` and
/// hands each the id, until all are served or `timeout` passes. Peers that
/// fail (bad secret, wrong world, duplicate rank, garbage, silence) are
/// refused and do not count; the listener keeps waiting for the real ones.
/// Returns the errors seen from refused peers alongside success.
pub fn serve(
    listener: &TcpListener,
    world: usize,
    secret: &Secret,
    id: &UniqueId,
    timeout: Duration,
) -> Result<Vec<RendezvousError>> {
    serve_with(listener, world, secret, id, timeout, |_, _, _| None)
}

/// Rank 0's side with the liveness channel: as [`serve`], and every
/// served rank's connection stays open as its liveness connection (see
/// [`crate::liveness`]). The returned [`Liveness`] watches them from the
/// start, so a rank that dies while others are still joining is already
/// reported. A served rank whose connection could not be kept (liveness
/// off on its side) has the id but is not watched; its error is in the
/// returned list. On an error, the ranks already attached see rank 0 as
/// lost. With `options` disabled this is [`serve`] plus a channel that
/// only knows local reports.
pub fn serve_live(
    listener: &TcpListener,
    world: usize,
    secret: &Secret,
    id: &UniqueId,
    timeout: Duration,
    options: &LivenessOptions,
) -> Result<(Liveness, Vec<RendezvousError>)> {
    if !options.is_enabled() {
        let refused = serve(listener, world, secret, id, timeout)?;
        return Ok((Liveness::off(world, 0), refused));
    }
    let live = start_hub(world, options)?;
    let outcome = serve_with(
        listener,
        world,
        secret,
        id,
        timeout,
        |stream, served, until| {
            // The address remote members reach this host by (a member on
            // this host may have come over loopback).
            let seen = stream.local_addr().ok().map(|a| a.ip());
            match attach_member(stream, served, world, secret, until) {
                Ok((link, listen)) => {
                    live.add_link(link, listen, seen);
                    None
                }
                Err(e) => Some(e),
            }
        },
    );
    match outcome {
        Ok(refused) => {
            live.done_accepting();
            Ok((live, refused))
        }
        Err(e) => {
            live.abandon();
            Err(e)
        }
    }
}

/// What rank 0 knows of a rank it served.
struct Served {
    rank: usize,
    nonce_c: Vec<u8>,
    nonce_s: [u8; NONCE],
}

/// Which ranks rank 0 has handed the id to, shared with the handshake
/// threads; a rank is claimed when its proof checks.
struct Door {
    served: Mutex<BTreeSet<usize>>,
    open: AtomicBool,
    world: usize,
}

impl Door {
    fn claim(&self, rank: usize) -> Result<()> {
        if rank == 0 || rank >= self.world {
            return Err(RendezvousError::RankOutOfRange {
                rank,
                world: self.world,
            });
        }
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        if !self.open.load(Ordering::Acquire) {
            return Err(RendezvousError::NotAccepting);
        }
        if !served.insert(rank) {
            return Err(RendezvousError::DuplicateRank { rank });
        }
        Ok(())
    }

    /// The id could not be sent after all: the rank may come again.
    fn unclaim(&self, rank: usize) {
        self.served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&rank);
    }
}

/// What a handshake thread reports to the accept loop.
type Outcome = Result<(TcpStream, Served, Instant)>;

/// The accept loop; `keep` gets each served rank's connection and returns
/// an error to list (the rank stays served: it has the id).
fn serve_with(
    listener: &TcpListener,
    world: usize,
    secret: &Secret,
    id: &UniqueId,
    timeout: Duration,
    mut keep: impl FnMut(TcpStream, Served, Instant) -> Option<RendezvousError>,
) -> Result<Vec<RendezvousError>> {
    let started = Instant::now();
    let deadline = started + timeout;
    listener.set_nonblocking(true)?;
    let door = Arc::new(Door {
        served: Mutex::new(BTreeSet::new()),
        open: AtomicBool::new(true),
        world,
    });
    let (tx, rx) = mpsc::channel::<Outcome>();
    let mut in_flight = 0usize;
    let mut served = 0usize;
    let mut refused = Vec::new();
    let _span = tracing::debug_span!("nccl.rendezvous_serve", world).entered();
    // A finished handshake: a served rank's connection is kept (or its
    // liveness attach refused) here, one at a time, while the other
    // handshakes go on.
    let mut finished = |outcome: Outcome, served: &mut usize, refused: &mut Vec<_>| match outcome {
        Ok((stream, who, until)) => {
            *served += 1;
            if let Some(e) = keep(stream, who, until) {
                tracing::debug!(error = %e, "rendezvous: no liveness connection");
                refused.push(e);
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "rendezvous peer refused");
            refused.push(e);
        }
    };
    let result = loop {
        while let Ok(outcome) = rx.try_recv() {
            in_flight -= 1;
            finished(outcome, &mut served, &mut refused);
        }
        if served + 1 >= world {
            break Ok(());
        }
        // Checked on every round, so a flood of connections cannot keep
        // rank 0 past its deadline.
        let phase = || format!("waiting for ranks (served {served} of {})", world - 1);
        if let Err(e) = deadline_left(deadline, &phase(), started) {
            break Err(e);
        }
        if refused.len() > MAX_REFUSED {
            // A flood: keep the first refusals, count no more.
            refused.truncate(MAX_REFUSED);
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if in_flight >= MAX_HANDSHAKES {
                    // Closed at once: a real rank sees a reset and retries.
                    refused.push(RendezvousError::Malformed("too many handshakes at once"));
                    continue;
                }
                let until = deadline.min(Instant::now() + PEER_TIMEOUT);
                let (door, tx) = (Arc::clone(&door), tx.clone());
                let (secret, id) = (secret.clone(), *id);
                let spawned = std::thread::Builder::new()
                    .name("nccl-rdv-handshake".into())
                    .spawn(move || {
                        let outcome = handshake_thread(stream, &door, &secret, &id, until, started);
                        let _ = tx.send(outcome);
                    });
                match spawned {
                    Ok(_) => in_flight += 1,
                    Err(e) => refused.push(RendezvousError::Io(e)),
                }
            }
            Err(e) => {
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) {
                    // A connection that died before it was accepted, or no
                    // descriptors left for now: the listener is still good.
                    tracing::debug!(error = %e, "rendezvous: accept failed; going on");
                }
                // Wakes at once when a handshake ends.
                if let Ok(outcome) = rx.recv_timeout(Duration::from_millis(2)) {
                    in_flight -= 1;
                    finished(outcome, &mut served, &mut refused);
                }
            }
        }
    };
    // Handshakes still running end by their own deadline and can no
    // longer claim a rank.
    door.open.store(false, Ordering::Release);
    result.map(|()| refused)
}

/// One connection's handshake, on its own thread.
fn handshake_thread(
    mut stream: TcpStream,
    door: &Door,
    secret: &Secret,
    id: &UniqueId,
    until: Instant,
    started: Instant,
) -> Outcome {
    stream.set_nonblocking(false)?;
    let claim = |rank: usize| door.claim(rank);
    let unclaim = |rank: usize| door.unclaim(rank);
    let who = handshake_server(
        &mut stream,
        door.world,
        secret,
        id,
        &claim,
        &unclaim,
        until,
        started,
    )?;
    Ok((stream, who, until))
}

/// The hub's side: waits for a served rank's `Attach` and answers
/// `Attached`; the link and where the member listens for a takeover.
fn attach_member(
    mut stream: TcpStream,
    served: Served,
    world: usize,
    secret: &Secret,
    until: Instant,
) -> Result<(Link, Option<SocketAddr>)> {
    let rank = served.rank;
    let key = session_key(secret, &served.nonce_s, &served.nonce_c, rank, world)?;
    let mut opener = Opener::new(key.clone(), Dir::Up, world);
    let mut sealer = Sealer::new(key, Dir::Down);
    let started = Instant::now();
    let not_attached = |detail: String| LivenessError::NotAttached { rank, detail };
    let (kind, payload) = read_raw_frame(&mut stream, until, "waiting for an attach", started)
        .map_err(|e| not_attached(e.to_string()))?;
    let listen = match opener.open(kind, &payload)? {
        Msg::Attach { listen } => listen,
        _ => return Err(not_attached("the first frame was not an attach".into()).into()),
    };
    write_bytes(&mut stream, &sealer.seal(&Msg::Attached)?, until)?;
    Ok((Link::new(rank, false, stream, sealer, opener)?, listen))
}

/// A member that became the hub: authenticates a member coming to it
/// after the old hub was lost (the rendezvous handshake again, `accept`
/// deciding which ranks may come), then its attach.
pub(crate) fn takeover_accept(
    mut stream: TcpStream,
    world: usize,
    secret: &Secret,
    id: &UniqueId,
    accept: &dyn Fn(usize) -> Result<()>,
) -> Result<Link> {
    stream.set_nonblocking(false)?;
    let started = Instant::now();
    let until = started + TAKEOVER_HANDSHAKE;
    let served = handshake_server(
        &mut stream,
        world,
        secret,
        id,
        accept,
        &|_| {},
        until,
        started,
    )?;
    attach_member(stream, served, world, secret, until).map(|(link, _)| link)
}

/// A member whose hub was lost: the rendezvous handshake with the rank
/// taking over at `addr`, which must hand out the same id, then the attach.
pub(crate) fn takeover_connect(
    addr: SocketAddr,
    hub: usize,
    rank: usize,
    world: usize,
    takeover: &Takeover,
    timeout: Duration,
) -> Result<Link> {
    let started = Instant::now();
    let joined = join_stream(addr, rank, world, &takeover.secret, started, timeout)?;
    if joined.id != takeover.id {
        return Err(RendezvousError::Malformed(
            "the new hub has another job's id",
        ));
    }
    let listen = takeover.listener.local_addr().ok();
    attach_to_hub(
        joined,
        hub,
        rank,
        world,
        &takeover.secret,
        listen,
        started + timeout,
    )
}

/// How long a takeover handshake may take on the accepting side.
const TAKEOVER_HANDSHAKE: Duration = Duration::from_secs(2);

/// Why rank 0 refuses a rank, as numbers on the wire.
fn reject_code(e: &RendezvousError) -> (u8, u32, u32) {
    match e {
        RendezvousError::BadSecret => (1, 0, 0),
        RendezvousError::WorldSizeMismatch { expected, got } => (2, *expected as u32, *got as u32),
        RendezvousError::DuplicateRank { rank } => (3, *rank as u32, 0),
        RendezvousError::RankOutOfRange { rank, world } => (4, *rank as u32, *world as u32),
        RendezvousError::NotAccepting => (5, 0, 0),
        _ => (6, 0, 0),
    }
}

/// The joining rank's reading of an authenticated reject: rank 0's view.
fn reject_reason(code: u8, a: u32, b: u32) -> RendezvousError {
    match code {
        1 => RendezvousError::BadSecret,
        2 => RendezvousError::WorldSizeMismatch {
            expected: a as usize,
            got: b as usize,
        },
        3 => RendezvousError::DuplicateRank { rank: a as usize },
        4 => RendezvousError::RankOutOfRange {
            rank: a as usize,
            world: b as usize,
        },
        5 => RendezvousError::NotAccepting,
        _ => RendezvousError::Malformed("rank 0 refused this rank for a reason it did not name"),
    }
}

fn reject_tag(
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8],
    body: &[u8],
) -> Result<Hmac<Sha256>> {
    mac(secret, &[b"nccl-rs reject v2", nonce_c, nonce_s, body])
}

/// Tells the joining rank why it is refused (best effort: it is going
/// anyway).
fn send_reject(
    stream: &mut TcpStream,
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8],
    why: &RendezvousError,
    until: Instant,
) {
    let (code, a, b) = reject_code(why);
    let mut body = vec![code];
    body.extend_from_slice(&a.to_be_bytes());
    body.extend_from_slice(&b.to_be_bytes());
    if let Ok(m) = reject_tag(secret, nonce_c, nonce_s, &body) {
        body.extend_from_slice(&m.finalize().into_bytes());
        let _ = write_frame(stream, Kind::Reject, &body, until);
    }
}

/// The AEAD that carries the id over one connection: its key is fresh
/// for every connection (both nonces), so the AEAD nonce can be fixed.
fn id_cipher(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    hello: &[u8],
) -> Result<ChaCha20Poly1305> {
    let mut salt = Vec::with_capacity(nonce_s.len() + nonce_c.len());
    salt.extend_from_slice(nonce_s);
    salt.extend_from_slice(nonce_c);
    let hk = Hkdf::<Sha256>::new(Some(&salt), secret.bytes());
    let mut info = b"nccl-rs id key v2".to_vec();
    info.extend_from_slice(hello);
    let mut key = [0u8; 32];
    hk.expand(&info, &mut key)
        .map_err(|_| LivenessError::Crypto)?;
    Ok(ChaCha20Poly1305::new(Key::from_slice(&key)))
}

fn id_aad(hello: &[u8]) -> Vec<u8> {
    let mut aad = b"nccl-rs id v2".to_vec();
    aad.extend_from_slice(hello);
    aad
}

fn server_proof(
    secret: &Secret,
    nonce_c: &[u8],
    nonce_s: &[u8],
    hello: &[u8],
) -> Result<Hmac<Sha256>> {
    mac(secret, &[b"nccl-rs server v2", nonce_c, nonce_s, hello])
}

fn client_proof(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    hello: &[u8],
) -> Result<Hmac<Sha256>> {
    mac(secret, &[b"nccl-rs proof v2", nonce_s, nonce_c, hello])
}

/// Rank 0's side of one handshake (module docs, steps 1 to 4). `claim`
/// decides whether the (authenticated) rank may have the id and takes
/// it; `unclaim` gives it back when the id could not be sent.
#[allow(clippy::too_many_arguments)]
fn handshake_server(
    stream: &mut TcpStream,
    world: usize,
    secret: &Secret,
    id: &UniqueId,
    claim: &dyn Fn(usize) -> Result<()>,
    unclaim: &dyn Fn(usize),
    until: Instant,
    started: Instant,
) -> Result<Served> {
    let hello_until = until.min(Instant::now() + HELLO_TIMEOUT);
    let (kind, hello) = read_frame(stream, hello_until, "reading a peer's hello", started)?;
    if kind != Kind::Hello || hello.len() != 8 + NONCE {
        return Err(RendezvousError::Malformed("expected a hello"));
    }
    let rank = u32::from_be_bytes([hello[0], hello[1], hello[2], hello[3]]) as usize;
    let peer_world = u32::from_be_bytes([hello[4], hello[5], hello[6], hello[7]]) as usize;
    let (claims, nonce_c) = hello.split_at(8);
    let nonce_s = nonce()?;
    let mut challenge = nonce_s.to_vec();
    challenge.extend_from_slice(
        &server_proof(secret, nonce_c, &nonce_s, claims)?
            .finalize()
            .into_bytes(),
    );
    write_frame(stream, Kind::Challenge, &challenge, until)?;
    let (kind, proof) = read_frame(stream, until, "reading a peer's proof", started)?;
    if kind != Kind::Proof || proof.len() != TAG {
        return Err(RendezvousError::Malformed("expected a proof"));
    }
    let refuse = |stream: &mut TcpStream, why: RendezvousError| {
        send_reject(stream, secret, nonce_c, &nonce_s, &why, until);
        Err(why)
    };
    if client_proof(secret, &nonce_s, nonce_c, claims)?
        .verify_slice(&proof)
        .is_err()
    {
        return refuse(stream, RendezvousError::BadSecret);
    }
    // Authenticated: now the claims may be trusted enough to answer them.
    if peer_world != world {
        return refuse(
            stream,
            RendezvousError::WorldSizeMismatch {
                expected: world,
                got: peer_world,
            },
        );
    }
    if let Err(why) = claim(rank) {
        return refuse(stream, why);
    }
    let sealed = id_cipher(secret, &nonce_s, nonce_c, claims)?
        .encrypt(
            Nonce::from_slice(&[0u8; 12]),
            Payload {
                msg: id.as_bytes(),
                aad: &id_aad(claims),
            },
        )
        .map_err(|_| LivenessError::Crypto)?;
    if let Err(e) = write_frame(stream, Kind::Id, &sealed, until) {
        unclaim(rank);
        return Err(e);
    }
    Ok(Served {
        rank,
        nonce_c: nonce_c.to_vec(),
        nonce_s,
    })
}

/// A joining rank's side: connects to `addr` (retrying until `timeout`),
/// proves it knows the secret and receives the id.
pub fn join(
    addr: impl ToSocketAddrs,
    rank: usize,
    world: usize,
    secret: &Secret,
    timeout: Duration,
) -> Result<UniqueId> {
    join_stream(addr, rank, world, secret, Instant::now(), timeout).map(|j| j.id)
}

/// A joining rank's side with the liveness channel: as [`join`], then
/// the connection stays open as this rank's liveness connection to rank 0
/// (see [`crate::liveness`]). Fails with [`LivenessError::NotAttached`]
/// when rank 0 does not keep it (liveness off there). With `options`
/// disabled this is [`join`] plus a channel that only knows local reports.
pub fn join_live(
    addr: impl ToSocketAddrs,
    rank: usize,
    world: usize,
    secret: &Secret,
    timeout: Duration,
    options: &LivenessOptions,
) -> Result<(UniqueId, Liveness)> {
    let started = Instant::now();
    if !options.is_enabled() {
        let id = join(addr, rank, world, secret, timeout)?;
        return Ok((id, Liveness::off(world, rank)));
    }
    let joined = join_stream(addr, rank, world, secret, started, timeout)?;
    let id = joined.id;
    // Where this rank would take over as hub: the interface it reached
    // rank 0 by, any port. Without it this rank cannot take over, but is
    // still watched.
    // A member that reached rank 0 over loopback listens on every
    // interface: ranks on other hosts reach it by the address rank 0 has
    // for this host, which rank 0 puts in the roster instead.
    let local = joined.stream.local_addr()?.ip();
    let bind_ip = match local {
        IpAddr::V4(a) if a.is_loopback() => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(a) if a.is_loopback() => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        other => other,
    };
    let takeover = TcpListener::bind((bind_ip, 0))
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .inspect_err(|e| tracing::warn!(error = %e, "liveness: no takeover listener"))
        .ok();
    let listen = takeover
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| SocketAddr::new(local, a.port()));
    let until = (started + timeout).min(Instant::now() + PEER_TIMEOUT);
    let link = attach_to_hub(joined, 0, rank, world, secret, listen, until)?;
    let takeover = takeover.map(|listener| Takeover {
        listener,
        secret: secret.clone(),
        id,
    });
    let live = start_member(world, rank, link, options, takeover)?;
    Ok((id, live))
}

/// A member's side after the handshake: `Attach` (with its takeover
/// address), then rank 0's `Attached`, by `until`. Not retried: the hub
/// already handed out the id.
fn attach_to_hub(
    joined: Joined,
    hub: usize,
    rank: usize,
    world: usize,
    secret: &Secret,
    listen: Option<SocketAddr>,
    until: Instant,
) -> Result<Link> {
    let Joined {
        mut stream,
        nonce_c,
        nonce_s,
        ..
    } = joined;
    let started = Instant::now();
    let key = session_key(secret, &nonce_s, &nonce_c, rank, world)?;
    let mut sealer = Sealer::new(key.clone(), Dir::Up);
    let mut opener = Opener::new(key, Dir::Down, world);
    let not_attached = |detail: String| LivenessError::NotAttached { rank, detail };
    write_bytes(&mut stream, &sealer.seal(&Msg::Attach { listen })?, until)
        .map_err(|e| not_attached(format!("sending the attach: {e}")))?;
    let (kind, payload) = read_raw_frame(
        &mut stream,
        until,
        "waiting for the hub's attached",
        started,
    )
    .map_err(|e| {
        not_attached(format!(
            "the hub did not keep the connection (liveness off there?): {e}"
        ))
    })?;
    match opener.open(kind, &payload)? {
        Msg::Attached => {}
        _ => {
            return Err(
                not_attached("the hub answered the attach with something else".into()).into(),
            );
        }
    }
    Ok(Link::new(hub, true, stream, sealer, opener)?)
}

/// What a joining rank takes from a finished handshake.
struct Joined {
    id: UniqueId,
    stream: TcpStream,
    nonce_c: [u8; NONCE],
    nonce_s: Vec<u8>,
}

fn join_stream(
    addr: impl ToSocketAddrs,
    rank: usize,
    world: usize,
    secret: &Secret,
    started: Instant,
    timeout: Duration,
) -> Result<Joined> {
    let deadline = started + timeout;
    if rank == 0 || rank >= world {
        return Err(RendezvousError::RankOutOfRange { rank, world });
    }
    let _span = tracing::debug_span!("nccl.rendezvous_join", rank, world).entered();
    let mut pause = Duration::from_millis(10);
    // What the last attempts ran into, for the error at the deadline.
    let mut unauthenticated = false;
    let mut last: Option<RendezvousError> = None;
    loop {
        if deadline_left(deadline, "connecting to rank 0", started).is_err() {
            return Err(at_deadline(unauthenticated, last, started));
        }
        // Resolved on every attempt: a name may not resolve yet when the
        // job starts (a failure here is retried like a refused connection).
        let (addrs, unresolved) = match addr.to_socket_addrs() {
            Ok(a) => (a.collect::<Vec<SocketAddr>>(), None),
            Err(e) => (Vec::new(), Some(e)),
        };
        // Each address gets what is left of the deadline (at most 2 s).
        let connected = addrs.iter().find_map(|a| {
            let left = deadline.checked_duration_since(Instant::now())?;
            TcpStream::connect_timeout(a, left.min(Duration::from_secs(2))).ok()
        });
        let attempt_until = deadline.min(Instant::now() + PEER_TIMEOUT);
        let outcome = match connected {
            Some(mut stream) => {
                handshake_client(&mut stream, rank, world, secret, attempt_until, started).map(
                    |(id, nonce_c, nonce_s)| Joined {
                        id,
                        stream,
                        nonce_c,
                        nonce_s,
                    },
                )
            }
            None => {
                Err(RendezvousError::Io(unresolved.unwrap_or_else(|| {
                    std::io::ErrorKind::ConnectionRefused.into()
                })))
            }
        };
        match outcome {
            Ok(joined) => return Ok(joined),
            // Anything that did not come from a holder of the secret is
            // retried until the deadline: rank 0 may not be listening yet
            // or be restarting, and a stranger on the port must not be
            // able to end the join.
            Err(e) if retryable(&e) => {
                if matches!(e, RendezvousError::Unauthenticated { .. }) {
                    if !unauthenticated {
                        tracing::warn!(
                            rank,
                            "rendezvous: the listener did not prove the shared secret; retrying until the deadline (a different secret on one side, or not this job's rank 0)"
                        );
                    }
                    unauthenticated = true;
                }
                last = Some(e);
                let Ok(left) = deadline_left(deadline, "connecting to rank 0", started) else {
                    return Err(at_deadline(unauthenticated, last, started));
                };
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The error a join ends with when its deadline passes: the most telling
/// of what the attempts saw, in our own words.
fn at_deadline(
    unauthenticated: bool,
    last: Option<RendezvousError>,
    started: Instant,
) -> RendezvousError {
    let waited = started.elapsed();
    if unauthenticated {
        return RendezvousError::Unauthenticated { waited };
    }
    match last {
        Some(RendezvousError::Version { got }) => RendezvousError::Version { got },
        Some(RendezvousError::Malformed(what)) => RendezvousError::Timeout {
            phase: format!("connecting to rank 0 (the last answer was refused: {what})"),
            waited,
        },
        Some(RendezvousError::Io(e)) => RendezvousError::Timeout {
            phase: format!("connecting to rank 0 (last attempt: {})", e.kind()),
            waited,
        },
        _ => RendezvousError::Timeout {
            phase: "connecting to rank 0".into(),
            waited,
        },
    }
}

fn retryable(e: &RendezvousError) -> bool {
    use std::io::ErrorKind::*;
    match e {
        // A name that does not resolve (yet) comes back as `Uncategorized`
        // or `Other` from the system resolver: retried as well.
        RendezvousError::Io(io) => {
            matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | BrokenPipe
                    | UnexpectedEof
                    | NotFound
                    | HostUnreachable
                    | NetworkUnreachable
                    | TimedOut
                    | Other
            ) || (io.raw_os_error().is_none() && io.kind() != InvalidInput)
        }
        RendezvousError::Malformed(_)
        | RendezvousError::Version { .. }
        | RendezvousError::Unauthenticated { .. }
        | RendezvousError::Timeout { .. } => true,
        _ => false,
    }
}

/// A joining rank's side of one handshake (module docs, steps 1 to 4),
/// by `until`.
fn handshake_client(
    stream: &mut TcpStream,
    rank: usize,
    world: usize,
    secret: &Secret,
    until: Instant,
    started: Instant,
) -> Result<(UniqueId, [u8; NONCE], Vec<u8>)> {
    let nonce_c = nonce()?;
    let mut claims = be32(rank).to_vec();
    claims.extend_from_slice(&be32(world));
    let mut hello = claims.clone();
    hello.extend_from_slice(&nonce_c);
    write_frame(stream, Kind::Hello, &hello, until)?;
    let (kind, challenge) = read_frame(stream, until, "waiting for rank 0's challenge", started)?;
    if kind != Kind::Challenge || challenge.len() != NONCE + TAG {
        return Err(RendezvousError::Malformed("expected a challenge"));
    }
    let (nonce_s, their_proof) = challenge.split_at(NONCE);
    server_proof(secret, &nonce_c, nonce_s, &claims)?
        .verify_slice(their_proof)
        .map_err(|_| RendezvousError::Unauthenticated {
            waited: started.elapsed(),
        })?;
    let proof = client_proof(secret, nonce_s, &nonce_c, &claims)?
        .finalize()
        .into_bytes();
    write_frame(stream, Kind::Proof, &proof, until)?;
    let (kind, answer) = read_frame(stream, until, "waiting for the id", started)?;
    match kind {
        Kind::Id if answer.len() == SEALED_ID => {
            let opened = id_cipher(secret, nonce_s, &nonce_c, &claims)?
                .decrypt(
                    Nonce::from_slice(&[0u8; 12]),
                    Payload {
                        msg: &answer,
                        aad: &id_aad(&claims),
                    },
                )
                .map_err(|_| RendezvousError::Malformed("the id failed authentication"))?;
            let mut bytes = [0u8; UniqueId::BYTES];
            bytes.copy_from_slice(&opened);
            Ok((UniqueId::from_bytes(bytes), nonce_c, nonce_s.to_vec()))
        }
        Kind::Reject if answer.len() == 9 + TAG => {
            let (body, tag) = answer.split_at(9);
            reject_tag(secret, &nonce_c, nonce_s, body)?
                .verify_slice(tag)
                .map_err(|_| RendezvousError::Malformed("an unauthenticated reject"))?;
            let a = u32::from_be_bytes([body[1], body[2], body[3], body[4]]);
            let b = u32::from_be_bytes([body[5], body[6], body[7], body[8]]);
            Err(RendezvousError::Rejected(Box::new(reject_reason(
                body[0], a, b,
            ))))
        }
        Kind::Reject => Err(RendezvousError::Malformed("an unauthenticated reject")),
        _ => Err(RendezvousError::Malformed("expected the id")),
    }
}
