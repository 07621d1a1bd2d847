//! One thread capturing one NCCL group over several GPUs into one CUDA
//! graph ([`capture_group`]).
//!
//! One thread driving several GPUs puts a step's calls in one NCCL group
//! (`ncclGroupStart`, a call per communicator, `ncclGroupEnd`). Captured
//! per GPU, that opens one capture sequence per stream on the thread at
//! once: a graph instantiated while the thread still has another
//! thread-local capture open is an unsafe call that CUDA refuses
//! (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`; cudarc's `end_capture` ends and
//! instantiates in one call), and NCCL's guide warns that graphs launched
//! one GPU after another from one thread may deadlock (a launch may block
//! before the others are made). Here there is one capture sequence: it
//! begins on the first GPU's stream, every other GPU's stream joins it
//! through an event (fork), the group is issued and ended, each stream is
//! joined back (join) and the capture ends once. One graph with nodes on
//! every GPU, and one launch that starts all of them.
//! `docs/research/one-thread-graph-capture.md` gives the NCCL and CUDA
//! facts this rests on.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys::CUgraphInstantiate_flags;
use cudarc::driver::{CudaEvent, CudaGraph, CudaStream, DriverError};

use super::{
    Captured, Opened, abort_unlaunched, give_back, longest_timeout, open_owned, settle_launches,
};
use crate::capture_state::{is_capturing, refuse_capture, spoil};
use crate::comm::{AbortHandle, Comm};
use crate::error::Role;
use crate::group::{self, GroupGuard};
use crate::ops::OnStream;
use crate::{Error, Result};

/// One communicator of a captured group, with the stream its work is
/// ordered with (its home) and the capture's stream on its GPU.
struct Lane {
    home: Arc<CudaStream>,
    /// Forked from `home`; nobody else can name it. The first lane's is
    /// where the capture begins and every launch goes.
    private: Arc<CudaStream>,
    /// The extents of the lane's buffers at the capture.
    extents: Vec<(u64, u64)>,
}

/// What is checked of each lane before a capture begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LaneFacts {
    /// The communicator, by address.
    comm: usize,
    comm_device: usize,
    stream_device: usize,
    /// Whether the stream is being captured already.
    stream_capturing: bool,
}

/// Refuses, before anything is forked or captured, a set of lanes that
/// cannot make one captured group: none, a buffer set per lane missing or
/// extra, a communicator given twice (its calls could not be told apart),
/// a stream on another GPU than its communicator (NCCL would launch there
/// a kernel of the communicator's GPU), or a stream that is captured
/// already (forking from it would merge two captures, which CUDA
/// refuses).
fn check_lanes(op: &'static str, lanes: &[LaneFacts], buffer_sets: usize) -> Result<()> {
    if lanes.is_empty() {
        return Err(Error::InvalidArgument {
            op,
            reason: "no communicator to capture",
        });
    }
    if buffer_sets != lanes.len() {
        return Err(Error::InvalidArgument {
            op,
            reason: "one set of buffers per communicator, in the communicators' order",
        });
    }
    for (i, lane) in lanes.iter().enumerate() {
        if lanes[..i].iter().any(|l| l.comm == lane.comm) {
            return Err(Error::InvalidArgument {
                op,
                reason: "a communicator is given twice",
            });
        }
        if lane.stream_device != lane.comm_device {
            return Err(Error::WrongDevice {
                op,
                role: Role::Stream,
                expected: lane.comm_device,
                found: lane.stream_device,
            });
        }
        if lane.stream_capturing {
            return Err(Error::InvalidArgument {
                op,
                reason: "a stream is being captured already: a captured group begins a capture of its own",
            });
        }
    }
    Ok(())
}

/// The capture sequence of a group: begun on the first stream, joined by
/// the others. Whatever happens, it is ended once, after every joined
/// stream was joined back, so no stream is left capturing.
struct Fork<'a> {
    streams: &'a [Arc<CudaStream>],
    /// The lanes' communicators: aborted when the capture is dropped
    /// unlaunched after NCCL recorded work ([`super::discard`]).
    comms: &'a [(AbortHandle, Duration)],
    /// How many streams after the first joined the capture.
    joined: usize,
    open: bool,
}

