//! `Comm`: an owned NCCL communicator, and `AbortHandle`.
//!
//! # Thread safety
//!
//! NCCL allows one thread at a time to call into a communicator; calls from
//! several threads must not overlap, but a communicator may move between
//! threads. So `Comm` is `Send` and not `Sync`. The one call NCCL allows
//! from elsewhere is `ncclCommAbort`, whose purpose is to stop a
//! communicator another thread is stuck on; [`AbortHandle`] (`Send + Sync`)
//! makes it. The raw handle lives behind a mutex shared by the two, so it is
//! freed exactly once, by whoever gets there first.
//!
//! # Teardown
//!
//! Dropping a `Comm` finalizes and destroys it, and aborts it if that
//! fails; it never panics. `ncclCommFinalize` waits for the other local
//! ranks, so communicators that one thread created together (`init_all`,
//! `split_all`) are finalized together, in one group, when the last of them
//! is dropped; they may be dropped in any order.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream};
use nccl_sys::{NCCL_SPLIT_NOCOLOR, ncclComm_t, ncclResult_t};

use crate::abort::{AbortCause, AbortSignal};
use crate::capabilities::{Capabilities, FP8_REDUCTION_MIN_CC};
use crate::config::{Config, RawConfig};
use crate::group::{GroupGuard, GroupHold};
use crate::library::Library;
use crate::observe::{ObservedStream, OpInfo, OpObserver, Pending};
use crate::unique_id::UniqueId;
use crate::{Error, Feature, Result};

enum State {
    Live(ncclComm_t),
    Aborted,
    Closed,
}

/// What `Comm` and `AbortHandle` share.
pub(crate) struct Shared {
    state: Mutex<State>,
    lib: &'static Library,
    ctx: Arc<CudaContext>,
    blocking: bool,
    timeout: Duration,
    clique: Option<Arc<Clique>>,
    /// Why it was (or is to be) aborted; the first cause wins. Set when an
    /// abort is asked for: while the abort cannot happen at once (the lock
    /// is busy, or an open group refers to the communicator), whoever holds
    /// the lock next performs it.
    cause: OnceLock<AbortCause>,
    /// Set, under the lock, while a group open on some thread holds calls
    /// on this communicator: NCCL still refers to it until that group
    /// ends, so an abort waits for the end (it crashed NCCL otherwise).
    in_open_group: AtomicBool,
    /// The job's signal, if any.
    signal: Option<AbortSignal>,
    /// Recorded on the comm's stream by the last `Comm`'s drop: teardown
    /// waits for it (with the deadline) before it finalizes.
    drain: Mutex<Option<cudarc::driver::CudaEvent>>,
    /// The observer at drop time, asked whether work is still unfinished.
    last_observer: Mutex<Option<Arc<dyn OpObserver>>>,
}

