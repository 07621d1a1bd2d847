//! Collectives captured into CUDA graphs.
//!
//! A graph captured from a stream replays its work at every launch, long
//! after the calls that recorded it returned. cudarc's capture and launch
//! are safe functions, and nothing in them ties a captured collective to
//! its buffers or its communicator: a launch after either is gone reads and
//! writes freed memory. So the safe API refuses to enqueue on a stream that
//! is being captured ([`crate::Error::Capturing`]), and offers three ways to
//! capture:
//!
//! - [`capture`]: the graph ([`CapturedGraph`]) owns the buffers the
//!   captured calls use and borrows their communicators, so neither can go
//!   while it may still launch; calls may use only those buffers and
//!   built-in reductions, and a launch checks that no buffer was replaced.
//!
//! ```no_run
//! # fn demo(comm: &nccl_safe::Comm) -> Result<(), Box<dyn std::error::Error>> {
//! use nccl_safe::{ReduceOp, capture};
//! let stream = comm.stream();
//! let grads = (stream.clone_htod(&[1.0f32; 1024])?, stream.alloc_zeros::<f32>(1024)?);
//! let mut graph = capture(stream, grads, |cap, (send, recv)| {
//!     cap.on(comm).all_reduce(send, recv, ReduceOp::Sum)
//! })?;
//! graph.launch()?;
//! let (_, recv) = graph.into_buffers()?;
//! assert_eq!(stream.clone_dtoh(&recv)?[0], comm.size() as f32);
//! # Ok(()) }
//! ```
//!
//! - [`capture_group`] (`grouped.rs`): one thread driving several GPUs
//!   captures one NCCL group over all of them into one graph
//!   ([`CapturedGroup`]), which owns a set of buffers per communicator and
//!   borrows the communicators, with the same rules as [`capture`].
//!
//! - [`allow_capture`]: an `unsafe` scope in which the safe API enqueues on
//!   capturing streams; its caller keeps everything alive for every launch
//!   (several streams, PreMulSum).
//!
//! ```no_run
//! # fn demo(comm: &nccl_safe::Comm, x: &mut nccl_safe::cudarc::driver::CudaSlice<f32>)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use nccl_safe::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
//! use nccl_safe::{ReduceOp, allow_capture};
//! let stream = comm.stream();
//! // Relaxed, as `capture` does: see `CAPTURE_MODE` in the source.
//! stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
//! // SAFETY: `comm` and `x` outlive `graph` below, and every launch of it
//! // is waited for before they go.
//! unsafe { allow_capture(|| comm.on(stream).all_reduce_in_place(x, ReduceOp::Sum)) }?;
//! let graph = stream.end_capture(CUgraphInstantiate_flags(0))?.ok_or("empty")?;
//! graph.launch()?;
//! stream.synchronize()?;
//! drop(graph);
//! # Ok(()) }
//! ```

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaStream};

/// The capture mode of [`capture`] and [`capture_group`]: relaxed. NCCL
/// connects a communicator lazily, in its first call of a kind; where
/// that call is captured with a thread per GPU of one process, NCCL's P2P
/// connection calls `cudaDeviceEnablePeerAccess` on the capturing thread,
/// which the thread-local and global modes refuse (`operation not
/// permitted when stream is capturing`, measured on 2 H200s with NCCL
/// 2.28.3). Relaxed lets those calls through; calls that would wait on
/// the capturing stream still fail, and the closures see only the safe
/// API, which makes no such call.
pub(crate) const CAPTURE_MODE: CUstreamCaptureMode =
    CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

use crate::abort::AbortCause;
use crate::buffer::{Access, DeviceBuffer, DeviceBufferMut};
use crate::capture_state::{is_capturing, refuse_capture, spoil};
use crate::comm::poll::poll_with_backoff;
use crate::comm::{AbortHandle, Comm};
use crate::dtype::NcclType;
use crate::memory::NcclMemory;
use crate::ops::OnStream;
use crate::{Error, Result};

pub use crate::capture_state::allow_capture;
pub use grouped::{CapturedGroup, CapturingGroup, capture_group};