impl<'a> Fork<'a> {
    /// Begins the capture on `streams[0]` and forks the others into it.
    fn begin(
        streams: &'a [Arc<CudaStream>],
        comms: &'a [(AbortHandle, Duration)],
    ) -> std::result::Result<Fork<'a>, DriverError> {
        let (origin, others) = streams
            .split_first()
            .expect("check_lanes: at least one lane");
        // Relaxed (see `CAPTURE_MODE`): the calls of other threads (a
        // watchdog's event queries) neither join nor invalidate this
        // capture, and NCCL's lazy connection may enable peer access.
        origin.begin_capture(super::CAPTURE_MODE)?;
        let mut fork = Fork {
            streams,
            comms,
            joined: 0,
            open: true,
        };
        for stream in others {
            // An event recorded into the capture and waited for on another
            // stream brings that stream into the same capture.
            stream.join(origin)?;
            fork.joined += 1;
        }
        Ok(fork)
    }

    /// Joins every forked stream back and ends the capture: the graph, if
    /// anything was captured. Streams still capturing after that (an end
    /// that failed) are stopped.
    fn close(&mut self) -> std::result::Result<Option<CudaGraph>, DriverError> {
        self.open = false;
        let origin = &self.streams[0];
        let mut joined = Ok(());
        for stream in &self.streams[1..=self.joined] {
            if let Err(e) = origin.join(stream)
                && joined.is_ok()
            {
                joined = Err(e);
            }
        }
        let ended = origin.end_capture(CUgraphInstantiate_flags(0));
        for stream in self.streams {
            if is_capturing(stream) {
                spoil(stream);
            }
        }
        let graph = ended?;
        joined?;
        Ok(graph)
    }
}

impl Drop for Fork<'_> {
    fn drop(&mut self) {
        if self.open {
            // An early return or a panic: the graph, if any, is destroyed
            // unlaunched, and with it the communicators NCCL recorded work
            // for.
            let ended = self.close();
            super::discard(ended, self.comms);
        }
    }
}

/// One lane as the closure given to [`capture_group`] sees it.
struct LaneRef<'x> {
    comm: &'x Comm,
    home: &'x CudaStream,
    private: &'x CudaStream,
    extents: &'x [(u64, u64)],
}

/// What the closure given to [`capture_group`] issues its calls through:
/// one NCCL group, open until the closure returns, whose calls are
/// captured on the GPU of their communicator.
pub struct CapturingGroup<'x> {
    lanes: &'x [LaneRef<'x>],
    group: GroupGuard<'x>,
}

impl std::fmt::Debug for CapturingGroup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturingGroup")
            .field("communicators", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

impl<'x> CapturingGroup<'x> {
    /// Calls on `comm`, one of the communicators given to
    /// [`capture_group`] (any other is refused: NCCL refuses a group whose
    /// communicators are not all captured, and leaves them unusable). They
    /// may use only the buffers of that communicator's set and built-in
    /// reductions.
    pub fn on<'s>(&'s self, comm: &Comm) -> Result<OnStream<'s, 'x>> {
        let lane = self
            .lanes
            .iter()
            .find(|l| std::ptr::eq(l.comm, comm))
            .ok_or(Error::InvalidArgument {
                op: "CapturingGroup::on",
                reason: "the communicator is not one of those given to capture_group",
            })?;
        Ok(OnStream::capturing_grouped(
            lane.comm,
            lane.private,
            lane.home,
            lane.extents,
            self.group.held(),
        ))
    }
}

/// A CUDA graph of one NCCL group over several GPUs ([`capture_group`]):
/// it owns a set of buffers per communicator and borrows the
/// communicators. One launch runs the group on every GPU. Dropping it
/// waits for its launches (at most the communicators' timeout, then
/// aborts them); memory a launch may still use is leaked rather than
/// freed.
pub struct CapturedGroup<'c, B: Captured> {
    graph: Option<CudaGraph>,
    lanes: Vec<Lane>,
    buffers: Option<Vec<B>>,
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

