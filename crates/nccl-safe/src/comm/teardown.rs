//! Teardown of communicators whose last handle went: alone, or together
//! with the others of their clique, bounded by their timeout.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use nccl_sys::{ncclComm_t, ncclResult_t};

use crate::comm::poll::{async_status, poll_with_backoff};
use crate::library::Library;
use crate::observe::OpObserver;

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
pub(crate) fn bounded(name: &str, deadline: Duration, job: impl FnOnce() + Send + 'static) {
    let wait = WAITS_FOR_TEARDOWN.try_with(Cell::get).unwrap_or(false);
    // The drain's wait and the finalize's, then NCCL's abort: the exit
    // waits for all of it (the dropping thread only for `deadline`).
    let hold = ExitHold::new(deadline.saturating_mul(2).saturating_add(ABORT_ALLOWANCE));
    // Made here, so the teardown thread's end allocates nothing (a
    // benchmark counts allocations on every thread).
    let done = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let signal = Arc::clone(&done);
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            tracing::debug!("teardown thread: start");
            job();
            tracing::debug!("teardown thread: done");
            drop(hold);
            let (flag, cvar) = &*signal;
            *flag.lock().unwrap_or_else(|p| p.into_inner()) = true;
            cvar.notify_all();
        });
    let grace = deadline.saturating_add(Duration::from_secs(1));
    let collected = wait
        && spawned.is_ok()
        && TOGETHER
            .try_with(|t| match t.borrow_mut().as_mut() {
                Some(ends) => {
                    ends.push((Arc::clone(&done), grace));
                    true
                }
                None => false,
            })
            .unwrap_or(false);
    match spawned {
        Ok(_) if !wait || collected => {}
        Ok(_) => await_teardown(&done, grace, grace),
        Err(error) => {
            tracing::warn!(%error, "no thread for the teardown; the communicator leaks");
        }
    }
}

/// How long a wait for a teardown's or a completion's `ncclCommAbort`
/// (an exit's, a recovery's) allows beyond the communicator's own waits:
/// NCCL's abort does not wait for peers, but it joins its proxy threads
/// and frees device memory, which took seconds behind a held stream on 2
/// H200s.
pub const ABORT_ALLOWANCE: Duration = Duration::from_secs(10);

/// Holds the process's exit back while NCCL work runs on a thread of its
/// own (a detached teardown or abort), at most for the hold's limit.
///
/// Exit handlers tear CUDA (and NCCL's state) down under threads that
/// still use them. Seen with cuda-gdb on 2 H200s: the main thread in
/// `exit`, inside libnccl's exit handler (the CUDA runtime linked into
/// libnccl unloading NCCL's kernels, `cuLibraryUnload`), while a
/// teardown thread was still inside `ncclCommAbort`, which then died of
/// SIGSEGV in libnccl. A test that passed ended that way in 14 of 30
/// runs while the exit waited only the communicator's timeout plus a
/// second; teardowns and aborts now ask for their waits plus
/// 10 s for NCCL's abort. While a hold lives, an `atexit` handler (registered with
/// the first hold, so it runs before the CUDA driver's own) waits for it,
/// up to the longest limit any hold asked for plus a second, and never
/// more than a minute. Dropping the hold releases it.
///
/// ```
/// use std::time::Duration;
/// let hold = nccl_safe::ExitHold::new(Duration::from_secs(5));
/// // ... NCCL work on this thread ...
/// drop(hold);
/// ```
#[derive(Debug)]
#[must_use = "the hold ends when it is dropped"]
pub struct ExitHold(());

static IN_FLIGHT: Mutex<usize> = Mutex::new(0);
static SETTLED: std::sync::Condvar = std::sync::Condvar::new();
static EXIT_WAIT_MS: AtomicU64 = AtomicU64::new(0);
/// Set (before it takes the lock) by the exit's wait: only then does the
/// last hold's drop wake anyone. The completion waker takes and drops a
/// hold with every burst of work, and a wake-up is a system call.
static EXITING: AtomicBool = AtomicBool::new(false);
static AT_EXIT: std::sync::Once = std::sync::Once::new();
/// The longest an exit waits for holds.
const EXIT_WAIT_MAX: Duration = Duration::from_secs(60);

