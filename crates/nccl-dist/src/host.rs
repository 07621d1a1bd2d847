//! For code that holds host data or must order communication against its
//! own compute: host-slice collectives and a communication stream with
//! events. (The barrier is [`crate::Communicator::barrier`].)
//!
//! Every wait here is [`Comm::synchronize`]: bounded by the communicator's
//! timeout, and a wait that runs out aborts the communicator instead of
//! hanging.

use std::sync::Arc;

use nccl_safe::cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use nccl_safe::{Comm, NcclType, ReduceOp};

use crate::error::{Result, cuda};

/// Collectives on host slices: copy in, run on the communicator's stream,
/// wait (with the communicator's deadline), copy out.
///
/// They are blocking calls on one communicator, for a thread (or process)
/// per rank. With one thread driving several ranks, use the device
/// collectives inside a group instead.
///
/// ```no_run
/// use nccl_dist::{Communicator, HostCollectives, World};
/// use nccl_dist::nccl_safe::ReduceOp;
///
/// let world = World::init()?;
/// let mut loss = [0.25f32];
/// world.comm().all_reduce_host(&mut loss, ReduceOp::Avg)?;
/// Communicator::barrier(world.comm())?;
/// # Ok::<(), nccl_dist::Error>(())
/// ```
pub trait HostCollectives {
    /// Every rank's `data` becomes the reduction of all ranks' `data`.
    fn all_reduce_host<T: NcclType>(&self, data: &mut [T], op: ReduceOp) -> Result<()>;

    /// Every rank's `data` becomes `root`'s.
    fn broadcast_host<T: NcclType>(&self, data: &mut [T], root: usize) -> Result<()>;

    /// Every rank's `send`, concatenated in rank order (all ranks pass the
    /// same length).
    fn all_gather_host<T: NcclType>(&self, send: &[T]) -> Result<Vec<T>>;
}

impl HostCollectives for Comm {
    fn all_reduce_host<T: NcclType>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        round_trip(self, "all_reduce_host", data, |buf| {
            self.all_reduce_in_place(buf, op)
        })
    }

    fn broadcast_host<T: NcclType>(&self, data: &mut [T], root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(nccl_safe::Error::RankOutOfRange {
                op: "broadcast_host",
                what: "root",
                rank: root,
                size: self.size(),
            }
            .into());
        }
        round_trip(self, "broadcast_host", data, |buf| {
            self.broadcast_in_place(buf, root)
        })
    }

    fn all_gather_host<T: NcclType>(&self, send: &[T]) -> Result<Vec<T>> {
        let total =
            send.len()
                .checked_mul(self.size())
                .ok_or_else(|| nccl_safe::Error::Overflow {
                    op: "all_gather_host",
                    count: send.len(),
                    factor: self.size(),
                })?;
        if total == 0 {
            return Ok(Vec::new());
        }
        let stream = self.stream();
        let dev_send = stream.clone_htod(send).map_err(cuda("all_gather_host"))?;
        // SAFETY: every element is written by the all-gather before it is
        // read back.
        let mut dev_recv = unsafe { stream.alloc::<T>(total) }.map_err(cuda("all_gather_host"))?;
        self.all_gather(&dev_send, &mut dev_recv)?;
        crate::watchdog::synchronize(self, stream)?;
        let out = stream
            .clone_dtoh(&dev_recv)
            .map_err(cuda("all_gather_host"))?;
        stream.synchronize().map_err(cuda("all_gather_host"))?;
        Ok(out)
    }
}

/// Copies `data` to `comm`'s device, runs `collective` on it in place,
/// waits with the communicator's deadline and copies the result back. An
/// empty slice makes no call.
fn round_trip<T: NcclType>(
    comm: &Comm,
    op: &'static str,
    data: &mut [T],
    collective: impl FnOnce(&mut CudaSlice<T>) -> nccl_safe::Result<()>,
) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let stream = comm.stream();
    let mut buf = stream.clone_htod(data).map_err(cuda(op))?;
    collective(&mut buf)?;
    crate::watchdog::synchronize(comm, stream)?;
    stream.memcpy_dtoh(&buf, data).map_err(cuda(op))?;
    stream.synchronize().map_err(cuda(op))?;
    Ok(())
}

/// A one-element all-reduce, waited for with the communicator's deadline.
pub(crate) fn barrier(comm: &Comm) -> Result<()> {
    let stream = comm.stream();
    let mut token = stream.alloc_zeros::<i32>(1).map_err(cuda("barrier"))?;
    comm.all_reduce_in_place(&mut token, ReduceOp::Sum)?;
    crate::watchdog::synchronize(comm, stream)?;
    Ok(())
}

/// A stream for communication beside the compute stream, so collectives
/// overlap with compute; events order the two where they must meet.
///
/// ```no_run
/// use nccl_dist::{CommStream, World};
/// use nccl_dist::nccl_safe::ReduceOp;
///
/// let world = World::init()?;
/// let comm = world.comm();
/// let compute = comm.stream().context().new_stream()?;
/// let mut grads = compute.alloc_zeros::<f32>(1 << 20)?;
/// // ... backward pass on `compute` writes `grads` ...
/// let comms = CommStream::new(comm)?;
/// comms.wait_for(&compute)?; // start once the gradients are written
/// comm.on(comms.stream()).all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
/// let reduced = comms.record()?;
/// // ... more compute on `compute`, overlapping the all-reduce ...
/// reduced.block(&compute)?; // the optimizer step waits for the reduction
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CommStream {
    stream: Arc<CudaStream>,
}

impl CommStream {
    /// A new stream on `comm`'s device.
    pub fn new(comm: &Comm) -> Result<CommStream> {
        let stream = comm
            .stream()
            .context()
            .new_stream()
            .map_err(cuda("CommStream::new"))?;
        Ok(CommStream { stream })
    }

    /// The stream, for `comm.on(stream)`.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Work queued on this stream from now on starts after the work queued
    /// on `other` so far.
    pub fn wait_for(&self, other: &CudaStream) -> Result<()> {
        self.stream
            .join(other)
            .map_err(cuda("CommStream::wait_for"))
    }

    /// An event that completes with the communication queued so far.
    pub fn record(&self) -> Result<CommEvent> {
        let event = self
            .stream
            .record_event(None)
            .map_err(cuda("CommStream::record"))?;
        Ok(CommEvent { event })
    }
}

/// The completion of communication queued on a [`CommStream`].
#[derive(Debug)]
pub struct CommEvent {
    event: CudaEvent,
}

impl CommEvent {
    /// Work queued on `stream` from now on starts after the event.
    pub fn block(&self, stream: &CudaStream) -> Result<()> {
        stream.wait(&self.event).map_err(cuda("CommEvent::block"))
    }

    /// Whether the communication has finished (never waits).
    pub fn is_done(&self) -> Result<bool> {
        self.event
            .try_is_complete()
            .map_err(cuda("CommEvent::is_done"))
    }
}
