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

use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// `ncclCommAbort` (once; later calls do nothing).
    fn abort(&mut self);
    /// Lets go of the lock.
    fn unlock(&mut self);
}

/// Runs the calls it is given inside one NCCL group of the calling thread
/// (this file sits below the library and the groups: the communicator
/// hands it in). `false`, with the calls not run, where no group opened.
pub(crate) type GroupCalls = fn(&mut dyn FnMut()) -> bool;

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
        group(&mut || {
            for h in held.iter_mut() {
                h.abort();
            }
        });
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
    let together: Vec<&Arc<dyn Abortable>> = members
        .iter()
        .rev()
        .filter(|m| m.aborts_together())
        .collect();
    if together.len() > 1 {
        abort_held(together.iter().filter_map(|m| m.hold_for_abort()).collect());
    }
    for member in members.iter().rev() {
        member.request_abort(cause.clone());
    }
}

struct SignalInner {
    /// Set once, when triggered: whether and why.
    cause: OnceLock<AbortCause>,
    members: Mutex<Vec<Weak<dyn Abortable>>>,
    /// Teardowns of members dropped while live, not yet done
    /// ([`PendingTeardown`]).
    teardowns: AtomicUsize,
}

/// A teardown of a communicator that carried the signal and was dropped
/// while live (its finalize or `ncclCommAbort`, on a thread of its own):
/// counted by the signal while this lives.
pub(crate) struct PendingTeardown(Arc<SignalInner>);

impl PendingTeardown {
    /// Whether the signal fired.
    pub(crate) fn fired(&self) -> bool {
        self.0.cause.get().is_some()
    }
}

