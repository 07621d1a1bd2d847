//! A hook that sees every operation a communicator puts on a stream, for
//! watchdogs and flight recorders (`nccl-dist` has one).
//!
//! With no observer set (the default) the hot path pays one branch on a
//! `Cell`. With one set, [`OpObserver::issued`] runs once per NCCL call,
//! after NCCL accepted it: at once outside a group, and at the outermost
//! `ncclGroupEnd` for calls made inside a group, because only then is the
//! work on the stream. Calls refused by validation, or by NCCL, are not
//! reported, and neither are the calls of a group that failed or was only
//! simulated.
//!
//! An observer may also check a call before it launches
//! ([`OpObserver::before`], asked for with [`OpObserver::checks_before`]):
//! it runs after validation and before the NCCL call, only for calls made
//! outside a group and outside a stream capture, and its refusal comes back
//! as [`crate::Error::CheckFailed`] with nothing launched. Inside a group
//! one thread may drive several ranks' communicators, so a check that
//! waits for the other ranks would deadlock there; calls inside a group or
//! a capture are not checked. Without an observer that asks for it, the
//! hot path pays one branch on a `Cell`.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nccl_sys::{cudaStream_t, ncclDataType_t, ncclRedOp_t};

/// One operation as NCCL received it: the NCCL function, its element count
/// and type, its reduction and the peer or root it names (if any). Only
/// this crate makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpInfo {
    /// The NCCL function, such as `"ncclAllReduce"`.
    pub op: &'static str,
    /// Elements per rank as NCCL was told (`count` / `sendcount`).
    pub count: usize,
    /// The element type.
    pub dtype: ncclDataType_t,
    /// The peer (send/recv) or root (broadcast, reduce, gather, scatter).
    pub peer: Option<usize>,
    /// The reduction (all-reduce, reduce, reduce-scatter); `None` for the
    /// others. A PreMulSum is a handle of its communicator (a value from
    /// [`ncclRedOp_t::ncclNumOps`] on), whose number may differ between
    /// ranks for the same reduction.
    pub redop: Option<ncclRedOp_t>,
}

impl OpInfo {
    pub(crate) fn new(op: &'static str, count: usize, dtype: ncclDataType_t) -> OpInfo {
        OpInfo {
            op,
            count,
            dtype,
            peer: None,
            redop: None,
        }
    }

    pub(crate) fn peer(mut self, peer: usize) -> OpInfo {
        self.peer = Some(peer);
        self
    }

    pub(crate) fn redop(mut self, redop: ncclRedOp_t) -> OpInfo {
        self.redop = Some(redop);
        self
    }
}

/// Why an observer refused a call before its launch
/// ([`OpObserver::before`]): the observer's own error, which the caller
/// gets back inside [`crate::Error::CheckFailed`] and can downcast.
pub type CheckError = Box<dyn std::error::Error + Send + Sync>;

/// The CUDA stream an observed operation was put on: a stream that is
/// live (not destroyed) for the duration of the [`OpObserver::issued`]
/// call it is given to.
///
/// Only this crate makes one, from a borrowed `CudaStream`, and the
/// lifetime `'s` keeps it from outliving that borrow: an observer cannot
/// be handed a forged or dangling handle. [`ObservedStream::as_raw`] gives
/// the handle to the observer's own `unsafe` code (to record an event
/// behind the operation, say), which may rely on it being live until
/// `issued` returns and on nothing after that. Compared by the handle:
/// two values are equal when they name the same stream.
///
/// A newtype over the raw handle: making one costs nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObservedStream<'s> {
    raw: cudaStream_t,
    _stream: PhantomData<&'s CudaStream>,
}

impl<'s> ObservedStream<'s> {
    /// The stream `stream`, live while the borrow lasts.
    pub(crate) fn new(stream: &'s CudaStream) -> ObservedStream<'s> {
        ObservedStream {
            raw: stream.cu_stream() as cudaStream_t,
            _stream: PhantomData,
        }
    }

    /// The raw handle. It names a live stream until the `issued` call that
    /// received `self` returns; after that it is only an identifier (CUDA
    /// may give the same handle to a stream created later).
    pub fn as_raw(&self) -> cudaStream_t {
        self.raw
    }
}

impl std::fmt::Debug for ObservedStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ObservedStream").field(&self.raw).finish()
    }
}