impl<B: Captured> std::fmt::Debug for CapturedGroup<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedGroup")
            .field("communicators", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

/// Captures one NCCL group over the communicators of `lanes`, each with
/// the stream its work is ordered with, into one graph that owns
/// `buffers` (a set per communicator, on its GPU, in the same order).
/// `f` issues the group's calls through its [`CapturingGroup`]; the group
/// ends when `f` returns. Nothing runs now: each
/// [`CapturedGroup::launch`] runs the whole group on every GPU.
///
/// Refused before the capture begins, with nothing forked or captured: no
/// communicator, a buffer set missing or extra, a communicator given
/// twice, a stream on another GPU than its communicator
/// ([`Error::WrongDevice`]), a stream captured already, a group open on
/// this thread (only the outermost group's end launches, so the calls
/// would not be captured). Refused with the capture ended and nothing
/// launched: a call on a communicator not in `lanes`, on memory outside
/// its buffer set, with a PreMulSum, a buffer replaced inside `f`, and
/// whatever `f` or the group's end returns as an error.
///
/// The capture runs on streams of its own, forked from each lane's
/// stream; a launch runs after the work queued on every lane's stream
/// before it, and before the work queued on them after it.
///
/// ```no_run
/// # fn demo(comms: &[nccl_safe::Comm]) -> Result<(), Box<dyn std::error::Error>> {
/// use nccl_safe::{ReduceOp, capture_group};
/// let lanes: Vec<_> = comms.iter().map(|c| (c, c.stream())).collect();
/// let buffers = comms
///     .iter()
///     .map(|c| Ok((c.stream().clone_htod(&[1.0f32; 1024])?, c.stream().alloc_zeros::<f32>(1024)?)))
///     .collect::<Result<Vec<_>, nccl_safe::cudarc::driver::DriverError>>()?;
/// let mut graph = capture_group(&lanes, buffers, |cap, buffers| {
///     for (comm, (send, recv)) in comms.iter().zip(buffers) {
///         cap.on(comm)?.all_reduce(send, recv, ReduceOp::Sum)?;
///     }
///     Ok(())
/// })?;
/// graph.launch()?;
/// let buffers = graph.into_buffers()?;
/// assert_eq!(comms[0].stream().clone_dtoh(&buffers[0].1)?[0], comms.len() as f32);
/// # Ok(()) }
/// ```
///
/// As with [`crate::capture`], a capture that fails and a graph dropped
/// or given back before its first launch abort every communicator of the
/// group (NCCL may have made connections inside the capture that only a
/// launch completes).
pub fn capture_group<'c, B: Captured>(
    lanes: &[(&'c Comm, &Arc<CudaStream>)],
    mut buffers: Vec<B>,
    f: impl for<'x> FnOnce(&CapturingGroup<'x>, &'x mut [B]) -> Result<()>,
) -> Result<CapturedGroup<'c, B>> {
    const OP: &str = "capture_group";
    let cuda = |source| Error::Cuda { op: OP, source };
    // Counted until the graph is gone, as in `capture`.
    let alive = crate::capture_state::GraphAlive::new();
    let facts: Vec<LaneFacts> = lanes
        .iter()
        .map(|(comm, stream)| LaneFacts {
            comm: std::ptr::from_ref::<Comm>(comm) as usize,
            comm_device: comm.device(),
            stream_device: stream.context().ordinal(),
            stream_capturing: is_capturing(stream),
        })
        .collect();
    check_lanes(OP, &facts, buffers.len())?;
    if group::is_open() {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: "a group is open on this thread: only the outermost group's end launches, so a captured group must not be nested",
        });
    }
    // Streams of our own (after each lane's work so far), which the
    // closure cannot name.
    let privates = lanes
        .iter()
        .map(|(_, stream)| stream.fork())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(cuda)?;
    let extents: Vec<Vec<(u64, u64)>> = buffers
        .iter_mut()
        .zip(&privates)
        .map(|(b, private)| {
            let mut opened = Opened::new();
            b.open(private, &mut opened);
            opened.extents()
        })
        .collect();
    let comms: Vec<(AbortHandle, Duration)> = lanes
        .iter()
        .map(|(comm, _)| (comm.abort_handle(), comm.timeout()))
        .collect();
    let mut fork = Fork::begin(&privates, &comms).map_err(cuda)?;
    let issued = {
        let views: Vec<LaneRef<'_>> = lanes
            .iter()
            .zip(&privates)
            .zip(&extents)
            .map(|(((comm, home), private), extents)| LaneRef {
                comm,
                home,
                private,
                extents,
            })
            .collect();
        // Fails only where the library does (an open group was looked for
        // above); the capture is then ended by `fork`'s drop.
        let group = GroupGuard::start()?;
        let cap = CapturingGroup {
            lanes: &views,
            group,
        };
        let issued = f(&cap, &mut buffers);
        // NCCL enqueues the group's calls at its end, into the capture;
        // `f`'s error wins over the end's.
        let CapturingGroup { group, .. } = cap;
        let ended = group.end();
        issued.and(ended)
    };
    // Always closed, so no capture outlives this call.
    let closed = fork.close();
    drop(fork);
    let graph = match (issued, closed) {
        (Ok(()), Ok(graph)) => graph,
        (issued, closed) => {
            let failed = closed.as_ref().err().cloned();
            super::discard(closed, &comms);
            issued?;
            return Err(cuda(failed.expect("one of the two failed")));
        }
    };
    let recorded = graph.as_ref().is_some_and(super::recorded_work);
    let lanes = lanes
        .iter()
        .zip(privates)
        .zip(extents)
        .map(|(((_, home), private), extents)| Lane {
            home: Arc::clone(home),
            private,
            extents,
        })
        .collect();
    let mut graph = CapturedGroup {
        graph,
        lanes,
        buffers: Some(buffers),
        comms,
        launched: false,
        recorded,
        _alive: alive,
        _comms: PhantomData,
    };
    // `f` had the buffers mutably: one it replaced was captured at an
    // address the graph no longer owns.
    graph.open_all(OP).map(drop)?;
    Ok(graph)
}

