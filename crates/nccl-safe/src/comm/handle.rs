//! The shared state behind a `Comm` and its `AbortHandle`s: the raw
//! handle under a mutex, the abort protocol, and the waits on it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use cudarc::driver::CudaContext;
use nccl_sys::{ncclComm_t, ncclResult_t};

use crate::abort::{AbortCause, AbortSignal, Abortable, HeldForAbort};
use crate::comm::poll::{async_status, poll_with_backoff};
use crate::comm::teardown::{Clique, Member, bounded};
use crate::library::Library;
use crate::observe::OpObserver;
use crate::one_shot::Words;
use crate::{Error, Result};

/// The state `ncclCommGetAsyncError` reports.
#[derive(Debug)]
#[non_exhaustive]
pub enum CommStatus {
    /// No error; nothing pending.
    Ready,
    /// A nonblocking call is still running.
    InProgress,
    /// An asynchronous error (a peer failed, a network error, ...).
    Failed(Error),
}

pub(crate) enum State {
    Live(ncclComm_t),
    Aborted,
    Closed,
}

/// A number for the calling thread, never 0, unique in this process.
pub(crate) fn thread_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static KEY: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    KEY.with(|k| *k)
}

/// What `Comm` and `AbortHandle` share.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) lib: &'static Library,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) blocking: bool,
    pub(crate) timeout: Duration,
    pub(crate) clique: Option<Arc<Clique>>,
    /// Why it was (or is to be) aborted; the first cause wins. Set when an
    /// abort is asked for: while the abort cannot happen at once (the lock
    /// is busy, or an open group refers to the communicator), whoever holds
    /// the lock next performs it.
    pub(crate) cause: OnceLock<AbortCause>,
    /// Set, under the lock, while a group open on some thread holds calls
    /// on this communicator: NCCL still refers to it until that group
    /// ends, so an abort waits for the end (it crashed NCCL otherwise).
    pub(crate) in_open_group: AtomicBool,
    /// The thread ([`thread_key`]) whose open group holds calls on this
    /// communicator, while `in_open_group` is set: calls from other threads
    /// (through another handle, [`crate::Comm::share`]) wait for its end,
    /// at most the timeout.
    pub(crate) group_thread: AtomicU64,
    /// How many `Comm` handles there are ([`crate::Comm::share`]):
    /// finalize and destroy need to be the last.
    pub(crate) handles: std::sync::atomic::AtomicUsize,
    /// What the connection gate already let through, for every handle of
    /// this communicator ([`crate::Comm::share`]).
    pub(crate) reached: Mutex<crate::comm::Reached>,
    /// The job's signal, if any.
    pub(crate) signal: Option<AbortSignal>,
    /// Recorded on the comm's stream by the last `Comm`'s drop: teardown
    /// waits for it (with the deadline) before it finalizes.
    pub(crate) drain: Mutex<Option<cudarc::driver::CudaEvent>>,
    /// The observer at drop time, asked whether work is still unfinished.
    pub(crate) last_observer: Mutex<Option<Arc<dyn OpObserver>>>,
    /// Events of completion futures that are done with them (seen
    /// complete), kept for the next future so that tracking an operation
    /// costs one `cuEventRecord`, not a create and a destroy too.
    pub(crate) spare_events: Mutex<Vec<cudarc::driver::CudaEvent>>,
    /// The host-mapped abort and status words of our own kernels
    /// (`crate::one_shot`), made with the first symmetric buffer that may
    /// use them (`None` inside: they could not be made).
    pub(crate) kernel_words: OnceLock<Option<Words>>,
    /// Made with [`crate::Config::park_on_peer_loss`].
    pub(crate) park_on_loss: bool,
    /// An abort for a lost peer was put off (`park.rs`): the
    /// handle is live in NCCL, every call is refused as aborted.
    pub(crate) parked: AtomicBool,
    /// No parking any more: an abort was asked for with another cause, by
    /// [`Shared::abort`], or by [`AbortSignal::end_parking`].
    pub(crate) unparked: AtomicBool,
    /// A parked blocking communicator whose kernels are still to be
    /// stopped ([`Shared::stop_if_pending`]).
    pub(crate) stop_pending: AtomicBool,
    /// Where stopping a parked communicator's kernels made one: the
    /// one-rank communicator NCCL made for it, torn down after this one.
    pub(crate) stopper: Mutex<Option<crate::Comm>>,
    /// A [`crate::Comm::shrink_parked`] runs on it: the shrink's own calls
    /// and polls pass although it is parked, and any abort asked for
    /// meanwhile unparks it (a second loss cuts the shrink short).
    pub(crate) shrinking: AtomicBool,
    /// A nonblocking init (no parent) is still polled by the thread that
    /// made it ([`Shared::wait_created`]): no other thread aborts it
    /// (NCCL's abort would wait there for the init thread); that thread
    /// answers `Aborted` and its drop of the handle makes the abort.
    pub(crate) creating: AtomicBool,
    /// Its place on its signal's roll, left once `Drop::drop` has counted
    /// the teardown, so the signal's waits never miss a member mid-drop.
    pub(crate) enrolment: crate::abort::Enrolment,
}

