//! The watchdog and flight recorder.
//!
//! NCCL has no host-side timeout: a collective whose peer died or never
//! joined spins on the GPU forever. A [`Watchdog`] is one background
//! thread that watches communicators. For each it
//!
//! - records a CUDA event behind every operation the communicator issues
//!   (through [`nccl_safe::OpObserver`]), numbered from 0 in issue order;
//! - polls those events and `ncclCommGetAsyncError`;
//! - when the oldest unfinished operation is older than the timeout, or
//!   NCCL reports an asynchronous error, aborts the communicator, so every
//!   waiter wakes: [`synchronize`] and the helpers of this crate then
//!   answer [`Error::Watchdog`] naming the communicator, the operation and
//!   its sequence number;
//! - keeps the last N operations (op, sequence, count, dtype, peer or root,
//!   state, when issued, how long it took) and prints them on failure.
//!
//! On by default in every [`World`](crate::World); off with
//! `NCCL_RS_WATCHDOG=0` or [`WorldOptions::no_watchdog`](crate::WorldOptions::no_watchdog).
//! Its timeout is the operation timeout (`NCCL_RS_TIMEOUT` or
//! [`WorldOptions::op_timeout`](crate::WorldOptions::op_timeout), 300 s by
//! default; `NCCL_RS_WATCHDOG_TIMEOUT` still overrides it), the recorder's
//! length `NCCL_RS_FLIGHT_RECORDER` (entries). A communicator without a
//! watchdog pays one `RefCell` check per operation. With one, an operation
//! on a stream the watch keeps (the communicator's own, those given to
//! [`Watched::track_stream`]) takes a short lock and writes one record
//! into the watch's lane, a ring on cache lines of its own (`lane.rs`);
//! the next look at the watch drains it into the flight recorder in
//! order, and the watchdog thread's poll (every 2 ms by default) closes
//! the batch behind one CUDA event (see `track.rs`), so a burst of small
//! collectives pays no driver call on the issuing thread. An operation on
//! another stream is recorded at once on the issuing thread.
//! Operations captured into a CUDA graph are not tracked. The watchdog
//! never waits behind a blocking NCCL call: it looks at a communicator
//! only when no other thread is inside a call on it, and asks for aborts
//! without waiting (the thread in the call performs it when it returns).
//!
//! ```no_run
//! use std::time::Duration;
//! use nccl_dist::{World, WorldOptions, Launch, WatchdogOptions};
//! use nccl_dist::nccl_safe::ReduceOp;
//!
//! let options = WorldOptions::new()
//!     .watchdog(WatchdogOptions::new().timeout(Duration::from_secs(30)));
//! let world = World::init_with(Launch::detect()?, &options)?;
//! let stream = world.comm().stream();
//! let mut grads = stream.clone_htod(&vec![1.0f32; 1 << 20])?;
//! world.comm().all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! // A dead peer ends this wait with Error::Watchdog after 30 s, not never.
//! nccl_dist::synchronize(world.comm(), stream)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Instant;

use nccl_safe::cudarc::driver::{CudaContext, CudaStream};
use nccl_safe::nccl_sys::cudaStream_t;
use nccl_safe::{
    AbortCause, CheckError, Comm, CommStatus, ObservedStream, OpInfo, OpObserver, WeakAbortHandle,
};

use crate::error::{Error, Result};
use crate::liveness::{EXCHANGE_WAIT, Exchanger, Liveness, PeerLoss};

mod check;
pub(crate) use nccl_control::culprit;
mod explain;
mod gate;
mod label;
mod lane;
mod options;
mod track;
mod verdict;

pub use crate::env::{
    CHECK_CALLS_ENV, FLIGHT_RECORDER_ENV, WATCHDOG_ENV, WATCHDOG_POLL_ENV, WATCHDOG_TIMEOUT_ENV,
};
use crate::record::render;
pub use crate::record::{Failure, FailureKind, OpRecord, OpState};
pub use check::CheckFailure;
pub use culprit::{Call, Divergence, Field, Tail, analyze};
pub use explain::{explain, synchronize};
pub(crate) use explain::{explain_known, from_failure};
use label::exchange_key;
use lane::{HotLane, LANE, Slot};
pub use options::WatchdogOptions;
use track::Tracker;

