//! Why a communicator was aborted, and a signal that aborts many at once.
//!
//! An abort has a cause ([`AbortCause`]), which every later call on the
//! communicator reports in [`crate::Error::Aborted`], so that "the
//! communicator was aborted" always says why (a lost peer, a timeout, a
//! request). An [`AbortSignal`] is shared by the communicators of one job
//! (set with [`crate::Config::abort_signal`]; children inherit it): when it
//! is triggered, every one of them is aborted, including one whose
//! nonblocking init or split is still in progress, and every later call
//! answers with the signal's cause.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Why a communicator was aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortCause {
    /// [`crate::AbortHandle::abort`] or [`crate::Comm::abort`].
    Requested,
    /// A peer rank of the job was lost (`detail` says how).
    PeerLost {
        /// The lost rank (in the job's world).
        rank: usize,
        /// How it was lost, as the detector put it.
        detail: String,
    },
    /// An operation did not finish in time (a watchdog or a wait of ours).
    Timeout {
        /// The operation that was unfinished.
        op: &'static str,
        /// Its sequence number on the communicator, where known.
        seq: Option<u64>,
    },
    /// NCCL reported an asynchronous error.
    AsyncError(String),
    /// Another reason, in words.
    Other(String),
}

impl std::fmt::Display for AbortCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbortCause::Requested => f.write_str("abort requested"),
            AbortCause::PeerLost { rank, detail } => {
                write!(f, "peer rank {rank} was lost: {detail}")
            }
            AbortCause::Timeout { op, seq: Some(seq) } => write!(f, "{op} #{seq} timed out"),
            AbortCause::Timeout { op, seq: None } => write!(f, "{op} timed out"),
            AbortCause::AsyncError(e) => write!(f, "NCCL reported: {e}"),
            AbortCause::Other(why) => f.write_str(why),
        }
    }
}

impl AbortCause {
    /// The lost rank, when the cause is [`AbortCause::PeerLost`].
    pub fn lost_rank(&self) -> Option<usize> {
        match self {
            AbortCause::PeerLost { rank, .. } => Some(*rank),
            _ => None,
        }
    }
}

/// A communicator a signal can abort (implemented by the communicator's
/// shared state, which sits above this file).
pub(crate) trait Abortable: Send + Sync {
    /// Records `cause` (the first one wins) without aborting: the next
    /// call or wait on the communicator sees it and aborts. Never waits.
    fn note_cause(&self, cause: AbortCause);
    /// Asks for an abort with `cause` without waiting for the lock (the
    /// abort itself, `ncclCommAbort`, may wait inside NCCL).
    fn request_abort(&self, cause: AbortCause) -> bool;
    /// Whether NCCL is done with it: aborted (or closed), and no
    /// `ncclCommAbort` of it still running. Never waits.
    fn is_settled(&self) -> bool;
    /// Whether it is parked: its abort for a lost peer put off
    /// ([`AbortSignal::end_parking`]). Never waits.
    fn is_parked(&self) -> bool {
        false
    }
    /// Whether it is parked and no thread is at it: its kernels' stop done
    /// (or not due) and its lock free, so that no NCCL call on it runs.
    /// Never waits.
    fn is_parked_idle(&self) -> bool {
        self.is_parked()
    }
    /// Parks it no more: the next abort asked for happens.
    fn unpark(&self) {}
    /// Whether it would be held to stop its kernels in the group (it parks
    /// or parked, blocking, its kernels not stopped yet). Never waits.
    fn wants_hold(&self) -> bool {
        false
    }
    /// Does what is due (an abort, or a park) and stops a parked one's
    /// kernels if that is still to do, unless a thread holds it (which
    /// then does it). Called once every abort of the trigger was asked
    /// for: a parked communicator's kernels may be queued behind another's
    /// that only its abort ends.
    fn stop_parked(&self) {}
    /// Takes its lock for an abort grouped with others on this thread
    /// ([`HeldForAbort`]): `None` where the lock is taken, it is not live,
    /// no abort is due, or an open group refers to it (then
    /// [`Abortable::request_abort`] does what it can). Never waits.
    fn hold_for_abort(&self) -> Option<Box<dyn HeldForAbort + '_>> {
        None
    }
    /// Whether its abort can join others in one NCCL group opened by the
    /// calling thread now: NCCL queues an abort's reclaim to the group's
    /// end (2.22+; safely with a failed one among them, 2.24+), the thread
    /// has no group open (NCCL would join the aborts to it), and no CUDA
    /// graph may refer to it (its reclaim would wait for the graph's
    /// owner, who may wait for the lock of another one held through the
    /// group).
    fn aborts_together(&self) -> bool {
        false
    }
}

