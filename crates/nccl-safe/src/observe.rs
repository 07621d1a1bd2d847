//! A hook that sees every operation a communicator puts on a stream, for
//! watchdogs and flight recorders (`nccl-dist` has one).
//!
//! With no observer set (the default) the hot path pays one branch on a
//! `Cell`. With one set, [`OpObserver::issued`] runs once per NCCL call,
//! after NCCL accepted it: at once outside a group, and at the outermost
//! `ncclGroupEnd` for calls made inside a group, because only then is the
//! work on the stream. Calls refused by validation, or by NCCL, are not
//! reported.

use std::sync::Arc;

use nccl_sys::{cudaStream_t, ncclDataType_t};

/// One operation as NCCL received it: the NCCL function, its element count
/// and type, and the peer or root it names (if any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// The NCCL function, such as `"ncclAllReduce"`.
    pub op: &'static str,
    /// Elements per rank as NCCL was told (`count` / `sendcount`).
    pub count: usize,
    /// The element type.
    pub dtype: ncclDataType_t,
    /// The peer (send/recv) or root (broadcast, reduce, gather, scatter).
    pub peer: Option<usize>,
}

impl OpInfo {
    pub(crate) fn new(op: &'static str, count: usize, dtype: ncclDataType_t) -> OpInfo {
        OpInfo {
            op,
            count,
            dtype,
            peer: None,
        }
    }

    pub(crate) fn peer(mut self, peer: usize) -> OpInfo {
        self.peer = Some(peer);
        self
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
    /// NCCL has put `info` on `stream`.
    fn issued(&self, info: &OpInfo, stream: cudaStream_t);

    /// Whether work it saw issued has not finished yet, as far as it knows
    /// (`false` when it does not track completion). A communicator's drop
    /// waits for it (within the communicator's timeout) before finalizing,
    /// and aborts instead when it does not finish.
    fn unfinished(&self) -> bool {
        false
    }

    /// The observer as `Any`, so its owner can find it again behind
    /// [`crate::Comm::observer`]. `None` by default.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// An observer with the call waiting for the outermost group end.
pub(crate) struct Pending {
    pub(crate) observer: Arc<dyn OpObserver>,
    pub(crate) info: OpInfo,
    pub(crate) stream: cudaStream_t,
}