struct WatchState {
    tracker: Tracker,
    failure: Option<Failure>,
    /// A timeout is being accounted for (the flight-record exchange runs):
    /// by the watchdog thread, or by a waiter whose own deadline fired.
    timing_out: bool,
    /// The calls taken from the lane by a drain (room for a full lane,
    /// reserved up front).
    drained: Vec<Slot>,
}

impl std::ops::Deref for WatchState {
    type Target = Tracker;
    fn deref(&self) -> &Tracker {
        &self.tracker
    }
}

impl std::ops::DerefMut for WatchState {
    fn deref_mut(&mut self) -> &mut Tracker {
        &mut self.tracker
    }
}

/// One watched communicator: the observer set on it.
#[repr(C)]
struct Watch {
    /// Where the issuing threads leave their calls (`lane.rs`): first, in
    /// a cache line of its own.
    lane: HotLane,
    label: String,
    registry: Arc<Registry>,
    abort: WeakAbortHandle,
    ctx: Arc<CudaContext>,
    /// The streams whose batches the watchdog thread may close (the
    /// communicator's own first), kept alive by this watch.
    streams: Mutex<Vec<Arc<CudaStream>>>,
    options: WatchdogOptions,
    began: Instant,
    state: Mutex<WatchState>,
    changed: Condvar,
    /// Calls are checked across ranks before launch (`check.rs`).
    check: bool,
    /// Calls checked so far: the number the next check goes by.
    checked: AtomicU64,
    /// Calls that may connect inside NCCL are gated (`gate.rs`).
    gating: Option<gate::Gating>,
}

