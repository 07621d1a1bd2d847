//! The [`Liveness`] handle, the state its clones share, and the one
//! background thread per process (`nccl-liveness`) that watches the
//! connections: it waits in `poll(2)` for any of them to become readable or
//! for the next heartbeat to be due, so it never spins.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{LivenessError, LivenessOptions, LossCause, PeerLoss};
use crate::link::{Link, READ_CHUNK, Rx, lock};
use crate::wire::{MAX_FRAME, MIN_FRAME, Msg, ROSTER_CHUNK};

mod check;
mod exchange;
mod handle;
mod takeover;
pub use check::gate_members;
pub use exchange::{Exchanger, TailSource, WAIT as EXCHANGE_WAIT};

pub use handle::Liveness;
pub(crate) use handle::{start_hub, start_member};
pub(crate) use takeover::Takeover;
use takeover::{accept_all, find_hub, helper};

/// What runs on a loss.
type Hook = Arc<dyn Fn(&PeerLoss) + Send + Sync>;

/// Holds the process's exit back for at most the duration given, until
/// what it returns is dropped (see [`Liveness::hold_exit_with`]).
pub type ExitHolder = Arc<dyn Fn(Duration) -> Box<dyn Send> + Send + Sync>;

/// How long a rank that left keeps reading its connections, so the peer's
/// last frames are consumed and the close stays a clean one.
const DRAIN: Duration = Duration::from_secs(1);
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Threads of one process; no sockets.
    InProcess,
    /// Rank 0 of a process job.
    Hub,
    /// Any other rank of a process job.
    Member,
    /// Liveness turned off: only local reports.
    Off,
}

#[derive(Default)]
struct State {
    losses: Vec<PeerLoss>,
    hooks: Vec<Hook>,
    /// This rank said goodbye or gave up: closes are no longer losses.
    left: bool,
    /// The hub told this rank that it counts as lost.
    excluded: bool,
    /// After leaving, when the thread stops draining.
    stop_by: Option<Instant>,
    /// Ranks that ended cleanly: not losses, not hub candidates.
    gone: Vec<usize>,
    /// Held while hooks run on a thread of their own.
    exit_holder: Option<ExitHolder>,
}

/// What every clone of a [`Liveness`] and its thread share.
struct Shared {
    world: usize,
    rank: Option<usize>,
    role: Role,
    heartbeat: Duration,
    silence: Duration,
    state: Mutex<State>,
    links: Mutex<Vec<Arc<Link>>>,
    /// The hub is still adding members (the rendezvous runs).
    accepting: AtomicBool,
    /// Set when the thread has ended (or never ran), for `leave` to wait.
    ended: Mutex<bool>,
    ended_cv: Condvar,
    /// A byte written here wakes the thread out of `poll` (a new link, a
    /// goodbye), so nothing waits for the next heartbeat.
    wake: Option<(UnixStream, UnixStream)>,
    /// Where each rank listens for a takeover, from rank 0's roster.
    roster: Mutex<Vec<Option<SocketAddr>>>,
    /// This member's means to become the hub or reach the next one.
    takeover: Option<Takeover>,
    /// The hub link was lost: the thread starts looking for the next hub.
    want_hub: AtomicBool,
    /// A helper is looking for the next hub (one at a time).
    finding: AtomicBool,
    /// Takeover handshakes running on helper threads (bounded).
    handshakes: AtomicUsize,
    /// Accepted takeover connections waiting for their helper.
    pending: Mutex<Vec<TcpStream>>,
    /// Rank 0: this host's first non-loopback address members came to.
    host_ip: Mutex<Option<std::net::IpAddr>>,
    /// The flight-recorder exchange (idle until a timeout).
    exchange: Mutex<exchange::Exchange>,
    /// Wakes the waiters of an exchange and of a call check.
    exchange_cv: Condvar,
    /// Wakes a rank waiting for a call check's outcome (its own, as it
    /// waits on `checks`, not `exchange`).
    check_cv: Condvar,
    /// The opt-in call check (idle unless it is on).
    checks: Mutex<check::Checks>,
}

impl Shared {
    /// A hold on the process's exit for at most `limit`, where the layer
    /// above gave a way to make one.
    fn hold_exit(&self, limit: Duration) -> Option<Box<dyn Send>> {
        let holder = lock(&self.state).exit_holder.clone();
        holder.map(|hold| hold(limit))
    }

