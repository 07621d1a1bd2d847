//! Rank 0's accept loop: [`serve`] and [`serve_live`], a handshake
//! thread per connection, and which ranks were served.

use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use nccl_sys::ncclUniqueId as UniqueId;

use crate::frame::{
    MAX_HANDSHAKES, MAX_REFUSED, PEER_TIMEOUT, RendezvousError, Result, check_fits, deadline_after,
    deadline_left,
};
use crate::handshake::accept::{Attach, Served, attach_member, handshake_server};
use crate::liveness::{Liveness, LivenessOptions, start_hub};
use crate::loss::LivenessError;
use crate::secret::Secret;
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
/// reported. A served rank that says it keeps no liveness connection
/// (liveness off on its side: it says goodbye instead of attaching) has
/// the id but is not watched; its error is in the returned list. A served
/// rank that neither attaches nor says so (it died, or its connection
/// broke, between taking the id and attaching) is reported lost, as after
/// the attach: the others may already be waiting for it in NCCL. On an
/// error, the ranks already attached see rank 0 as lost. With `options`
/// disabled this is [`serve`] plus a channel that only knows local
/// reports.
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
            let rank = served.rank();
            match attach_member(stream, served, world, secret, until) {
                Ok(Attach::Kept(link, listen)) => {
                    live.add_link(*link, listen, seen);
                    None
                }
                Ok(Attach::Declined) => Some(
                    LivenessError::NotAttached {
                        rank,
                        detail: "liveness is off on its side; it is not watched".into(),
                    }
                    .into(),
                ),
                // It has the id, so the others may already wait for it in
                // NCCL: a loss, not a refusal.
                Err(e) => {
                    live.lost_before_attach(rank, &e);
                    Some(e)
                }
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

/// The least time a served rank's attach is given from when rank 0 turns
/// to it ([`serve_live`] keeps ranks one at a time).
const ATTACH_GRACE: Duration = Duration::from_secs(1);

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
    let deadline = deadline_after(started, timeout);
    check_fits(0, world)?;
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
            // Ranks are kept one at a time: one whose attach already
            // waits must not run out of time behind a slow one, and be
            // reported lost for it.
            let until = until.max(Instant::now() + ATTACH_GRACE).min(deadline);
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::handshake::connect::join_stream;
    use crate::liveness::LossCause;
    use crate::rendezvous::join;

    fn secret() -> Secret {
        Secret::from_bytes(vec![7; 32], "test").expect("long enough")
    }

    fn id() -> UniqueId {
        UniqueId::from_bytes([3; nccl_sys::NCCL_UNIQUE_ID_BYTES])
    }

    /// What `serve_live` returns.
    type HubResult = Result<(Liveness, Vec<RendezvousError>)>;

    /// Rank 0 of a world of two watching ranks, on its own thread.
    fn hub() -> (std::net::SocketAddr, std::thread::JoinHandle<HubResult>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let options = LivenessOptions::new().heartbeat(Duration::from_millis(50));
        let hub = std::thread::spawn(move || {
            serve_live(&l, 2, &secret(), &id(), Duration::from_secs(10), &options)
        });
        (addr, hub)
    }

    #[test]
    fn a_rank_that_takes_the_id_and_vanishes_before_its_attach_is_lost() {
        let (addr, hub) = hub();
        let started = Instant::now();
        // The handshake, then the connection closes with no attach and no
        // goodbye: what a rank killed in between leaves.
        let joined = join_stream(addr, 1, 2, &secret(), started, Duration::from_secs(10))
            .expect("handshake");
        assert_eq!(joined.id, id());
        drop(joined);
        let (live, refused) = hub
            .join()
            .expect("thread")
            .expect("the rendezvous completes");
        assert_eq!(refused.len(), 1, "{refused:?}");
        let losses = live.losses();
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert_eq!((losses[0].rank, losses[0].seen_by), (1, 0));
        assert!(
            matches!(&losses[0].cause, LossCause::Exited { reason } if reason.contains("attach")),
            "{losses:?}"
        );
        // Known at once, not at a deadline.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_rank_without_liveness_says_so_and_is_not_lost() {
        let (addr, hub) = hub();
        assert_eq!(
            join(addr, 1, 2, &secret(), Duration::from_secs(10)).expect("join"),
            id()
        );
        let (live, refused) = hub
            .join()
            .expect("thread")
            .expect("the rendezvous completes");
        assert!(
            matches!(
                refused.as_slice(),
                [RendezvousError::Liveness(LivenessError::NotAttached { rank: 1, detail })]
                    if detail.contains("off on its side")
            ),
            "{refused:?}"
        );
        assert!(live.losses().is_empty(), "{:?}", live.losses());
        assert!(!live.is_lost(1));
    }
}