impl Watch {
    /// The watch's state, with every call waiting in the lane drained
    /// into it first: whoever looks sees each call issued before.
    fn lock(&self) -> MutexGuard<'_, WatchState> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (first, at) = {
            let mut lane = self.lane.lock();
            if !lane.waiting() {
                return st;
            }
            lane.drain(&mut st.drained)
        };
        self.take_drained(&mut st, first, at.unwrap_or_else(Instant::now));
        st
    }

    /// Records the calls a drain took (numbered from `first`) as issued
    /// at `now` (when the first of them was), in order.
    fn take_drained(&self, st: &mut WatchState, first: u64, now: Instant) {
        let calls = std::mem::take(&mut st.drained);
        for (seq, call) in (first..).zip(calls.iter()) {
            let record = self.record(seq, call, st.failure.is_some(), now);
            if st.failure.is_some() {
                st.untracked(record);
            } else {
                st.tracker.join(record, call.stream(), &self.ctx, now);
            }
        }
        st.drained = calls;
    }

    /// The flight recorder's record of call `seq`.
    fn record(&self, seq: u64, call: &Slot, failed: bool, now: Instant) -> OpRecord {
        OpRecord {
            seq,
            op: call.op,
            count: call.count,
            dtype: call.dtype,
            peer: call.peer,
            reduction: call.redop,
            state: if failed {
                OpState::Untracked
            } else {
                OpState::InFlight
            },
            issued_at: now.saturating_duration_since(self.began),
            took: None,
        }
    }

    /// One look: finished operations, the timeout, NCCL's async error.
    fn poll(&self) {
        let timed_out = {
            let mut st = self.lock();
            if st.failure.is_some() {
                return;
            }
            st.settle(&self.ctx);
            if st.retire() {
                self.changed.notify_all();
            }
            st.oldest()
                .is_some_and(|(_, issued)| issued.elapsed() >= self.options.timeout)
        };
        if timed_out {
            self.fail_timeout();
            return;
        }
        let Some(handle) = self.abort.upgrade() else {
            return;
        };
        // Never wait behind a blocking NCCL call on another thread: look
        // again at the next poll.
        match handle.try_status() {
            Some(Ok(CommStatus::Failed(e))) => self.fail_async(e.to_string()),
            Some(Err(nccl_safe::Error::Aborted { cause, .. })) if self.lock().unfinished() => {
                let kind = match cause {
                    AbortCause::PeerLost { rank, detail } => {
                        FailureKind::PeerLost(crate::error::loss_of(rank, detail))
                    }
                    _ => FailureKind::Aborted,
                };
                self.fail(kind)
            }
            _ => {}
        }
    }

    /// A timeout, accounted for once: the ranks' divergence from the
    /// flight-record exchange, else the plain timeout. When another thread
    /// accounts for it already (the watchdog thread, or a waiter whose own
    /// deadline fired), waits for that account instead, bounded by the
    /// exchange's wait and four polls.
    fn fail_timeout(&self) {
        {
            let mut st = self.lock();
            if st.failure.is_some() {
                return;
            }
            if st.timing_out {
                drop(st);
                self.await_failure(EXCHANGE_WAIT + self.options.poll * 4);
                return;
            }
            st.timing_out = true;
        }
        let deadline = self.options.timeout;
        let kind = match self.diverged() {
            Some(divergence) => FailureKind::Diverged {
                deadline,
                divergence,
            },
            None => FailureKind::Timeout { deadline },
        };
        self.fail(kind);
    }

    /// NCCL reported an error: where the ranks diverge when the flight
    /// recorders say so (a mismatch NCCL noticed), else the plain error.
    fn fail_async(&self, error: String) {
        if self.lock().failure.is_some() {
            return;
        }
        // Only a disagreement on a call every rank made: after an error
        // (unlike a timeout) the ranks may just be at different points of
        // the same program, one enqueue ahead of another.
        let kind = match self
            .diverged()
            .filter(|d| d.field != culprit::Field::Missing)
        {
            Some(divergence) => FailureKind::Mismatch { error, divergence },
            None => FailureKind::AsyncError(error),
        };
        self.fail(kind);
    }

    fn fail(&self, kind: FailureKind) {
        let failure = {
            let mut st = self.lock();
            if let Some(earlier) = &mut st.failure {
                // NCCL may report a dead peer's closed socket before the
                // liveness channel names it: the loss is the better cause.
                if matches!(kind, FailureKind::PeerLost(_))
                    && !matches!(earlier.kind, FailureKind::PeerLost(_))
                {
                    earlier.kind = kind;
                    self.changed.notify_all();
                }
                return;
            }
            let (seq, issued) = st
                .oldest()
                .unwrap_or((st.next_seq.saturating_sub(1), Instant::now()));
            let first = matches!(
                kind,
                FailureKind::Timeout { .. } | FailureKind::Diverged { .. }
            );
            let unfinished: Vec<(u64, u64)> = st.unfinished_ranges().collect();
            for (lo, hi) in unfinished {
                for s in lo..=hi {
                    if let Some(r) = st.record_mut(s) {
                        r.state = if s == seq && first {
                            OpState::TimedOut
                        } else {
                            OpState::Aborted
                        };
                    }
                }
            }
            let op = st.record_mut(seq).map_or("(none)", |r| r.op);
            let failure = Failure {
                comm: self.label.clone(),
                op,
                seq,
                kind,
                after: issued.elapsed(),
                history: st.history.iter().cloned().collect(),
            };
            st.failure = Some(failure.clone());
            failure
        };
        // Abort outside our lock: the issuing thread may be waiting for it.
        // Never waits: a blocking call in progress aborts when it returns.
        if let Some(handle) = self.abort.upgrade() {
            let cause = match &failure.kind {
                FailureKind::PeerLost(loss) => AbortCause::PeerLost {
                    rank: loss.rank,
                    detail: loss.to_string(),
                },
                FailureKind::Timeout { .. } | FailureKind::Diverged { .. } => AbortCause::Timeout {
                    op: failure.op,
                    seq: Some(failure.seq),
                },
                FailureKind::AsyncError(e) | FailureKind::Mismatch { error: e, .. } => {
                    AbortCause::AsyncError(e.clone())
                }
                FailureKind::Aborted => AbortCause::Requested,
            };
            handle.request_abort(cause);
        }
        tracing::error!(comm = %failure.comm, op = failure.op, seq = failure.seq, "{failure}");
        if self.options.print {
            eprintln!(
                "nccl-dist watchdog: {failure}\n{}",
                failure.render_history()
            );
        }
        self.changed.notify_all();
    }
}

impl OpObserver for Watch {
    fn issued(&self, info: &OpInfo, stream: ObservedStream<'_>) {
        // A kept stream: into the lane, drained by the next look.
        let call = Slot::of(info, stream.as_raw());
        if self.lane.lock().push(call) {
            return;
        }
        self.issued_past_the_lane(call, stream);
    }

    fn checks_before(&self) -> bool {
        self.check
    }

    fn before(&self, info: &OpInfo) -> std::result::Result<(), CheckError> {
        self.check_call(info)
    }

    fn gates(&self) -> bool {
        self.gating.is_some()
    }

