//! A joining rank's entry points: [`join`] and [`join_live`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::time::{Duration, Instant};

use nccl_sys::ncclUniqueId as UniqueId;

use crate::frame::{PEER_TIMEOUT, Result, deadline_after};
use crate::handshake::connect::{attach_to_hub, decline_attach, join_stream};
use crate::liveness::{Liveness, LivenessOptions, Takeover, start_member};
use crate::secret::Secret;
/// A joining rank's side: connects to `addr` (retrying until `timeout`),
/// proves it knows the secret and receives the id. It keeps no liveness
/// connection, and says so before it closes: a rank 0 that watches ranks
/// ([`serve_live`](crate::rendezvous::serve_live)) then does not count it
/// as lost, as it does a rank that took the id and vanished.
pub fn join(
    addr: impl ToSocketAddrs,
    rank: usize,
    world: usize,
    secret: &Secret,
    timeout: Duration,
) -> Result<UniqueId> {
    let joined = join_stream(addr, rank, world, secret, Instant::now(), timeout)?;
    let id = joined.id;
    decline_attach(joined, rank, world, secret);
    Ok(id)
}

/// A joining rank's side with the liveness channel: as [`join`], then
/// the connection stays open as this rank's liveness connection to rank 0
/// (see [`crate::liveness`]). Fails with [`LivenessError::NotAttached`](crate::liveness::LivenessError::NotAttached)
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
    let until = deadline_after(started, timeout).min(Instant::now() + PEER_TIMEOUT);
    let link = attach_to_hub(joined, 0, rank, world, secret, listen, until)?;
    let takeover = takeover.map(|listener| Takeover {
        listener,
        secret: secret.clone(),
        id,
    });
    let live = start_member(world, rank, link, options, takeover)?;
    Ok((id, live))
}