    fn new(world: usize, rank: Option<usize>, role: Role, options: &LivenessOptions) -> Shared {
        Shared {
            world,
            rank,
            role,
            heartbeat: options.heartbeat_interval(),
            silence: options.silence(),
            state: Mutex::new(State::default()),
            links: Mutex::new(Vec::new()),
            accepting: AtomicBool::new(false),
            ended: Mutex::new(true),
            ended_cv: Condvar::new(),
            wake: None,
            roster: Mutex::new(vec![None; world]),
            takeover: None,
            want_hub: AtomicBool::new(false),
            finding: AtomicBool::new(false),
            handshakes: AtomicUsize::new(0),
            pending: Mutex::new(Vec::new()),
            host_ip: Mutex::new(None),
            exchange: Mutex::new(exchange::Exchange::default()),
            exchange_cv: Condvar::new(),
            check_cv: Condvar::new(),
            checks: Mutex::new(check::Checks::default()),
        }
    }

    /// Adds the wake-up pair, for a role with a thread.
    fn with_wake(mut self) -> std::io::Result<Shared> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        self.wake = Some((tx, rx));
        Ok(self)
    }

    fn wake(&self) {
        if let Some((tx, _)) = &self.wake {
            // A full pipe already holds a wake-up: nothing is lost.
            let _ = (&*tx).write(&[1]);
        }
    }

    /// Empties the wake-up pipe after `poll` said it is readable.
    fn drain_wake(&self) {
        if let Some((_, rx)) = &self.wake {
            let mut sink = [0u8; 64];
            while matches!((&*rx).read(&mut sink), Ok(n) if n > 0) {}
        }
    }

    /// Waits (at most [`DRAIN`]) for the thread to end, unless this is the
    /// thread itself (a hook that leaves).
    fn wait_ended(&self) {
        if std::thread::current().name() == Some(THREAD_NAME) {
            return;
        }
        let ended = lock(&self.ended);
        let _ = self
            .ended_cv
            .wait_timeout_while(ended, DRAIN, |ended| !*ended);
    }

    fn links(&self) -> Vec<Arc<Link>> {
        lock(&self.links).clone()
    }

    /// The links now, into `out` (emptied first): the thread's snapshot,
    /// in a vector it keeps, so a round allocates nothing.
    fn links_into(&self, out: &mut Vec<Arc<Link>>) {
        out.clear();
        out.extend(lock(&self.links).iter().cloned());
    }

    /// Whether any link is being watched.
    fn has_links(&self) -> bool {
        !lock(&self.links).is_empty()
    }

    /// Removes `link`; false when it was already gone.
    fn remove(&self, link: &Arc<Link>) -> bool {
        let mut links = lock(&self.links);
        let before = links.len();
        links.retain(|l| !Arc::ptr_eq(l, link));
        links.len() != before
    }

    /// Adds `loss` unless its rank is already lost; the hooks to run.
    fn record(&self, loss: &PeerLoss) -> Option<Vec<Hook>> {
        let mut st = lock(&self.state);
        if st.losses.iter().any(|l| l.rank == loss.rank) {
            return None;
        }
        tracing::warn!(%loss, "liveness: a rank was lost");
        st.losses.push(loss.clone());
        Some(st.hooks.clone())
    }

    fn run_hooks(hooks: Vec<Hook>, loss: &PeerLoss) {
        for hook in hooks {
            // A hook that panics must not take the liveness thread (and so
            // every later loss) down with it.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(loss))).is_err() {
                tracing::error!(%loss, "liveness: a loss hook panicked");
            }
        }
    }

    /// Records `loss` and passes it on: to every member as `Lost` (the lost
    /// rank's own connection is then closed), to this rank's hub as
    /// `Report`, but not back where it came `from`; then the hooks.
    fn spread(&self, loss: &PeerLoss, from: Option<&Arc<Link>>) {
        let Some(hooks) = self.record(loss) else {
            return;
        };
        // A rank waiting for a call check stops waiting for the lost one.
        self.check_cv.notify_all();
        for link in self.links() {
            if from.is_some_and(|f| Arc::ptr_eq(f, &link)) {
                continue;
            }
            if link.to_hub {
                link.send(&Msg::Report(loss.clone()));
                continue;
            }
            // The lost rank hears it too: if it still runs (silent, or it
            // reported itself), it learns that the job gave up on it.
            link.send(&Msg::Lost(loss.clone()));
            if link.peer == loss.rank && self.remove(&link) {
                link.shut();
            }
        }
        Self::run_hooks(hooks, loss);
    }

    fn report(&self, loss: PeerLoss) {
        if loss.rank >= self.world {
            tracing::warn!(%loss, world = self.world, "liveness: a report of a rank outside the world was ignored");
            return;
        }
        self.spread(&loss, None);
    }

    fn is_lost(&self, rank: usize) -> bool {
        lock(&self.state).losses.iter().any(|l| l.rank == rank)
    }

    /// Adds an attached link and tells it the losses it missed.
    fn attach(&self, link: Link) {
        if self.quiet() {
            // Left while the handshake ran: end this one cleanly too.
            link.send(&Msg::Goodbye);
            link.shut();
            return;
        }
        let link = Arc::new(link);
        let (past, gone) = {
            let st = lock(&self.state);
            (st.losses.clone(), st.gone.clone())
        };
        lock(&self.links).push(Arc::clone(&link));
        for loss in past {
            link.send(&if link.to_hub {
                Msg::Report(loss)
            } else {
                Msg::Lost(loss)
            });
        }
        if !link.to_hub {
            for rank in gone {
                link.send(&Msg::Left(rank));
            }
        }
        self.wake();
    }

    /// `rank` ended cleanly: remembered (a later hub search skips it) and
    /// passed on to this rank's members, not back where it came `from`.
    fn note_left(&self, rank: usize, from: Option<&Arc<Link>>) {
        {
            let mut st = lock(&self.state);
            if st.gone.contains(&rank) {
                return;
            }
            st.gone.push(rank);
        }
        for link in self.links() {
            if !link.to_hub && !from.is_some_and(|f| Arc::ptr_eq(f, &link)) {
                link.send(&Msg::Left(rank));
            }
        }
    }

    fn is_gone(&self, rank: usize) -> bool {
        lock(&self.state).gone.contains(&rank)
    }

    fn leave(&self) {
        if matches!(self.role, Role::InProcess | Role::Off) {
            return;
        }
        {
            let mut st = lock(&self.state);
            if st.left {
                return;
            }
            st.left = true;
            st.stop_by = Some(Instant::now() + DRAIN);
        }
        self.accepting.store(false, Ordering::Release);
        for link in self.links() {
            link.send(&Msg::Goodbye);
            // Only our half: the thread keeps reading until the peer closes
            // (or the drain ends), so nothing unread turns the close into a
            // reset.
            let _ = link.stream.shutdown(Shutdown::Write);
        }
        self.wake();
        // The peers close on the goodbye; once the thread has read those
        // closes, the process may exit without a reset reaching anyone.
        self.wait_ended();
    }

    /// Gives up without a goodbye: the peers count this rank as lost.
    fn abandon(&self) {
        {
            let mut st = lock(&self.state);
            st.left = true;
            st.stop_by = Some(Instant::now());
        }
        self.accepting.store(false, Ordering::Release);
        for link in std::mem::take(&mut *lock(&self.links)) {
            link.shut();
        }
        self.wake();
    }

    fn quiet(&self) -> bool {
        let st = lock(&self.state);
        st.left || st.excluded
    }

    /// `link` is gone for `cause`: a loss unless it said goodbye or this
    /// rank is ending anyway.
    fn link_lost(&self, link: &Arc<Link>, cause: LossCause) {
        if !self.remove(link) {
            return;
        }
        link.shut();
        if link.goodbye.load(Ordering::Acquire) || self.quiet() {
            return;
        }
        let seen_by = self.rank.unwrap_or(0);
        let loss = PeerLoss {
            rank: link.peer,
            cause,
            seen_by,
        };
        self.spread(&loss, Some(link));
        if link.to_hub && self.takeover.is_some() {
            self.want_hub.store(true, Ordering::Release);
        }
    }

    fn link_failed(&self, link: &Arc<Link>, error: &LivenessError) {
        tracing::warn!(peer = link.peer, %error, "liveness: a frame failed its check; closing");
        self.link_lost(
            link,
            LossCause::Exited {
                reason: format!(
                    "its liveness connection was closed after a frame that failed the check \
                     ({error}): someone may be in the middle"
                ),
            },
        );
    }

    fn handle(&self, link: &Arc<Link>, msg: Msg) {
        match (link.to_hub, msg) {
            (_, Msg::Heartbeat) => {}
            // A hub that ends cleanly ends the job's watch: no takeover
            // (its members are ending too, and would find no one).
            (to_hub, Msg::Goodbye) => {
                link.goodbye.store(true, Ordering::Release);
                self.link_lost(link, LossCause::ConnectionClosed);
                if !to_hub {
                    self.note_left(link.peer, Some(link));
                }
            }
            (true, Msg::Left(rank)) => self.note_left(rank, Some(link)),
            (false, Msg::Report(loss)) => self.spread(&loss, Some(link)),
            (true, Msg::Lost(loss)) => {
                if Some(loss.rank) == self.rank {
                    lock(&self.state).excluded = true;
                }
                self.spread(&loss, Some(link));
            }
            (false, Msg::Tail { key, calls }) => self.on_tail(link, &key, calls),
            (true, Msg::Ask { key }) => self.on_ask(link, key),
            (true, Msg::Verdict { key, divergence }) => self.on_verdict(key, divergence),
            (false, Msg::Check { key, seq, call }) => self.on_check(link, &key, seq, call),
            (true, Msg::Checked { key, seq, outcome }) => self.on_checked(key, seq, outcome),
            (true, Msg::Roster(entries)) => {
                let mut roster = lock(&self.roster);
                for (rank, addr) in entries {
                    if let Some(slot) = roster.get_mut(rank) {
                        *slot = Some(addr);
                    }
                }
            }
            _ => self.link_failed(
                link,
                &LivenessError::Malformed("a message out of place in a running session"),
            ),
        }
    }

    /// Reads what `poll` said is there and acts on every whole frame;
    /// `msgs` is the thread's (empty) vector to collect them in.
    fn service(&self, link: &Arc<Link>, chunk: &mut [u8], msgs: &mut Vec<Msg>) {
        let n = match (&link.stream).read(chunk) {
            Ok(0) => return self.link_lost(link, LossCause::ConnectionClosed),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                return;
            }
            Err(_) => return self.link_lost(link, LossCause::ConnectionClosed),
        };
        let bad = {
            let mut rx = lock(&link.rx);
            let Rx {
                opener,
                buf,
                last_heard,
            } = &mut *rx;
            buf.push(&chunk[..n]);
            let mut bad = None;
            loop {
                let (kind, payload) = match buf.next_frame() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                };
                match opener.open(kind, payload) {
                    Ok(m) => {
                        *last_heard = Instant::now();
                        msgs.push(m);
                    }
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                }
            }
            bad
        };
        // Handled with no lock held; the vector keeps its room.
        for m in msgs.drain(..) {
            self.handle(link, m);
        }
        if let Some(e) = bad {
            self.link_failed(link, &e);
        }
    }
}