impl<'c, B: Captured> CapturedGroup<'c, B> {
    /// Every lane's buffers opened on its private stream, refused when
    /// they were given back or one was replaced since the capture.
    fn open_all(&mut self, op: &'static str) -> Result<Vec<Opened<'_>>> {
        let Some(buffers) = self.buffers.as_mut() else {
            return Err(Error::InvalidArgument {
                op,
                reason: "the graph gave its buffers back",
            });
        };
        buffers
            .iter_mut()
            .zip(&self.lanes)
            .map(|(b, lane)| open_owned(Some(b), &lane.private, &lane.extents, op))
            .collect()
    }

    /// Runs the captured group once more on every GPU, ordered after the
    /// work queued on each lane's stream (and on the buffers, through
    /// their accesses), and before the work queued on them afterwards.
    /// Refused when one of those streams is being captured, a buffer was
    /// replaced, or a communicator aborted.
    pub fn launch(&mut self) -> Result<()> {
        const OP: &str = "CapturedGroup::launch";
        let cuda = |source| Error::Cuda { op: OP, source };
        for lane in &self.lanes {
            refuse_capture(OP, &lane.home)?;
        }
        if self.comms.iter().any(|(h, _)| h.is_aborted()) {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "a communicator of the graph was aborted",
            });
        }
        if self.graph.is_none() {
            // Nothing was captured: nothing to run.
            return Ok(());
        }
        for lane in &self.lanes {
            lane.private.join(&lane.home).map_err(cuda)?;
        }
        // A capture begun on a lane's stream by another thread since the
        // check above would have pulled our stream in with the join: stop
        // it rather than let it record the launch.
        if self.lanes.iter().any(|l| is_capturing(&l.private)) {
            for lane in &self.lanes {
                if is_capturing(&lane.private) {
                    spoil(&lane.private);
                }
            }
            return Err(Error::Capturing { op: OP });
        }
        let ordered = {
            let Self {
                graph,
                lanes,
                buffers,
                ..
            } = self;
            let Some(graph) = graph.as_ref() else {
                return Ok(());
            };
            let Some(buffers) = buffers.as_mut() else {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "the graph gave its buffers back",
                });
            };
            // Each lane's buffers wait on its own GPU's stream (their
            // events live there), then the launch stream waits for all.
            let opened = buffers
                .iter_mut()
                .zip(lanes.iter())
                .map(|(b, lane)| open_owned(Some(b), &lane.private, &lane.extents, OP))
                .collect::<Result<Vec<_>>>()?;
            let (first, others) = lanes
                .split_first()
                .expect("capture_group refuses a group of no lane");
            for lane in others {
                first.private.join(&lane.private).map_err(cuda)?;
            }
            graph.launch().map_err(cuda)?;
            self.launched = true;
            // Every lane's stream after the launch, so that the accesses
            // record it for each buffer as they go and the home streams
            // can follow.
            let mut ordered = others
                .iter()
                .all(|l| l.private.join(&first.private).is_ok());
            drop(opened);
            for lane in lanes.iter() {
                ordered &= lane.home.join(&lane.private).is_ok();
            }
            ordered
        };
        if !ordered && !self.settle() {
            // Cannot order the callers' streams after the launch: it was
            // waited for instead (bounded), so later work sees its
            // results; it did not finish in time.
            return Err(Error::Timeout {
                op: OP,
                waited: longest_timeout(&self.comms),
            });
        }
        Ok(())
    }

    /// The buffer sets, between launches, in the communicators' order:
    /// work queued on them through the safe API (or cudarc with event
    /// tracking on) is ordered with the launches; a buffer replaced here
    /// makes the next launch refuse.
    pub fn buffers(&mut self) -> Option<&mut [B]> {
        self.buffers.as_deref_mut()
    }

    /// Waits for the launches (at most the communicators' timeout) and
    /// hands the buffer sets back.
    pub fn into_buffers(mut self) -> Result<Vec<B>> {
        let settled = self.settle();
        give_back(
            settled,
            &mut self.buffers,
            &self.comms,
            "CapturedGroup::into_buffers",
        )
    }

    /// Waits for the work queued on every lane's private stream (see
    /// [`settle_launches`]). Whether it finished.
    fn settle(&mut self) -> bool {
        let Ok(events) = self
            .lanes
            .iter()
            .map(|l| l.private.record_event(None))
            .collect::<std::result::Result<Vec<CudaEvent>, _>>()
        else {
            return false;
        };
        settle_launches(&mut self.graph, &self.comms, &events, "CapturedGroup")
    }
}