mod grouped;

/// The device buffers of one [`Captured`] value, opened on a stream: the
/// address and size in bytes of each, and the access that orders it with
/// the work on the stream (kept until that work is queued).
pub struct Opened<'a>(smallvec::SmallVec<[(u64, usize, Access<'a>); 8]>);

impl<'a> Opened<'a> {
    fn new() -> Self {
        Opened(smallvec::SmallVec::new())
    }

    /// Adds one buffer, as its [`DeviceBufferMut::write`] gave it.
    pub fn push(&mut self, address: u64, bytes: usize, access: Access<'a>) {
        self.0.push((address, bytes, access));
    }

    fn extents(&self) -> Vec<(u64, u64)> {
        self.0
            .iter()
            .map(|(p, b, _)| (*p, p.saturating_add(*b as u64)))
            .collect()
    }
}

/// Device memory that a [`CapturedGraph`] owns: one buffer, or several in a
/// tuple, an array or a `Vec`.
///
/// # Safety
///
/// [`Captured::open`] pushes every device buffer the value owns, each as
/// its [`DeviceBufferMut::write`] on `stream` returns it (address, size in
/// bytes, access), in the same order every time while the value is not
/// changed; the memory stays allocated until the value is dropped, and a
/// dropped buffer frees it ordered after the work recorded through its
/// accesses (as cudarc's slices do with event tracking on).
pub unsafe trait Captured {
    /// Opens every buffer for use on `stream`.
    fn open<'a>(&'a mut self, stream: &'a CudaStream, out: &mut Opened<'a>);
}

// SAFETY: one buffer, opened through its own `write`; cudarc frees a slice
// after the events its accesses recorded.
unsafe impl<T: NcclType> Captured for CudaSlice<T> {
    fn open<'a>(&'a mut self, stream: &'a CudaStream, out: &mut Opened<'a>) {
        let bytes = DeviceBuffer::<T>::len(self) * std::mem::size_of::<T>();
        let (ptr, access) = DeviceBufferMut::<T>::write(self, stream);
        out.push(ptr, bytes, access);
    }
}

// SAFETY: as above; `NcclMemory`'s drop waits for the work joined into its
// stream (and leaks the memory when it does not finish).
unsafe impl<T: NcclType> Captured for NcclMemory<T> {
    fn open<'a>(&'a mut self, stream: &'a CudaStream, out: &mut Opened<'a>) {
        let bytes = DeviceBuffer::<T>::len(self) * std::mem::size_of::<T>();
        let (ptr, access) = DeviceBufferMut::<T>::write(self, stream);
        out.push(ptr, bytes, access);
    }
}

macro_rules! captured_tuple {
    ($($name:ident),+) => {
        // SAFETY: each member keeps its own promise, in a fixed order.
        unsafe impl<$($name: Captured),+> Captured for ($($name,)+) {
            #[allow(non_snake_case)]
            fn open<'a>(&'a mut self, stream: &'a CudaStream, out: &mut Opened<'a>) {
                let ($($name,)+) = self;
                $($name.open(stream, out);)+
            }
        }
    };
}
captured_tuple!(A, B);
captured_tuple!(A, B, C);
captured_tuple!(A, B, C, D);

// SAFETY: each element keeps its own promise, in index order.
unsafe impl<X: Captured, const N: usize> Captured for [X; N] {
    fn open<'a>(&'a mut self, stream: &'a CudaStream, out: &mut Opened<'a>) {
        for x in self {
            x.open(stream, out);
        }
    }
}

// SAFETY: as for arrays; a `Vec` whose length changes has other extents,
// which a launch refuses.
unsafe impl<X: Captured> Captured for Vec<X> {
    fn open<'a>(&'a mut self, stream: &'a CudaStream, out: &mut Opened<'a>) {
        for x in self {
            x.open(stream, out);
        }
    }
}