impl ExitHold {
    /// A hold whose work ends within `limit` (the exit waits that long,
    /// plus a second, at most).
    pub fn new(limit: Duration) -> ExitHold {
        AT_EXIT.call_once(|| {
            // SAFETY: registers a plain `extern "C"` function that never
            // unwinds; `atexit` only fails for lack of memory, and then
            // nothing waits at exit (as before).
            let _ = unsafe { libc::atexit(wait_at_exit) };
        });
        ExitHold::extend(limit);
        *IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        ExitHold(())
    }

    /// Lets a live hold's work run up to `limit` (plus a second) at exit,
    /// if that is longer than asked for so far.
    pub(crate) fn extend(limit: Duration) {
        let ms = u64::try_from(limit.saturating_add(Duration::from_secs(1)).as_millis())
            .unwrap_or(u64::MAX);
        EXIT_WAIT_MS.fetch_max(ms, Ordering::Relaxed);
    }
}

impl Drop for ExitHold {
    fn drop(&mut self) {
        let mut n = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        // Read under the lock: an exit that set the flag before taking it
        // either sees this decrement or waits and is woken here.
        if *n == 0 && EXITING.load(Ordering::SeqCst) {
            SETTLED.notify_all();
        }
    }
}

/// At exit: waits (bounded) until no hold is left. It logs nothing: by
/// now the exiting thread's thread-locals are gone, and a subscriber that
/// uses one would panic here, which aborts the process.
extern "C" fn wait_at_exit() {
    let limit = Duration::from_millis(EXIT_WAIT_MS.load(Ordering::Relaxed)).min(EXIT_WAIT_MAX);
    EXITING.store(true, Ordering::SeqCst);
    let n = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
    let _ = SETTLED.wait_timeout_while(n, limit, |n| *n > 0);
}

/// A teardown's end: set and signalled when its thread is done.
type Done = Arc<(Mutex<bool>, std::sync::Condvar)>;

/// Drops `owner` (a communicator's shared state, held by a
/// [`crate::Comm`] handle or a [`crate::KeptComm`]) with this thread
/// waiting (boundedly) for the teardown that dropping the last one starts.
pub(crate) fn drop_waited<T>(owner: T) {
    let _ = WAITS_FOR_TEARDOWN.try_with(|w| w.set(true));
    drop(owner);
    let _ = WAITS_FOR_TEARDOWN.try_with(|w| w.set(false));
}

thread_local! {
    /// Set while a `Comm` drops its handle: that thread waits (boundedly)
    /// for the teardown it starts.
    pub(crate) static WAITS_FOR_TEARDOWN: Cell<bool> = const { Cell::new(false) };
    /// Set by [`drop_together`]: the teardowns that drops on this thread
    /// start are collected here (with their grace) instead of being
    /// waited for one after the other.
    static TOGETHER: std::cell::RefCell<Option<Vec<(Done, Duration)>>> =
        const { std::cell::RefCell::new(None) };
}

/// Drops `comms` with their teardowns running at the same time, and
/// waits for all of them at most the longest of their timeouts plus a
/// second (a teardown still running then goes on in the background, as
/// one [`Comm`](crate::Comm)'s drop does). They are
/// [`Comm`](crate::Comm)s or [`KeptComm`](crate::KeptComm)s (anything
/// else is simply dropped).
///
/// A dropped communicator's teardown finalizes it and then frees it with
/// `ncclCommAbort`, whose proxy thread may take up to half a second to
/// notice; dropping several (the axes of a mesh) one after the other adds
/// those up. A communicator dropped inside an open group still waits for
/// the group's end, as on its own.
///
/// ```no_run
/// # fn main() -> nccl_safe::Result<()> {
/// use nccl_safe::{Comm, Config};
/// let comms = Comm::init_all(&[0, 1], &Config::new())?;
/// nccl_safe::drop_together(comms);
/// # Ok(())
/// # }
/// ```
pub fn drop_together<C>(comms: impl IntoIterator<Item = C>) {
    let together = Together {
        outer: TOGETHER
            .try_with(|t| t.borrow_mut().replace(Vec::new()))
            .ok()
            .flatten(),
    };
    for comm in comms {
        drop(comm);
    }
    drop(together);
}

/// The collecting scope of [`drop_together`]: its drop (on return or
/// while unwinding) puts the outer collection back and waits for what
/// was collected, so a panic in the middle leaves no thread collecting.
struct Together {
    outer: Option<Vec<(Done, Duration)>>,
}