impl<B: Captured> Drop for CapturedGroup<'_, B> {
    fn drop(&mut self) {
        if !self.launched && self.recorded {
            // The graph goes first: NCCL's abort waits for it.
            drop(self.graph.take());
            abort_unlaunched(&self.comms);
        }
        // Still running at the end of the wait: the buffers are leaked.
        if self.buffers.is_some() && !self.settle() {
            tracing::warn!("a captured group's launches did not finish: its buffers are leaked");
            std::mem::forget(self.buffers.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OP: &str = "capture_group";

    fn lane(comm: usize, device: usize) -> LaneFacts {
        LaneFacts {
            comm,
            comm_device: device,
            stream_device: device,
            stream_capturing: false,
        }
    }

    fn reason(r: Result<()>) -> &'static str {
        match r {
            Err(Error::InvalidArgument { reason, .. }) => reason,
            other => panic!("not an invalid argument: {other:?}"),
        }
    }

    #[test]
    fn one_lane_per_gpu_with_a_buffer_set_each_is_accepted() {
        let lanes = [lane(0x10, 0), lane(0x20, 1), lane(0x30, 2), lane(0x40, 3)];
        check_lanes(OP, &lanes, 4).unwrap();
        check_lanes(OP, &lanes[..1], 1).unwrap();
    }

    #[test]
    fn two_communicators_on_one_gpu_are_accepted() {
        // NCCL runs a group of several communicators of one GPU (splits
        // of one another, say); each gets a capture stream of its own.
        check_lanes(OP, &[lane(0x10, 0), lane(0x20, 0)], 2).unwrap();
    }

    #[test]
    fn no_lane_is_refused() {
        assert_eq!(
            reason(check_lanes(OP, &[], 0)),
            "no communicator to capture"
        );
    }

    #[test]
    fn a_buffer_set_missing_or_extra_is_refused() {
        let lanes = [lane(0x10, 0), lane(0x20, 1)];
        for sets in [0, 1, 3] {
            assert!(reason(check_lanes(OP, &lanes, sets)).starts_with("one set of buffers"));
        }
    }

    #[test]
    fn a_communicator_given_twice_is_refused() {
        let lanes = [lane(0x10, 0), lane(0x20, 1), lane(0x10, 0)];
        assert_eq!(
            reason(check_lanes(OP, &lanes, 3)),
            "a communicator is given twice"
        );
    }

    #[test]
    fn a_stream_on_another_gpu_is_refused_with_both_devices() {
        let mut lanes = [lane(0x10, 0), lane(0x20, 1)];
        lanes[1].stream_device = 0;
        match check_lanes(OP, &lanes, 2) {
            Err(Error::WrongDevice {
                role: Role::Stream,
                expected: 1,
                found: 0,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_stream_captured_already_is_refused() {
        let mut lanes = [lane(0x10, 0), lane(0x20, 1)];
        lanes[1].stream_capturing = true;
        assert!(reason(check_lanes(OP, &lanes, 2)).starts_with("a stream is being captured"));
    }
}