// SAFETY: the only non-thread-safe part is the raw `ncclComm_t`, which is
// only touched with `state` locked, so calls on it never overlap. NCCL lets
// a communicator be used from different threads one after another, and
// `ncclCommAbort` from any thread (NCCL's fault-tolerance model).
unsafe impl Send for Shared {}
// SAFETY: as above: shared access goes through the mutex.
unsafe impl Sync for Shared {}

impl Shared {
    /// Records why the communicator is (to be) aborted, the first cause
    /// winning, and stops our kernels' waits on it (their abort word).
    pub(crate) fn set_cause(&self, cause: AbortCause) -> std::result::Result<(), AbortCause> {
        let set = self.cause.set(cause);
        // Pairs with the fence in `kernel_words`: either a launch sees the
        // cause, or this sees the words and raises them.
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(Some(words)) = self.kernel_words.get() {
            words.raise_abort();
        }
        set
    }

    /// The kernels' words, made on first use; `None` when they could not
    /// be. Raised at once when a cause is already recorded.
    pub(crate) fn kernel_words(&self) -> Option<Words> {
        let words = *self.kernel_words.get_or_init(|| Words::new(&self.ctx));
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(w) = &words
            && self.abort_due()
        {
            w.raise_abort();
        }
        words
    }

    /// Why one of our kernels on this communicator ended early (it saw the
    /// abort, or timed out), if one did: its result is undefined. One
    /// volatile read.
    pub(crate) fn kernel_cause(&self) -> Option<AbortCause> {
        let Some(Some(words)) = self.kernel_words.get() else {
            return None;
        };
        match words.status() {
            0 => None,
            1 => Some(self.cause.get().cloned().unwrap_or(AbortCause::Requested)),
            _ => Some(AbortCause::Timeout {
                op: "one-shot all-reduce",
                seq: None,
            }),
        }
    }