// SAFETY: the only non-thread-safe part is the raw `ncclComm_t`, which is
// only touched with `state` locked, so calls on it never overlap. NCCL lets
// a communicator be used from different threads one after another, and
// `ncclCommAbort` from any thread (NCCL's fault-tolerance model).
unsafe impl Send for Shared {}
// SAFETY: as above: shared access goes through the mutex.
unsafe impl Sync for Shared {}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
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
    fn abort_due(&self) -> bool {
        if self.cause.get().is_some() {
            return true;
        }
        match self.signal.as_ref().and_then(AbortSignal::cause) {
            Some(cause) => {
                let _ = self.cause.set(cause);
                true
            }
            None => false,
        }
    }

    /// Performs a due abort now if nothing refers to the communicator any
    /// more (the caller holds the lock). Returns whether it is aborted.
    ///
    /// `true` only for the transition from live to aborted made here, so
    /// [`Shared::after_abort`] runs once per communicator.
    fn settle_abort(&self, state: &mut MutexGuard<'_, State>) -> bool {
        if !matches!(**state, State::Live(_)) {
            return false;
        }
        if !self.abort_due() || self.in_open_group.load(Ordering::Acquire) {
            return false;
        }
        let _ = self.abort_locked(state);
        true
    }

    /// Runs `f` on the live handle with the device's context current. An
    /// abort that is due happens first (and the call is refused); one that
    /// was asked for while `f` ran happens right after it.
    pub(crate) fn with_raw<R>(
        &self,
        op: &'static str,
        f: impl FnOnce(ncclComm_t) -> Result<R>,
    ) -> Result<R> {
        let mut state = self.lock();
        let result = match *state {
            State::Live(raw) => {
                if self.abort_due() {
                    let aborted = self.settle_abort(&mut state);
                    drop(state);
                    if aborted {
                        self.after_abort();
                    }
                    return Err(self.aborted(op));
                }
                self.ctx
                    .bind_to_thread()
                    .map_err(|source| Error::Cuda { op, source })?;
                f(raw)
            }
            State::Aborted => return Err(self.aborted(op)),
            State::Closed => return Err(Error::Finalized { op }),
        };
        if self.cause.get().is_some() && self.settle_abort(&mut state) {
            drop(state);
            self.after_abort();
        }
        result
    }

    /// Whether NCCL calls on it block.
    pub(crate) fn is_blocking(&self) -> bool {
        self.blocking
    }

    /// Marks the communicator as used by the group open on this thread
    /// (call with the lock held, i.e. inside [`Shared::with_raw`]).
    pub(crate) fn enter_group(&self) {
        self.in_open_group.store(true, Ordering::Release);
    }

    /// The group that used the communicator has ended: an abort asked for
    /// meanwhile happens now.
    pub(crate) fn leave_group(&self) {
        let mut state = self.lock();
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
        let _ = self.cause.set(cause);
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
            let status = self.with_raw(op, |raw| async_status(self.lib, raw))?;
            if status != ncclResult_t::ncclSuccess && status != ncclResult_t::ncclInProgress {
                failed = Some(status);
                return Ok(true);
            }
            done(status)
        })?;
        if let Some(status) = failed {
            return self.with_raw(op, |raw| self.lib.check(op, status, raw));
        }
        match timed_out {
            None => Ok(()),
            Some(waited) => Err(Error::Timeout { op, waited }),
        }
    }

    /// `ncclCommGetAsyncError` as a [`CommStatus`].
    fn status(&self) -> Result<CommStatus> {
        const OP: &str = "ncclCommGetAsyncError";
        self.with_raw(OP, |raw| {
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
    fn status_nowait(&self) -> Option<Result<CommStatus>> {
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
    fn abort_locked(&self, state: &mut MutexGuard<'_, State>) -> Result<()> {
        let State::Live(raw) = **state else {
            return Ok(());
        };
        **state = State::Aborted;
        let _ = self.cause.set(AbortCause::Requested);
        let _span = tracing::debug_span!("nccl.abort").entered();
        let _ = self.ctx.bind_to_thread();
        match self.lib.raw().ncclCommAbort() {
            Ok(abort) => {
                // SAFETY: `raw` was live and the state now says Aborted,
                // so nobody else uses or frees it; no open group refers to
                // it (checked by the callers); aborted exactly once.
                let code = unsafe { abort(raw) };
                self.lib.check("ncclCommAbort", code, std::ptr::null_mut())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// After an abort, with the lock released: the clique may tear down
    /// its other members now, which must not wait on this one.
    fn after_abort(&self) {
        if let Some(clique) = &self.clique {
            clique.withdraw();
        }
    }

    /// Aborts with `cause`, waiting for a call in progress on another
    /// thread to return. Deferred to the group's end when an open group
    /// refers to the communicator.
    fn abort(&self, cause: AbortCause) -> Result<()> {
        let _ = self.cause.set(cause);
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
        let State::Live(raw) = state else { return };
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
        };
        let clique = self.clique.clone();
        // A group open on this thread may still refer to the communicator:
        // tear down after it ends.
        crate::group::after_group(Box::new(move || match clique {
            Some(clique) => clique.hand_in(member),
            None => bounded("nccl-teardown", member.timeout, move || {
                member.teardown_alone()
            }),
        }));
    }
}

/// Runs `job` on a thread of its own and waits for it at most `deadline`
/// (plus a little). A teardown that takes longer goes on in the background
/// and keeps what NCCL may still touch; nothing waits for it forever. If
/// no thread can be started, the job is not run: its communicators leak
/// rather than risk an unbounded wait.
///
/// Only the thread that drops a `Comm` waits (see [`WAITS_FOR_TEARDOWN`]);
/// a teardown that another thread starts (a watchdog or liveness thread
/// that held the last handle, an abort that completes a clique) runs
/// detached, so those threads never stall.
fn bounded(name: &str, deadline: Duration, job: impl FnOnce() + Send + 'static) {
    let wait = WAITS_FOR_TEARDOWN.try_with(Cell::get).unwrap_or(false);
    // Made here, so the teardown thread's end allocates nothing (a
    // benchmark counts allocations on every thread).
    let done = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let signal = Arc::clone(&done);
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            job();
            let (flag, cvar) = &*signal;
            *flag.lock().unwrap_or_else(|p| p.into_inner()) = true;
            cvar.notify_all();
        });
    match spawned {
        Ok(_) if !wait => {}
        Ok(_) => {
            let grace = deadline + Duration::from_secs(1);
            let (flag, cvar) = &*done;
            let finished = flag.lock().unwrap_or_else(|p| p.into_inner());
            let (finished, _) = cvar
                .wait_timeout_while(finished, grace, |f| !*f)
                .unwrap_or_else(|p| p.into_inner());
            if !*finished {
                tracing::warn!(
                    ?grace,
                    "communicator teardown did not finish in time; it goes on in the background"
                );
            }
        }
        Err(error) => {
            tracing::warn!(%error, "no thread for the teardown; the communicator leaks");
        }
    }
}

thread_local! {
    /// Set while a `Comm` drops its handle: that thread waits (boundedly)
    /// for the teardown it starts.
    static WAITS_FOR_TEARDOWN: Cell<bool> = const { Cell::new(false) };
}

/// How long a wait polls without sleeping. A nonblocking group launch
/// (NCCL hands it to a new thread) finishes in tens of microseconds, and
/// the shortest sleep Linux gives is about 50 µs: sleeping at once would
/// double the cost of every small nonblocking collective (seen: +30 µs per
/// 8 B all_reduce on H200, NCCL 2.28.9).
const SPIN: Duration = Duration::from_millis(1);

/// Calls `done` until it answers `true` (then `Ok(None)`) or `timeout` has
/// passed (then `Ok(Some(elapsed))`): back to back (yielding the CPU) for
/// the first [`SPIN`], then pausing 5 µs, doubling up to 1 ms. An error
/// from `done` ends it.
pub(crate) fn poll_with_backoff(
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<Option<Duration>> {
    let started = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        if done()? {
            return Ok(None);
        }
        let elapsed = started.elapsed();
        if elapsed >= timeout {
            return Ok(Some(elapsed));
        }
        if elapsed < SPIN {
            std::thread::yield_now();
            continue;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

fn async_status(lib: &Library, raw: ncclComm_t) -> Result<ncclResult_t> {
    let get = lib.raw().ncclCommGetAsyncError()?;
    let mut status = ncclResult_t::ncclSuccess;
    // SAFETY: `raw` is live (caller holds the lock); one result is written.
    let code = unsafe { get(raw, &mut status) };
    lib.check("ncclCommGetAsyncError", code, raw)?;
    Ok(status)
}

/// A communicator handed in for teardown.
struct Member {
    raw: ncclComm_t,
    lib: &'static Library,
    ctx: Arc<CudaContext>,
    blocking: bool,
    timeout: Duration,
    /// An abort was due: abort, do not finalize.
    abort_only: bool,
    /// Work queued on the comm's own stream before the drop.
    drain: Option<cudarc::driver::CudaEvent>,
    /// The observer, which may know of unfinished work on other streams.
    observer: Option<Arc<dyn OpObserver>>,
}

// SAFETY: a member is no longer reachable from any `Comm`; it moves to the
// thread that tears it down, which is the only user. The event and the
// observer are `Send` on their own.
unsafe impl Send for Member {}

impl Member {
    /// Waits (up to the timeout) until the work issued before the drop has
    /// finished: the comm stream's drain event and what the observer knows
    /// of. `false` when it did not: finalizing would then wait on peers
    /// that may never come, so the caller aborts.
    fn drained(&self) -> bool {
        if self.ctx.bind_to_thread().is_err() {
            return false;
        }
        let finished = poll_with_backoff(self.timeout, || {
            let stream_done = self
                .drain
                .as_ref()
                .is_none_or(|e| matches!(e.try_is_complete(), Ok(true)));
            let observed_done = self.observer.as_ref().is_none_or(|o| !o.unfinished());
            Ok(stream_done && observed_done)
        });
        matches!(finished, Ok(None))
    }

    fn finalize_call(&self) -> ncclResult_t {
        if self.ctx.bind_to_thread().is_err() {
            return ncclResult_t::ncclUnhandledCudaError;
        }
        match self.lib.raw().ncclCommFinalize() {
            // SAFETY: `raw` is live and owned by this member alone.
            Ok(finalize) => unsafe { finalize(self.raw) },
            Err(_) => ncclResult_t::ncclInvalidUsage,
        }
    }

    /// Waits out a nonblocking finalize; `false` on error or timeout.
    fn settle(&self) -> bool {
        let started = Instant::now();
        loop {
            match async_status(self.lib, self.raw) {
                Ok(ncclResult_t::ncclSuccess) => return true,
                Ok(ncclResult_t::ncclInProgress) if started.elapsed() < self.timeout => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                _ => return false,
            }
        }
    }

    fn destroy_or_abort(self, finalized: bool) {
        let _ = self.ctx.bind_to_thread();
        if finalized && let Ok(destroy) = self.lib.raw().ncclCommDestroy() {
            // SAFETY: finalized and owned by this member alone; freed once.
            let code = unsafe { destroy(self.raw) };
            if code == ncclResult_t::ncclSuccess {
                return;
            }
            tracing::warn!(
                ?code,
                "ncclCommDestroy failed during drop; the communicator leaks"
            );
            return;
        }
        if let Ok(abort) = self.lib.raw().ncclCommAbort() {
            // SAFETY: not destroyed above; owned by this member alone.
            let code = unsafe { abort(self.raw) };
            if code != ncclResult_t::ncclSuccess {
                tracing::warn!(?code, "ncclCommAbort failed during drop");
            }
        }
    }

    /// Finalize and destroy; abort instead when an abort was due or the
    /// work before the drop did not finish within the timeout.
    fn teardown_alone(self) {
        let _span = tracing::debug_span!("nccl.drop").entered();
        if self.abort_only || !self.drained() {
            self.destroy_or_abort(false);
            return;
        }
        let code = self.finalize_call();
        let finalized = match code {
            ncclResult_t::ncclSuccess if self.blocking => true,
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => self.settle(),
            _ => false,
        };
        self.destroy_or_abort(finalized);
    }
}

/// Communicators one thread created together; torn down together.
pub(crate) struct Clique {
    pending: Mutex<(Vec<Member>, usize)>,
    /// A member was aborted: the others are ranks of the same
    /// communicator, so finalizing them would wait for it; all abort.
    aborted: AtomicBool,
}

impl Clique {
    fn new(members: usize) -> Arc<Clique> {
        Arc::new(Clique {
            pending: Mutex::new((Vec::new(), members)),
            aborted: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, (Vec<Member>, usize)> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A member was aborted: one fewer to wait for.
    fn withdraw(&self) {
        self.aborted.store(true, Ordering::Release);
        let ready = {
            let mut pending = self.lock();
            pending.1 = pending.1.saturating_sub(1);
            pending.0.len() == pending.1 && !pending.0.is_empty()
        };
        if ready {
            self.teardown();
        }
    }

    fn hand_in(&self, member: Member) {
        let ready = {
            let mut pending = self.lock();
            pending.0.push(member);
            pending.0.len() >= pending.1
        };
        if ready {
            self.teardown();
        }
    }

    /// Tears the handed-in members down together, on a thread of its own,
    /// waiting at most their timeout.
    fn teardown(&self) {
        let mut members = std::mem::take(&mut self.lock().0);
        if members.is_empty() {
            return;
        }
        if self.aborted.load(Ordering::Acquire) {
            for m in &mut members {
                m.abort_only = true;
            }
        }
        let deadline = members.iter().map(|m| m.timeout).max().unwrap_or_default();
        bounded("nccl-teardown", deadline, move || {
            Clique::teardown_members(members)
        });
    }

    fn teardown_members(members: Vec<Member>) {
        let _span = tracing::debug_span!("nccl.drop_clique", members = members.len()).entered();
        let (finalizing, aborting): (Vec<Member>, Vec<Member>) = members
            .into_iter()
            .partition(|m| !m.abort_only && m.drained());
        if !aborting.is_empty() {
            // One member cannot finish: finalizing the others would wait for
            // it, so the whole clique is aborted.
            for member in finalizing.into_iter().chain(aborting) {
                member.destroy_or_abort(false);
            }
            return;
        }
        let Some(lib) = finalizing.first().map(|m| m.lib) else {
            return;
        };
        let codes: Vec<ncclResult_t> = match (lib.raw().ncclGroupStart(), lib.raw().ncclGroupEnd())
        {
            (Ok(start), Ok(end)) => {
                // SAFETY: no arguments; the group is closed below.
                let _ = unsafe { start() };
                let codes = finalizing.iter().map(Member::finalize_call).collect();
                // SAFETY: closes the group opened above.
                let _ = unsafe { end() };
                codes
            }
            _ => vec![ncclResult_t::ncclInvalidUsage; finalizing.len()],
        };
        for (member, code) in finalizing.into_iter().zip(codes) {
            let finalized = match code {
                ncclResult_t::ncclSuccess if member.blocking => true,
                ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => member.settle(),
                _ => false,
            };
            member.destroy_or_abort(finalized);
        }
    }
}

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

/// An NCCL communicator on one GPU, with a CUDA stream for its work.
///
/// `Send`, not `Sync`: see the module docs for NCCL's rule.
pub struct Comm {
    /// Dropped by hand in `Drop`, so the teardown it may start knows that
    /// this thread waits for it.
    shared: std::mem::ManuallyDrop<Arc<Shared>>,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
    device: usize,
    compute_capability: (i32, i32),
    force_send_recv: Cell<bool>,
    observer: RefCell<Option<Arc<dyn OpObserver>>>,
    /// The last stream handed to [`Comm::borrowed_stream`], wrapped.
    borrowed: RefCell<Option<Arc<CudaStream>>>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device)
            .field("blocking", &self.shared.blocking)
            .finish_non_exhaustive()
    }
}

impl Drop for Comm {
    /// Leaves what the teardown needs to know whether work is still
    /// running: an event behind the work queued on the comm's stream, and
    /// the observer. The teardown itself happens when the last handle goes
    /// (the shared state's drop), bounded by the communicator's timeout.
    fn drop(&mut self) {
        // `lock`, not `try_lock`: a watchdog's momentary look must not make
        // the teardown skip the drain (only an abort holds it long).
        let live = matches!(*self.shared.lock(), State::Live(_));
        if live {
            if let Ok(event) = self.stream.record_event(None) {
                *self.shared.drain.lock().unwrap_or_else(|p| p.into_inner()) = Some(event);
            }
            *self
                .shared
                .last_observer
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = self.observer.borrow_mut().take();
        }
        let _ = WAITS_FOR_TEARDOWN.try_with(|w| w.set(true));
        // SAFETY: dropped exactly once, here; `self` is not used after.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.shared) };
        let _ = WAITS_FOR_TEARDOWN.try_with(|w| w.set(false));
    }
}

/// Aborts a communicator from any thread. Cheap to clone.
#[derive(Clone)]
pub struct AbortHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortHandle { .. }")
    }
}

/// An [`AbortHandle`] that does not keep the communicator alive: for a
/// watchdog, which must not delay the teardown of what it watches.
#[derive(Clone)]
pub struct WeakAbortHandle {
    shared: std::sync::Weak<Shared>,
}

impl std::fmt::Debug for WeakAbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakAbortHandle { .. }")
    }
}

impl WeakAbortHandle {
    /// The handle, while the communicator exists.
    pub fn upgrade(&self) -> Option<AbortHandle> {
        self.shared.upgrade().map(|shared| AbortHandle { shared })
    }

    /// Whether the communicator still exists, without taking a handle
    /// (so the caller never ends up holding the last one and its teardown).
    pub fn is_alive(&self) -> bool {
        self.shared.strong_count() > 0
    }
}

impl AbortHandle {
    /// Whether both are handles of one communicator.
    pub(crate) fn same_as(&self, other: &AbortHandle) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// A handle that does not keep the communicator alive.
    pub fn downgrade(&self) -> WeakAbortHandle {
        WeakAbortHandle {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// `ncclCommAbort`: stops the communicator's work and frees it. Later
    /// calls on the `Comm` return `Error::Aborted`. Aborting twice is a
    /// no-op. On a blocking communicator this waits for a call in progress
    /// on another thread to return; a nonblocking one is interrupted
    /// between polls. When a group open on another thread holds calls on
    /// the communicator, the abort happens at that group's end (NCCL still
    /// refers to the communicator until then) and this returns at once.
    pub fn abort(&self) -> Result<()> {
        self.abort_with(AbortCause::Requested)
    }

    /// As [`AbortHandle::abort`], with the cause later calls report.
    pub fn abort_with(&self, cause: AbortCause) -> Result<()> {
        // On the thread that has a group open, the group still refers to
        // the communicator: abort after it ends.
        refuse_in_group("ncclCommAbort")?;
        self.shared.abort(cause)
    }

    /// Asks for an abort with `cause` without ever waiting: done at once
    /// when no other thread is inside a call on the communicator, else by
    /// that thread as soon as its call returns (or at the end of the group
    /// that holds calls on it). Returns whether it is aborted now. For
    /// watchdogs, which must never wait behind a blocking NCCL call.
    pub fn request_abort(&self, cause: AbortCause) -> bool {
        self.shared.request_abort(cause)
    }

    /// `ncclCommGetAsyncError`, from any thread: how a watchdog learns
    /// that a peer failed. [`Error::Aborted`] once aborted. Waits for a
    /// call in progress on another thread; see [`AbortHandle::try_status`].
    pub fn status(&self) -> Result<CommStatus> {
        self.shared.status()
    }

    /// As [`AbortHandle::status`], but `None` at once when another thread
    /// is inside a call on the communicator.
    pub fn try_status(&self) -> Option<Result<CommStatus>> {
        self.shared.status_nowait()
    }

    /// Whether the communicator was aborted, or an abort was asked for.
    pub fn is_aborted(&self) -> bool {
        self.shared.abort_requested()
    }

    /// Why it was aborted (or is to be), once it was.
    pub fn cause(&self) -> Option<AbortCause> {
        self.shared
            .abort_requested()
            .then(|| self.shared.cause.get().cloned())
            .flatten()
    }
}

/// What a new `Comm` needs besides its raw handle.
struct Parts {
    lib: &'static Library,
    ctx: Arc<CudaContext>,
    blocking: bool,
    timeout: Duration,
    signal: Option<AbortSignal>,
}

impl Parts {
    /// A child's parts: the parent's device, its settings unless `config`
    /// gives new ones.
    fn child_of(parent: &Shared, config: Option<&Config>) -> Parts {
        Parts {
            lib: parent.lib,
            ctx: Arc::clone(&parent.ctx),
            blocking: config.map_or(parent.blocking, Config::is_blocking),
            timeout: config.map_or(parent.timeout, Config::get_timeout),
            signal: config
                .and_then(Config::get_abort_signal)
                .or(parent.signal.as_ref())
                .cloned(),
        }
    }
}

fn cuda(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |source| Error::Cuda { op, source }
}

fn c_int(op: &'static str, what: &'static str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::InvalidArgument { op, reason: what })
}

/// Communicators are created and torn down outside groups: NCCL would
/// finish the job at a group end this call cannot see, after the memory it
/// was given is gone.
fn refuse_in_group(op: &'static str) -> Result<()> {
    if crate::group::in_group() {
        Err(Error::InvalidArgument {
            op,
            reason: "not allowed while a group is open on this thread",
        })
    } else {
        Ok(())
    }
}

/// cudarc panics when it cannot load the CUDA driver; ask first, so a
/// machine without one gets an error value.
pub(crate) fn require_cuda_driver() -> Result<()> {
    // SAFETY: only tries to load libcuda and reports whether it could.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::Unsupported {
            what: "CUDA",
            requires: "the NVIDIA driver's libcuda.so".to_string(),
            found: "no loadable libcuda.so".to_string(),
        })
    }
}

impl Comm {
    fn parts(device: usize, config: &Config) -> Result<(Parts, RawConfig)> {
        crate::secrecy::check_comm_id_env("communicator init")?;
        let lib = Library::get()?;
        require_cuda_driver()?;
        if !config.is_blocking() {
            lib.capabilities().require(Feature::Nonblocking)?;
        }
        let raw_config = config.to_raw(lib.version())?;
        let ctx = CudaContext::new(device).map_err(cuda("CudaContext::new"))?;
        ctx.bind_to_thread().map_err(cuda("bind_to_thread"))?;
        Ok((
            Parts {
                lib,
                ctx,
                blocking: config.is_blocking(),
                timeout: config.get_timeout(),
                signal: config.get_abort_signal().cloned(),
            },
            raw_config,
        ))
    }

    /// Wraps a freshly created raw communicator; finishes a nonblocking
    /// init by polling, then reads rank, size and device.
    fn adopt(
        raw: ncclComm_t,
        parts: Parts,
        clique: Option<Arc<Clique>>,
        wait: bool,
    ) -> Result<Comm> {
        let Parts {
            lib,
            ctx,
            blocking,
            timeout,
            signal,
        } = parts;
        let stream = ctx.new_stream().map_err(cuda("new_stream"));
        let compute_capability = ctx.compute_capability().map_err(cuda("compute_capability"));
        let shared = Arc::new(Shared {
            state: Mutex::new(State::Live(raw)),
            lib,
            ctx,
            blocking,
            timeout,
            clique,
            cause: OnceLock::new(),
            in_open_group: AtomicBool::new(false),
            signal: signal.clone(),
            drain: Mutex::new(None),
            last_observer: Mutex::new(None),
        });
        // Enrolled before the wait, so a signal can cut a nonblocking init
        // short.
        if let Some(signal) = &signal {
            signal.enroll(&shared);
        }
        // From here on, `shared`'s Drop owns the handle.
        if wait && !blocking {
            shared.wait_ready("ncclCommInitRankConfig")?;
        }
        let (stream, compute_capability) = (stream?, compute_capability?);
        let query = |op: &'static str,
                     f: fn(
            &Library,
        )
            -> Result<nccl_sys::pfn::ncclCommCount, nccl_sys::SymbolError>| {
            shared.with_raw(op, |raw| {
                let get = f(lib)?;
                let mut value = 0;
                // SAFETY: `raw` is live; one int is written.
                let code = unsafe { get(raw, &mut value) };
                lib.check(op, code, raw)?;
                usize::try_from(value).map_err(|_| Error::InvalidArgument {
                    op,
                    reason: "negative value from NCCL",
                })
            })
        };
        let size = query("ncclCommCount", |l| l.raw().ncclCommCount())?;
        let rank = query("ncclCommUserRank", |l| l.raw().ncclCommUserRank())?;
        let device = query("ncclCommCuDevice", |l| l.raw().ncclCommCuDevice())?;
        Ok(Comm {
            shared: std::mem::ManuallyDrop::new(shared),
            stream,
            rank,
            size,
            device,
            compute_capability,
            force_send_recv: Cell::new(false),
            observer: RefCell::new(None),
            borrowed: RefCell::new(None),
            _not_sync: PhantomData,
        })
    }

    /// `ncclCommInitRankConfig`: joins rank `rank` of `nranks` on GPU
    /// `device`. Every rank passes the same `id` and `nranks` and calls at
    /// the same time (a thread or process each).
    pub fn init_rank(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        device: usize,
        config: &Config,
    ) -> Result<Comm> {
        const OP: &str = "ncclCommInitRankConfig";
        refuse_in_group(OP)?;
        if nranks == 0 || rank >= nranks {
            return Err(Error::RankOutOfRange {
                op: OP,
                what: "rank",
                rank,
                size: nranks,
            });
        }
        let nranks_c = c_int(OP, "nranks exceeds i32", nranks)?;
        let rank_c = c_int(OP, "rank exceeds i32", rank)?;
        let (parts, mut raw_config) = Comm::parts(device, config)?;
        let _span = tracing::debug_span!("nccl.init_rank", rank, nranks, device).entered();
        let init = parts.lib.raw().ncclCommInitRankConfig()?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer and config; the id is passed by value.
        let code = unsafe { init(&mut raw, nranks_c, id.raw(), rank_c, &mut raw_config.raw) };
        if raw.is_null() {
            parts.lib.check(OP, code, raw)?;
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "NCCL returned no communicator",
            });
        }
        if code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress {
            let err = parts.lib.check(OP, code, raw).err();
            let _ = Comm::adopt_failed(raw, parts);
            return Err(err.unwrap_or(Error::InvalidArgument {
                op: OP,
                reason: "init failed",
            }));
        }
        Comm::adopt(raw, parts, None, true)
    }

    /// A handle NCCL gave back with an error: abort it so nothing leaks.
    fn adopt_failed(raw: ncclComm_t, parts: Parts) -> Option<()> {
        let abort = parts.lib.raw().ncclCommAbort().ok()?;
        // SAFETY: a handle NCCL created; nobody else has it.
        let _ = unsafe { abort(raw) };
        Some(())
    }

    /// `ncclCommInitRankScalable`: as [`Comm::init_rank`] with several ids
    /// (the same list on every rank) to spread the bootstrap. NCCL 2.23+.
    pub fn init_rank_scalable(
        ids: &[UniqueId],
        rank: usize,
        nranks: usize,
        device: usize,
        config: &Config,
    ) -> Result<Comm> {
        const OP: &str = "ncclCommInitRankScalable";
        refuse_in_group(OP)?;
        let lib = Library::get()?;
        lib.capabilities().require(Feature::InitScalable)?;
        if ids.is_empty() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "no unique ids",
            });
        }
        if nranks == 0 || rank >= nranks {
            return Err(Error::RankOutOfRange {
                op: OP,
                what: "rank",
                rank,
                size: nranks,
            });
        }
        let (parts, mut raw_config) = Comm::parts(device, config)?;
        let _span = tracing::debug_span!(
            "nccl.init_rank_scalable",
            rank,
            nranks,
            device,
            ids = ids.len()
        )
        .entered();
        let init = lib.raw().ncclCommInitRankScalable()?;
        let mut raw_ids: Vec<_> = ids.iter().map(UniqueId::raw).collect();
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer, id array of the stated length, config.
        let code = unsafe {
            init(
                &mut raw,
                c_int(OP, "nranks exceeds i32", nranks)?,
                c_int(OP, "rank exceeds i32", rank)?,
                c_int(OP, "too many ids", raw_ids.len())?,
                raw_ids.as_mut_ptr(),
                &mut raw_config.raw,
            )
        };
        if raw.is_null()
            || (code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress)
        {
            let err = lib.check(OP, code, raw).err();
            if !raw.is_null() {
                Comm::adopt_failed(raw, parts);
            }
            return Err(err.unwrap_or(Error::InvalidArgument {
                op: OP,
                reason: "NCCL returned no communicator",
            }));
        }
        Comm::adopt(raw, parts, None, true)
    }

    /// One communicator per device of `devices`, all in this process and
    /// driven from this thread (rank i on `devices[i]`). Created in one group
    /// with `ncclCommInitRankConfig`, which is what `ncclCommInitAll` does,
    /// but with a [`Config`]. Collectives on them must be issued inside a
    /// group ([`GroupGuard`]); they may be dropped in any order.
    pub fn init_all(devices: &[usize], config: &Config) -> Result<Vec<Comm>> {
        const OP: &str = "ncclCommInitAll";
        refuse_in_group(OP)?;
        if devices.is_empty() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "no devices",
            });
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "a device is listed twice",
                });
            }
        }
        let nranks = c_int(OP, "too many devices", devices.len())?;
        let id = UniqueId::new()?;
        let _span = tracing::debug_span!("nccl.init_all", nranks = devices.len()).entered();
        // What can fail on this side (contexts, configs, the symbol) is
        // done before the group opens: once some ranks' inits are queued, a
        // group ended without the others would wait for them forever.
        // Inside the group only NCCL's calls remain (a failure NCCL records
        // fails the whole group at its end) and making each device's
        // context current, which cannot fail for a context already made
        // and bound once above.
        let mut parts_list = Vec::with_capacity(devices.len());
        // Capacity reserved up front: pushing never moves the configs NCCL
        // already holds pointers to.
        let mut raw_configs: Vec<RawConfig> = Vec::with_capacity(devices.len());
        for &device in devices {
            let (parts, raw_config) = Comm::parts(device, config)?;
            parts_list.push(parts);
            raw_configs.push(raw_config);
        }
        let init = parts_list[0].lib.raw().ncclCommInitRankConfig()?;
        // As in `split_all`: out-slots and configs stay put until the group
        // has ended.
        let mut slots: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
        let slot_base = slots.as_mut_ptr();
        let config_base = raw_configs.as_mut_ptr();
        let group = GroupGuard::start()?;
        let mut failure = None;
        for (rank, parts) in parts_list.iter().enumerate() {
            if let Err(e) = parts.ctx.bind_to_thread() {
                failure = Some(Error::Cuda { op: OP, source: e });
                break;
            }
            // SAFETY: `rank < devices.len()`, the length of both vectors,
            // which are not touched through any other path until the group
            // has ended.
            let (slot, config_ptr) = unsafe {
                (
                    slot_base.add(rank),
                    &mut (*config_base.add(rank)).raw as *mut _,
                )
            };
            // SAFETY: out-slot and config stay valid until after the group
            // ends, where NCCL finishes the initialization.
            let code = unsafe { init(slot, nranks, id.raw(), rank as i32, config_ptr) };
            if code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress {
                failure = Some(
                    parts
                        .lib
                        .check(OP, code, std::ptr::null_mut())
                        .err()
                        .unwrap_or(Error::InvalidArgument {
                            op: OP,
                            reason: "init failed",
                        }),
                );
                break;
            }
        }
        let ended = group.end();
        if !config.is_blocking() && ended.is_err() {
            // NCCL's background init may still write the slots and read
            // the configs: leak them rather than free them under it.
            std::mem::forget(slots);
            std::mem::forget(raw_configs);
            return Err(failure.or(ended.err()).unwrap_or(Error::Timeout {
                op: OP,
                waited: config.get_timeout(),
            }));
        }
        drop(raw_configs);
        let created: Vec<(ncclComm_t, Parts)> = slots.into_iter().zip(parts_list).collect();
        if let Some(e) = failure.or(ended.err()) {
            for (raw, parts) in created {
                if !raw.is_null() {
                    Comm::adopt_failed(raw, parts);
                }
            }
            return Err(e);
        }
        // Members that will hand themselves in: the live handles only.
        let live = created.iter().filter(|(raw, _)| !raw.is_null()).count();
        let clique = Clique::new(live);
        Comm::adopt_together(created, Some(clique))?
            .into_iter()
            .map(|c| {
                c.ok_or(Error::InvalidArgument {
                    op: OP,
                    reason: "NCCL returned no communicator",
                })
            })
            .collect()
    }

    /// Wraps handles created together. On a failure nothing leaks: the
    /// communicators wrapped so far are aborted, and the handles not yet
    /// wrapped are aborted raw and withdrawn from the clique (which then
    /// tears down the one that failed, instead of waiting for members that
    /// never come). Null handles (a rank that took no part) give `None`.
    fn adopt_together(
        created: Vec<(ncclComm_t, Parts)>,
        clique: Option<Arc<Clique>>,
    ) -> Result<Vec<Option<Comm>>> {
        let mut out: Vec<Option<Comm>> = Vec::with_capacity(created.len());
        let mut rest = created.into_iter();
        while let Some((raw, parts)) = rest.next() {
            if raw.is_null() {
                out.push(None);
                continue;
            }
            match Comm::adopt(raw, parts, clique.clone(), true) {
                Ok(comm) => out.push(Some(comm)),
                Err(e) => {
                    for comm in out.into_iter().flatten() {
                        let _ = comm.abort_handle().abort();
                    }
                    for (raw, parts) in rest {
                        if !raw.is_null() {
                            Comm::adopt_failed(raw, parts);
                            if let Some(clique) = &clique {
                                clique.withdraw();
                            }
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// `ncclCommSplit` on this communicator alone (one thread per rank).
    /// Ranks with the same `color` form a new communicator, ordered by
    /// `key`; `None` takes no part and gets `Ok(None)`. `config: None`
    /// inherits this communicator's configuration.
    pub fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: Option<&Config>,
    ) -> Result<Option<Comm>> {
        let mut out = Comm::split_all(&[self], &[color], &[key], config)?;
        Ok(out.pop().flatten())
    }

    /// `ncclCommSplit` on several communicators driven by this thread, in
    /// one group. Returns one entry per input.
    pub fn split_all(
        comms: &[&Comm],
        colors: &[Option<u32>],
        keys: &[i32],
        config: Option<&Config>,
    ) -> Result<Vec<Option<Comm>>> {
        const OP: &str = "ncclCommSplit";
        refuse_in_group(OP)?;
        if comms.len() != colors.len() || comms.len() != keys.len() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "one color and one key per communicator",
            });
        }
        let Some(first) = comms.first() else {
            return Ok(Vec::new());
        };
        let lib = first.shared.lib;
        lib.capabilities().require(Feature::Split)?;
        let colors = colors
            .iter()
            .map(|c| {
                c.map(i32::try_from)
                    .transpose()
                    .map(|c| c.unwrap_or(NCCL_SPLIT_NOCOLOR))
            })
            .collect::<Result<Vec<i32>, _>>()
            .map_err(|_| Error::InvalidArgument {
                op: OP,
                reason: "color exceeds i32",
            })?;
        let _span = tracing::debug_span!("nccl.split", comms = comms.len()).entered();
        let split = lib.raw().ncclCommSplit()?;
        let expected: Vec<bool> = colors.iter().map(|&c| c != NCCL_SPLIT_NOCOLOR).collect();
        Comm::grouped_children(OP, comms, &expected, config, |i, raw, slot, config_ptr| {
            // SAFETY: `raw` is live; `slot` and the config (null or valid)
            // stay valid until after the group ends.
            unsafe { split(raw, colors[i], keys[i], slot, config_ptr) }
        })
    }

    /// Creates one child per communicator in one group, as `ncclCommSplit`
    /// and `ncclCommShrink` need when one thread drives several. NCCL writes
    /// each new handle at group end, so the out-slots and configs live in
    /// vectors that are allocated once and read only after `end()`.
    fn grouped_children(
        op: &'static str,
        comms: &[&Comm],
        expected: &[bool],
        config: Option<&Config>,
        mut call: impl FnMut(
            usize,
            ncclComm_t,
            *mut ncclComm_t,
            *mut nccl_sys::ncclConfig_t,
        ) -> ncclResult_t,
    ) -> Result<Vec<Option<Comm>>> {
        let Some(first) = comms.first() else {
            return Ok(Vec::new());
        };
        let lib = first.shared.lib;
        let mut slots: Vec<ncclComm_t> = vec![std::ptr::null_mut(); comms.len()];
        let slot_base = slots.as_mut_ptr();
        // One config per call, built before the group so nothing is pushed
        // (and moved) while NCCL holds pointers into the vector.
        let mut raw_configs: Vec<Option<RawConfig>> = comms
            .iter()
            .map(|_| config.map(|c| c.to_raw(lib.version())).transpose())
            .collect::<Result<_>>()?;
        let config_base = raw_configs.as_mut_ptr();
        let mut parts = Vec::with_capacity(comms.len());
        let group = GroupGuard::start()?;
        let mut failure = None;
        for (i, comm) in comms.iter().enumerate() {
            // SAFETY: `i < len` for both vectors, which are not touched
            // through any other path until the group has ended.
            let (slot, config_slot) = unsafe { (slot_base.add(i), &mut *config_base.add(i)) };
            let config_ptr = config_slot
                .as_mut()
                .map_or(std::ptr::null_mut(), |c| &mut c.raw as *mut _);
            crate::group::touch(&comm.shared);
            let result = comm.shared.with_raw(op, |raw| {
                comm.shared.enter_group();
                let code = call(i, raw, slot, config_ptr);
                if code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress {
                    lib.check(op, code, raw)?;
                }
                Ok(())
            });
            if let Err(e) = result {
                failure = Some(e);
                break;
            }
            parts.push(Parts::child_of(&comm.shared, config));
        }
        let ended = group.end();
        // A nonblocking parent's child handle is written by NCCL's
        // background job when it finishes, after the group end returned.
        let timeout = first.shared.timeout;
        let nonblocking = comms.iter().any(|c| !c.shared.blocking);
        if nonblocking && ended.is_err() {
            // The group's end failed or timed out, so the background job
            // may not have finished: it may still write the slots, so they and the
            // configs are leaked rather than freed under it, with any
            // child it makes; and the parents are aborted (never
            // finalized while the job may still use them: the abort stops
            // and joins it).
            for c in comms {
                c.shared
                    .request_abort(AbortCause::Timeout { op, seq: None });
            }
            std::mem::forget(slots);
            std::mem::forget(raw_configs);
            return Err(failure.or(ended.err()).unwrap_or(Error::Timeout {
                op,
                waited: timeout,
            }));
        }
        if failure.is_none() && ended.is_ok() && !Comm::await_slots(&slots, expected, timeout) {
            // NCCL may still write into the slots and configs: leak them
            // rather than let it write into freed memory, and abort the
            // parents, whose background job may still run.
            for c in comms {
                c.shared
                    .request_abort(AbortCause::Timeout { op, seq: None });
            }
            std::mem::forget(slots);
            std::mem::forget(raw_configs);
            return Err(Error::Timeout {
                op,
                waited: timeout,
            });
        }
        drop(raw_configs);
        let children: Vec<(ncclComm_t, Parts)> = slots.into_iter().zip(parts).collect();
        if let Some(e) = failure.or(ended.err()) {
            for (raw, parts) in children {
                if !raw.is_null() {
                    Comm::adopt_failed(raw, parts);
                }
            }
            return Err(e);
        }
        let live = children.iter().filter(|(raw, _)| !raw.is_null()).count();
        let clique = (comms.len() > 1 && live > 0).then(|| Clique::new(live));
        Comm::adopt_together(children, clique)
    }

    /// Waits (up to `timeout`) until every expected slot holds a handle.
    fn await_slots(slots: &[ncclComm_t], expected: &[bool], timeout: Duration) -> bool {
        let filled = poll_with_backoff(timeout, || {
            Ok(!slots.iter().zip(expected).any(|(slot, &want)| {
                // SAFETY: a valid element of `slots`; NCCL's job may write it
                // concurrently, hence the volatile read of a pointer-sized
                // value.
                want && unsafe { std::ptr::read_volatile(slot) }.is_null()
            }))
        });
        matches!(filled, Ok(None))
    }

    /// `ncclCommShrink`: a new communicator without the ranks in `exclude`
    /// (NCCL 2.27+). Only the remaining ranks call it. With `abort_first`,
    /// the parent's pending work is aborted first (`NCCL_SHRINK_ABORT`), as
    /// after a peer failure.
    pub fn shrink(
        &self,
        exclude: &[usize],
        abort_first: bool,
        config: Option<&Config>,
    ) -> Result<Comm> {
        let mut out = Comm::shrink_all(&[self], exclude, abort_first, config)?;
        out.pop().flatten().ok_or(Error::InvalidArgument {
            op: "ncclCommShrink",
            reason: "NCCL returned no communicator",
        })
    }

    /// `ncclCommShrink` on several communicators driven by this thread, in
    /// one group (the remaining ranks only). One child per input.
    pub fn shrink_all(
        comms: &[&Comm],
        exclude: &[usize],
        abort_first: bool,
        config: Option<&Config>,
    ) -> Result<Vec<Option<Comm>>> {
        const OP: &str = "ncclCommShrink";
        refuse_in_group(OP)?;
        let Some(first) = comms.first() else {
            return Ok(Vec::new());
        };
        let lib = first.shared.lib;
        lib.capabilities().require(Feature::Shrink)?;
        if exclude.is_empty() {
            // NCCL answers ncclInvalidArgument (seen on 2.28.9); say why.
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "nothing to exclude: shrink needs at least one excluded rank",
            });
        }
        let mut excluded = Vec::with_capacity(exclude.len());
        for &r in exclude {
            if r >= first.size {
                return Err(Error::RankOutOfRange {
                    op: OP,
                    what: "excluded rank",
                    rank: r,
                    size: first.size,
                });
            }
            excluded.push(r as i32);
        }
        if comms.iter().any(|c| exclude.contains(&c.rank)) {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "an excluded rank must not call shrink",
            });
        }
        let flags = if abort_first {
            nccl_sys::NCCL_SHRINK_ABORT
        } else {
            nccl_sys::NCCL_SHRINK_DEFAULT
        };
        let count = excluded.len() as i32;
        let list = excluded.as_mut_ptr();
        let _span =
            tracing::debug_span!("nccl.shrink", comms = comms.len(), excluded = exclude.len())
                .entered();
        let shrink = lib.raw().ncclCommShrink()?;
        // `excluded` outlives the group inside `grouped_children`.
        Comm::grouped_children(
            OP,
            comms,
            &vec![true; comms.len()],
            config,
            |_, raw, slot, config_ptr| {
                // SAFETY: `raw` is live; the exclude list (`count` ints), the
                // slot and the config stay valid until after the group ends.
                unsafe { shrink(raw, list, count, slot, config_ptr, flags) }
            },
        )
    }

    /// `ncclCommGetUniqueId`: an id for growing this communicator (root
    /// rank only; NCCL 2.29+).
    pub fn grow_id(&self) -> Result<UniqueId> {
        const OP: &str = "ncclCommGetUniqueId";
        let lib = self.shared.lib;
        lib.capabilities().require(Feature::Grow)?;
        self.shared.with_raw(OP, |raw| {
            let get = lib.raw().ncclCommGetUniqueId()?;
            let mut id = nccl_sys::ncclUniqueId::zeroed();
            // SAFETY: `raw` is live; one id is written.
            let code = unsafe { get(raw, &mut id) };
            lib.check(OP, code, raw)?;
            Ok(UniqueId::from_bytes(id.internal))
        })
    }

    /// `ncclCommGrow` from an existing rank: the new communicator of
    /// `new_size` ranks. The root passes the id from [`Comm::grow_id`];
    /// the others pass `None`. NCCL 2.29+.
    pub fn grow(
        &self,
        new_size: usize,
        id: Option<&UniqueId>,
        config: Option<&Config>,
    ) -> Result<Comm> {
        const OP: &str = "ncclCommGrow";
        refuse_in_group(OP)?;
        let lib = self.shared.lib;
        lib.capabilities().require(Feature::Grow)?;
        if new_size <= self.size {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the new size must exceed the current one",
            });
        }
        // Everything that can fail on this side, before NCCL is called.
        let new_size_c = c_int(OP, "size exceeds i32", new_size)?;
        let mut raw_config = config.map(|c| c.to_raw(lib.version())).transpose()?;
        let grow = lib.raw().ncclCommGrow()?;
        let raw_id = id.map(UniqueId::raw);
        let (child, code) = self.shared.with_raw(OP, |raw| {
            let mut child: ncclComm_t = std::ptr::null_mut();
            let id_ptr = raw_id.as_ref().map_or(std::ptr::null(), |i| i as *const _);
            let config_ptr = raw_config
                .as_mut()
                .map_or(std::ptr::null_mut(), |c| &mut c.raw as *mut _);
            // SAFETY: `raw` is live; id null or valid; rank -1 marks an
            // existing rank; valid out-pointer; config null or valid.
            let code = unsafe { grow(raw, new_size_c, id_ptr, -1, &mut child, config_ptr) };
            Ok((child, code))
        })?;
        let parts = Parts::child_of(&self.shared, config);
        if code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress {
            let err = self
                .shared
                .with_raw(OP, |raw| lib.check(OP, code, raw))
                .err();
            // A handle NCCL made before failing is aborted, not leaked.
            if !child.is_null() {
                Comm::adopt_failed(child, parts);
            }
            return Err(err.unwrap_or(Error::InvalidArgument {
                op: OP,
                reason: "grow failed",
            }));
        }
        if child.is_null() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "NCCL returned no communicator",
            });
        }
        Comm::adopt(child, parts, None, true)
    }

    /// `ncclCommRevoke`: stops in-flight work so that the communicator can
    /// be split, shrunk or destroyed (NCCL 2.28.7+). It cannot be used for
    /// collectives afterwards.
    pub fn revoke(&self) -> Result<()> {
        const OP: &str = "ncclCommRevoke";
        refuse_in_group(OP)?;
        let lib = self.shared.lib;
        lib.capabilities().require(Feature::Revoke)?;
        let code = self.shared.with_raw(OP, |raw| {
            let revoke = lib.raw().ncclCommRevoke()?;
            // SAFETY: `raw` is live; the flags are the only valid value.
            Ok(unsafe { revoke(raw, nccl_sys::NCCL_REVOKE_DEFAULT) })
        })?;
        match code {
            ncclResult_t::ncclSuccess => Ok(()),
            ncclResult_t::ncclInProgress => self.shared.wait_ready(OP),
            code => self.shared.with_raw(OP, |raw| lib.check(OP, code, raw)),
        }
    }

    /// Finalizes and destroys the communicator, returning the errors
    /// `Drop` can only log. For a communicator of a group created
    /// together (`init_all`, `split_all`), this hands it in like `Drop` and
    /// the group is torn down when its last member goes.
    pub fn finalize(self) -> Result<()> {
        const OP: &str = "ncclCommFinalize";
        refuse_in_group(OP)?;
        if self.shared.clique.is_some() {
            return Ok(());
        }
        let lib = self.shared.lib;
        let _span = tracing::debug_span!("nccl.finalize").entered();
        let code = self.shared.with_raw(OP, |raw| {
            let finalize = lib.raw().ncclCommFinalize()?;
            // SAFETY: `raw` is live.
            Ok(unsafe { finalize(raw) })
        })?;
        if code == ncclResult_t::ncclInProgress
            || (code == ncclResult_t::ncclSuccess && !self.shared.blocking)
        {
            self.shared.wait_ready(OP)?;
        } else {
            self.shared.with_raw(OP, |raw| lib.check(OP, code, raw))?;
        }
        self.destroy()
    }

    /// `ncclCommDestroy` (which finalizes first if that was not done).
    pub fn destroy(self) -> Result<()> {
        const OP: &str = "ncclCommDestroy";
        refuse_in_group(OP)?;
        if self.shared.clique.is_some() {
            return Ok(());
        }
        let lib = self.shared.lib;
        let mut state = self.shared.lock();
        let State::Live(raw) = *state else {
            return Ok(());
        };
        *state = State::Closed;
        drop(state);
        self.shared.ctx.bind_to_thread().map_err(cuda(OP))?;
        let destroy = lib.raw().ncclCommDestroy()?;
        // SAFETY: `raw` was live and the state now says Closed, so nothing
        // else frees or uses it.
        let code = unsafe { destroy(raw) };
        lib.check(OP, code, std::ptr::null_mut())
    }

    /// `ncclCommAbort` now.
    pub fn abort(self) -> Result<()> {
        refuse_in_group("ncclCommAbort")?;
        self.shared.abort(AbortCause::Requested)
    }

    /// A handle that can abort this communicator from another thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// `ncclCommGetAsyncError`.
    pub fn status(&self) -> Result<CommStatus> {
        self.shared.status()
    }

    /// This rank's index.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// CUDA device ordinal.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The stream collectives use unless told otherwise.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A cudarc wrapper, not owning it, for a stream that someone else
    /// created on this communicator's context (a framework's current
    /// stream), to pass to [`Comm::on`]. The communicator's own stream is
    /// returned as itself, and the last other stream asked for is
    /// remembered, so a caller that names the same stream on every call
    /// allocates nothing after the first.
    ///
    /// # Safety
    ///
    /// `raw` is a live stream of this communicator's CUDA context (the
    /// primary context of its device, which is where every stream of that
    /// device made through cudarc or the CUDA runtime lives), and stays
    /// alive while the returned wrapper is used.
    ///
    /// ```no_run
    /// # fn demo(comm: &nccl_safe::Comm, theirs: nccl_safe::cudarc::driver::sys::CUstream)
    /// # -> nccl_safe::Result<()> {
    /// // SAFETY: `theirs` is a live stream on the communicator's device.
    /// let stream = unsafe { comm.borrowed_stream(theirs) };
    /// let mut grads = comm.stream().alloc_zeros::<f32>(1024).unwrap();
    /// comm.on(&stream).all_reduce_in_place(&mut grads, nccl_safe::ReduceOp::Sum)?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn borrowed_stream(&self, raw: cudarc::driver::sys::CUstream) -> Arc<CudaStream> {
        if raw == self.stream.cu_stream() {
            return Arc::clone(&self.stream);
        }
        let mut last = self.borrowed.borrow_mut();
        if let Some(s) = last.as_ref().filter(|s| s.cu_stream() == raw) {
            return Arc::clone(s);
        }
        // SAFETY: the caller's promise: `raw` is a live stream of this
        // context; the wrapper does not destroy it.
        let wrapped = unsafe { self.stream.context().wrap_borrowed_stream(raw) };
        *last = Some(Arc::clone(&wrapped));
        wrapped
    }

    /// How long this communicator's own waits (nonblocking polling,
    /// [`Comm::synchronize`], teardown) may take: the [`Config`] timeout.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Waits until the work queued so far on `stream` has finished, for at
    /// most [`Comm::timeout`], checking `ncclCommGetAsyncError` while it
    /// waits. A stream that does not drain in time, or an asynchronous NCCL
    /// error, aborts this communicator (the only way NCCL offers out of a
    /// stuck collective) and returns [`Error::Timeout`] or the NCCL error;
    /// later calls then get [`Error::Aborted`].
    ///
    /// `stream` must belong to this communicator's device.
    pub fn synchronize(&self, stream: &CudaStream) -> Result<()> {
        const OP: &str = "synchronize";
        let found = stream.context().ordinal();
        if found != self.device {
            return Err(Error::WrongDevice {
                op: OP,
                role: crate::Role::Stream,
                expected: self.device,
                found,
            });
        }
        let cuda = |source| Error::Cuda { op: OP, source };
        let event = stream.record_event(None).map_err(cuda)?;
        // The state is checked before the event: work that an abort cut
        // short also drains the stream, and must not read as finished.
        let waited = self
            .shared
            .poll_until(OP, |_| event.try_is_complete().map_err(cuda));
        if let Err(e) = &waited
            && !matches!(e, Error::Aborted { .. } | Error::Cuda { .. })
        {
            let cause = match e {
                Error::Timeout { .. } => AbortCause::Timeout { op: OP, seq: None },
                other => AbortCause::AsyncError(other.to_string()),
            };
            // Never waits: a blocking call in progress elsewhere aborts
            // when it returns.
            self.shared.request_abort(cause);
        }
        waited
    }

    /// Whether NCCL calls block (the configuration's `blocking`).
    pub fn is_blocking(&self) -> bool {
        self.shared.blocking
    }

    /// The GPU's compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The loaded library.
    pub fn library(&self) -> &'static Library {
        self.shared.lib
    }

    /// The loaded library's capabilities.
    pub fn capabilities(&self) -> &'static Capabilities {
        self.shared.lib.capabilities()
    }

    /// Whether fp8 values can be reduced on this communicator's GPU.
    pub fn fp8_reductions(&self) -> bool {
        self.capabilities().has(Feature::Fp8) && self.compute_capability >= FP8_REDUCTION_MIN_CC
    }

    /// Build all-to-all, gather and scatter from grouped send/recv even
    /// where the library has them natively (NCCL 2.28+). Both paths give
    /// the same bytes; tests use this to prove it.
    pub fn force_send_recv_collectives(&self, force: bool) {
        self.force_send_recv.set(force);
    }

    /// Sets (or with `None` removes) the [`OpObserver`] that sees every
    /// operation issued on this communicator from now on.
    pub fn set_observer(&self, observer: Option<Arc<dyn OpObserver>>) {
        *self.observer.borrow_mut() = observer;
    }

    /// The observer set with [`Comm::set_observer`]. Its owner gets its
    /// own type back with [`OpObserver::into_any`] and `Arc::downcast`.
    pub fn observer(&self) -> Option<Arc<dyn OpObserver>> {
        self.observer.borrow().clone()
    }

    /// Reports an accepted call on `stream` to the observer: now, or, for
    /// a call issued into a group, at that group's outermost end (the
    /// group's `hold` keeps it, with the stream borrowed for as long).
    pub(crate) fn observe<'a>(
        &self,
        info: OpInfo,
        stream: &'a CudaStream,
        hold: Option<&RefCell<GroupHold<'a>>>,
    ) {
        let observer = self.observer.borrow();
        let Some(observer) = observer.as_ref() else {
            return;
        };
        let stream = ObservedStream::new(stream);
        match hold {
            Some(hold) => hold.borrow_mut().observed.push(Pending {
                observer: Arc::clone(observer),
                info,
                stream,
            }),
            None => crate::capture::without_capture(|| observer.issued(&info, stream)),
        }
    }

    pub(crate) fn uses_send_recv(&self, native: Feature) -> bool {
        self.force_send_recv.get() || !self.capabilities().has(native)
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The raw handle, for calls this crate does not wrap.
    ///
    /// # Safety
    ///
    /// The handle must not be freed, aborted or used concurrently with
    /// this `Comm`, and not after it is dropped.
    pub unsafe fn as_raw(&self) -> Result<ncclComm_t> {
        self.shared.with_raw("as_raw", Ok)
    }
}
