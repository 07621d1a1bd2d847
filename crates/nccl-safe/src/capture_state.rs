//! Whether this thread may enqueue on capturing streams ([`allow_capture`]
//! scopes), and the capture-status queries every enqueue and every group end
//! asks. Imports nothing above it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUstreamCaptureStatus;

use crate::{Error, Result};

thread_local! {
    /// How many [`allow_capture`] scopes are open on this thread.
    static ALLOWED: Cell<usize> = const { Cell::new(0) };
}

/// Graphs of collectives alive in the process through the capture API,
/// counted from the capture's start to the graph's drop ([`GraphAlive`]).
static GRAPHS: AtomicUsize = AtomicUsize::new(0);
/// Whether an [`allow_capture`] scope ever opened: graphs of the caller's
/// own may refer to communicators from then on.
static RAW_CAPTURES: AtomicBool = AtomicBool::new(false);

/// One graph of the capture API alive (see [`graphs_may_exist`]).
pub(crate) struct GraphAlive(());

impl GraphAlive {
    pub(crate) fn new() -> GraphAlive {
        GRAPHS.fetch_add(1, Ordering::AcqRel);
        GraphAlive(())
    }
}

impl Drop for GraphAlive {
    fn drop(&mut self) {
        GRAPHS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a CUDA graph may refer to a communicator of this process: NCCL's
/// reclaim of an aborted communicator waits until no graph does, which
/// only the graph's owner (another thread, maybe) can end.
pub(crate) fn graphs_may_exist() -> bool {
    GRAPHS.load(Ordering::Acquire) > 0 || RAW_CAPTURES.load(Ordering::Acquire)
}

/// Runs `f` with enqueueing on capturing streams allowed on this thread.
///
/// # Safety
///
/// For every operation `f` enqueues on a stream that is being captured:
/// its buffers stay allocated (and are not written by anything else while
/// a launch may run) and its communicator stays alive, not aborted or
/// destroyed, until every launch of every graph made from that capture has
/// finished. Wait for the launches (synchronize the stream they went on)
/// before dropping any of them.
pub unsafe fn allow_capture<R>(f: impl FnOnce() -> R) -> R {
    struct Scope;
    impl Drop for Scope {
        fn drop(&mut self) {
            ALLOWED.with(|a| a.set(a.get().saturating_sub(1)));
        }
    }
    RAW_CAPTURES.store(true, Ordering::Release);
    ALLOWED.with(|a| a.set(a.get() + 1));
    let _scope = Scope;
    f()
}

/// Whether an [`allow_capture`] scope is open on this thread.
pub(crate) fn is_allowed() -> bool {
    ALLOWED.with(Cell::get) > 0
}

/// Runs `f` with no [`allow_capture`] scope in force (for code this crate
/// calls but does not control, such as observers: the caller's promise
/// covers its own calls, not theirs).
pub(crate) fn without_capture<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            ALLOWED.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(ALLOWED.with(|a| a.replace(0)));
    f()
}

/// Whether `stream` is being captured now (an error counts as yes).
pub(crate) fn is_capturing(stream: &CudaStream) -> bool {
    capture_status(stream).is_none_or(|s| s != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `stream`'s capture status in one driver call, `None` when the driver
/// will not say so. The stream names its context, so no binding is needed
/// first (cudarc's own query binds: one more call).
fn capture_status(stream: &CudaStream) -> Option<CUstreamCaptureStatus> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is a live stream (borrowed for the call); one status
    // is written.
    let code = unsafe { cudarc::driver::sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) };
    (code == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some(status)
}

/// Stops a capture that began on `stream` after a group call was checked
/// and before the group's end, which would record the call into it: the
/// capture is ended here and its graph destroyed, so the group's work runs
/// now on a stream that no longer captures; where this thread may not end
/// it, it is made invalid (synchronizing a capturing stream does that), so
/// no graph comes of it.
pub(crate) fn spoil(stream: &CudaStream) {
    let mut graph: cudarc::driver::sys::CUgraph = std::ptr::null_mut();
    // SAFETY: a live stream; `graph` receives the captured graph, destroyed
    // at once (it was never instantiated).
    let code = unsafe { cudarc::driver::sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) };
    if code == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        if !graph.is_null() {
            // SAFETY: the graph just returned to us; destroyed once.
            let _ = unsafe { cudarc::driver::sys::cuGraphDestroy(graph) };
        }
    } else {
        // SAFETY: a live stream; during a capture this fails and
        // invalidates the capture, which is what is wanted.
        let _ = unsafe { cudarc::driver::sys::cuStreamSynchronize(stream.cu_stream()) };
    }
}

/// Refuses `op` on a stream that is being captured, unless an
/// [`allow_capture`] scope is open on this thread.
pub(crate) fn refuse_capture(op: &'static str, stream: &CudaStream) -> Result<()> {
    if ALLOWED.with(Cell::get) > 0 {
        return Ok(());
    }
    // One driver call on the hot path; cudarc's query (which binds the
    // context) is the fallback should the driver want one.
    let status = match capture_status(stream) {
        Some(status) => status,
        None => stream
            .capture_status()
            .map_err(|source| Error::Cuda { op, source })?,
    };
    match status {
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(()),
        _ => Err(Error::Capturing { op }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_close_even_on_panic() {
        let depth = || ALLOWED.with(Cell::get);
        assert_eq!(depth(), 0);
        // SAFETY: nothing is enqueued.
        unsafe {
            allow_capture(|| {
                assert_eq!(depth(), 1);
                allow_capture(|| assert_eq!(depth(), 2));
                assert_eq!(depth(), 1);
            })
        };
        assert_eq!(depth(), 0);
        let caught = std::panic::catch_unwind(|| {
            // SAFETY: nothing is enqueued.
            unsafe { allow_capture(|| panic!("inside")) }
        });
        assert!(caught.is_err());
        assert_eq!(depth(), 0, "a panic closes the scope");
    }
}

#[cfg(test)]
mod graph_tests {
    use super::*;

    #[test]
    fn a_graph_alive_is_counted_until_it_drops_and_seen_by_every_thread() {
        // No other unit test of this crate makes a graph (that needs a GPU).
        let before = GRAPHS.load(Ordering::Acquire);
        let alive = GraphAlive::new();
        assert_eq!(GRAPHS.load(Ordering::Acquire), before + 1);
        assert!(std::thread::spawn(graphs_may_exist).join().unwrap());
        drop(alive);
        assert_eq!(GRAPHS.load(Ordering::Acquire), before);
    }
}