/// A communicator whose lock the calling thread holds for an abort
/// ([`Abortable::hold_for_abort`]): it stays unsettled to
/// [`AbortSignal::wait_settled`] until [`HeldForAbort::unlock`]; what
/// follows an abort done through it runs at its drop (also on unwinding).
pub(crate) trait HeldForAbort {
    /// What brackets the aborts of several held communicators with
    /// `ncclGroupStart`/`ncclGroupEnd` of their library, asked once every
    /// lock is held; `None` where they must not abort together after all
    /// (they are then let go unaborted, for [`Abortable::request_abort`]).
    fn group(&self) -> Option<GroupCalls>;
    /// `ncclCommAbort` (once; later calls do nothing). Nothing for one held
    /// to stop its kernels ([`HeldForAbort::stops`]).
    fn abort(&mut self);
    /// Whether it parked and is held to stop its kernels instead of an
    /// abort ([`crate::Config::park_on_peer_loss`]).
    fn stops(&self) -> bool {
        false
    }
    /// Stops its kernels, in the group, once every held one's abort was
    /// called (once; later calls do nothing).
    fn stop(&mut self) {}
    /// Whether an NCCL call it made inside the group returned an error.
    /// NCCL then fails the group's end without running any job queued in
    /// it: every abort's reclaim is dropped unrun (NCCL 2.28's
    /// `groupCleanup`), its communicator left allocated with its abort
    /// flags set.
    fn failed_in_group(&self) -> bool {
        false
    }
    /// After such a group: `ncclCommAbort` again, alone, for one aborted
    /// in it, so that NCCL reclaims it after all (nothing otherwise).
    fn abort_again(&mut self) {}
    /// Lets go of the lock.
    fn unlock(&mut self);
}

/// Runs the calls it is given inside one NCCL group of the calling thread
/// (this file sits below the library and the groups: the communicator
/// hands it in), and says how the group ended.
pub(crate) type GroupCalls = fn(&mut dyn FnMut()) -> GroupEnd;

/// How a [`GroupCalls`] ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum GroupEnd {
    /// No group opened: the calls did not run.
    NotOpened,
    /// The calls ran, and `ncclGroupEnd` succeeded.
    Ended,
    /// The calls ran, and `ncclGroupEnd` returned an error.
    Failed,
}

/// Aborts the communicators held by this thread, in the order given, in
/// one NCCL group: each `ncclCommAbort` sets its flags at once (every
/// kernel of theirs stops before any reclaim waits on a stream), and NCCL
/// runs the reclaims, which each join the communicator's proxy threads
/// (up to 500 ms: they poll with that timeout), side by side on threads of
/// its own at the group's end, instead of one after another. It is NCCL's
/// grouping, from one thread: no two threads of ours call NCCL on these
/// communicators at once. The locks are held until the group's end, so
/// nobody sees one settled early, then all let go before what follows the
/// aborts runs. Where no group opens, none is aborted here: they are let
/// go for the one-at-a-time path (holding one while aborting another
/// could keep a thread from aborting a communicator the other's abort
/// waits behind).
fn abort_held(mut held: Vec<Box<dyn HeldForAbort + '_>>) {
    if held.len() > 1
        && let Some(group) = held.first().and_then(|h| h.group())
    {
        // Every abort first: each sets its flags at once, so a parked
        // one's stop, which waits for its kernels inside the call, finds
        // none of theirs still in the way.
        let ended = group(&mut || {
            for h in held.iter_mut() {
                h.abort();
            }
            for h in held.iter_mut().filter(|h| h.stops()) {
                h.stop();
            }
        });
        // A call that failed inside made NCCL fail the group's end and
        // drop every reclaim queued in it, unrun: each aborted one is
        // aborted again, alone. Both are asked for: an end that failed
        // without such a call may have run the reclaims.
        if ended == GroupEnd::Failed && held.iter().any(|h| h.failed_in_group()) {
            tracing::warn!("a call in a group of aborts failed; each is aborted again on its own");
            for h in held.iter_mut() {
                h.abort_again();
            }
        }
    }
    for h in held.iter_mut() {
        h.unlock();
    }
}