/// Sees the operations of the communicators it is set on
/// ([`crate::Comm::set_observer`]).
///
/// `issued` runs on the thread that issued the work, with the
/// communicator's CUDA context current, so it can record a CUDA event on
/// `stream` behind the operation. It must be quick and must not call back
/// into the communicator.
pub trait OpObserver: Send + Sync {
    /// NCCL has put `info` on `stream`, which is live until this returns.
    fn issued(&self, info: &OpInfo, stream: ObservedStream<'_>);

    /// Whether [`OpObserver::before`] does anything: read once, when the
    /// observer is set ([`crate::Comm::set_observer`]), so an observer
    /// that checks nothing costs the hot path one branch. `false` by
    /// default.
    fn checks_before(&self) -> bool {
        false
    }

    /// A call is about to launch: `Err` refuses it, and the caller gets
    /// [`crate::Error::CheckFailed`] with nothing launched (the
    /// communicator stays usable). Runs on the issuing thread, after
    /// validation, only when [`OpObserver::checks_before`] said so and the
    /// call is made outside a group and outside a stream capture (a group
    /// may drive several ranks from one thread: a check that waits for
    /// the other ranks would deadlock there). It may block (for the other
    /// ranks, say) but must be bounded, and must not call back into the
    /// communicator. `Ok` by default.
    fn before(&self, info: &OpInfo) -> Result<(), CheckError> {
        let _ = info;
        Ok(())
    }

    /// Whether [`OpObserver::gate`] does anything: read once, when the
    /// observer is set, like [`OpObserver::checks_before`]. `false` by
    /// default.
    fn gates(&self) -> bool {
        false
    }

    /// Calls are about to go to NCCL that may make a connection inside
    /// it, where a peer that never makes its side of the call leaves this
    /// thread waiting in NCCL, out of any abort's reach. Its `&[usize]`
    /// holds every rank, this one included, for the first use of a call
    /// every rank makes (the first collective, all-to-all or
    /// all-to-all-v, gather or scatter of a root); else the peers of the
    /// point-to-point directions it connects that were not met yet (a
    /// send's, a receive's, a later all-to-all-v's; lowest first). An
    /// observer that can reach the other ranks makes them meet first,
    /// outside NCCL and within a deadline, so that a rank that never makes
    /// the call is found and named here. `Err` refuses the calls with
    /// [`crate::Error::CheckFailed`], nothing enqueued; after `Ok` the
    /// communicator does not ask again for those ranks.
    ///
    /// Outside a group each such call comes alone, at the call. Inside a
    /// group the calls are held back to the group's end (with every call
    /// after the first of them, so the order stays) and come together, one
    /// communicator at a time in the order of [`OpObserver::gate_label`]:
    /// the observer meets their ranks in an order that is the same on
    /// every rank (in a ring of sends to the next rank and receives from
    /// the one before, each rank's calls in their own order would wait for
    /// each other in a circle). Runs inside stream captures too. An
    /// observer may only ask for it when one thread drives one rank of
    /// the job, or its meeting would wait for itself. Runs on the issuing
    /// thread, after validation, only when [`OpObserver::gates`] said so;
    /// bounded; must not call back into the communicator. Ranks are
    /// communicator ranks.
    fn gate(&self, calls: &[(OpInfo, &[usize])]) -> Result<(), CheckError> {
        let _ = calls;
        Ok(())
    }

    /// The label that orders communicators' meetings at a group's end
    /// (the same on every rank for the same communicator); `None` sorts
    /// first.
    fn gate_label(&self) -> Option<String> {
        None
    }

    /// Whether work it saw issued has not finished yet, as far as it knows
    /// (`false` when it does not track completion). A communicator's drop
    /// waits for it (within the communicator's timeout) before finalizing,
    /// and aborts instead when it does not finish.
    fn unfinished(&self) -> bool {
        false
    }

    /// The observer as `Any`, for a look at its type by reference. `None`
    /// by default.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }

    /// The observer as an `Arc<dyn Any>`, so its owner can get its own
    /// type back from [`crate::Comm::observer`] with `Arc::downcast`,
    /// which checks the type of the allocation itself. Implement it as
    /// `Some(self)`. `None` by default.
    fn into_any(self: Arc<Self>) -> Option<Arc<dyn Any + Send + Sync>> {
        None
    }
}

/// A grouped call waiting for its group's outermost end, with its stream
/// borrowed for the group's lifetime `'g`.
pub(crate) struct Pending<'g> {
    pub(crate) observer: Arc<dyn OpObserver>,
    pub(crate) info: OpInfo,
    pub(crate) stream: ObservedStream<'g>,
}