/// Sleeps until one of `fds` is readable (or hung up) or `wait` passes.
fn wait_readable(fds: &mut [libc::pollfd], wait: Duration) {
    let ms = wait.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a live, exclusively borrowed slice of `pollfd`
    // whose length is passed with it; poll(2) only writes the `revents`
    // fields inside it, and the descriptors stay open (their links are
    // held by the caller) for the whole call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        for f in fds.iter_mut() {
            f.revents = 0;
        }
        // Anything but a signal would repeat at once: wait instead of
        // spinning.
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            std::thread::sleep(wait);
        }
    }
}

/// The thread: heartbeats, silence, and every readable connection.
///
/// Everything a round needs (the read buffer, the poll set, the snapshot of
/// the links, the messages read) is made here once and reused, so once the
/// channel is up a heartbeat sent or received and an idle round allocate
/// nothing; only rare events (a new link, a loss, a goodbye) do.
fn run(shared: Arc<Shared>) {
    let mut next_beat = Instant::now();
    let mut chunk = vec![0u8; READ_CHUNK];
    let room = shared.world + 2;
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(room);
    let mut links: Vec<Arc<Link>> = Vec::with_capacity(room);
    // The most frames one read can complete (a partial frame and a read).
    let mut msgs: Vec<Msg> = Vec::with_capacity((READ_CHUNK + MAX_FRAME) / MIN_FRAME + 1);
    loop {
        let (ending, stop_by) = {
            let st = lock(&shared.state);
            (st.left || st.excluded, st.stop_by)
        };
        let now = Instant::now();
        if ending {
            let drained = !shared.has_links() || stop_by.is_none_or(|t| now >= t);
            if drained {
                break;
            }
        } else {
            // A member that can take over keeps watching with no link: it
            // may become the hub, or be between two hubs.
            if !shared.has_links()
                && !shared.accepting.load(Ordering::Acquire)
                && shared.takeover.is_none()
            {
                break;
            }
            if !shared.finding.swap(true, Ordering::AcqRel) {
                if !shared.want_hub.swap(false, Ordering::AcqRel) {
                    shared.finding.store(false, Ordering::Release);
                } else if !helper(&shared, find_hub, false) {
                    // No thread now: try again on the next turn.
                    shared.want_hub.store(true, Ordering::Release);
                    shared.finding.store(false, Ordering::Release);
                }
            }
            if now >= next_beat {
                shared.links_into(&mut links);
                for link in &links {
                    // A failed write shows up on the reading side as EOF or
                    // a reset, with the right cause.
                    link.send(&Msg::Heartbeat);
                }
                next_beat = now + shared.heartbeat;
            }
            shared.links_into(&mut links);
            for link in &links {
                let quiet = now.saturating_duration_since(link.last_heard());
                if quiet >= shared.silence {
                    shared.link_lost(link, LossCause::Silent { for_: quiet });
                }
            }
        }
        let wait = if ending {
            // Every close and the end of the drain wake the poll.
            stop_by.map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
        } else {
            // A gathering of flight-recorder tails, and a call check, end
            // at their deadlines.
            shared.finish_gather(true);
            shared.expire_checks();
            let until = [shared.gather_deadline(), shared.check_deadline()]
                .into_iter()
                .flatten()
                .fold(next_beat, Instant::min);
            until.saturating_duration_since(Instant::now())
        };
        shared.links_into(&mut links);
        fds.clear();
        if let Some((_, rx)) = &shared.wake {
            fds.push(libc::pollfd {
                fd: rx.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let listening = match (&shared.takeover, ending) {
            (Some(t), false) => {
                fds.push(libc::pollfd {
                    fd: t.listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                true
            }
            _ => false,
        };
        let first_link = fds.len();
        fds.extend(links.iter().map(|l| libc::pollfd {
            fd: l.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        wait_readable(&mut fds, wait);
        if shared.wake.is_some() && fds[0].revents != 0 {
            shared.drain_wake();
        }
        if listening && fds[first_link - 1].revents != 0 {
            accept_all(&shared);
        }
        for (link, fd) in links.iter().zip(&fds[first_link..]) {
            if fd.revents != 0 {
                shared.service(link, &mut chunk, &mut msgs);
            }
        }
        // No link outlives the round in the snapshot.
        links.clear();
    }
    for link in std::mem::take(&mut *lock(&shared.links)) {
        link.shut();
    }
    *lock(&shared.ended) = true;
    shared.ended_cv.notify_all();
}

/// The name of the background thread.
const THREAD_NAME: &str = "nccl-liveness";

fn spawn(shared: &Arc<Shared>) -> std::io::Result<()> {
    let s = Arc::clone(shared);
    *lock(&shared.ended) = false;
    std::thread::Builder::new()
        .name(THREAD_NAME.into())
        .spawn(move || run(s))
        .map(drop)
        .inspect_err(|_| *lock(&shared.ended) = true)
}

/// What the tests of the channel's parts share.
#[cfg(test)]
pub(super) mod testing {
    use std::net::TcpListener;
    use std::time::Duration;

    use nccl_sys::ncclUniqueId as UniqueId;

    use crate::culprit::Call;
    use crate::liveness::{Liveness, LivenessOptions};
    use crate::rendezvous::{join_live, serve_live};
    use crate::secret::Secret;

    /// A sum all-reduce of `count` f32 elements, as a rank's call.
    pub(crate) fn ar(count: usize) -> Call {
        Call {
            op: "ncclAllReduce",
            count,
            dtype: nccl_sys::ncclDataType_t::ncclFloat32,
            peer: None,
            reduction: Some(nccl_sys::ncclRedOp_t::ncclSum),
        }
    }

    /// `world` ranks over loopback sockets, rank 0 the hub.
    pub(crate) fn channel(world: usize) -> Vec<Liveness> {
        let secret =
            Secret::from_bytes(b"a secret for the channel tests".to_vec(), "test").unwrap();
        let options = LivenessOptions::new();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let id = UniqueId::from_bytes([9; nccl_sys::NCCL_UNIQUE_ID_BYTES]);
        let t = Duration::from_secs(10);
        let members: Vec<_> = (1..world)
            .map(|rank| {
                let (secret, options) = (secret.clone(), options.clone());
                std::thread::spawn(move || {
                    join_live(addr, rank, world, &secret, t, &options)
                        .unwrap()
                        .1
                })
            })
            .collect();
        let (hub, refused) = serve_live(&listener, world, &secret, &id, t, &options).unwrap();
        assert!(refused.is_empty());
        let mut ranks = vec![hub];
        ranks.extend(members.into_iter().map(|m| m.join().unwrap()));
        ranks
    }
}
