//! Completion futures: `.await` an operation instead of blocking a thread
//! on its stream.
//!
//! [`Comm::completion`] records a CUDA event behind the work enqueued so
//! far on a stream (a collective, a whole group, anything) and returns a
//! [`Completion`] that owns the buffers that work uses and hands them back
//! when the event has completed. [`Comm::all_reduce_owned`] and
//! [`Comm::all_reduce_in_place_owned`] enqueue and track in one call.
//!
//! What they promise is on [`Completion`].
//!
//! # Files
//!
//! `state.rs` (one tracked operation and its step) ← `thread.rs` (the
//! waker thread) ← this file (`Completion`, the event and communicator
//! behind it, `Comm`'s methods).

mod state;
mod thread;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};

use crate::abort::AbortCause;
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::comm::handle::Shared;
use crate::comm::{Comm, CommStatus};
use crate::dtype::NcclType;
use crate::reduce_op::ReduceOp;
use crate::{Error, Result};

use state::{Source, Tracked};

/// The work behind a completion: an event on its stream, and the
/// communicator whose abort or error it reports. Holding the
/// communicator's state also keeps its teardown waiting until the work is
/// done.
struct OnComm {
    /// `None` only once dropped (handed back to the communicator's spares).
    event: Option<CudaEvent>,
    shared: Arc<Shared>,
    /// Seen complete: the event can serve the next future.
    reusable: AtomicBool,
}

/// At most this many spare events are kept per communicator (the most
/// completions in flight at once, up to this bound, is what is reused).
const MAX_SPARE_EVENTS: usize = 256;

