//! A joining rank's side of one connection: connecting and retrying by
//! the deadline, the handshake, the liveness attach, and a member's
//! attach to a takeover hub.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use hmac::Mac;
use nccl_sys::ncclUniqueId as UniqueId;

use crate::frame::{
    Kind, NONCE, PEER_TIMEOUT, RendezvousError, Result, SEALED_ID, check_fits, deadline_after,
    deadline_left, read_frame, read_raw_frame, write_bytes, write_frame,
};
use crate::handshake::auth::{
    CHALLENGE, claims, hello, nonce, open_id, open_reject, proof, server_proof,
};
use crate::link::Link;
use crate::loss::LivenessError;
use crate::secret::Secret;
use crate::wire::{Dir, Msg, Opener, Sealer, session_key};

/// A member whose hub was lost: the rendezvous handshake with the rank
/// taking over at `addr`, which must hand out the same `id`, then the
/// attach, naming `listen` as where this member takes over in turn.
#[allow(clippy::too_many_arguments)]
pub(crate) fn takeover_connect(
    addr: SocketAddr,
    hub: usize,
    rank: usize,
    world: usize,
    secret: &Secret,
    id: &UniqueId,
    listen: Option<SocketAddr>,
    timeout: Duration,
) -> Result<Link> {
    let started = Instant::now();
    let joined = join_stream(addr, rank, world, secret, started, timeout)?;
    if joined.id != *id {
        return Err(RendezvousError::Malformed(
            "the new hub has another job's id",
        ));
    }
    attach_to_hub(
        joined,
        hub,
        rank,
        world,
        secret,
        listen,
        deadline_after(started, timeout),
    )
}

/// A member's side after the handshake: `Attach` (with its takeover
/// address), then rank 0's `Attached`, by `until`. Not retried: the hub
/// already handed out the id.
pub(crate) fn attach_to_hub(
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

/// A member that keeps no liveness connection (liveness off on its side,
/// or a plain [`join`](crate::rendezvous::join)): tells the hub so with a
/// sealed `Goodbye` in place of the attach, then closes. A hub that
/// watches ranks then knows that this rank chose not to be watched, and
/// counts a connection that closes without either as a rank that took the
/// id and was lost. Best effort: a hub that does not watch has closed its
/// side already.
pub(crate) fn decline_attach(joined: Joined, rank: usize, world: usize, secret: &Secret) {
    let Joined {
        mut stream,
        nonce_c,
        nonce_s,
        ..
    } = joined;
    let sealed = session_key(secret, &nonce_s, &nonce_c, rank, world)
        .and_then(|key| Sealer::new(key, Dir::Up).seal(&Msg::Goodbye));
    if let Ok(bytes) = sealed {
        let _ = write_bytes(&mut stream, &bytes, Instant::now() + DECLINE_WRITE);
    }
}

/// How long [`decline_attach`] may take to write its goodbye: a few
/// dozen bytes into an empty socket buffer.
const DECLINE_WRITE: Duration = Duration::from_millis(200);

/// What a joining rank takes from a finished handshake.
pub(crate) struct Joined {
    pub(crate) id: UniqueId,
    pub(crate) stream: TcpStream,
    nonce_c: [u8; NONCE],
    nonce_s: Vec<u8>,
}

pub(crate) fn join_stream(
    addr: impl ToSocketAddrs,
    rank: usize,
    world: usize,
    secret: &Secret,
    started: Instant,
    timeout: Duration,
) -> Result<Joined> {
    let deadline = deadline_after(started, timeout);
    check_fits(rank, world)?;
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
    let claims = claims(rank, world);
    write_frame(stream, Kind::Hello, &hello(&claims, &nonce_c), until)?;
    let (kind, challenge) = read_frame(stream, until, "waiting for rank 0's challenge", started)?;
    if kind != Kind::Challenge || challenge.len() != CHALLENGE {
        return Err(RendezvousError::Malformed("expected a challenge"));
    }
    let (nonce_s, their_proof) = challenge.split_at(NONCE);
    server_proof(secret, &nonce_c, nonce_s, &claims)?
        .verify_slice(their_proof)
        .map_err(|_| RendezvousError::Unauthenticated {
            waited: started.elapsed(),
        })?;
    let proof = proof(secret, nonce_s, &nonce_c, &claims)?;
    write_frame(stream, Kind::Proof, &proof, until)?;
    let (kind, answer) = read_frame(stream, until, "waiting for the id", started)?;
    match kind {
        Kind::Id if answer.len() == SEALED_ID => {
            let id = open_id(secret, nonce_s, &nonce_c, &claims, &answer)?;
            Ok((id, nonce_c, nonce_s.to_vec()))
        }
        Kind::Reject => Err(open_reject(secret, &nonce_c, nonce_s, &answer)),
        _ => Err(RendezvousError::Malformed("expected the id")),
    }
}
