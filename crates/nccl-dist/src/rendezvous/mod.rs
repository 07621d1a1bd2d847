//! Handing rank 0's [`UniqueId`] to every rank, over TCP or a shared file,
//! and (over TCP) keeping each authenticated connection as that rank's
//! liveness connection.
//!
//! # TCP protocol (version 1)
//!
//! Every message is a frame: the magic `NCRV`, the protocol version (u16),
//! a kind (u8), a payload length (u32, at most [`MAX_PAYLOAD`]) and the
//! payload; integers are big-endian.
//!
//! 1. the joining rank sends `Hello { rank, world, nonce_c }`;
//! 2. rank 0 answers `Challenge { nonce_s }`;
//! 3. the joining rank sends `Proof { HMAC-SHA256(secret, "nccl-rs proof" ‖ nonce_s ‖ nonce_c ‖ rank ‖ world) }`;
//! 4. rank 0 checks the proof, the world size and that the rank is new,
//!    then sends `Id { id, HMAC(secret, "nccl-rs id" ‖ nonce_c ‖ id) }`, so
//!    the joining rank knows the id came from someone with the secret; or
//!    `Reject { reason }`.
//!
//! 5. with the liveness channel ([`serve_live`], [`join_live`]), the
//!    connection is not closed: the joining rank sends `Attach` and rank 0
//!    answers `Attached`, both already MACed with a session key derived
//!    from the secret and both nonces; from then on it carries heartbeats
//!    and losses. Those frames and the key derivation are described in
//!    [`crate::liveness`]. The handshake bytes above are the same either
//!    way, so the version stays 1.
//!
//! Rank 0 never sends the id before a valid proof. Each connection is read
//! with a short deadline, so a peer that connects and says nothing delays
//! the others by at most [`PEER_TIMEOUT`]; the whole rendezvous has its own
//! deadline on both sides. Nothing here panics on bad input.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use nccl_safe::UniqueId;
use sha2::Sha256;

use crate::liveness::wire::{Dir, Msg, Opener, Sealer, session_key};
use crate::liveness::{
    Link, Liveness, LivenessError, LivenessOptions, Takeover, start_hub, start_member,
};
use crate::secret::Secret;

mod file;
pub use file::{decode_file, publish_file, wait_file};

/// Protocol version on the wire.
pub const PROTOCOL_VERSION: u16 = 1;
/// Largest payload a frame may carry.
pub const MAX_PAYLOAD: u32 = 1024;
/// How long rank 0 waits for one connected peer's next frame.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(5);
const MAGIC: &[u8; 4] = b"NCRV";
const NONCE: usize = 32;
const TAG: usize = 32;

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
    /// Rank 0 refused this rank.
    #[error("rank 0 rejected this rank: {0}")]
    Rejected(String),
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

