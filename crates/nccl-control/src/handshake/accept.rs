//! Rank 0's side of one connection (module docs of [`crate::rendezvous`],
//! steps 1 to 5): the handshake, the liveness attach, and a takeover
//! hub's acceptance of a member.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hmac::Mac;
use nccl_sys::ncclUniqueId as UniqueId;

use crate::loss::LivenessError;

use crate::frame::{
    HELLO_TIMEOUT, Kind, NONCE, RendezvousError, Result, TAG, read_frame, read_raw_frame,
    write_bytes, write_frame,
};
use crate::handshake::auth::{challenge, client_proof, nonce, read_hello, reject, seal_id};
use crate::link::Link;
use crate::secret::Secret;
use crate::wire::{Dir, Msg, Opener, Sealer, session_key};
/// What rank 0 knows of a rank it served.
pub(crate) struct Served {
    rank: usize,
    nonce_c: Vec<u8>,
    nonce_s: [u8; NONCE],
}

impl Served {
    /// The rank it proved it is.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }
}

/// How a served rank answered the hub's wait for its attach.
pub(crate) enum Attach {
    /// It attached: its link, and where it listens for a takeover.
    Kept(Box<Link>, Option<SocketAddr>),
    /// It said goodbye instead: liveness is off on its side, and it is not
    /// watched.
    Declined,
}

/// The hub's side: waits for a served rank's `Attach` and answers
/// `Attached`. An error means the rank took the id and then failed to
/// attach (it died, closed, stayed silent or sent garbage).
pub(crate) fn attach_member(
    mut stream: TcpStream,
    served: Served,
    world: usize,
    secret: &Secret,
    until: Instant,
) -> Result<Attach> {
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
        Msg::Goodbye => return Ok(Attach::Declined),
        _ => return Err(not_attached("the first frame was not an attach".into()).into()),
    };
    write_bytes(&mut stream, &sealer.seal(&Msg::Attached)?, until)?;
    Ok(Attach::Kept(
        Box::new(Link::new(rank, false, stream, sealer, opener)?),
        listen,
    ))
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
    let rank = served.rank;
    match attach_member(stream, served, world, secret, until)? {
        Attach::Kept(link, _) => Ok(*link),
        // Only members that watch come to a takeover hub.
        Attach::Declined => Err(LivenessError::NotAttached {
            rank,
            detail: "it said goodbye instead of attaching to the new hub".into(),
        }
        .into()),
    }
}

/// How long a takeover handshake may take on the accepting side.
const TAKEOVER_HANDSHAKE: Duration = Duration::from_secs(2);

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
    if let Ok(payload) = reject(secret, nonce_c, nonce_s, why) {
        let _ = write_frame(stream, Kind::Reject, &payload, until);
    }
}

/// Rank 0's side of one handshake (module docs, steps 1 to 4). `claim`
/// decides whether the (authenticated) rank may have the id and takes
/// it; `unclaim` gives it back when the id could not be sent.
#[allow(clippy::too_many_arguments)]
pub(crate) fn handshake_server(
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
    let (rank, peer_world, claims, nonce_c) = read_hello(&hello)
        .filter(|_| kind == Kind::Hello)
        .ok_or(RendezvousError::Malformed("expected a hello"))?;
    let nonce_s = nonce()?;
    let challenge = challenge(secret, nonce_c, &nonce_s, claims)?;
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
    let sealed = seal_id(secret, &nonce_s, nonce_c, claims, id)?;
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
