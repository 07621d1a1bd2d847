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
//! Dropping a `Comm` finalizes it and then frees it with `ncclCommAbort`
//! (never `ncclCommDestroy`, which waits inside NCCL for every peer to
//! finalize too), or aborts it without finalizing if its work does not
//! finish in time; it never panics. `ncclCommFinalize` waits for the other local
//! ranks, so communicators that one thread created together (`init_all`,
//! `split_all`) are finalized together, in one group, when the last of them
//! is dropped; they may be dropped in any order.
//!
//! # Files
//!
//! `poll.rs` (the waiting loop) ← `teardown.rs` (bounded teardown, alone
//! or by clique) ← `handle.rs` (the state `Comm` and `AbortHandle` share:
//! the raw handle under its mutex, the abort protocol) ← this file (`Comm`,
//! its accessors, [`Comm::with_raw`]), `init.rs`, `split.rs` (split,
//! shrink, grow) and `abort.rs` (`AbortHandle`; revoke, finalize, destroy,
//! abort). The group files import `handle.rs`; it imports only the
//! group's thread state back.

mod abort;
pub(crate) mod handle;
mod init;
pub(crate) mod park;
pub(crate) mod poll;
mod split;
pub(crate) mod teardown;
pub use teardown::ABORT_ALLOWANCE;
pub use teardown::{ExitHold, drop_together};

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use nccl_sys::ncclComm_t;

use crate::abort::{AbortCause, AbortSignal};
use crate::capabilities::{Capabilities, FP8_REDUCTION_MIN_CC};
use crate::comm::handle::{Shared, State};
use crate::comm::teardown::drop_waited;
use crate::config::Config;
use crate::library::Library;
use crate::observe::OpObserver;
use crate::{Error, Feature, Result};

pub use abort::{AbortHandle, KeptComm, WeakAbortHandle};
pub use handle::CommStatus;

/// An NCCL communicator on one GPU, with a CUDA stream for its work.
///
/// `Send`, not `Sync`: see the module docs for NCCL's rule.
pub struct Comm {
    /// Dropped by hand in `Drop`, so the teardown it may start knows that
    /// this thread waits for it.
    pub(in crate::comm) shared: std::mem::ManuallyDrop<Arc<Shared>>,
    pub(in crate::comm) stream: Arc<CudaStream>,
    pub(in crate::comm) rank: usize,
    pub(in crate::comm) size: usize,
    pub(in crate::comm) device: usize,
    pub(in crate::comm) compute_capability: (i32, i32),
    pub(in crate::comm) force_send_recv: Cell<bool>,
    pub(crate) observer: RefCell<Option<Arc<dyn OpObserver>>>,
    /// The observer asks to check calls before launch
    /// ([`OpObserver::checks_before`]), read when it is set.
    pub(crate) checks_before: Cell<bool>,
    /// The observer gates calls that may connect
    /// ([`OpObserver::gates`]), read when it is set.
    pub(crate) gates: Cell<bool>,
    /// What this handle has seen the gate let through (the shared state's
    /// `reached` records it for every handle, and only ever grows): later
    /// calls of the same kind skip its lock.
    pub(crate) met: Cell<Met>,
    /// The last stream handed to [`Comm::borrowed_stream`], wrapped.
    pub(in crate::comm) borrowed: RefCell<Option<Arc<CudaStream>>>,
    pub(in crate::comm) _not_sync: PhantomData<Cell<()>>,
}

/// A handle's copy of what [`Reached`] says was met, read without its
/// lock: the first collective, the first all-to-all, and the first send to
/// and receive from each of ranks 0 to 63 (a bit each; higher ranks ask
/// the shared record).
#[derive(Clone, Copy, Default)]
pub(crate) struct Met {
    pub(crate) collective: bool,
    pub(crate) all_to_all: bool,
    pub(crate) send: u64,
    pub(crate) recv: u64,
}

impl Met {
    /// The bit of `rank` in `send` and `recv` (none past 63).
    pub(crate) fn bit(rank: usize) -> u64 {
        u32::try_from(rank)
            .ok()
            .and_then(|r| 1u64.checked_shl(r))
            .unwrap_or(0)
    }
}