fn write_frame(stream: &mut TcpStream, kind: Kind, payload: &[u8]) -> Result<()> {
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    stream.write_all(&encode_frame(kind as u8, payload))?;
    Ok(())
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
    let mut served: BTreeSet<usize> = BTreeSet::new();
    let mut refused = Vec::new();
    let _span = tracing::debug_span!("nccl.rendezvous_serve", world).entered();
    while served.len() + 1 < world {
        let (mut stream, _) = match listener.accept() {
            Ok(conn) => conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                deadline_left(
                    deadline,
                    &format!(
                        "waiting for ranks (served {} of {})",
                        served.len(),
                        world - 1
                    ),
                    started,
                )?;
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        stream.set_nonblocking(false)?;
        let peer_deadline = deadline.min(Instant::now() + PEER_TIMEOUT);
        let accept = |rank: usize| {
            if rank == 0 || rank >= world {
                return Err(RendezvousError::RankOutOfRange { rank, world });
            }
            if served.contains(&rank) {
                return Err(RendezvousError::DuplicateRank { rank });
            }
            Ok(())
        };
        match handshake_server(
            &mut stream,
            world,
            secret,
            id,
            &accept,
            peer_deadline,
            started,
        ) {
            Ok(who) => {
                served.insert(who.rank);
                if let Some(e) = keep(stream, who, peer_deadline) {
                    tracing::debug!(error = %e, "rendezvous: no liveness connection");
                    refused.push(e);
                }
            }
            Err(e) => {
                let _ = write_frame(&mut stream, Kind::Reject, e.to_string().as_bytes());
                tracing::debug!(error = %e, "rendezvous peer refused");
                refused.push(e);
            }
        }
    }
    Ok(refused)
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
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    stream.write_all(&sealer.seal(&Msg::Attached)?)?;
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
    let served = handshake_server(&mut stream, world, secret, id, accept, until, started)?;
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

fn handshake_server(
    stream: &mut TcpStream,
    world: usize,
    secret: &Secret,
    id: &UniqueId,
    accept: &dyn Fn(usize) -> Result<()>,
    until: Instant,
    started: Instant,
) -> Result<Served> {
    let (kind, hello) = read_frame(stream, until, "reading a peer's hello", started)?;
    if kind != Kind::Hello || hello.len() != 8 + NONCE {
        return Err(RendezvousError::Malformed("expected a hello"));
    }
    let rank = u32::from_be_bytes([hello[0], hello[1], hello[2], hello[3]]) as usize;
    let peer_world = u32::from_be_bytes([hello[4], hello[5], hello[6], hello[7]]) as usize;
    let nonce_c = &hello[8..];
    let nonce_s = nonce()?;
    write_frame(stream, Kind::Challenge, &nonce_s)?;
    let (kind, proof) = read_frame(stream, until, "reading a peer's proof", started)?;
    if kind != Kind::Proof || proof.len() != TAG {
        return Err(RendezvousError::Malformed("expected a proof"));
    }
    mac(
        secret,
        &[
            b"nccl-rs proof",
            &nonce_s,
            nonce_c,
            &hello[..4],
            &hello[4..8],
        ],
    )?
    .verify_slice(&proof)
    .map_err(|_| RendezvousError::BadSecret)?;
    // Authenticated: now the claims may be trusted enough to answer them.
    if peer_world != world {
        return Err(RendezvousError::WorldSizeMismatch {
            expected: world,
            got: peer_world,
        });
    }
    accept(rank)?;
    let tag = mac(secret, &[b"nccl-rs id", nonce_c, id.as_bytes()])?
        .finalize()
        .into_bytes();
    let mut payload = id.as_bytes().to_vec();
    payload.extend_from_slice(&tag);
    write_frame(stream, Kind::Id, &payload)?;
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
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    stream
        .write_all(&sealer.seal(&Msg::Attach { listen })?)
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
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    let _span = tracing::debug_span!("nccl.rendezvous_join", rank, world).entered();
    let mut pause = Duration::from_millis(10);
    loop {
        let left = deadline_left(deadline, "connecting to rank 0", started)?;
        let connected = addrs
            .iter()
            .find_map(|a| TcpStream::connect_timeout(a, left.min(Duration::from_secs(2))).ok());
        let outcome = match connected {
            Some(mut stream) => {
                handshake_client(&mut stream, rank, world, secret, deadline, started).map(
                    |(id, nonce_c, nonce_s)| Joined {
                        id,
                        stream,
                        nonce_c,
                        nonce_s,
                    },
                )
            }
            None => Err(RendezvousError::Io(
                std::io::ErrorKind::ConnectionRefused.into(),
            )),
        };
        match outcome {
            // A dropped or refused connection is retried until the deadline:
            // rank 0 may not be listening yet, or be restarting.
            Err(e) if retryable(&e) => {
                std::thread::sleep(pause.min(deadline_left(
                    deadline,
                    "connecting to rank 0",
                    started,
                )?));
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

fn retryable(e: &RendezvousError) -> bool {
    use std::io::ErrorKind::*;
    match e {
        RendezvousError::Io(io) => matches!(
            io.kind(),
            ConnectionRefused | ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
        ),
        RendezvousError::Malformed("connection closed mid-frame") => true,
        _ => false,
    }
}

fn handshake_client(
    stream: &mut TcpStream,
    rank: usize,
    world: usize,
    secret: &Secret,
    deadline: Instant,
    started: Instant,
) -> Result<(UniqueId, [u8; NONCE], Vec<u8>)> {
    let nonce_c = nonce()?;
    let mut hello = be32(rank).to_vec();
    hello.extend_from_slice(&be32(world));
    hello.extend_from_slice(&nonce_c);
    write_frame(stream, Kind::Hello, &hello)?;
    let (kind, challenge) =
        read_frame(stream, deadline, "waiting for rank 0's challenge", started)?;
    match kind {
        Kind::Challenge if challenge.len() == NONCE => {}
        Kind::Reject => {
            return Err(RendezvousError::Rejected(
                String::from_utf8_lossy(&challenge).into_owned(),
            ));
        }
        _ => return Err(RendezvousError::Malformed("expected a challenge")),
    }
    let proof = mac(
        secret,
        &[
            b"nccl-rs proof",
            &challenge,
            &nonce_c,
            &be32(rank),
            &be32(world),
        ],
    )?
    .finalize()
    .into_bytes();
    write_frame(stream, Kind::Proof, &proof)?;
    let (kind, answer) = read_frame(stream, deadline, "waiting for the id", started)?;
    match kind {
        Kind::Id if answer.len() == UniqueId::BYTES + TAG => {
            let (id_bytes, tag) = answer.split_at(UniqueId::BYTES);
            mac(secret, &[b"nccl-rs id", &nonce_c, id_bytes])?
                .verify_slice(tag)
                .map_err(|_| RendezvousError::BadSecret)?;
            let mut bytes = [0u8; UniqueId::BYTES];
            bytes.copy_from_slice(id_bytes);
            Ok((UniqueId::from_bytes(bytes), nonce_c, challenge))
        }
        Kind::Reject => Err(RendezvousError::Rejected(
            String::from_utf8_lossy(&answer).into_owned(),
        )),
        _ => Err(RendezvousError::Malformed("expected the id")),
    }
}
