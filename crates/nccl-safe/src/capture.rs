//! Collectives captured into CUDA graphs.
//!
//! A graph captured from a stream replays its work at every launch, long
//! after the calls that recorded it returned. cudarc's capture and launch
//! are safe functions, and nothing in them ties a captured collective to
//! its buffers or its communicator: a launch after either is gone reads and
//! writes freed memory. So the safe API refuses to enqueue on a stream that
//! is being captured ([`crate::Error::Capturing`]), and capturing is done
//! inside [`allow_capture`], whose caller promises what the borrow checker
//! cannot see.
//!
//! ```no_run
//! # fn demo(comm: &nccl_safe::Comm, x: &mut nccl_safe::cudarc::driver::CudaSlice<f32>)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use nccl_safe::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
//! use nccl_safe::{ReduceOp, allow_capture};
//! let stream = comm.stream();
//! stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
//! // SAFETY: `comm` and `x` outlive `graph` below, and every launch of it
//! // is waited for before they go.
//! unsafe { allow_capture(|| comm.on(stream).all_reduce_in_place(x, ReduceOp::Sum)) }?;
//! let graph = stream.end_capture(CUgraphInstantiate_flags(0))?.ok_or("empty")?;
//! graph.launch()?;
//! stream.synchronize()?;
//! drop(graph);
//! # Ok(()) }
//! ```

use std::cell::Cell;

use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUstreamCaptureStatus;

use crate::{Error, Result};

thread_local! {
    /// How many [`allow_capture`] scopes are open on this thread.
    static ALLOWED: Cell<usize> = const { Cell::new(0) };
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
    ALLOWED.with(|a| a.set(a.get() + 1));
    let _scope = Scope;
    f()
}

/// Refuses `op` on a stream that is being captured, unless an
/// [`allow_capture`] scope is open on this thread.
pub(crate) fn refuse_capture(op: &'static str, stream: &CudaStream) -> Result<()> {
    if ALLOWED.with(Cell::get) > 0 {
        return Ok(());
    }
    match stream.capture_status() {
        Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE) => Ok(()),
        Ok(_) => Err(Error::Capturing { op }),
        Err(source) => Err(Error::Cuda { op, source }),
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