    fn gate(&self, calls: &[(OpInfo, &[usize])]) -> std::result::Result<(), CheckError> {
        // Only calls that may connect come here (a communicator's first
        // collective, new point-to-point peers): not the hot path.
        let _span = tracing::debug_span!("nccl.gate", calls = calls.len()).entered();
        self.gate_calls(calls)
    }

    fn gate_label(&self) -> Option<String> {
        Some(exchange_key(&self.label))
    }

    fn unfinished(&self) -> bool {
        let st = self.lock();
        st.failure.is_none() && st.tracker.unfinished()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn into_any(self: Arc<Self>) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Some(self)
    }
}

/// The observer as a `T`, when its allocation holds one. `Arc::downcast`
/// checks the type of the allocation `into_any` hands back, so an observer
/// that lies there can at worst name some other real `T` (never make a
/// `T` of memory that holds something else).
fn observer_as<T: std::any::Any + Send + Sync>(observer: Arc<dyn OpObserver>) -> Option<Arc<T>> {
    observer.into_any()?.downcast::<T>().ok()
}

struct Registry {
    watches: Mutex<Vec<Weak<Watch>>>,
    /// Communicators gated so far, by label (the same order on every
    /// rank, as communicators are made collectively).
    generations: Mutex<std::collections::HashMap<String, u64>>,
    options: WatchdogOptions,
    /// The liveness channel a timeout's flight-recorder exchange uses.
    liveness: Mutex<Option<Exchanger>>,
    /// The channel the connection gate meets over (`gate.rs`): the
    /// exchange's, or, for threads of one process, their own.
    gating: Mutex<Option<Exchanger>>,
}

impl Registry {
    /// The watches whose communicators still exist.
    fn live(&self) -> Vec<Arc<Watch>> {
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

fn lock_liveness(r: &Registry) -> MutexGuard<'_, Option<Exchanger>> {
    r.liveness.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock_gating(r: &Registry) -> MutexGuard<'_, Option<Exchanger>> {
    r.gating.lock().unwrap_or_else(|p| p.into_inner())
}

/// The collectives every rank records exactly once per call.
const SYMMETRIC: [&str; 5] = [
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
];

/// A background thread that watches communicators (see the module docs).
/// Cheap to clone; the thread ends when the last clone and the last
/// watched communicator are gone.
#[derive(Clone)]
pub struct Watchdog {
    registry: Arc<Registry>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("options", &self.registry.options)
            .finish_non_exhaustive()
    }
}