    /// An error when one of our kernels on this communicator ended early:
    /// the communicator is then aborted (without waiting).
    pub(crate) fn kernel_failed(&self, op: &'static str) -> Result<()> {
        match self.kernel_cause() {
            None => Ok(()),
            Some(cause) => {
                self.request_abort(cause);
                Err(self.aborted(op))
            }
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What the connection gate let through, for every handle.
    pub(crate) fn lock_reached(&self) -> MutexGuard<'_, crate::comm::Reached> {
        self.reached.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The error for a call that found the communicator aborted.
    pub(crate) fn aborted(&self, op: &'static str) -> Error {
        Error::Aborted {
            op,
            cause: self.cause.get().cloned().unwrap_or(AbortCause::Requested),
        }
    }

    /// Whether an abort is due: asked for, or the job's signal fired.
    pub(crate) fn abort_due(&self) -> bool {
        if self.cause.get().is_some() {
            return true;
        }
        match self.signal.as_ref().and_then(AbortSignal::cause) {
            Some(cause) => {
                let _ = self.set_cause(cause);
                true
            }
            None => false,
        }
    }

    /// Performs a due abort now if nothing refers to the communicator any
    /// more (the caller holds the lock). Returns whether it is aborted.
    ///
    /// `true` only for the transition from live to aborted made here, so
    /// [`Shared::after_abort`] runs once per communicator. A due abort for
    /// a lost peer parks the communicator instead where it may
    /// ([`Shared::park_if_due`], `park.rs`).
    pub(crate) fn settle_abort(&self, state: &mut MutexGuard<'_, State>) -> bool {
        if !self.abort_ready(state) || self.park_if_due(state) {
            return false;
        }
        let _ = self.abort_locked(state);
        true
    }

    /// Whether an abort can happen now (the caller holds the lock): live,
    /// due, created, not parked, and no open group refers to it.
    pub(crate) fn abort_ready(&self, state: &State) -> bool {
        matches!(state, State::Live(_))
            && self.abort_due()
            && !self.creating.load(Ordering::SeqCst)
            && !self.is_parked()
            && !self.in_open_group.load(Ordering::Acquire)
    }

    /// Runs `f` on the live handle with the device's context current. An
    /// abort that is due happens first (and the call is refused); one that
    /// was asked for while `f` ran happens right after it.
    pub(crate) fn with_raw<R>(
        &self,
        op: &'static str,
        f: impl FnOnce(ncclComm_t) -> Result<R>,
    ) -> Result<R> {
        self.with_raw_from(op, false, f)
    }

    /// As [`Shared::with_raw`]; `any_thread`: also while a group open on
    /// another thread holds calls on the communicator (for
    /// `ncclCommGetAsyncError` and the error text, which change nothing),
    /// where other calls wait for that group's end, at most the timeout
    /// ([`Error::Timeout`]).
    fn with_raw_from<R>(
        &self,
        op: &'static str,
        any_thread: bool,
        f: impl FnOnce(ncclComm_t) -> Result<R>,
    ) -> Result<R> {
        let mut state = self.lock();
        if !any_thread && self.held_by_another_group() {
            drop(state);
            state = self.after_another_group(op)?;
        }
        let result = match *state {
            State::Live(raw) => {
                if self.abort_due() && !self.shrinks_parked() {
                    return Err(self.refuse_due(state, op));
                }
                make_current(&self.ctx).map_err(|source| Error::Cuda { op, source })?;
                f(raw)
            }
            State::Aborted | State::Closed => return Err(self.refuse_not_live(&state, op)),
        };
        if self.cause.get().is_some() {
            self.abort_asked_during(state);
        }
        result
    }

    // The three paths of `with_raw_from` that no valid call on a live
    // communicator takes, out of line and cold: the call's own code then
    // spans fewer instruction cache lines, each fetched again after
    // NCCL's enqueue evicted it (`segments.rs`).

    /// A due abort, made now where it can be; the call is refused.
    #[cold]
    #[inline(never)]
    fn refuse_due(&self, mut state: MutexGuard<'_, State>, op: &'static str) -> Error {
        let aborted = self.settle_and_stop(&mut state);
        drop(state);
        if aborted {
            self.after_abort();
        }
        self.aborted(op)
    }

    /// The refusal of a call on a communicator aborted or closed.
    #[cold]
    #[inline(never)]
    fn refuse_not_live(&self, state: &State, op: &'static str) -> Error {
        match state {
            State::Closed => Error::Finalized { op },
            State::Aborted | State::Live(_) => self.aborted(op),
        }
    }

    /// An abort asked for while the call ran: made right after it.
    #[cold]
    #[inline(never)]
    fn abort_asked_during(&self, mut state: MutexGuard<'_, State>) {
        if self.settle_and_stop(&mut state) {
            drop(state);
            self.after_abort();
        }
    }

    /// Whether a [`crate::Comm::shrink_parked`] runs on it, parked: its
    /// calls pass.
    fn shrinks_parked(&self) -> bool {
        self.shrinking.load(Ordering::Acquire) && self.is_parked()
    }

    /// Whether NCCL calls on it block.
    pub(crate) fn is_blocking(&self) -> bool {
        self.blocking
    }

    /// Whether a group open on another thread holds calls on the
    /// communicator (exact with the lock held; a hint without it).
    fn held_by_another_group(&self) -> bool {
        self.in_open_group.load(Ordering::Acquire)
            && self.group_thread.load(Ordering::Relaxed) != thread_key()
    }

    /// The lock, once no group open on another thread holds calls on the
    /// communicator (another handle's, [`crate::Comm::share`]), or at once
    /// when an abort is due (the caller then answers `Aborted` without
    /// touching NCCL); after the timeout, [`Error::Timeout`].
    #[cold]
    #[inline(never)]
    fn after_another_group(&self, op: &'static str) -> Result<MutexGuard<'_, State>> {
        let started = std::time::Instant::now();
        let free = || !self.held_by_another_group() || self.abort_due();
        loop {
            let left = self.timeout.saturating_sub(started.elapsed());
            let waited = poll_with_backoff(left, || Ok(free()))?;
            let state = self.lock();
            if free() {
                return Ok(state);
            }
            if waited.is_some() {
                return Err(Error::Timeout {
                    op,
                    waited: started.elapsed(),
                });
            }
        }
    }

    /// Marks the communicator as used by the group open on this thread
    /// (call with the lock held, i.e. inside [`Shared::with_raw`]).
    pub(crate) fn enter_group(&self) {
        self.group_thread.store(thread_key(), Ordering::Relaxed);
        self.in_open_group.store(true, Ordering::Release);
    }

    /// The group that used the communicator has ended: an abort asked for
    /// meanwhile happens now.
    pub(crate) fn leave_group(&self) {
        let mut state = self.lock();
        // A group that touched it without holding it (its call waited for
        // another thread's group and gave up) leaves that group's mark.
        if self.held_by_another_group() {
            return;
        }
        self.in_open_group.store(false, Ordering::Release);
        if self.settle_abort(&mut state) {
            drop(state);
            self.after_abort();
        }
    }

    /// Asks for an abort with `cause`, without waiting: done now when the
    /// lock is free and no open group refers to the communicator, else by
    /// the thread that holds it as soon as it lets go (or at the group's
    /// end). Returns whether it is aborted now.
    pub(crate) fn request_abort(&self, cause: AbortCause) -> bool {
        // Only a loss parks; a parked one's shrink ends at any request.
        if !matches!(cause, AbortCause::PeerLost { .. }) || self.shrinking.load(Ordering::Acquire) {
            self.unparked.store(true, Ordering::Release);
        }
        let _ = self.set_cause(cause);
        let Some(mut state) = self.try_lock() else {
            return false;
        };
        let aborted_here = self.settle_abort(&mut state);
        let aborted = matches!(*state, State::Aborted);
        drop(state);
        if aborted_here {
            self.after_abort();
        }
        aborted
    }

    /// Whether an abort was asked for or done.
    pub(crate) fn abort_requested(&self) -> bool {
        self.abort_due() || matches!(self.try_lock().as_deref(), Some(State::Aborted))
    }

    /// Polls `ncclCommGetAsyncError` until the communicator is no longer
    /// `ncclInProgress`, against the communicator's deadline. The lock is
    /// released between polls so an abort can get in.
    pub(crate) fn wait_ready(&self, op: &'static str) -> Result<()> {
        self.poll_until(op, |status| Ok(status == ncclResult_t::ncclSuccess))
    }

    /// Polls a nonblocking init (a communicator with no parent) until NCCL
    /// no longer reports `ncclInProgress`, against the communicator's
    /// deadline, like [`Shared::wait_ready`], except that it answers
    /// [`Error::Aborted`] as soon as an abort is due and never waits for
    /// the lock.
    ///
    /// Meanwhile no other thread aborts the communicator
    /// ([`Shared::creating`]): NCCL's `ncclCommAbort` of a communicator
    /// being initialised first joins its init thread, which does not look at
    /// the abort flag while it loads NCCL's kernels (the first
    /// communicator of a process; up to 2 s with four processes loading
    /// at once on 4 H100s). The thread that asked (the liveness channel's,
    /// which names no other loss meanwhile) would wait there, and this one
    /// for the lock. The handle's drop makes the abort instead, on a
    /// teardown thread that the signal counts
    /// ([`crate::AbortSignal::wait_settled`] and
    /// [`crate::AbortSignal::wait_quiet`] wait for it). Nothing the caller
    /// owns is in NCCL's hands during a creation.
    pub(crate) fn wait_created(&self, op: &'static str) -> Result<()> {
        let mut failed = None;
        let timed_out = poll_with_backoff(self.timeout, || {
            if self.abort_due() {
                return Err(self.aborted(op));
            }
            let Some(state) = self.try_lock() else {
                return Ok(false);
            };
            let raw = match *state {
                State::Live(raw) => raw,
                State::Aborted => return Err(self.aborted(op)),
                State::Closed => return Err(Error::Finalized { op }),
            };
            make_current(&self.ctx).map_err(|source| Error::Cuda { op, source })?;
            match async_status(self.lib, raw)? {
                ncclResult_t::ncclSuccess => Ok(true),
                ncclResult_t::ncclInProgress => Ok(false),
                code => {
                    failed = Some(self.lib.check(op, code, raw));
                    Ok(true)
                }
            }
        })?;
        match (failed, timed_out) {
            (Some(error), _) => error,
            (None, None) => Ok(()),
            (None, Some(waited)) => Err(Error::Timeout { op, waited }),
        }
    }

    /// The one polling loop of our waits: returns when `done` (given the
    /// asynchronous status) says so, with the NCCL error when the
    /// communicator reports one, [`Error::Aborted`] when it was aborted
    /// meanwhile, or [`Error::Timeout`] after the communicator's timeout.
    /// The lock is released between polls, so an abort can get in; the
    /// pause grows from 5 µs to 1 ms.
    pub(crate) fn poll_until(
        &self,
        op: &'static str,
        mut done: impl FnMut(ncclResult_t) -> Result<bool>,
    ) -> Result<()> {
        let mut failed = None;
        let timed_out = poll_with_backoff(self.timeout, || {
            let status = self.with_raw_from(op, true, |raw| async_status(self.lib, raw))?;
            if status != ncclResult_t::ncclSuccess && status != ncclResult_t::ncclInProgress {
                failed = Some(status);
                return Ok(true);
            }
            done(status)
        })?;
        if let Some(status) = failed {
            return self.with_raw_from(op, true, |raw| self.lib.check(op, status, raw));
        }
        match timed_out {
            None => Ok(()),
            Some(waited) => Err(Error::Timeout { op, waited }),
        }
    }

    /// `ncclCommGetAsyncError` as a [`CommStatus`].
    pub(crate) fn status(&self) -> Result<CommStatus> {
        const OP: &str = "ncclCommGetAsyncError";
        self.with_raw_from(OP, true, |raw| {
            let status = async_status(self.lib, raw)?;
            Ok(match status {
                ncclResult_t::ncclSuccess => CommStatus::Ready,
                ncclResult_t::ncclInProgress => CommStatus::InProgress,
                code => {
                    CommStatus::Failed(self.lib.check("async error", code, raw).err().unwrap_or(
                        Error::InvalidArgument {
                            op: OP,
                            reason: "unknown status",
                        },
                    ))
                }
            })
        })
    }

    /// As [`Shared::status`], but `None` instead of waiting when another
    /// thread is inside a call on the communicator (a watchdog must never
    /// wait behind a blocking NCCL call).
    pub(crate) fn status_nowait(&self) -> Option<Result<CommStatus>> {
        const OP: &str = "ncclCommGetAsyncError";
        let state = self.try_lock()?;
        let raw = match *state {
            State::Live(raw) => raw,
            State::Aborted => return Some(Err(self.aborted(OP))),
            State::Closed => return Some(Err(Error::Finalized { op: OP })),
        };
        let mut state = state;
        if self.abort_due() {
            // Performed on the guard held (never a blocking lock here).
            let aborted_here = self.settle_abort(&mut state);
            drop(state);
            if aborted_here {
                self.after_abort();
            }
            return Some(Err(self.aborted(OP)));
        }
        if let Err(source) = self.ctx.bind_to_thread() {
            return Some(Err(Error::Cuda { op: OP, source }));
        }
        Some(async_status(self.lib, raw).map(|status| match status {
            ncclResult_t::ncclSuccess => CommStatus::Ready,
            ncclResult_t::ncclInProgress => CommStatus::InProgress,
            code => CommStatus::Failed(self.lib.check("async error", code, raw).err().unwrap_or(
                Error::InvalidArgument {
                    op: OP,
                    reason: "unknown status",
                },
            )),
        }))
    }

    /// `ncclCommAbort` with the lock held; the state becomes `Aborted`.
    pub(crate) fn abort_locked(&self, state: &mut MutexGuard<'_, State>) -> Result<()> {
        let State::Live(raw) = **state else {
            return Ok(());
        };
        **state = State::Aborted;
        let _ = self.set_cause(AbortCause::Requested);
        let _span = tracing::debug_span!("nccl.abort").entered();
        let _ = self.ctx.bind_to_thread();
        match self.lib.raw().ncclCommAbort() {
            Ok(abort) => {
                // SAFETY: `raw` was live and the state now says Aborted,
                // so nobody else uses or frees it; no open group of the
                // caller's refers to it (checked by the callers: the one
                // group a signal may open around it holds only aborts);
                // aborted exactly once.
                let code = unsafe { abort(raw) };
                self.lib.check("ncclCommAbort", code, std::ptr::null_mut())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// After an abort, with the lock released: the clique may tear down
    /// its other members now, which must not wait on this one.
    pub(crate) fn after_abort(&self) {
        if let Some(clique) = &self.clique {
            clique.withdraw();
        }
    }

    /// Aborts with `cause`, waiting for a call in progress on another
    /// thread to return. Deferred to the group's end when an open group
    /// refers to the communicator.
    pub(crate) fn abort(&self, cause: AbortCause) -> Result<()> {
        self.unparked.store(true, Ordering::Release);
        let _ = self.set_cause(cause);
        let mut state = self.lock();
        if !matches!(*state, State::Live(_)) || self.in_open_group.load(Ordering::Acquire) {
            return Ok(());
        }
        let result = self.abort_locked(&mut state);
        drop(state);
        self.after_abort();
        result
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let abort_due = self.abort_due();
        let state = std::mem::replace(
            self.state.get_mut().unwrap_or_else(|p| p.into_inner()),
            State::Closed,
        );
        let State::Live(raw) = state else {
            self.enrolment.leave();
            return;
        };
        let member = Member {
            raw,
            lib: self.lib,
            ctx: Arc::clone(&self.ctx),
            blocking: self.blocking,
            timeout: self.timeout,
            abort_only: abort_due,
            drain: self
                .drain
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
            observer: self
                .last_observer
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
            pending: self
                .signal
                .as_ref()
                .map(|s| s.pending_teardown(self.is_parked())),
        };
        // Counted: the signal's waits go by the count from here (a parked
        // one's teardown is not waited for by `wait_quiet`, though this
        // thread may wait for it below).
        self.enrolment.leave();
        let clique = self.clique.clone();
        // A stop's one-rank communicator goes after this one (on the same
        // thread where this one's teardown is its own; in a clique, once
        // this one is handed in).
        let stopper = self
            .stopper
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        // A group open on this thread may still refer to the communicator:
        // tear down after it ends.
        crate::group::state::after_group(Box::new(move || match clique {
            Some(clique) => {
                clique.hand_in(member);
                drop(stopper);
            }
            None => bounded("nccl-teardown", member.timeout, move || {
                member.teardown_alone();
                drop(stopper);
            }),
        }));
    }
}

impl Abortable for Shared {
    fn note_cause(&self, cause: AbortCause) {
        let _ = self.set_cause(cause);
    }

    fn request_abort(&self, cause: AbortCause) -> bool {
        Shared::request_abort(self, cause)
    }

    fn is_parked(&self) -> bool {
        Shared::is_parked(self)
    }

    fn stop_parked(&self) {
        let Some(mut state) = self.try_lock() else {
            return;
        };
        let aborted = self.settle_and_stop(&mut state);
        drop(state);
        if aborted {
            self.after_abort();
        }
    }

    fn wants_hold(&self) -> bool {
        self.park_on_loss
            && self.blocking
            && !self.unparked.load(Ordering::Acquire)
            && self.abort_due()
            && (!self.parked.load(Ordering::Acquire) || self.stop_pending.load(Ordering::Acquire))
            && !matches!(
                self.try_lock().as_deref(),
                Some(State::Aborted | State::Closed)
            )
    }

    fn is_parked_idle(&self) -> bool {
        Shared::is_parked(self)
            && self
                .try_lock()
                .is_some_and(|state| !self.stop_is_pending(&state))
    }

    fn unpark(&self) {
        self.unparked.store(true, Ordering::Release);
    }

    fn is_settled(&self) -> bool {
        // `abort_locked` holds the lock through `ncclCommAbort` (a grouped
        // abort through its group's end): a free lock on a communicator
        // that is no longer live means NCCL's abort (and the reclaim of
        // the process's ranks it may run) returned.
        self.try_lock()
            .is_some_and(|state| !matches!(*state, State::Live(_)))
    }

    fn aborts_together(&self) -> bool {
        aborts_together(
            self.lib.version(),
            crate::group::state::in_group(),
            crate::capture_state::graphs_may_exist(),
        )
    }

    fn hold_for_abort(&self) -> Option<Box<dyn HeldForAbort + '_>> {
        self.hold()
    }
}

/// Whether a communicator's abort may join others in one NCCL group of the
/// calling thread ([`Abortable::aborts_together`]): NCCL 2.22 queues an
/// abort's reclaim to the group's end, and from 2.24 a failed one among
/// them no longer makes the end read the others' freed communicators; no
/// group of the thread open (NCCL would join the aborts to it); no CUDA
/// graph that may refer to a communicator (its reclaim waits until the
/// graph is gone, and the graph's owner may wait for the lock of another
/// communicator held through the group).
fn aborts_together(version: nccl_sys::Version, in_group: bool, graphs: bool) -> bool {
    version >= nccl_sys::Version::new(2, 24, 0) && !in_group && !graphs
}

impl crate::group::Member for Shared {
    fn is_blocking(&self) -> bool {
        Shared::is_blocking(self)
    }

    fn wait_ready(&self, op: &'static str) -> Result<()> {
        Shared::wait_ready(self, op)
    }

    fn leave_group(&self) {
        Shared::leave_group(self)
    }

    fn parks_and_due(&self) -> bool {
        self.park_on_loss && self.abort_due()
    }

    fn leave_group_only(&self) {
        let _state = self.lock();
        if !self.held_by_another_group() {
            self.in_open_group.store(false, Ordering::Release);
        }
    }

    fn abortable(self: Arc<Self>) -> Arc<dyn Abortable> {
        self
    }
}

/// Makes `ctx` current on this thread for an NCCL call: one
/// `cuCtxGetCurrent`, and a `cuCtxSetCurrent` when another context is
/// current. cudarc's `bind_to_thread` also takes the error cudarc recorded
/// from its own drops, an atomic swap (a locked instruction, a full
/// barrier on x86) on every call; that error is cudarc's to report, at its
/// next call that checks.
pub(crate) fn make_current(
    ctx: &CudaContext,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::result::ctx;
    match ctx::get_current()? {
        Some(current) if current == ctx.cu_ctx() => Ok(()),
        // SAFETY: `ctx` is a live context (the handle keeps it); making it
        // current changes only this thread's binding.
        _ => unsafe { ctx::set_current(ctx.cu_ctx()) },
    }
}

#[cfg(test)]
mod tests;
