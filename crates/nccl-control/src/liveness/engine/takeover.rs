//! Rank-0 takeover: when a member loses its hub, the lowest live rank in
//! the roster becomes the hub and the other survivors attach to it, with
//! the rendezvous handshake again (both sides prove the secret; the new hub
//! proves it has the job's id). Handshakes run on short-lived helper
//! threads, at most `world` at once, so a stranger that connects and says
//! nothing cannot stall the watch.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nccl_sys::ncclUniqueId as UniqueId;

use super::{LossCause, PeerLoss, Shared, THREAD_NAME, lock};
use crate::frame::RendezvousError;
use crate::handshake::accept::takeover_accept;
use crate::handshake::connect::takeover_connect;
use crate::secret::Secret;

/// How long a member tries to reach the next hub before counting it lost.
const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(1);

/// What a member needs to take over as hub or join the one that did.
pub(crate) struct Takeover {
    /// Its listener (non-blocking), whose address is in the roster.
    pub(crate) listener: TcpListener,
    /// The job's secret.
    pub(crate) secret: Secret,
    /// The job's unique id (a new hub proves it has the same one).
    pub(crate) id: UniqueId,
}

/// Runs `work` on a short-lived helper thread, at most `world` at once
/// (a flood of connections cannot make more).
/// `capped` work counts against that bound; the search for the next hub
/// does not, so strangers cannot hold it off. False when no thread started.
pub(super) fn helper(shared: &Arc<Shared>, work: fn(&Shared), capped: bool) -> bool {
    if capped && shared.handshakes.fetch_add(1, Ordering::AcqRel) >= shared.world {
        shared.handshakes.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    let s = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name(THREAD_NAME.into())
        .spawn(move || {
            work(&s);
            if capped {
                s.handshakes.fetch_sub(1, Ordering::AcqRel);
            }
        });
    if spawned.is_err() && capped {
        shared.handshakes.fetch_sub(1, Ordering::AcqRel);
    }
    spawned.is_ok()
}

/// Accepts every pending takeover connection, each handshake on a helper
/// thread (a stranger that says nothing must not stall the watch).
pub(super) fn accept_all(shared: &Arc<Shared>) {
    let Some(t) = &shared.takeover else {
        return;
    };
    loop {
        let stream = match t.listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors, say: the connection stays queued and
                // `poll` would report it again at once; pause instead of
                // spinning.
                tracing::warn!(error = %e, "liveness: accepting a takeover connection failed");
                std::thread::sleep(Duration::from_millis(10));
                return;
            }
        };
        let mut pending = lock(&shared.pending);
        if pending.len() >= shared.world {
            continue;
        }
        pending.push(stream);
        drop(pending);
        helper(shared, accept_member, true);
    }
}

/// A helper: authenticates one member that comes to this rank as its new
/// hub, and watches it.
fn accept_member(shared: &Shared) {
    let Some(stream) = lock(&shared.pending).pop() else {
        return;
    };
    let (Some(t), Some(me)) = (&shared.takeover, shared.rank) else {
        return;
    };
    let has_link = |r: usize| shared.links().iter().any(|l| l.peer == r && !l.to_hub);
    let accept = |r: usize| -> Result<(), RendezvousError> {
        if r >= shared.world || r == me || shared.is_lost(r) || has_link(r) {
            return Err(RendezvousError::RankOutOfRange {
                rank: r,
                world: shared.world,
            });
        }
        Ok(())
    };
    match takeover_accept(stream, shared.world, &t.secret, &t.id, &accept) {
        Ok(link) => {
            tracing::info!(
                rank = me,
                member = link.peer,
                "liveness: a member attached to this rank as its hub"
            );
            shared.attach(link);
        }
        Err(error) => tracing::debug!(%error, "liveness: a takeover connection was refused"),
    }
}

/// A helper: the hub was lost; attach to the lowest live rank, or be the
/// hub if that is this rank. A rank that cannot be reached in time counts
/// as lost, and the next one is tried.
pub(super) fn find_hub(shared: &Shared) {
    search(shared);
    shared.finding.store(false, Ordering::Release);
    // Another hub may have been lost meanwhile: let the thread look.
    shared.wake();
}

fn search(shared: &Shared) {
    let (Some(t), Some(me)) = (&shared.takeover, shared.rank) else {
        return;
    };
    loop {
        if shared.quiet() {
            return;
        }
        let roster = lock(&shared.roster).clone();
        let next = (0..shared.world).find(|&r| {
            r == me
                || (!shared.is_lost(r)
                    && !shared.is_gone(r)
                    && roster.get(r).is_some_and(Option::is_some))
        });
        let Some(next) = next else {
            return;
        };
        if next == me {
            tracing::info!(rank = me, "liveness: this rank takes over as hub");
            return;
        }
        let Some(Some(addr)) = roster.get(next).copied() else {
            return;
        };
        let listen = t.listener.local_addr().ok();
        let (secret, id, world) = (&t.secret, &t.id, shared.world);
        match takeover_connect(addr, next, me, world, secret, id, listen, TAKEOVER_TIMEOUT) {
            Ok(link) => {
                tracing::info!(rank = me, hub = next, "liveness: attached to the new hub");
                shared.attach(link);
                return;
            }
            Err(error) => shared.spread(
                &PeerLoss {
                    rank: next,
                    cause: LossCause::Exited {
                        reason: format!("it could not be reached to take over as hub: {error}"),
                    },
                    seen_by: me,
                },
                None,
            ),
        }
    }
}