/// Asks every member for its abort, newest first (`members` in the order
/// they were made): where two or more can abort together
/// ([`Abortable::aborts_together`]), those this thread can hold now
/// together ([`abort_held`]); then each of the rest on its own
/// ([`Abortable::request_abort`]: a thread in a call on one aborts it
/// when it lets go).
fn abort_members(members: &[Arc<dyn Abortable>], cause: &AbortCause) {
    abort_together(members.iter().rev());
    for member in members.iter().rev() {
        member.request_abort(cause.clone());
    }
}

/// Of `members`, in that order, those whose aborts can go together and
/// that this thread can hold ([`hold_all`]): aborted in one NCCL group,
/// the parked ones' kernels stopped after every abort ([`abort_held`]).
fn abort_together<'a>(members: impl Iterator<Item = &'a Arc<dyn Abortable>>) {
    let together: Vec<&Arc<dyn Abortable>> = members.filter(|m| m.aborts_together()).collect();
    if together.len() > 1 {
        abort_held(hold_all(&together));
    }
}

/// How long [`hold_all`] tries again for a member that would park and stop
/// its kernels but whose lock was taken.
const HOLD_RETRY: Duration = Duration::from_millis(5);

/// The holds of `members` ([`Abortable::hold_for_abort`]), trying again
/// for [`HOLD_RETRY`] for those whose stop belongs in the group
/// ([`Abortable::wants_hold`]) but whose lock a thread held for a moment:
/// left out, such a member's kernels would be stopped only after the
/// group, where another's abort may wait behind them.
fn hold_all<'a>(members: &[&'a Arc<dyn Abortable>]) -> Vec<Box<dyn HeldForAbort + 'a>> {
    let mut held = Vec::with_capacity(members.len());
    let mut missed = Vec::new();
    for &m in members {
        match m.hold_for_abort() {
            Some(h) => held.push(h),
            None if m.wants_hold() => missed.push(m),
            None => {}
        }
    }
    if !missed.is_empty() {
        let until = Instant::now() + HOLD_RETRY;
        wait_until(until, || {
            missed.retain(|m| match m.hold_for_abort() {
                Some(h) => {
                    held.push(h);
                    false
                }
                None => m.wants_hold(),
            });
            missed.is_empty()
        });
    }
    held
}