impl Drop for PendingTeardown {
    fn drop(&mut self) {
        self.0.teardowns.fetch_sub(1, Ordering::AcqRel);
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
    /// so it runs to `until`.
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
        let mut pause = Duration::from_micros(50);
        loop {
            let members = self.live_members();
            // The trigger's own attempt may have found a lock taken (by a
            // thread that then let go without aborting).
            if let Some(cause) = self.cause()
                && members.iter().any(|m| !m.is_settled())
            {
                abort_members(&members, &cause);
            }
            let settled = members.iter().all(|m| m.is_settled());
            drop(members);
            if settled && self.inner.teardowns.load(Ordering::Acquire) == 0 {
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

    /// The communicators that carry it and still exist.
    fn live_members(&self) -> Vec<Arc<dyn Abortable>> {
        self.inner
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Counts a teardown of one of its communicators until the returned
    /// value drops.
    pub(crate) fn pending_teardown(&self) -> PendingTeardown {
        self.inner.teardowns.fetch_add(1, Ordering::AcqRel);
        PendingTeardown(Arc::clone(&self.inner))
    }

    /// Adds a communicator (at its creation).
    pub(crate) fn enroll(&self, member: Weak<dyn Abortable>) {
        let mut members = self.inner.members.lock().unwrap_or_else(|p| p.into_inner());
        members.retain(|w| w.strong_count() > 0);
        members.push(member);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A member that logs what the signal asks of it.
    struct Logged {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
        /// Set when this member learns of the cause.
        noted: AtomicBool,
        /// Another member whose cause this one's abort waits for, as
        /// `ncclCommAbort` of an idle communicator waits behind a stuck
        /// kernel that only the other's abort ends.
        waits_for: Option<Arc<Logged>>,
    }

    impl Abortable for Logged {
        fn note_cause(&self, cause: AbortCause) {
            self.noted.store(true, Ordering::SeqCst);
            self.log
                .lock()
                .unwrap()
                .push(format!("note {} {cause}", self.name));
        }

        fn request_abort(&self, _cause: AbortCause) -> bool {
            if let Some(other) = &self.waits_for {
                // What a thread polling the other would do at its next look.
                assert!(
                    other.noted.load(Ordering::SeqCst),
                    "{}'s abort would wait for {}, which has not learned of the cause",
                    self.name,
                    other.name
                );
            }
            self.log
                .lock()
                .unwrap()
                .push(format!("abort {}", self.name));
            true
        }

        fn is_settled(&self) -> bool {
            self.noted.load(Ordering::SeqCst)
        }
    }

    fn member(
        name: &'static str,
        log: &Arc<Mutex<Vec<String>>>,
        waits_for: Option<Arc<Logged>>,
    ) -> Arc<Logged> {
        Arc::new(Logged {
            name,
            log: Arc::clone(log),
            noted: AtomicBool::new(false),
            waits_for,
        })
    }

    #[test]
    fn every_member_learns_the_cause_before_any_abort_and_the_newest_aborts_first() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let data = member("data", &log, None);
        // Enrolled first, as a world's control communicator is (its split
        // makes the data one), and its abort waits for the data one.
        let control = member("control", &log, Some(Arc::clone(&data)));
        let signal = AbortSignal::new();
        signal.enroll(Arc::downgrade(
            &(Arc::clone(&control) as Arc<dyn Abortable>),
        ));
        signal.enroll(Arc::downgrade(&(Arc::clone(&data) as Arc<dyn Abortable>)));
        signal.trigger(AbortCause::Other("test".into()));
        let log = log.lock().unwrap().clone();
        assert_eq!(
            log,
            [
                "note control test",
                "note data test",
                "abort data",
                "abort control"
            ]
        );
        assert!(signal.is_triggered());
    }

    #[test]
    fn a_member_enrolled_after_the_signal_fired_is_asked_to_abort_by_the_next_trigger_only() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let signal = AbortSignal::new();
        signal.trigger(AbortCause::Requested);
        let late = member("late", &log, None);
        signal.enroll(Arc::downgrade(&(Arc::clone(&late) as Arc<dyn Abortable>)));
        // The communicator itself reads the signal at its next call
        // (`Shared::abort_due`); a second trigger reaches it too.
        assert!(log.lock().unwrap().is_empty());
        signal.trigger(AbortCause::Other("again".into()));
        assert_eq!(
            *log.lock().unwrap(),
            ["note late abort requested", "abort late"],
            "the first cause wins"
        );
    }

    /// A member whose `ncclCommAbort` runs on another thread until `done`.
    struct Aborting {
        done: AtomicBool,
    }

    impl Abortable for Aborting {
        fn note_cause(&self, _cause: AbortCause) {}

        fn request_abort(&self, _cause: AbortCause) -> bool {
            false
        }

        fn is_settled(&self) -> bool {
            self.done.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn wait_settled_waits_for_every_member_still_there_and_ends_at_its_deadline() {
        let signal = AbortSignal::new();
        let slow = Arc::new(Aborting {
            done: AtomicBool::new(false),
        });
        signal.enroll(Arc::downgrade(&(Arc::clone(&slow) as Arc<dyn Abortable>)));
        // A member already dropped does not count.
        let gone: Arc<dyn Abortable> = Arc::new(Aborting {
            done: AtomicBool::new(false),
        });
        signal.enroll(Arc::downgrade(&gone));
        drop(gone);
        let started = Instant::now();
        assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(30)));
        assert!(started.elapsed() >= Duration::from_millis(30));
        let other = Arc::clone(&slow);
        let finisher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            other.done.store(true, Ordering::SeqCst);
        });
        let started = Instant::now();
        assert!(signal.wait_settled(Instant::now() + Duration::from_secs(10)));
        assert!(started.elapsed() >= Duration::from_millis(15));
        finisher.join().unwrap();
        // A teardown of a member dropped live is waited for too.
        let pending = signal.pending_teardown();
        assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(20)));
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(pending);
        });
        assert!(signal.wait_settled(Instant::now() + Duration::from_secs(10)));
        ender.join().unwrap();
    }

    #[test]
    fn wait_settled_asks_again_for_the_abort_of_a_member_still_live() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let signal = AbortSignal::new();
        let m = member("m", &log, None);
        signal.enroll(Arc::downgrade(&(Arc::clone(&m) as Arc<dyn Abortable>)));
        // Not triggered: nothing is asked, and a live member is waited for.
        assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(10)));
        assert!(log.lock().unwrap().is_empty());
        signal.trigger(AbortCause::Requested);
        assert!(signal.wait_settled(Instant::now() + Duration::from_secs(10)));
    }

    thread_local! {
        /// What the holdable members and their fake group calls did, on
        /// this test's thread.
        static HELD_LOG: std::cell::RefCell<Vec<String>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }

    fn say(what: String) {
        HELD_LOG.with(|l| l.borrow_mut().push(what));
    }

    fn said() -> Vec<String> {
        HELD_LOG.with(|l| l.borrow().clone())
    }

    /// Stands for `ncclGroupStart`/`ncclGroupEnd` around the calls.
    fn fake_group(calls: &mut dyn FnMut()) -> bool {
        say("group start".into());
        calls();
        say("group end".into());
        true
    }

    /// A member that can be held for an abort with others, as a live
    /// communicator whose lock is free can; `group`: what its holds offer
    /// to bracket the aborts with.
    struct Holdable {
        name: &'static str,
        lock: Mutex<()>,
        aborted: AtomicBool,
        group: Option<GroupCalls>,
    }

    impl Abortable for Holdable {
        fn note_cause(&self, _cause: AbortCause) {
            say(format!("note {}", self.name));
        }

        fn request_abort(&self, _cause: AbortCause) -> bool {
            match self.lock.try_lock() {
                Ok(_) if !self.aborted.swap(true, Ordering::SeqCst) => {
                    say(format!("abort alone {}", self.name));
                }
                Ok(_) => {}
                // The thread in a call on it aborts it when it lets go.
                Err(_) => say(format!("asked {}", self.name)),
            }
            self.aborted.load(Ordering::SeqCst)
        }

        fn is_settled(&self) -> bool {
            self.aborted.load(Ordering::SeqCst) && self.lock.try_lock().is_ok()
        }

        fn aborts_together(&self) -> bool {
            true
        }

        fn hold_for_abort(&self) -> Option<Box<dyn HeldForAbort + '_>> {
            let guard = self.lock.try_lock().ok()?;
            if self.aborted.load(Ordering::SeqCst) {
                return None;
            }
            say(format!("hold {}", self.name));
            Some(Box::new(HeldHoldable {
                member: self,
                guard: Some(guard),
            }))
        }
    }

    struct HeldHoldable<'a> {
        member: &'a Holdable,
        guard: Option<std::sync::MutexGuard<'a, ()>>,
    }

    impl HeldForAbort for HeldHoldable<'_> {
        fn group(&self) -> Option<GroupCalls> {
            self.member.group
        }

        fn abort(&mut self) {
            self.member.aborted.store(true, Ordering::SeqCst);
            say(format!("abort {}", self.member.name));
        }

        fn unlock(&mut self) {
            self.guard = None;
            say(format!("unlock {}", self.member.name));
        }
    }

    /// Members named `names`, enrolled in that order (oldest first).
    fn holdables(
        signal: &AbortSignal,
        names: &[&'static str],
        group: Option<GroupCalls>,
    ) -> Vec<Arc<Holdable>> {
        let members: Vec<Arc<Holdable>> = names
            .iter()
            .map(|&name| {
                Arc::new(Holdable {
                    name,
                    lock: Mutex::new(()),
                    aborted: AtomicBool::new(false),
                    group,
                })
            })
            .collect();
        for m in &members {
            signal.enroll(Arc::downgrade(&(Arc::clone(m) as Arc<dyn Abortable>)));
        }
        members
    }

    #[test]
    fn without_a_group_the_held_members_are_let_go_unaborted_and_abort_one_at_a_time() {
        let signal = AbortSignal::new();
        let members = holdables(&signal, &["control", "data", "busy"], None);
        // Another thread is in a call on `busy`.
        let in_call = members[2].lock.lock().unwrap();
        signal.trigger(AbortCause::Requested);
        assert_eq!(
            said(),
            [
                "note control",
                "note data",
                "note busy",
                "hold data",
                "hold control",
                // No group: let go unaborted, then one at a time, newest
                // first.
                "unlock data",
                "unlock control",
                "asked busy",
                "abort alone data",
                "abort alone control",
            ]
        );
        // Not settled while that thread holds it; once it let go without
        // aborting, `wait_settled` aborts it.
        assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(10)));
        drop(in_call);
        assert!(signal.wait_settled(Instant::now() + Duration::from_secs(10)));
        let log = said();
        assert_eq!(
            log[log.len() - 3..],
            ["hold busy", "unlock busy", "abort alone busy"]
        );
    }

    #[test]
    fn members_held_together_abort_inside_one_group_newest_first_and_are_let_go_after_its_end() {
        let signal = AbortSignal::new();
        let _members = holdables(&signal, &["a", "b", "c"], Some(fake_group));
        signal.trigger(AbortCause::Requested);
        assert_eq!(
            said()[3..],
            [
                "hold c",
                "hold b",
                "hold a",
                "group start",
                "abort c",
                "abort b",
                "abort a",
                "group end",
                "unlock c",
                "unlock b",
                "unlock a"
            ]
        );
        assert!(signal.wait_settled(Instant::now() + Duration::from_secs(1)));
    }

    #[test]
    fn a_lone_member_that_could_group_aborts_without_a_group() {
        let signal = AbortSignal::new();
        let _members = holdables(&signal, &["a"], Some(fake_group));
        let other = member("other", &Arc::new(Mutex::new(Vec::new())), None);
        signal.enroll(Arc::downgrade(&(Arc::clone(&other) as Arc<dyn Abortable>)));
        signal.trigger(AbortCause::Requested);
        // Only one member aborts together: the one-at-a-time path.
        assert_eq!(said(), ["note a", "abort alone a"]);
    }
}
