//! The public [`Liveness`] handle over the shared state, and the
//! constructors the rendezvous uses.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::takeover::Takeover;
use super::{ExitHolder, Link, Msg, ROSTER_CHUNK, Role, Shared, lock, spawn};
use crate::liveness::{LivenessOptions, LossCause, PeerLoss};

/// The handle every clone points at; its drop is the clean goodbye.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.leave();
    }
}

/// This rank's view of who in the job is still there: the losses seen so
/// far, hooks to run on the next ones, and (in a process job) the
/// connection(s) and thread that find them. Cheap to clone; the last clone
/// dropped says goodbye like [`Liveness::leave`].
#[derive(Clone)]
pub struct Liveness {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.handle.shared;
        f.debug_struct("Liveness")
            .field("world", &s.world)
            .field("rank", &s.rank)
            .field("role", &s.role)
            .field("links", &lock(&s.links).len())
            .field("losses", &lock(&s.state).losses)
            .finish()
    }
}

impl Liveness {
    fn from_shared(shared: Shared) -> Liveness {
        Liveness {
            handle: Arc::new(Handle {
                shared: Arc::new(shared),
            }),
        }
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// The channel of `world` ranks run as threads of this process: no
    /// sockets and no thread; a [`Liveness::report`] from any rank's thread
    /// reaches every hook at once, on the reporter's thread.
    /// [`Liveness::leave`] does nothing here (one rank ending cleanly does
    /// not end the others' channel).
    pub fn in_process(world: usize) -> Liveness {
        Liveness::from_shared(Shared::new(
            world,
            None,
            Role::InProcess,
            &LivenessOptions::default(),
        ))
    }

    /// A channel with no connections for `rank` of a process job whose
    /// liveness is off: local reports and hooks only.
    pub(crate) fn off(world: usize, rank: usize) -> Liveness {
        Liveness::from_shared(Shared::new(
            world,
            Some(rank),
            Role::Off,
            &LivenessOptions::default(),
        ))
    }

    /// This rank, in a process job; `None` for [`Liveness::in_process`].
    pub fn rank(&self) -> Option<usize> {
        self.shared().rank
    }

    /// The number of ranks in the job.
    pub fn world(&self) -> usize {
        self.shared().world
    }

    /// How often this channel's ends send a heartbeat: the spread of the
    /// moments at which ranks that stopped together are found silent
    /// (each is found a silence limit after its own last frame).
    pub fn heartbeat(&self) -> std::time::Duration {
        self.shared().heartbeat
    }

    /// Where `rank` listens for a takeover, from the roster: the address
    /// the other ranks reach its host by (`None` before the roster came,
    /// or for a rank without one).
    pub fn address_of(&self, rank: usize) -> Option<SocketAddr> {
        lock(&self.shared().roster).get(rank).copied().flatten()
    }

    /// Reports a loss found here: a rank's thread panicked or ended with
    /// an error (in one process), or this rank found it otherwise (its own
    /// thread unwinding, say). Recorded once per rank, and passed on: by
    /// rank 0 to every member, by a member to rank 0, which passes it on.
    /// A rank outside the world is ignored (logged).
    pub fn report(&self, loss: PeerLoss) {
        self.shared().report(loss);
    }

    /// Runs `hook` once for every lost rank: at once (on this thread) for
    /// those already lost, later on the thread that learns of the loss
    /// (the liveness thread, or a reporter's). Hooks must not block; one
    /// that panics is logged and skipped.
    pub fn on_loss(&self, hook: Arc<dyn Fn(&PeerLoss) + Send + Sync>) {
        let past = {
            let mut st = lock(&self.shared().state);
            st.hooks.push(Arc::clone(&hook));
            st.losses.clone()
        };
        for loss in &past {
            Shared::run_hooks(vec![Arc::clone(&hook)], loss);
        }
    }

    /// Lets the process's exit wait for the hooks that this channel runs
    /// on a thread of its own (a silent rank's report after a connection
    /// gate): `holder(limit)` is called before such a thread starts, and
    /// what it returns is dropped once the hooks are done. The layer above
    /// passes its exit hold where its hooks use NCCL (`nccl-dist` aborts
    /// communicators in them).
    pub fn hold_exit_with(&self, holder: ExitHolder) {
        lock(&self.shared().state).exit_holder = Some(holder);
    }

    /// Every loss so far, in the order this rank learned them.
    pub fn losses(&self) -> Vec<PeerLoss> {
        lock(&self.shared().state).losses.clone()
    }

    /// The first loss this rank learned of, if any.
    pub fn first_loss(&self) -> Option<PeerLoss> {
        lock(&self.shared().state).losses.first().cloned()
    }

    /// Whether `rank` counts as lost here.
    pub fn is_lost(&self, rank: usize) -> bool {
        lock(&self.shared().state)
            .losses
            .iter()
            .any(|l| l.rank == rank)
    }

    /// Where the hub's request for this rank's flight-recorder tail is
    /// answered from (the watchdog sets it).
    pub fn set_tail_source(&self, source: super::TailSource) {
        self.shared().set_tail_source(source);
    }

    /// The means to run a flight-recorder exchange over this channel.
    pub fn exchanger(&self) -> super::Exchanger {
        super::Exchanger(Arc::downgrade(self.shared()))
    }

    /// A clean goodbye: this rank ends normally, so the close of its
    /// connection that follows is not a loss. Later losses are no longer
    /// watched for. Waits (at most a second, usually well under a
    /// millisecond) for the peers to close their side, so the process may
    /// exit right after. Idempotent; also what dropping the last clone
    /// does.
    pub fn leave(&self) {
        self.shared().leave();
    }

    /// Gives up without a goodbye (a failed rendezvous): the members
    /// already attached count this rank as lost, as if it had died.
    pub(crate) fn abandon(&self) {
        self.shared().abandon();
    }

    /// Rank 0: a member finished its handshake and attach; watch it, and
    /// tell it of the losses it missed.
    /// `seen` is this host's address on the member's connection.
    pub(crate) fn add_link(&self, link: Link, listen: Option<SocketAddr>, seen: Option<IpAddr>) {
        if let Some(slot) = lock(&self.shared().roster).get_mut(link.peer) {
            *slot = listen;
        }
        if let Some(ip) = seen.filter(|ip| !ip.is_loopback()) {
            lock(&self.shared().host_ip).get_or_insert(ip);
        }
        self.shared().attach(link);
    }

    /// Rank 0: `rank` took the id but its attach failed with `error`
    /// (it died or its connection broke in between): lost, as if its
    /// liveness connection had closed after the attach.
    pub(crate) fn lost_before_attach(&self, rank: usize, error: &dyn std::fmt::Display) {
        self.shared().report(PeerLoss {
            rank,
            cause: LossCause::Exited {
                reason: format!("it took the id, then its liveness attach failed: {error}"),
            },
            seen_by: 0,
        });
    }

    /// Rank 0: the rendezvous is over; no more members will come. Every
    /// member gets the roster of takeover addresses.
    pub(crate) fn done_accepting(&self) {
        let s = self.shared();
        s.accepting.store(false, Ordering::Release);
        let host_ip = *lock(&s.host_ip);
        let entries: Vec<(usize, SocketAddr)> = lock(&s.roster)
            .iter()
            .enumerate()
            .filter_map(|(r, a)| a.map(|a| (r, a)))
            .map(|(r, a)| match host_ip {
                // A member on this host that came over loopback listens on
                // every interface: the others reach it by this host's
                // address.
                Some(ip) if a.ip().is_loopback() => (r, SocketAddr::new(ip, a.port())),
                _ => (r, a),
            })
            .collect();
        for link in s.links() {
            for chunk in entries.chunks(ROSTER_CHUNK) {
                link.send(&Msg::Roster(chunk.to_vec()));
            }
        }
        s.wake();
    }
}

/// Rank 0's channel, its thread started, ready for members.
pub(crate) fn start_hub(world: usize, options: &LivenessOptions) -> std::io::Result<Liveness> {
    let shared = Shared::new(world, Some(0), Role::Hub, options).with_wake()?;
    shared.accepting.store(true, Ordering::Release);
    let live = Liveness::from_shared(shared);
    spawn(live.shared())?;
    Ok(live)
}

/// A member's channel over its attached link to rank 0, thread started.
pub(crate) fn start_member(
    world: usize,
    rank: usize,
    link: Link,
    options: &LivenessOptions,
    takeover: Option<Takeover>,
) -> std::io::Result<Liveness> {
    let mut shared = Shared::new(world, Some(rank), Role::Member, options).with_wake()?;
    shared.takeover = takeover;
    lock(&shared.links).push(Arc::new(link));
    let live = Liveness::from_shared(shared);
    spawn(live.shared())?;
    Ok(live)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::liveness::LossCause;

    #[test]
    fn in_process_reports_reach_every_hook_once_and_late_hooks_catch_up() {
        let live = Liveness::in_process(4);
        assert_eq!(live.rank(), None);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        live.on_loss(Arc::new(move |l: &PeerLoss| lock(&s).push(l.rank)));
        let loss = PeerLoss {
            rank: 2,
            cause: LossCause::Panicked {
                message: "boom".into(),
            },
            seen_by: 2,
        };
        let other = live.clone();
        std::thread::spawn(move || other.report(loss.clone()))
            .join()
            .unwrap();
        live.report(PeerLoss {
            rank: 2,
            cause: LossCause::ConnectionClosed,
            seen_by: 1,
        });
        live.report(PeerLoss {
            rank: 9,
            cause: LossCause::ConnectionClosed,
            seen_by: 1,
        });
        assert_eq!(*lock(&seen), vec![2]);
        let late = Arc::new(Mutex::new(Vec::new()));
        let l2 = Arc::clone(&late);
        live.on_loss(Arc::new(move |l: &PeerLoss| lock(&l2).push(l.rank)));
        assert_eq!(*lock(&late), vec![2]);
        assert_eq!(live.first_loss().map(|l| l.rank), Some(2));
        assert!(live.is_lost(2) && !live.is_lost(1));
        // A panicking hook does not stop the others.
        live.on_loss(Arc::new(|_: &PeerLoss| panic!("a bad hook")));
        live.report(PeerLoss {
            rank: 3,
            cause: LossCause::ConnectionClosed,
            seen_by: 0,
        });
        assert_eq!(*lock(&seen), vec![2, 3]);
        assert_eq!(*lock(&late), vec![2, 3]);
    }

    #[test]
    fn the_heartbeat_is_the_channels_own() {
        let every = Duration::from_millis(40);
        let hub = start_hub(2, &LivenessOptions::new().heartbeat(every)).expect("hub");
        assert_eq!(hub.heartbeat(), every);
        hub.leave();
        assert_eq!(
            Liveness::in_process(2).heartbeat(),
            LivenessOptions::new().heartbeat_interval()
        );
    }
}