impl Watchdog {
    /// Starts the watchdog thread.
    pub fn start(options: WatchdogOptions) -> Result<Watchdog> {
        let registry = Arc::new(Registry {
            watches: Mutex::new(Vec::new()),
            generations: Mutex::new(std::collections::HashMap::new()),
            options,
            liveness: Mutex::new(None),
            gating: Mutex::new(None),
        });
        let weak = Arc::downgrade(&registry);
        std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watch_loop(weak))
            .map_err(|e| Error::InvalidArgument {
                op: "Watchdog::start",
                reason: format!("cannot start the watchdog thread: {e}"),
            })?;
        Ok(Watchdog { registry })
    }

    /// The options it runs with.
    pub fn options(&self) -> &WatchdogOptions {
        &self.registry.options
    }

    /// After a timeout, exchange flight-recorder tails over `liveness`,
    /// so the failure names the rank and field that diverged
    /// ([`FailureKind::Diverged`]); and answer the hub's requests for
    /// this rank's tails from the watched communicators.
    pub(crate) fn exchange_over(&self, liveness: &Liveness) {
        let exchanger = liveness.exchanger();
        exchanger.set_check_wait(self.registry.options.timeout);
        *lock_gating(&self.registry) = Some(exchanger.clone());
        *lock_liveness(&self.registry) = Some(exchanger);
        let registry = Arc::downgrade(&self.registry);
        liveness.set_tail_source(Arc::new(move |key: &str| {
            let registry = registry.upgrade()?;
            let watches = registry.watches.lock().unwrap_or_else(|p| p.into_inner());
            let watch = watches
                .iter()
                .filter_map(Weak::upgrade)
                .find(|w| exchange_key(&w.label) == key)?;
            let st = watch.lock();
            Some(st.history.iter().map(|r| (r.seq, r.call())).collect())
        }));
    }

    /// Gate calls that may connect over `liveness` (threads of one
    /// process, whose channel has no flight-record exchange).
    pub(crate) fn gate_over(&self, liveness: &Liveness) {
        let exchanger = liveness.exchanger();
        // The gates end at 0.9 of the operation timeout, as at a hub.
        exchanger.set_check_wait(self.registry.options.timeout);
        *lock_gating(&self.registry) = Some(exchanger);
    }

    /// A peer of the job was lost: every watched communicator fails with
    /// [`FailureKind::PeerLost`] (its flight recorder names the operation
    /// it was at) and is aborted without waiting.
    pub fn peer_lost(&self, loss: &PeerLoss) {
        for watch in self.registry.live() {
            watch.fail(FailureKind::PeerLost(loss.clone()));
        }
    }

    /// Watches `comm` under `label` from its next operation on, replacing
    /// any observer it had. The watch ends when `comm` is dropped.
    pub fn watch(&self, comm: &Comm, label: impl Into<String>) -> Watched {
        self.watch_ranks(comm, label, None)
    }

    /// As [`Watchdog::watch`]; with `members` (the world rank of each
    /// rank of `comm`, one thread per rank) its calls that may connect
    /// inside NCCL are gated (`gate.rs`).
    pub(crate) fn watch_ranks(
        &self,
        comm: &Comm,
        label: impl Into<String>,
        members: Option<Vec<usize>>,
    ) -> Watched {
        track::load_event_query(comm.stream().context());
        let label = label.into();
        let gating = members
            .filter(|m| m.len() == comm.size() && comm.size() > 1)
            .map(|m| {
                let mut gens = self
                    .registry
                    .generations
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let n = gens.entry(label.clone()).or_insert(0);
                *n += 1;
                gate::Gating::new(&label, *n - 1, m, comm.rank())
            });
        let began = Instant::now();
        let watch = Arc::new(Watch {
            lane: HotLane::new(comm.stream().cu_stream() as cudaStream_t, began),
            gating,
            check: check::checks(self.registry.options.check_calls, &label),
            checked: AtomicU64::new(0),
            label,
            registry: Arc::clone(&self.registry),
            abort: comm.abort_handle().downgrade(),
            ctx: Arc::clone(comm.stream().context()),
            streams: Mutex::new(vec![Arc::clone(comm.stream())]),
            options: self.registry.options.clone(),
            began,
            state: Mutex::new(WatchState {
                tracker: {
                    let mut t = Tracker::new(self.registry.options.history);
                    t.kept.push(comm.stream().cu_stream() as cudaStream_t);
                    t
                },
                failure: None,
                timing_out: false,
                drained: Vec::with_capacity(LANE),
            }),
            changed: Condvar::new(),
        });
        comm.set_observer(Some(watch.clone()));
        let mut watches = self
            .registry
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        watches.retain(|w| w.strong_count() > 0);
        watches.push(Arc::downgrade(&watch));
        Watched { watch }
    }
}

/// Watched communicators the watchdog thread has room for up front.
const WATCHES_RESERVED: usize = 128;

fn watch_loop(registry: Weak<Registry>) {
    // Reused every round: the watchdog allocates nothing while it polls
    // (the bench counts allocations on every thread).
    // Room for this many watched communicators from the start: the first
    // poll that finds one would otherwise allocate then, in the middle of
    // whatever the program is doing (the bench saw it as one allocation
    // in its first timed window). More than this grows the list once.
    let mut watches: Vec<Arc<Watch>> = Vec::with_capacity(WATCHES_RESERVED);
    loop {
        let poll = {
            let Some(registry) = registry.upgrade() else {
                return;
            };
            watches.extend(
                registry
                    .watches
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter_map(Weak::upgrade),
            );
            registry.options.poll
        };
        for watch in &watches {
            watch.poll();
        }
        watches.clear();
        std::thread::sleep(poll);
    }
}

/// The handle of one watched communicator: its flight recorder and its
/// failure, and waits that wake on it.
#[derive(Clone)]
pub struct Watched {
    watch: Arc<Watch>,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("label", &self.watch.label)
            .finish_non_exhaustive()
    }
}

impl Watched {
    /// The watch of `comm`, if a [`Watchdog`] watches it.
    pub fn of(comm: &Comm) -> Option<Watched> {
        let watch = observer_as::<Watch>(comm.observer()?)?;
        Some(Watched { watch })
    }

    /// The label given to [`Watchdog::watch`].
    pub fn label(&self) -> &str {
        &self.watch.label
    }