impl OnComm {
    /// An event recorded behind the work on `stream`: a spare one of the
    /// communicator's when the stream is on its device, else a new one.
    fn record(shared: &Arc<Shared>, stream: &CudaStream) -> Result<Self> {
        let spare = if Arc::ptr_eq(stream.context(), &shared.ctx) {
            lock(&shared.spare_events).pop()
        } else {
            None
        };
        let event = match spare {
            Some(event) => event,
            None => stream
                .context()
                .new_event(None)
                .map_err(|source| Error::Cuda {
                    op: "cuEventCreate",
                    source,
                })?,
        };
        // A failed record drops the event (destroyed, never reused).
        event.record(stream).map_err(|source| Error::Cuda {
            op: "cuEventRecord",
            source,
        })?;
        Ok(OnComm {
            event: Some(event),
            shared: Arc::clone(shared),
            reusable: AtomicBool::new(false),
        })
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for OnComm {
    fn drop(&mut self) {
        // Only an event seen complete goes back: its next record starts
        // from a known state (re-recording one in flight is allowed by
        // CUDA, but nothing would be gained from it).
        if let Some(event) = self.event.take()
            && *self.reusable.get_mut()
            && Arc::ptr_eq(event.context(), &self.shared.ctx)
        {
            let mut spares = lock(&self.shared.spare_events);
            if spares.len() < MAX_SPARE_EVENTS {
                spares.push(event);
            }
        }
    }
}

impl Source for OnComm {
    fn is_complete(&self) -> Result<bool> {
        let Some(event) = &self.event else {
            return Ok(true);
        };
        let complete = event.try_is_complete().map_err(|source| Error::Cuda {
            op: "cuEventQuery",
            source,
        })?;
        if complete {
            self.reusable.store(true, Ordering::Relaxed);
        }
        Ok(complete)
    }

    fn failure(&self, op: &'static str, deep: bool) -> Option<Error> {
        if self.shared.abort_requested() {
            return Some(self.shared.aborted(op));
        }
        // One of our one-shot kernels ended early: its result is undefined.
        if let Some(cause) = self.shared.kernel_cause() {
            abort_elsewhere(&self.shared, cause);
            return Some(self.shared.aborted(op));
        }
        if !deep {
            return None;
        }
        // Never waits behind a call in progress on another thread, and never
        // aborts here: with a cause already set, the status query would
        // settle the abort on this (the waker) thread; NCCL's abort can
        // wait for the device.
        if self.shared.cause.get().is_some() {
            return Some(self.shared.aborted(op));
        }
        match self.shared.status_nowait()? {
            Ok(CommStatus::Failed(e)) => {
                abort_elsewhere(&self.shared, AbortCause::AsyncError(e.to_string()));
                Some(e)
            }
            Ok(_) => None,
            Err(e) => Some(e),
        }
    }

    fn timed_out(&self, op: &'static str) {
        abort_elsewhere(&self.shared, AbortCause::Timeout { op, seq: None });
    }
}

/// Asks for the communicator's abort on a thread of its own, once: NCCL's
/// abort can wait for the device (a stream held by other work), and the
/// one waker thread must go on waking the other futures meanwhile. The
/// cause is set here, before that thread starts, so the communicator's
/// other futures resolve with it at their next look; the one that asked
/// resolves with its own error at once.
fn abort_elsewhere(shared: &Arc<Shared>, cause: AbortCause) {
    // The cause first, so the other futures of the communicator resolve
    // with it and none of them starts a thread of its own (once).
    if shared.set_cause(cause).is_err() {
        return;
    }
    let on_its_own = Arc::clone(shared);
    let hold = crate::ExitHold::new(shared.timeout.saturating_add(crate::comm::ABORT_ALLOWANCE));
    let spawned = std::thread::Builder::new()
        .name("nccl-completion-abort".into())
        .spawn(move || {
            let _hold = hold;
            tracing::debug!("completion abort thread: start");
            let cause = on_its_own
                .cause
                .get()
                .cloned()
                .unwrap_or(AbortCause::Requested);
            let now = on_its_own.request_abort(cause);
            tracing::debug!(aborted_now = now, "completion abort thread: done");
        });
    if let Err(e) = spawned {
        // No thread to be had: the cause stays set, so the communicator's
        // next use (or its drop) aborts it; never on the waker thread.
        tracing::warn!("no thread for a completion future's abort ({e}); left to the next use");
    }
}

/// A future for work enqueued on a stream, owning the buffers `B` that
/// the work uses: resolves to `Ok(buffers)` once the work has finished,
/// or to the error that stopped it.
///
/// - **Executor-independent**: a std [`Future`] woken through its
///   [`Waker`](std::task::Waker) by one waker thread per process
///   (`thread.rs`), never a thread per operation.
/// - **Cancel-safe**: dropping or leaking (`mem::forget`) a `Completion`
///   never frees a buffer the GPU may still use. The waker thread keeps
///   its own reference to the buffers and lets go only after the event has
///   completed; a future dropped early leaves its buffers to be freed there.
/// - **`Send`**: a `Completion` holds no `Comm`, so it can be awaited on any
///   task of a multi-thread runtime while the `Comm` (`Send`, not `Sync`)
///   stays with whoever submits. The issue order on each rank is the order
///   of the submitting calls: to share one communicator between tasks, put
///   it behind one lock (or one submitting task) and keep the same order on
///   every rank.
/// - **Errors and deadlines**: a communicator aborted meanwhile (an
///   [`AbortHandle`](crate::AbortHandle), a watchdog, a lost peer through
///   the job's [`AbortSignal`](crate::AbortSignal)) resolves the future to
///   [`Error::Aborted`] with the cause; an asynchronous NCCL error aborts
///   the communicator and resolves to that error; past the communicator's
///   [`timeout`](Comm::timeout) the communicator is aborted and the future
///   resolves to [`Error::Timeout`]. The buffers of a failed operation are
///   freed once the device is done with them, never before.
///
/// Made by [`Comm::completion`], [`Comm::all_reduce_owned`] and
/// [`Comm::all_reduce_in_place_owned`]. `Send` when `B` is.
#[must_use = "dropping a Completion does not cancel the work; await it to get the buffers back"]
pub struct Completion<B> {
    inner: Inner<B>,
    /// Until then a pending poll asks to be polled again at once
    /// ([`Completion::spin_for`]).
    spin_until: Option<Instant>,
}

enum Inner<B> {
    Tracked(Arc<Tracked<B, OnComm>>),
    /// Failed before anything could be tracked; the buffers were leaked
    /// (the device may still use them).
    Failed(Option<Error>),
}

impl<B> std::fmt::Debug for Completion<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion").finish_non_exhaustive()
    }
}