/// What the closure given to [`capture`] issues its calls through.
pub struct Capturing<'c, 'x> {
    stream: &'x CudaStream,
    /// The caller's stream, where buffers are opened during the capture.
    home: &'x CudaStream,
    extents: &'x [(u64, u64)],
    comms: &'x RefCell<Vec<(AbortHandle, Duration)>>,
    /// Invariant in `'c`: a `&Capturing<'c, _>` must not shrink to a
    /// shorter borrow of the communicators than the graph keeps.
    _comms: PhantomData<Cell<&'c Comm>>,
}

impl<'c, 'x> Capturing<'c, 'x> {
    /// Calls on `comm`, captured on the graph's stream. They may use only
    /// the buffers the graph owns and built-in reductions; `comm` stays
    /// borrowed as long as the graph lives.
    pub fn on<'s>(&'s self, comm: &'c Comm) -> OnStream<'s, 's>
    where
        'c: 's,
        'x: 's,
    {
        let mut comms = self.comms.borrow_mut();
        let handle = comm.abort_handle();
        if !comms.iter().any(|(h, _)| h.same_as(&handle)) {
            comms.push((handle, comm.timeout()));
        }
        OnStream::capturing(comm, self.stream, self.home, self.extents)
    }
}

/// A CUDA graph of collectives that owns the buffers it uses and borrows
/// the communicators it runs on ([`capture`]). Dropping it waits for its
/// launches (at most the communicators' timeout, then aborts them); memory
/// a launch may still use is leaked rather than freed.
pub struct CapturedGraph<'c, B: Captured> {
    graph: Option<CudaGraph>,
    /// The caller's stream: launches are ordered with its work.
    home: Arc<CudaStream>,
    /// The stream the graph was captured on and is launched on. Nobody
    /// else can name it, so no one can end the capture early, keep a
    /// graph of their own from it, or slip other work into it.
    private: Arc<CudaStream>,
    buffers: Option<B>,
    extents: Vec<(u64, u64)>,
    comms: Vec<(AbortHandle, Duration)>,
    /// Whether the graph ran once: until then, its drop aborts the
    /// communicators ([`abort_unlaunched`]) if NCCL recorded work in it.
    launched: bool,
    /// Whether the capture recorded work (any node but an empty one).
    recorded: bool,
    /// Counted until the graph is gone (declared after it, it drops after).
    _alive: crate::capture_state::GraphAlive,
    _comms: PhantomData<&'c Comm>,
}

/// Ends the private capture if the closure unwinds, so no graph of it
/// survives the buffers (declared after them, it drops first).
struct EndOnUnwind<'a> {
    stream: &'a Arc<CudaStream>,
    comms: &'a RefCell<Vec<(AbortHandle, Duration)>>,
    armed: bool,
}

impl Drop for EndOnUnwind<'_> {
    fn drop(&mut self) {
        if self.armed {
            // The graph, if any, is destroyed unlaunched; the communicators
            // NCCL recorded work for go with it.
            let ended = self.stream.end_capture(CUgraphInstantiate_flags(0));
            if let Ok(comms) = self.comms.try_borrow() {
                discard(ended, &comms);
            }
        }
    }
}

impl<B: Captured> std::fmt::Debug for CapturedGraph<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedGraph")
            .field("buffers", &self.extents.len())
            .field("communicators", &self.comms.len())
            .finish_non_exhaustive()
    }
}