    /// The failure, once there was one.
    pub fn failure(&self) -> Option<Failure> {
        self.watch.lock().failure.clone()
    }

    /// The flight recorder now, oldest first.
    pub fn history(&self) -> Vec<OpRecord> {
        self.watch.lock().history.iter().cloned().collect()
    }

    /// The flight recorder as a table.
    pub fn render_history(&self) -> String {
        render(&self.watch.label, &self.history())
    }

    /// Keeps `stream` alive with the watch, so operations on it are
    /// tracked in batches (a fraction of a driver call each) instead of
    /// one CUDA event per operation. The communicator's own stream is
    /// always tracked so; give here a framework's stream that its
    /// collectives go on (a stream of the communicator's device). The
    /// communicator's own stream and the first three given here (or
    /// inherited from a parent) take the fastest path, the watch's lane;
    /// later ones are batched on the issuing thread. The per-thread
    /// default stream is a different stream on every thread: it is not
    /// kept (its operations get an event each).
    pub fn track_stream(&self, stream: Arc<CudaStream>) -> Result<()> {
        let found = stream.context().ordinal();
        if found != self.watch.ctx.ordinal() {
            return Err(Error::Nccl(nccl_safe::Error::WrongDevice {
                op: "Watched::track_stream",
                role: nccl_safe::Role::Stream,
                expected: self.watch.ctx.ordinal(),
                found,
            }));
        }
        let raw = stream.cu_stream() as cudaStream_t;
        // The per-thread default stream is another stream on every thread:
        // its calls are recorded at once, as on a stream not kept.
        if raw as usize == lane::PER_THREAD {
            return Ok(());
        }
        let mut streams = self.watch.streams.lock().unwrap_or_else(|p| p.into_inner());
        if streams.iter().any(|s| s.cu_stream() as cudaStream_t == raw) {
            return Ok(());
        }
        streams.push(stream);
        let mut st = self.watch.lock();
        st.tracker.kept.push(raw);
        self.watch.lane.lock().keep(raw);
        Ok(())
    }

    /// The sequence number the next operation will get.
    pub fn next_seq(&self) -> u64 {
        self.watch.lane.lock().next_seq()
    }

    /// Waits until every operation issued so far has finished: `Ok`, or
    /// [`Error::Watchdog`] as soon as the watchdog acts (it wakes this
    /// wait). The watchdog's timeout bounds it.
    pub fn wait_idle(&self) -> Result<()> {
        let mut st = self.watch.lock();
        loop {
            if let Some(f) = &st.failure {
                return Err(from_failure(f.clone()));
            }
            if !st.tracker.unfinished() {
                return Ok(());
            }
            // The watchdog thread notifies on progress and failure; the
            // timed wait covers an untracked end (the comm dropped).
            st = nccl_control::wait::at_most(&self.watch.changed, st, self.watch.options.poll * 4);
            if !self.watch.abort.is_alive() {
                return Ok(());
            }
        }
    }
}

/// Watches `child` (split from `parent`) with `parent`'s watchdog, if it
/// has one, under `parent`'s label and `suffix`. The child's operations
/// are batched on every stream the parent's are (its own stream and those
/// given to [`Watched::track_stream`]) as well as on the child's own: a
/// program that orders a step on one stream, say a mesh's, and issues each
/// axis's collectives there pays no event per call. The parent's streams
/// are copied at the split: one tracked on the parent later is not passed
/// on (track it on the child too).
pub(crate) fn inherit(parent: &Comm, child: &Comm, suffix: &str) {
    inherit_ranks(parent, child, suffix, None)
}

/// As [`inherit`], with the world rank of each rank of `child`, so that
/// its calls that may connect are gated when the parent's are.
pub(crate) fn inherit_ranks(
    parent: &Comm,
    child: &Comm,
    suffix: &str,
    members: Option<Vec<usize>>,
) {
    if let Some(w) = Watched::of(parent) {
        let label = format!("{}/{suffix}", w.watch.label);
        let members = members.filter(|_| w.watch.gating.is_some());
        let watched = Watchdog {
            registry: Arc::clone(&w.watch.registry),
        }
        .watch_ranks(child, label, members);
        let streams = w
            .watch
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for stream in streams {
            // A split child lives on its parent's device: the check in
            // `track_stream` cannot fail, and a stream it refused would
            // only cost an event per call.
            let _ = watched.track_stream(stream);
        }
    }
}

#[cfg(test)]
mod tests;