impl<B: Send + 'static> Completion<B> {
    fn failed(error: Error) -> Self {
        Completion {
            inner: Inner::Failed(Some(error)),
            spin_until: None,
        }
    }

    /// Opt-in low latency for short operations: until `window` has passed
    /// since the operation was tracked, a poll that finds it unfinished
    /// wakes its own task, so the executor polls it again as soon as it
    /// has run its other ready tasks (a yield, as `tokio::task::yield_now`
    /// does) instead of parking until the waker thread's wake arrives.
    ///
    /// That saves the executor thread's wake-up (a few microseconds) on
    /// work that ends within the window, and costs what the executor
    /// spends polling meanwhile: keep the window near the operation's
    /// expected time (tens of microseconds for a small collective). After
    /// the window the future waits for the waker thread as usual. Without
    /// this call a pending poll never wakes itself.
    ///
    /// ```no_run
    /// # async fn demo(comm: &nccl_safe::Comm) -> nccl_safe::Result<()> {
    /// use std::time::Duration;
    /// use nccl_safe::ReduceOp;
    /// let x = comm.stream().alloc_zeros::<f32>(2).unwrap();
    /// let x = comm
    ///     .all_reduce_in_place_owned(x, ReduceOp::Sum)
    ///     .spin_for(Duration::from_micros(20))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn spin_for(mut self, window: Duration) -> Self {
        if let Inner::Tracked(tracked) = &self.inner {
            let started = tracked.started();
            // A window past what `Instant` can hold spins until the work
            // ends (its deadline resolves it at the latest).
            self.spin_until = started
                .checked_add(window)
                .or_else(|| started.checked_add(Duration::from_secs(86_400 * 365)));
        }
        self
    }

    /// Blocks this thread until the work has finished: the same answer as
    /// `.await`, for code outside an async runtime.
    ///
    /// Like a CUDA stream synchronize, it first looks at the work back to
    /// back (for 50 µs, one `cuEventQuery` a look), so a short
    /// operation is seen finished at once; after that the thread sleeps
    /// until the waker thread wakes it.
    pub fn wait(mut self) -> Result<B> {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let spin_until = Instant::now() + WAIT_SPIN;
        loop {
            match Pin::new(&mut self).poll(&mut cx) {
                Poll::Ready(result) => return result,
                Poll::Pending if Instant::now() < spin_until => std::hint::spin_loop(),
                Poll::Pending => std::thread::park(),
            }
        }
    }
}

/// How long [`Completion::wait`] looks at the work before it sleeps: the
/// span of a small collective (a few microseconds) with room to spare, and
/// short enough that a long wait costs a negligible share of one core.
const WAIT_SPIN: Duration = Duration::from_micros(50);

/// Wakes a thread blocked in [`Completion::wait`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

impl<B: Send + 'static> Future for Completion<B> {
    type Output = Result<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<B>> {
        let this = self.get_mut();
        match &mut this.inner {
            Inner::Tracked(tracked) => match tracked.poll_outcome(cx.waker()) {
                Some(result) => Poll::Ready(result),
                None => {
                    if this.spin_until.is_some_and(|until| Instant::now() < until) {
                        cx.waker().wake_by_ref();
                    }
                    Poll::Pending
                }
            },
            Inner::Failed(error) => {
                Poll::Ready(Err(error.take().unwrap_or(Error::InvalidArgument {
                    op: "Completion",
                    reason: "the completion was polled after it finished",
                })))
            }
        }
    }
}