/// The calls that may make a connection inside NCCL which this rank has
/// met its peers for ([`OpObserver::gate`]).
///
/// NCCL connects a collective's ranks at the first collective (and
/// every algorithm at its first use, unless `NCCL_RUNTIME_CONNECT=0`), and
/// point-to-point peers one direction at a time: the first send to a rank
/// connects this rank's send side, the first receive from it the receive
/// side.
#[derive(Debug, Default)]
pub(crate) struct Reached {
    /// The first collective was let through.
    pub(crate) collective: bool,
    /// `send[r]` / `recv[r]`: the first send to / receive from rank `r`
    /// was.
    pub(crate) send: Vec<bool>,
    pub(crate) recv: Vec<bool>,
    /// Calls every rank makes (all-to-all, and gather and scatter by
    /// root) whose first use met every rank: (the NCCL function, the
    /// root).
    pub(crate) firsts: Vec<(&'static str, usize)>,
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
        self.shared
            .handles
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        // `lock`, not `try_lock`: a watchdog's momentary look must not make
        // the teardown skip the drain (only an abort holds it long).
        let live = matches!(*self.shared.lock(), State::Live(_));
        if live {
            if let Ok(event) = self.stream.record_event(None) {
                *self.shared.drain.lock().unwrap_or_else(|p| p.into_inner()) = Some(event);
            }
            // Another handle's observer stays when this one has none.
            if let Some(observer) = self.observer.borrow_mut().take() {
                *self
                    .shared
                    .last_observer
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(observer);
            }
        }
        // SAFETY: taken exactly once, here; `self.shared` is not used
        // after.
        let shared = unsafe { std::mem::ManuallyDrop::take(&mut self.shared) };
        drop_waited(shared);
    }
}

/// What a new `Comm` needs besides its raw handle.
struct Parts {
    lib: &'static Library,
    ctx: Arc<CudaContext>,
    blocking: bool,
    timeout: Duration,
    signal: Option<AbortSignal>,
    park_on_loss: bool,
    /// Made by an init (no parent): its creation is the creator's alone
    /// to cut short ([`Shared::creating`](handle::Shared::creating)). A
    /// child's may still read its parent inside NCCL, so the signal
    /// aborts it before the parent, as before.
    parentless: bool,
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
            park_on_loss: config.is_some_and(Config::parks_on_peer_loss),
            parentless: false,
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
    if crate::group::is_open() {
        Err(Error::InvalidArgument {
            op,
            reason: "not allowed while a group is open on this thread",
        })
    } else {
        Ok(())
    }
}

/// Checks that the CUDA driver (`libcuda.so`) can be loaded, and says so
/// as an error value when it cannot: cudarc panics on any call without
/// it. Every init of this crate asks first; call it before your own first
/// cudarc call (a `CudaContext`, `device_count`) to exit cleanly on a
/// machine without a GPU driver.
///
/// ```
/// match nccl_safe::require_cuda_driver() {
///     Ok(()) => println!("the CUDA driver loads"),
///     Err(e) => eprintln!("no GPU work here: {e}"),
/// }
/// ```
pub fn require_cuda_driver() -> Result<()> {
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

/// The number of GPUs the CUDA driver sees, at least one: the first call a
/// program that needs a GPU can make. A typed error, never cudarc's panic,
/// when the driver is missing ([`require_cuda_driver`]), fails
/// (`Error::Cuda`), or sees no GPU (`Error::Unsupported`).
///
/// ```
/// match nccl_safe::require_gpus() {
///     Ok(n) => println!("{n} GPU(s)"),
///     Err(e) => eprintln!("this program needs a GPU: {e}"),
/// }
/// ```
pub fn require_gpus() -> Result<usize> {
    require_cuda_driver()?;
    let n = cudarc::driver::CudaContext::device_count().map_err(cuda("cuDeviceGetCount"))?;
    match usize::try_from(n) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::Unsupported {
            what: "a GPU",
            requires: "at least one GPU the CUDA driver sees".to_string(),
            found: "none".to_string(),
        }),
    }
}