/// Captures the calls `f` makes through its [`Capturing`] on `stream` into a
/// graph that owns `buffers`. The calls are not run now: each
/// [`CapturedGraph::launch`] runs them all.
///
/// Refused, with the capture ended and nothing launched: a call on memory
/// that `buffers` does not own, a PreMulSum, a buffer replaced inside `f`,
/// and whatever `f` returns as an error. Inside `f` the buffers are opened
/// on `stream` (only to learn their addresses; nothing is joined into the
/// capture), so cudarc's event tracking may stay on.
///
/// The capture runs on a stream of its own, forked from `stream`; each
/// launch runs there too, after the work queued on `stream` before it and
/// before the work queued on `stream` after it. Calls go straight to NCCL,
/// not in a group: for one thread driving several GPUs, whose calls need a
/// group, use [`capture_group`].
///
/// A capture that fails (the closure's error or panic, or CUDA's at its
/// end), and a graph dropped or given back
/// ([`CapturedGraph::into_buffers`]) before its first launch, abort the
/// communicators that had calls in it once NCCL recorded work there: NCCL
/// may have made connections inside the capture that only a launch
/// completes (see `abort_unlaunched`). A call refused before NCCL saw it
/// aborts nothing. Launch a graph once before relying on its
/// communicators elsewhere.
pub fn capture<'c, B: Captured>(
    stream: &Arc<CudaStream>,
    mut buffers: B,
    f: impl for<'x> FnOnce(&Capturing<'c, 'x>, &'x mut B) -> Result<()>,
) -> Result<CapturedGraph<'c, B>> {
    const OP: &str = "capture";
    let cuda = |source| Error::Cuda { op: OP, source };
    refuse_capture(OP, stream)?;
    // Counted from before the capture (NCCL counts the graph's references
    // from its calls in it) until the graph is gone: declared first, it
    // drops last on every way out.
    let alive = crate::capture_state::GraphAlive::new();
    // A stream of our own (after `stream`'s work so far), which the
    // closure cannot name.
    let private = stream.fork().map_err(cuda)?;
    let extents = {
        let mut opened = Opened::new();
        buffers.open(&private, &mut opened);
        opened.extents()
    };
    let comms = RefCell::new(Vec::new());
    private.begin_capture(CAPTURE_MODE).map_err(cuda)?;
    let mut unwind = EndOnUnwind {
        stream: &private,
        comms: &comms,
        armed: true,
    };
    let issued = {
        let cap = Capturing {
            stream: &private,
            home: stream,
            extents: &extents,
            comms: &comms,
            _comms: PhantomData,
        };
        f(&cap, &mut buffers)
    };
    unwind.armed = false;
    drop(unwind);
    // Always ended, so no capture outlives this call.
    let ended = private.end_capture(CUgraphInstantiate_flags(0));
    let comms = comms.into_inner();
    let graph = match (issued, ended) {
        (Ok(()), Ok(graph)) => graph,
        (issued, ended) => {
            let failed = ended.as_ref().err().cloned();
            discard(ended, &comms);
            issued?;
            return Err(cuda(failed.expect("one of the two failed")));
        }
    };
    let recorded = graph.as_ref().is_some_and(recorded_work);
    let mut graph = CapturedGraph {
        graph,
        home: Arc::clone(stream),
        private,
        buffers: Some(buffers),
        extents,
        comms,
        launched: false,
        recorded,
        _alive: alive,
        _comms: PhantomData,
    };
    // `f` had the buffers mutably: one it replaced was captured at an
    // address the graph no longer owns.
    graph.check_extents(OP)?;
    Ok(graph)
}

/// Why the communicators of a graph dropped unlaunched are aborted.
const UNLAUNCHED: &str = "a CUDA graph of its calls was dropped before its first launch, and NCCL may have made connections inside the capture that only a launch completes";

/// Aborts the communicators of a capture whose graph will never run.
///
/// NCCL makes some connections lazily, inside the call that first needs
/// them (a communicator's first collective, a new peer, an algorithm not
/// used before), and inside a capture part of that set-up is recorded
/// into the graph. A graph dropped before its first launch leaves those
/// connections half made: on 2 H200s with a thread per GPU (NCCL 2.28.3)
/// the next launch on the communicator failed with
/// `CUDA_ERROR_ILLEGAL_ADDRESS`, and with `NCCL_RUNTIME_CONNECT=0` (every
/// connection made at init) it did not. Which calls set up what is
/// NCCL's to decide, so every communicator with calls in such a capture
/// is aborted: later calls on it return [`Error::Aborted`] naming this,
/// instead of running on a broken state.
///
/// Call it once the graph is destroyed: NCCL's abort waits until no graph
/// refers to the communicator. The abort is requested, never waited for:
/// the cause is set at once (every later call fails with it), and inside
/// a group open on this thread the abort itself runs at the group's end.
pub(crate) fn abort_unlaunched(comms: &[(AbortHandle, Duration)]) {
    for (handle, _) in comms {
        if handle.is_aborted() {
            continue;
        }
        tracing::warn!("aborting a communicator: {UNLAUNCHED}");
        handle.request_abort(AbortCause::Other(UNLAUNCHED.to_string()));
    }
}