impl Comm {
    /// A [`Completion`] for everything enqueued so far on `stream` (one
    /// operation, a group, anything), owning `buffers` until that work has
    /// finished: pass the buffers the work uses (or `()`), and get them
    /// back from the future. Aborts, asynchronous errors and this
    /// communicator's timeout resolve it as [`Completion`] says.
    ///
    /// ```no_run
    /// # async fn demo(comm: &nccl_safe::Comm) -> nccl_safe::Result<()> {
    /// use nccl_safe::{ReduceOp, group};
    /// let mut grads = comm.stream().alloc_zeros::<f32>(1024).unwrap();
    /// group(|g| g.on(comm).all_reduce_in_place(&mut grads, ReduceOp::Sum))?;
    /// let grads = comm.completion(comm.stream(), grads).await?;
    /// # Ok(()) }
    /// ```
    pub fn completion<B: Send + 'static>(&self, stream: &CudaStream, buffers: B) -> Completion<B> {
        self.track("completion", stream, buffers, None)
    }

    /// `ncclAllReduce` ([`OnStream::all_reduce`](crate::OnStream::all_reduce))
    /// on this communicator's stream, owning its buffers: the future hands
    /// them back when the reduction has finished. A refused or failed
    /// enqueue resolves to its error.
    pub fn all_reduce_owned<T, S, R>(
        &self,
        send: S,
        mut recv: R,
        op: ReduceOp,
    ) -> Completion<(S, R)>
    where
        T: NcclType,
        S: DeviceBuffer<T> + Send + 'static,
        R: DeviceBufferMut<T> + Send + 'static,
    {
        let enqueued = self.all_reduce(&send, &mut recv, op);
        self.track("ncclAllReduce", self.stream(), (send, recv), enqueued.err())
    }

    /// In-place `ncclAllReduce` on `buf`, owning it: see
    /// [`Comm::all_reduce_owned`].
    pub fn all_reduce_in_place_owned<T, B>(&self, mut buf: B, op: ReduceOp) -> Completion<B>
    where
        T: NcclType,
        B: DeviceBufferMut<T> + Send + 'static,
    {
        let enqueued = self.all_reduce_in_place(&mut buf, op);
        self.track("ncclAllReduce", self.stream(), buf, enqueued.err())
    }

    /// Tracks `buffers` behind the work on `stream`; resolved at once with
    /// `error` when given (the buffers are still kept until the work on the
    /// stream is done: a failed enqueue may have launched part of it).
    fn track<B: Send + 'static>(
        &self,
        op: &'static str,
        stream: &CudaStream,
        buffers: B,
        error: Option<Error>,
    ) -> Completion<B> {
        if matches!(error, Some(Error::Timeout { .. })) {
            // A nonblocking enqueue that timed out may still launch after
            // any event recorded now: nothing tells when the device is
            // done with the buffers, so they are never freed.
            std::mem::forget(buffers);
            return Completion::failed(error.unwrap_or(Error::Finalized { op }));
        }
        let source = match OnComm::record(self.shared(), stream) {
            Ok(source) => source,
            Err(e) => {
                // Nothing tells when the device is done with them.
                std::mem::forget(buffers);
                return Completion::failed(error.unwrap_or(e));
            }
        };
        let tracked = Arc::new(Tracked::new(op, source, buffers, self.timeout(), error));
        if !thread::register(Arc::clone(&tracked) as Arc<dyn state::Entry>) {
            std::mem::forget(tracked);
            return Completion::failed(Error::Unsupported {
                what: "completion futures",
                requires: "a waker thread".to_string(),
                found: "the thread could not be started".to_string(),
            });
        }
        Completion {
            inner: Inner::Tracked(tracked),
            spin_until: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A completion of device buffers can be spawned on a multi-thread
    /// runtime, although `Comm` is not `Sync`.
    #[test]
    fn a_completion_of_device_buffers_is_send_and_static() {
        fn spawnable<F: Future + Send + 'static>(_: &F) {}
        let done = Completion::<(cudarc::driver::CudaSlice<f32>, ())>::failed(Error::Finalized {
            op: "test",
        });
        spawnable(&done);
        assert!(matches!(done.wait(), Err(Error::Finalized { op: "test" })));
    }
}