impl Comm {
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
        waited?;
        // A one-shot all-reduce that ended early left its result undefined.
        self.shared.kernel_failed(OP)
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
        self.checks_before
            .set(observer.as_ref().is_some_and(|o| o.checks_before()));
        self.gates.set(observer.as_ref().is_some_and(|o| o.gates()));
        *self.observer.borrow_mut() = observer;
    }

    /// The observer set with [`Comm::set_observer`]. Its owner gets its
    /// own type back with [`OpObserver::into_any`] and `Arc::downcast`.
    pub fn observer(&self) -> Option<Arc<dyn OpObserver>> {
        self.observer.borrow().clone()
    }

    /// A second handle on this communicator: the same NCCL communicator
    /// and stream, its observer and settings, for a second owner (a mesh
    /// whose axis holds the world's ranks in the world's order uses the
    /// world's communicator this way, and so its connections). The
    /// communicator lives until its last handle is dropped; an abort
    /// through any handle reaches all of them (their calls then answer
    /// [`Error::Aborted`]).
    ///
    /// The handles' calls never overlap (they take the communicator's one
    /// lock, as NCCL requires), and a call through one handle while a group
    /// open on another thread holds calls on the communicator waits for
    /// that group's end, at most [`Comm::timeout`] ([`Error::Timeout`]);
    /// [`Comm::finalize`] and [`Comm::destroy`] need the last handle
    /// ([`Error::InvalidArgument`] before any NCCL call). They remain one
    /// communicator for NCCL: every rank must issue its calls through all
    /// of its handles in the same order, so calls from two threads at once,
    /// whose order nothing fixes, are the caller's to avoid.
    ///
    /// [`Error::InvalidArgument`] inside a group open on this thread;
    /// [`Error::Aborted`] or [`Error::Finalized`] when the communicator is
    /// gone.
    ///
    /// ```no_run
    /// # fn demo(comm: nccl_safe::Comm) -> nccl_safe::Result<()> {
    /// let other = comm.share()?;
    /// let worker = std::thread::spawn(move || -> nccl_safe::Result<()> {
    ///     let mut x = other.stream().clone_htod(&[1.0f32; 8]).unwrap();
    ///     other.all_reduce_in_place(&mut x, nccl_safe::ReduceOp::Sum)?;
    ///     other.synchronize(other.stream())
    /// });
    /// worker.join().unwrap()?;
    /// // Later calls on `comm` come after the worker's on every rank.
    /// # Ok(()) }
    /// ```
    pub fn share(&self) -> Result<Comm> {
        const OP: &str = "Comm::share";
        refuse_in_group(OP)?;
        match *self.shared.lock() {
            State::Live(_) => {}
            State::Aborted => return Err(self.shared.aborted(OP)),
            State::Closed => return Err(Error::Finalized { op: OP }),
        }
        self.shared
            .handles
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(Comm {
            shared: std::mem::ManuallyDrop::new(Arc::clone(&self.shared)),
            stream: Arc::clone(&self.stream),
            rank: self.rank,
            size: self.size,
            device: self.device,
            compute_capability: self.compute_capability,
            force_send_recv: Cell::new(self.force_send_recv.get()),
            observer: RefCell::new(self.observer.borrow().clone()),
            checks_before: Cell::new(self.checks_before.get()),
            gates: Cell::new(self.gates.get()),
            met: Cell::new(self.met.get()),
            borrowed: RefCell::new(None),
            _not_sync: PhantomData,
        })
    }

    /// Whether `other` is a handle on the same communicator
    /// ([`Comm::share`]), or this one.
    pub fn same_communicator(&self, other: &Comm) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    pub(crate) fn uses_send_recv(&self, native: Feature) -> bool {
        self.force_send_recv.get() || !self.capabilities().has(native)
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Runs `f` on the raw handle, for calls this crate does not wrap. The
    /// communicator stays alive and is not aborted, finalized or used by
    /// another thread while `f` runs (an abort asked for meanwhile happens
    /// right after it); the device's context is current.
    ///
    /// [`Error::Aborted`] or [`Error::Finalized`] instead of running `f`
    /// when the communicator is gone; [`Error::InvalidArgument`] while a
    /// group ([`GroupGuard`](crate::GroupGuard)) is open on this thread
    /// (work enqueued through the raw handle would join a group this crate
    /// does not know the communicator is in). `f` runs under the
    /// communicator's lock: calling this communicator's methods that take
    /// it (every operation) from inside `f` blocks or panics, so use the
    /// raw handle only.
    ///
    /// # Safety
    ///
    /// `f` must not free, abort or finalize the handle, nor keep it past
    /// its return, nor leave an `ncclGroupStart` of its own open; what it
    /// calls on the handle must follow NCCL's rules for this communicator
    /// (an NCCL call that enqueues work leaves it to the caller to keep its
    /// buffers alive until that work is done).
    pub unsafe fn with_raw<R>(&self, f: impl FnOnce(ncclComm_t) -> R) -> Result<R> {
        refuse_in_group("with_raw")?;
        self.shared.with_raw("with_raw", |raw| Ok(f(raw)))
    }
}

#[cfg(test)]
mod met_tests {
    use super::Met;

    /// Ranks 0 to 63 have a bit each; others none, so they always ask the
    /// shared record (never a false "met").
    #[test]
    fn each_rank_below_64_has_its_own_bit() {
        let bits: Vec<u64> = (0..64).map(Met::bit).collect();
        assert!(bits.iter().all(|b| b.count_ones() == 1));
        assert_eq!(bits.iter().fold(0, |a, b| a | b), u64::MAX);
        for r in [64, 65, 1 << 20, usize::MAX] {
            assert_eq!(Met::bit(r), 0, "rank {r}");
        }
    }
}