/// Asks `done` until it says yes (`true`) or `until` passes (`false`, after
/// a last look), pausing 50 µs at first, then twice as long each time up
/// to 5 ms.
fn wait_until(until: Instant, mut done: impl FnMut() -> bool) -> bool {
    let mut pause = Duration::from_micros(50);
    loop {
        if done() {
            return true;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        std::thread::sleep(pause.min(until - now));
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Performs the due aborts of `members` (each with the cause it recorded)
/// as a trigger does: those this thread can hold, in one NCCL group with
/// the parked ones' stops after every abort; then each one left, on its
/// own. For the end of a group that used a communicator that parks, when
/// a loss came while it was open.
pub(crate) fn settle_together(members: &[Arc<dyn Abortable>]) {
    abort_together(members.iter());
    for member in members {
        member.stop_parked();
    }
}

/// Each member of a signal, and the flag its [`Enrolment`] sets when it
/// goes.
type Roll = Vec<(Weak<dyn Abortable>, Arc<AtomicBool>)>;

struct SignalInner {
    /// Set once, when triggered: whether and why.
    cause: OnceLock<AbortCause>,
    members: Mutex<Roll>,
    /// Teardowns of members dropped while live, not yet done
    /// ([`PendingTeardown`]).
    teardowns: AtomicUsize,
    /// Those of them that were parked (aborts put off, now running).
    parked_teardowns: AtomicUsize,
    /// [`AbortSignal::end_parking`] was called: no member parks any more.
    parking_ended: AtomicBool,
}

/// A member's place on its signal's roll, kept by the member; its drop
/// leaves the roll once it has counted its teardown ([`PendingTeardown`]).
///
/// Between a member's last handle going (its `Weak` no longer upgrades)
/// and its drop counting the teardown, the waits would see it neither
/// live nor counted, and could answer "settled" while its teardown is only
/// being handed over. Until it leaves, a member that no longer upgrades
/// counts as unsettled.
pub(crate) struct Enrolment(Arc<AtomicBool>);

impl Enrolment {
    pub(crate) fn new() -> Enrolment {
        Enrolment(Arc::new(AtomicBool::new(false)))
    }

    /// The member's drop has counted its teardown (or had none): the
    /// waits go by the count from here. Release: a wait that sees it gone
    /// also sees the count.
    pub(crate) fn leave(&self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Drop for Enrolment {
    /// A drop that ended before `leave` (a panic) leaves here.
    fn drop(&mut self) {
        self.leave();
    }
}

/// A teardown of a communicator that carried the signal and was dropped
/// while live (its finalize or `ncclCommAbort`, on a thread of its own):
/// counted by the signal while this lives.
pub(crate) struct PendingTeardown {
    inner: Arc<SignalInner>,
    parked: bool,
}

impl PendingTeardown {
    /// Whether the signal fired.
    pub(crate) fn fired(&self) -> bool {
        self.inner.cause.get().is_some()
    }
}

impl Drop for PendingTeardown {
    fn drop(&mut self) {
        // The whole count last, so it never reads below the parked one
        // for long (the quiet wait then waits a little longer, not less).
        if self.parked {
            self.inner.parked_teardowns.fetch_sub(1, Ordering::AcqRel);
        }
        self.inner.teardowns.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Aborts every communicator that carries it, once. Cheap to clone; all
/// clones are one signal.
///
/// Triggering never waits for a call in progress: a communicator whose
/// lock is held (a blocking NCCL call, an open group on another thread) is
/// aborted by that thread as soon as it lets go.
///
/// ```
/// use nccl_safe::{AbortCause, AbortSignal, Config};
/// let signal = AbortSignal::new();
/// let config = Config::new().abort_signal(&signal);
/// assert!(config.get_abort_signal().is_some());
/// signal.trigger(AbortCause::Other("shutting down".into()));
/// assert!(signal.is_triggered());
/// ```
#[derive(Clone)]
pub struct AbortSignal {
    inner: Arc<SignalInner>,
}

impl std::fmt::Debug for AbortSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortSignal")
            .field("cause", &self.inner.cause.get())
            .finish_non_exhaustive()
    }
}

impl PartialEq for AbortSignal {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for AbortSignal {}

impl Default for AbortSignal {
    fn default() -> Self {
        AbortSignal::new()
    }
}

impl AbortSignal {
    /// A signal not yet triggered.
    pub fn new() -> AbortSignal {
        AbortSignal {
            inner: Arc::new(SignalInner {
                cause: OnceLock::new(),
                members: Mutex::new(Vec::new()),
                teardowns: AtomicUsize::new(0),
                parked_teardowns: AtomicUsize::new(0),
                parking_ended: AtomicBool::new(false),
            }),
        }
    }

    /// Aborts every communicator carrying the signal (now, or as soon as
    /// the thread in a call on it lets go) with `cause`. The first cause
    /// wins; triggering again asks again for the aborts not yet done (of
    /// communicators enrolled since, or held by a thread at the first).
    ///
    /// With NCCL 2.24 or later, the communicators no thread is in a call
    /// on abort in one NCCL group on the calling thread (unless it has a
    /// group open, or a CUDA graph may refer to one): NCCL then joins
    /// their proxy threads side by side (up to 500 ms each in NCCL 2.28)
    /// instead of one after another.
    pub fn trigger(&self, cause: AbortCause) {
        let _ = self.inner.cause.set(cause);
        let members = self.live_members();
        let cause = self.cause().unwrap_or(AbortCause::Requested);
        // Every member learns of it first: a thread waiting on one aborts
        // it itself at its next look, whatever an abort below waits for.
        // `ncclCommAbort` of an idle communicator (a world's control one)
        // may wait inside NCCL behind a kernel of another communicator on
        // the same GPU that waits for a rank that is gone.
        for member in &members {
            member.note_cause(cause.clone());
        }
        // Then the newest first: the communicators that run the kernels
        // (a world's own, its splits) before the ones they were made from.
        abort_members(&members, &cause);
        // Last, the kernels of those that parked instead.
        for member in &members {
            member.stop_parked();
        }
    }

    /// Whether it was triggered.
    pub fn is_triggered(&self) -> bool {
        self.inner.cause.get().is_some()
    }

    /// The cause it was triggered with.
    pub fn cause(&self) -> Option<AbortCause> {
        self.inner.cause.get().cloned()
    }

    /// Waits, at most until `until`, until NCCL is done with every
    /// communicator that carried the signal: each one that still exists
    /// aborted (or closed) with no `ncclCommAbort` of it running, and the
    /// teardown of each one dropped while live (on a thread of its own)
    /// done. Returns whether that came in time. After a
    /// [`AbortSignal::trigger`], it asks again at each look for the abort
    /// of a communicator still live (one that a thread held at the
    /// trigger); before one, it only waits. A communicator that an open
    /// group on the calling thread refers to aborts at that group's end,
    /// so it runs to `until`. A parked member
    /// ([`crate::Config::park_on_peer_loss`]) is not settled (NCCL still
    /// holds it) and a trigger does not abort it: call
    /// [`AbortSignal::end_parking`] first, or this runs to `until`.
    ///
    /// For a job that makes new communicators on the same GPUs after giving
    /// up these (a recovery): NCCL does not allow calls on independent
    /// communicators of one device from several threads at once, and the
    /// aborts run on whichever thread made them (a watchdog's, a liveness
    /// hook's), where the last `ncclCommAbort` of a communicator's ranks in
    /// one process frees the resources of all of them.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use nccl_safe::{AbortCause, AbortSignal};
    ///
    /// let signal = AbortSignal::new();
    /// signal.trigger(AbortCause::Requested);
    /// // No communicator carries it: nothing to wait for.
    /// assert!(signal.wait_settled(Instant::now() + Duration::from_secs(1)));
    /// ```
    pub fn wait_settled(&self, until: Instant) -> bool {
        wait_until(until, || {
            // The members first (held for the look, so none of them starts
            // its drop), then the count (see `SignalInner::teardowns`).
            let (members, dropping) = self.look();
            // The trigger's own attempt may have found a lock taken (by a
            // thread that then let go without aborting).
            if let Some(cause) = self.cause()
                && members.iter().any(|m| !m.is_settled())
            {
                abort_members(&members, &cause);
            }
            members.iter().all(|m| m.is_settled())
                && !dropping
                && self.inner.teardowns.load(Ordering::Acquire) == 0
        })
    }

    /// Ends parking ([`crate::Config::park_on_peer_loss`]): every member
    /// parked so far is aborted (as [`AbortSignal::trigger`] aborts), and
    /// none parks from now on. For giving communicators up without
    /// shrinking them; [`AbortSignal::wait_settled`] then waits for them.
    pub fn end_parking(&self) {
        self.inner.parking_ended.store(true, Ordering::Release);
        let members = self.live_members();
        for member in &members {
            member.unpark();
        }
        if let Some(cause) = self.cause() {
            abort_members(&members, &cause);
        }
    }

    /// Whether [`AbortSignal::end_parking`] was called.
    pub(crate) fn parking_ended(&self) -> bool {
        self.inner.parking_ended.load(Ordering::Acquire)
    }

    /// As [`AbortSignal::wait_settled`], but a parked member counts as
    /// settled once no thread is at it (its kernels' stop, which calls
    /// NCCL, done), and so does the teardown of a parked member dropped since
    /// (its abort runs on a thread of its own): NCCL is done with every
    /// member that is not parked. Returns whether that came in time. For
    /// survivors about to shrink their parked communicators, who must not
    /// make new ones while NCCL still aborts others of theirs (a world's
    /// splits), but need not wait for the aborts of a lost rank's parked
    /// ones in the same process, which have their own GPUs. At each look
    /// it does what the members' holders let go of undone (a due abort or
    /// park, a parked one's stop), so call it holding no communicator.
    pub fn wait_quiet(&self, until: Instant) -> bool {
        wait_until(until, || {
            // As in `wait_settled`: the members, then the counts (the
            // parked one first, so it never exceeds the whole).
            let (members, dropping) = self.look();
            let parked = self.inner.parked_teardowns.load(Ordering::Acquire);
            let all = self.inner.teardowns.load(Ordering::Acquire);
            // What a thread let go of undone (a due abort, a parked one's
            // stop) is done here: the caller holds no communicator.
            for member in &members {
                member.stop_parked();
            }
            !dropping
                && all.saturating_sub(parked) == 0
                && members.iter().all(|m| m.is_parked_idle() || m.is_settled())
        })
    }

    /// The communicators that carry it and still exist.
    fn live_members(&self) -> Vec<Arc<dyn Abortable>> {
        self.look().0
    }

    /// The members that still exist (held, so none starts its drop while
    /// the caller looks), and whether the drop of another is under way: it
    /// no longer upgrades, and its drop has not counted its teardown yet
    /// ([`Enrolment`]). One pass under the roll's lock.
    fn look(&self) -> (Vec<Arc<dyn Abortable>>, bool) {
        let roll = self.inner.members.lock().unwrap_or_else(|p| p.into_inner());
        let mut dropping = false;
        let mut live = Vec::with_capacity(roll.len());
        for (member, gone) in roll.iter() {
            match member.upgrade() {
                Some(m) => live.push(m),
                None => dropping |= !gone.load(Ordering::Acquire),
            }
        }
        (live, dropping)
    }

    /// Counts a teardown of one of its communicators until the returned
    /// value drops.
    /// `parked`: the member was parked (see [`AbortSignal::wait_quiet`]).
    pub(crate) fn pending_teardown(&self, parked: bool) -> PendingTeardown {
        // The parked count first, so it never exceeds the whole.
        if parked {
            self.inner.parked_teardowns.fetch_add(1, Ordering::AcqRel);
        }
        self.inner.teardowns.fetch_add(1, Ordering::AcqRel);
        PendingTeardown {
            inner: Arc::clone(&self.inner),
            parked,
        }
    }

    /// Adds a communicator (at its creation); it stays on the roll until
    /// its drop has counted its teardown (`Enrolment::leave`).
    pub(crate) fn enroll(&self, member: Weak<dyn Abortable>, enrolment: &Enrolment) {
        let mut members = self.inner.members.lock().unwrap_or_else(|p| p.into_inner());
        members.retain(|(w, gone)| w.strong_count() > 0 || !gone.load(Ordering::Acquire));
        members.push((member, Arc::clone(&enrolment.0)));
    }
}

#[cfg(test)]
mod tests;