impl Drop for Together {
    fn drop(&mut self) {
        let outer = self.outer.take();
        let ends = TOGETHER
            .try_with(|t| std::mem::replace(&mut *t.borrow_mut(), outer))
            .ok()
            .flatten()
            .unwrap_or_default();
        let Some(grace) = ends.iter().map(|(_, g)| *g).max() else {
            return;
        };
        let until = Instant::now()
            .checked_add(grace)
            .unwrap_or_else(Instant::now);
        for (done, _) in ends {
            await_teardown(
                &done,
                until.saturating_duration_since(Instant::now()),
                grace,
            );
        }
    }
}

/// Waits at most `left` for a teardown's end; one that has not ended
/// then goes on in the background (said with its `grace`).
fn await_teardown(done: &Done, left: Duration, grace: Duration) {
    let (flag, cvar) = &**done;
    let finished = flag.lock().unwrap_or_else(|p| p.into_inner());
    let (finished, _) = cvar
        .wait_timeout_while(finished, left, |f| !*f)
        .unwrap_or_else(|p| p.into_inner());
    if !*finished {
        tracing::warn!(
            ?grace,
            "communicator teardown did not finish in time; it goes on in the background"
        );
    }
}

/// A communicator handed in for teardown.
pub(crate) struct Member {
    pub(crate) raw: ncclComm_t,
    pub(crate) lib: &'static Library,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) blocking: bool,
    pub(crate) timeout: Duration,
    /// An abort was due: abort, do not finalize.
    pub(crate) abort_only: bool,
    /// Work queued on the comm's own stream before the drop.
    pub(crate) drain: Option<cudarc::driver::CudaEvent>,
    /// The observer, which may know of unfinished work on other streams.
    pub(crate) observer: Option<Arc<dyn OpObserver>>,
    /// Counts this teardown with its signal's until it is done (dropped
    /// with the member, after NCCL let go of it); a signal that fires
    /// meanwhile ends the wait for the work to drain (the abort follows).
    pub(crate) pending: Option<crate::abort::PendingTeardown>,
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
        let mut fired = false;
        let finished = poll_with_backoff(self.timeout, || {
            // The job gave its communicators up (a loss, a recovery): the
            // work will not finish as issued, and a recovery waits for this.
            if self.pending.as_ref().is_some_and(|p| p.fired()) {
                fired = true;
                return Ok(true);
            }
            let stream_done = self
                .drain
                .as_ref()
                .is_none_or(|e| matches!(e.try_is_complete(), Ok(true)));
            let observed_done = self.observer.as_ref().is_none_or(|o| !o.unfinished());
            Ok(stream_done && observed_done)
        });
        !fired && matches!(finished, Ok(None))
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

    /// Frees the communicator with `ncclCommAbort`, after a finalize
    /// (`finalized`) or instead of one. Never `ncclCommDestroy`: NCCL's
    /// destroy joins the communicator's proxy thread, which runs until
    /// every rank that connected to it has finalized as well, so a rank
    /// that outlives this one held the destroy inside NCCL, where nothing
    /// can abort it (on 2 H200s: a replacement rank's drop waited for a
    /// survivor that waited for the replacement's exit). After a finalize
    /// (the work flushed, proxies stopped) the abort only frees.
    fn release(self, finalized: bool) {
        let _ = self.ctx.bind_to_thread();
        if let Ok(abort) = self.lib.raw().ncclCommAbort() {
            // SAFETY: owned by this member alone; freed once, here.
            let code = unsafe { abort(self.raw) };
            if code != ncclResult_t::ncclSuccess {
                tracing::warn!(?code, finalized, "ncclCommAbort failed during drop");
            }
        }
    }

    /// Finalize, then free; free without finalizing when an abort was due
    /// or the work before the drop did not finish within the timeout.
    pub(crate) fn teardown_alone(self) {
        let _span = tracing::debug_span!("nccl.drop").entered();
        if self.abort_only || !self.drained() {
            self.release(false);
            return;
        }
        let code = self.finalize_call();
        let finalized = match code {
            ncclResult_t::ncclSuccess if self.blocking => true,
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => self.settle(),
            _ => false,
        };
        self.release(finalized);
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
    pub(crate) fn new(members: usize) -> Arc<Clique> {
        Arc::new(Clique {
            pending: Mutex::new((Vec::new(), members)),
            aborted: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, (Vec<Member>, usize)> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A member was aborted: one fewer to wait for.
    pub(crate) fn withdraw(&self) {
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

    pub(crate) fn hand_in(&self, member: Member) {
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
                member.release(false);
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
            member.release(finalized);
        }
    }
}