/// The end of a capture whose graph will never run: the graph destroyed
/// first, then the communicators aborted when NCCL recorded work in it
/// (or when that cannot be known: the end failed).
pub(crate) fn discard(
    ended: std::result::Result<Option<CudaGraph>, cudarc::driver::DriverError>,
    comms: &[(AbortHandle, Duration)],
) {
    let recorded = match &ended {
        Ok(graph) => graph.as_ref().is_some_and(recorded_work),
        Err(_) => true,
    };
    drop(ended);
    if recorded {
        abort_unlaunched(comms);
    }
}

/// Whether a captured graph holds work: any node but an empty one (the
/// joins of streams may leave those). Unknown (a query failed) counts as
/// work.
pub(crate) fn recorded_work(graph: &CudaGraph) -> bool {
    use cudarc::driver::sys::{self, CUgraphNodeType, CUresult};
    let g = graph.cu_graph();
    let mut count = 0usize;
    // SAFETY: `g` is the live graph `graph` owns; a null node array asks
    // for the count only.
    if unsafe { sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut count) }
        != CUresult::CUDA_SUCCESS
    {
        return true;
    }
    if count == 0 {
        return false;
    }
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: `nodes` has room for `count` handles, which CUDA fills and
    // which stay valid while the graph lives (it does, borrowed).
    if unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut count) } != CUresult::CUDA_SUCCESS
    {
        return true;
    }
    nodes.iter().take(count).any(|&node| {
        let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` belongs to the live graph; `kind` is written.
        let queried = unsafe { sys::cuGraphNodeGetType(node, &mut kind) };
        queried != CUresult::CUDA_SUCCESS || kind != CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY
    })
}

/// The graph's buffers opened on `stream`, refused when they were given
/// back or one of them was replaced since the capture (its extents differ).
fn open_owned<'a, B: Captured>(
    buffers: Option<&'a mut B>,
    stream: &'a CudaStream,
    extents: &[(u64, u64)],
    op: &'static str,
) -> Result<Opened<'a>> {
    let Some(buffers) = buffers else {
        return Err(Error::InvalidArgument {
            op,
            reason: "the graph gave its buffers back",
        });
    };
    let mut opened = Opened::new();
    buffers.open(stream, &mut opened);
    if opened.extents() != extents {
        return Err(Error::InvalidArgument {
            op,
            reason: "a buffer the graph owns was replaced since the capture",
        });
    }
    Ok(opened)
}

impl<'c, B: Captured> CapturedGraph<'c, B> {
    fn check_extents(&mut self, op: &'static str) -> Result<()> {
        open_owned(self.buffers.as_mut(), &self.private, &self.extents, op).map(drop)
    }

    /// Runs the captured calls once more, ordered after the work queued on
    /// the stream given to [`capture`] (and the work on the buffers, through
    /// their accesses), and before the work queued on it afterwards.
    /// Refused when that stream is being captured (the launch would become
    /// part of a graph this one cannot follow), a buffer was replaced, or a
    /// communicator aborted.
    pub fn launch(&mut self) -> Result<()> {
        const OP: &str = "CapturedGraph::launch";
        let cuda = |source| Error::Cuda { op: OP, source };
        refuse_capture(OP, &self.home)?;
        if self.comms.iter().any(|(h, _)| h.is_aborted()) {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "a communicator of the graph was aborted",
            });
        }
        let Some(graph) = self.graph.as_ref() else {
            // Nothing was captured: nothing to run.
            return Ok(());
        };
        self.private.join(&self.home).map_err(cuda)?;
        // A capture begun on the caller's stream by another thread since
        // the check above would have pulled ours in with the join: stop
        // it rather than let it record the launch.
        if is_capturing(&self.private) {
            spoil(&self.private);
            return Err(Error::Capturing { op: OP });
        }
        let opened = open_owned(self.buffers.as_mut(), &self.private, &self.extents, OP)?;
        graph.launch().map_err(cuda)?;
        self.launched = true;
        // The accesses record the launch for each buffer as they go.
        drop(opened);
        if self.home.join(&self.private).is_err() {
            // Cannot order the caller's stream after the launch: wait for
            // it instead (bounded), so later work there sees its results.
            if !self.settle() {
                return Err(Error::Timeout {
                    op: OP,
                    waited: self.timeout(),
                });
            }
        }
        Ok(())
    }

    /// The buffers, between launches: work queued on them through the safe
    /// API (or cudarc with event tracking on) is ordered with the launches;
    /// a buffer replaced here makes the next launch refuse.
    pub fn buffers(&mut self) -> Option<&mut B> {
        self.buffers.as_mut()
    }

    /// Waits for the launches (at most the communicators' timeout) and
    /// hands the buffers back.
    pub fn into_buffers(mut self) -> Result<B> {
        let settled = self.settle();
        give_back(
            settled,
            &mut self.buffers,
            &self.comms,
            "CapturedGraph::into_buffers",
        )
    }

    fn timeout(&self) -> Duration {
        longest_timeout(&self.comms)
    }

    /// Waits for the work queued on the graph's stream (see
    /// [`settle_launches`]). Whether it finished.
    fn settle(&mut self) -> bool {
        let Ok(event) = self.private.record_event(None) else {
            return false;
        };
        settle_launches(&mut self.graph, &self.comms, &[event], "CapturedGraph")
    }
}

/// The longest timeout of `comms` (the default without any).
pub(crate) fn longest_timeout(comms: &[(AbortHandle, Duration)]) -> Duration {
    comms
        .iter()
        .map(|(_, t)| *t)
        .max()
        .unwrap_or(crate::DEFAULT_TIMEOUT)
}

/// Waits for `events` (recorded after a graph's launches, on each stream
/// it runs on) at most the communicators' timeout; when they do not
/// finish, aborts the communicators (their kernels then stop) and waits
/// once more. Whether they finished.
pub(crate) fn settle_launches(
    graph: &mut Option<CudaGraph>,
    comms: &[(AbortHandle, Duration)],
    events: &[CudaEvent],
    op: &'static str,
) -> bool {
    let timeout = longest_timeout(comms);
    let done = || {
        poll_with_backoff(timeout, || {
            events.iter().try_fold(true, |all, e| {
                let complete = e
                    .try_is_complete()
                    .map_err(|source| Error::Cuda { op, source })?;
                Ok(all && complete)
            })
        })
    };
    if matches!(done(), Ok(None)) {
        return true;
    }
    // NCCL's abort waits until no graph refers to the communicator: the
    // graph goes first (CUDA keeps a running launch's resources until it
    // ends; the abort then stops its kernels).
    drop(graph.take());
    for (h, _) in comms {
        let _ = h.abort();
    }
    matches!(done(), Ok(None))
}

/// The buffers handed back once the launches `settled`; while they still
/// run, the memory stays with no one (leaked, and the drop does not wait
/// a second time) and the caller gets the timeout.
pub(crate) fn give_back<T>(
    settled: bool,
    buffers: &mut Option<T>,
    comms: &[(AbortHandle, Duration)],
    op: &'static str,
) -> Result<T> {
    if !settled {
        std::mem::forget(buffers.take());
        return Err(Error::Timeout {
            op,
            waited: longest_timeout(comms),
        });
    }
    buffers.take().ok_or(Error::InvalidArgument {
        op,
        reason: "the graph gave its buffers back",
    })
}

impl<B: Captured> Drop for CapturedGraph<'_, B> {
    fn drop(&mut self) {
        if !self.launched && self.recorded {
            // The graph goes first: NCCL's abort waits for it.
            drop(self.graph.take());
            abort_unlaunched(&self.comms);
        }
        // Still running at the end of the wait: the buffers are leaked.
        if self.buffers.is_some() && !self.settle() {
            tracing::warn!("a captured graph's launches did not finish: its buffers are leaked");
            std::mem::forget(self.buffers.take());
        }
    }
}
