//! One description of an operation ([`Op`]) and the one path that enqueues
//! it: a trace span, the native NCCL call or the send/recv form that
//! stands in for it, the nonblocking wait, the observer's report, and the
//! buffers' bookkeeping. The collectives validate and then build an `Op`;
//! this file is the only place that calls NCCL's enqueue functions.

use std::ffi::c_void;

use nccl_sys::{ncclDataType_t, ncclRedOp_t};
use tracing::field::Empty;

use crate::buffer::Access;
use crate::dtype::NcclType;
use crate::group::GroupGuard;
use crate::observe::OpInfo;
use crate::ops::{OnStream, ptr};
use crate::{Error, Feature, Result};

/// Which NCCL operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    Reduce,
    ReduceScatter,
    Broadcast,
    AllGather,
    AllToAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

/// One operation, as its NCCL call takes it: a plain value on the stack.
///
/// Addresses are device addresses the constructor validated; the
/// root-side address is 0 off the root, where NCCL does not use it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Op {
    /// The name errors and observers see (NCCL's function, or ours).
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) send: u64,
    pub(crate) recv: u64,
    /// Elements per rank, as NCCL counts them.
    pub(crate) count: usize,
    pub(crate) dtype: ncclDataType_t,
    pub(crate) elem_bytes: usize,
    /// The root (rooted operations) or the peer (send, recv).
    pub(crate) peer: usize,
    /// The reduction and its name (reducing operations).
    pub(crate) reduction: ncclRedOp_t,
    pub(crate) reduction_name: &'static str,
    pub(crate) in_place: bool,
    /// Our one-shot kernel instead of NCCL (an all-reduce on a
    /// [`crate::SymmetricBuffer`] that qualifies).
    pub(crate) fast: Option<crate::OneShot>,
}

impl Op {
    /// `kind` on `count` elements of `T`, named `name`.
    #[inline]
    pub(crate) fn of<T: NcclType>(name: &'static str, kind: Kind, count: usize) -> Op {
        Op {
            name,
            kind,
            send: 0,
            recv: 0,
            count,
            dtype: T::DATATYPE,
            elem_bytes: std::mem::size_of::<T>(),
            peer: 0,
            reduction: ncclRedOp_t::ncclSum,
            reduction_name: "",
            in_place: false,
            fast: None,
        }
    }

    /// Runs on our one-shot kernel (see [`OnStream::one_shot_for`]).
    #[inline]
    pub(crate) fn fast(self, fast: Option<crate::OneShot>) -> Op {
        Op { fast, ..self }
    }

    /// The addresses read and written.
    #[inline]
    pub(crate) fn buffers(self, send: u64, recv: u64) -> Op {
        Op { send, recv, ..self }
    }

    /// The root or peer.
    #[inline]
    pub(crate) fn peer(self, peer: usize) -> Op {
        Op { peer, ..self }
    }

    /// The reduction and its name.
    #[inline]
    pub(crate) fn reduce(self, reduction: ncclRedOp_t, name: &'static str) -> Op {
        Op {
            reduction,
            reduction_name: name,
            ..self
        }
    }

    /// Marks the in-place form (for tracing).
    #[inline]
    pub(crate) fn in_place(self) -> Op {
        Op {
            in_place: true,
            ..self
        }
    }

    /// What its observers are told.
    pub(crate) fn info(&self) -> OpInfo {
        let info = OpInfo::new(self.name, self.count, self.dtype);
        match self.kind {
            Kind::AllReduce | Kind::ReduceScatter => info.redop(self.reduction),
            Kind::Reduce => info.redop(self.reduction).peer(self.peer),
            Kind::AllGather | Kind::AllToAll => info,
            Kind::Broadcast | Kind::Gather | Kind::Scatter | Kind::Send | Kind::Recv => {
                info.peer(self.peer)
            }
        }
    }

    /// Its trace span (entered around the enqueue).
    fn span(&self) -> tracing::Span {
        let (count, dtype, op) = (self.count, self.dtype, self.reduction_name);
        let (root, peer) = (self.peer, self.peer);
        let span = match self.kind {
            Kind::AllReduce => {
                tracing::trace_span!("nccl.all_reduce", count, dtype = ?dtype, op, in_place = Empty)
            }
            Kind::Reduce => {
                tracing::trace_span!("nccl.reduce", count, dtype = ?dtype, op, root, in_place = Empty)
            }
            Kind::ReduceScatter => {
                tracing::trace_span!("nccl.reduce_scatter", count, dtype = ?dtype, op, in_place = Empty)
            }
            Kind::Broadcast => {
                tracing::trace_span!("nccl.broadcast", count, dtype = ?dtype, root, in_place = Empty)
            }
            Kind::AllGather => {
                tracing::trace_span!("nccl.all_gather", count, dtype = ?dtype, in_place = Empty)
            }
            Kind::AllToAll => tracing::trace_span!("nccl.all_to_all", count, dtype = ?dtype),
            Kind::Gather => {
                tracing::trace_span!("nccl.gather", count, dtype = ?dtype, root, in_place = Empty)
            }
            Kind::Scatter => {
                tracing::trace_span!("nccl.scatter", count, dtype = ?dtype, root, in_place = Empty)
            }
            Kind::Send => tracing::trace_span!("nccl.send", count, dtype = ?dtype, peer),
            Kind::Recv => tracing::trace_span!("nccl.recv", count, dtype = ?dtype, peer),
        };
        if self.in_place {
            span.record("in_place", true);
        }
        span
    }
}

impl<'a> OnStream<'_, 'a> {
    /// Enqueues `op` and keeps `accesses` for as long as its work needs
    /// them (to the group's end inside a group). All-to-all, gather and
    /// scatter go as grouped send/recv where the library lacks them or
    /// they are forced so.
    ///
    /// # Safety
    ///
    /// `op` was validated against this communicator and stream: its
    /// buffers lie on this device and hold what `op.kind` reads and writes
    /// at `send` and `recv` (`count` elements, times the number of ranks
    /// on the gathered or scattered side), overlapping only in NCCL's
    /// in-place layout; the root-side address is 0 off the root; the
    /// reduction belongs to this communicator; `accesses` keep the buffers
    /// ordered and alive until the work is enqueued.
    #[inline]
    pub(crate) unsafe fn enqueue(
        &self,
        op: Op,
        accesses: impl IntoIterator<Item = Access<'a>>,
    ) -> Result<()> {
        crate::segments::mark(crate::segments::Seg::Validate);
        // The span only where trace level can be on: the hot path skips
        // picking the kind's span, recording its fields and entering a
        // disabled span.
        let _span = tracing::level_enabled!(tracing::Level::TRACE).then(|| op.span().entered());
        // One branch on a `Cell` unless the observer checks calls.
        if self.comm.checks_before.get()
            && let Err(e) = self.before(&op)
        {
            self.settle(accesses);
            return Err(e);
        }
        // One branch on a `Cell` unless the observer gates calls. Inside a
        // group a call that may connect is held back to the group's end
        // (and so is every call after it, to keep the order).
        if self.comm.gates.get() {
            if let Some(hold) = self.defers(&op, None) {
                // SAFETY: the caller's promise; the accesses go to the
                // group's hold below and stay to its end.
                unsafe { self.defer(op, hold) };
                self.settle(accesses);
                return Ok(());
            }
            if (self.hold.is_none() || self.capture.is_some())
                && let Err(e) = self.gate(&op, None)
            {
                self.settle(accesses);
                return Err(e);
            }
        }
        // SAFETY: the caller's promise.
        let enqueued = unsafe { self.dispatch(&op) };
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle(accesses);
        enqueued
    }

    /// The NCCL call(s) of `op`: all-to-all, gather and scatter as grouped
    /// send/recv where the library lacks them or they are forced so.
    ///
    /// # Safety
    ///
    /// As for [`OnStream::enqueue`].
    pub(crate) unsafe fn dispatch(&self, op: &Op) -> Result<()> {
        let op = *op;
        match op.kind {
            Kind::AllToAll if self.comm.uses_send_recv(Feature::NativeAllToAll) => {
                let counts = vec![op.count; self.comm.size()];
                let displs: Vec<usize> = (0..self.comm.size()).map(|i| i * op.count).collect();
                // SAFETY: the caller's promise: `size` blocks of `count` at
                // each address.
                unsafe { self.send_recv_all(&op, &counts, &displs, &counts, &displs) }
            }
            Kind::Gather | Kind::Scatter
                if self.comm.uses_send_recv(Feature::NativeGatherScatter) =>
            {
                // SAFETY: the caller's promise.
                unsafe { self.rooted_send_recv(&op) }
            }
            // SAFETY: the caller's promise.
            _ => unsafe { self.launch(&op) },
        }
    }

    /// The NCCL call of `op`, through [`OnStream::call`] (nonblocking wait,
    /// observer, the group's record of the stream).
    ///
    /// # Safety
    ///
    /// As for [`OnStream::enqueue`].
    unsafe fn launch(&self, op: &Op) -> Result<()> {
        let lib = self.comm.library().raw();
        let (s, r) = (op.send as *const c_void, op.recv as *mut c_void);
        let (n, dt, red, peer) = (op.count, op.dtype, op.reduction, op.peer as i32);
        match op.kind {
            Kind::AllReduce => {
                if let Some(fast) = op.fast {
                    // SAFETY: the caller's promise; `one_shot_for` chose it.
                    return unsafe { self.launch_one_shot(op, fast) };
                }
                let f = lib.ncclAllReduce()?;
                // SAFETY: the caller's promise (validated buffers and op).
                self.call(op, |c, st| unsafe { f(s, r, n, dt, red, c, st) })
            }
            Kind::Reduce => {
                let f = lib.ncclReduce()?;
                // SAFETY: the caller's promise; `r` is null off the root.
                self.call(op, |c, st| unsafe { f(s, r, n, dt, red, peer, c, st) })
            }
            Kind::ReduceScatter => {
                let f = lib.ncclReduceScatter()?;
                // SAFETY: the caller's promise (validated buffers and op).
                self.call(op, |c, st| unsafe { f(s, r, n, dt, red, c, st) })
            }
            Kind::Broadcast => {
                let f = lib.ncclBroadcast()?;
                // SAFETY: the caller's promise; `s` is null off the root.
                self.call(op, |c, st| unsafe { f(s, r, n, dt, peer, c, st) })
            }
            Kind::AllGather => {
                let f = lib.ncclAllGather()?;
                // SAFETY: the caller's promise (validated buffers).
                self.call(op, |c, st| unsafe { f(s, r, n, dt, c, st) })
            }
            Kind::AllToAll => {
                let f = lib.ncclAlltoAll()?;
                // SAFETY: the caller's promise (validated buffers).
                self.call(op, |c, st| unsafe { f(s, r, n, dt, c, st) })
            }
            Kind::Gather | Kind::Scatter => {
                let f = match op.kind {
                    Kind::Gather => lib.ncclGather()?,
                    _ => lib.ncclScatter()?,
                };
                // SAFETY: the caller's promise; the root-side buffer is
                // null off the root, where NCCL does not use it.
                self.call(op, |c, st| unsafe { f(s, r, n, dt, peer, c, st) })
            }
            Kind::Send => {
                let f = lib.ncclSend()?;
                // SAFETY: the caller's promise: `n` readable elements at `s`.
                self.call(op, |c, st| unsafe { f(s, n, dt, peer, c, st) })
            }
            Kind::Recv => {
                let f = lib.ncclRecv()?;
                // SAFETY: the caller's promise: `n` writable elements at `r`.
                self.call(op, |c, st| unsafe { f(r, n, dt, peer, c, st) })
            }
        }
    }

    /// Our one-shot all-reduce of `op` (see `crate::one_shot`): launched
    /// with the communicator live and its context current, then reported
    /// to the observer as an NCCL call would be.
    ///
    /// # Safety
    ///
    /// As for [`OnStream::enqueue`]; `fast` came from
    /// [`OnStream::one_shot_for`] for this `op`.
    unsafe fn launch_one_shot(&self, op: &Op, fast: crate::OneShot) -> Result<()> {
        let stream = self.stream.cu_stream();
        self.comm.shared().with_raw(op.name, |_| {
            // SAFETY: the caller's promise: `takes` said yes, `recv` holds
            // `count` writable elements ordered after earlier uses, the
            // ranks make the same calls in the same order; `with_raw`
            // made the context current.
            unsafe { fast.launch(op.dtype, op.elem_bytes, op.recv, op.count, stream) }.map_err(
                |source| Error::Cuda {
                    op: op.name,
                    source,
                },
            )
        })?;
        Self::observe(self.comm, op, self.stream, self.hold);
        Ok(())
    }

    /// The one-shot kernel for an all-reduce `op` reading a buffer whose
    /// view is `view`: only outside groups, for a built-in sum on the
    /// communicator's own stream (or inside a capture), when the kernel
    /// takes its type, size and addresses. A kernel that ended early on
    /// this communicator is an error here (its result was undefined).
    pub(crate) fn one_shot_for(
        &self,
        view: Option<crate::OneShot>,
        op: &Op,
    ) -> Result<Option<crate::OneShot>> {
        let Some(v) = view else { return Ok(None) };
        if v.words.status() != 0 {
            self.comm.shared().kernel_failed(op.name)?;
        }
        let own_stream =
            self.capture.is_some() || self.stream.cu_stream() == self.comm.stream().cu_stream();
        // Into a graph (ours, or a capture the caller allowed on this
        // stream): small ones keep NCCL's symmetric kernels.
        let captured = self.capture.is_some()
            || (crate::capture_state::is_allowed()
                && crate::capture_state::is_capturing(self.stream));
        let takes = self.hold.is_none()
            && !crate::group::is_open()
            && own_stream
            && op.reduction == nccl_sys::ncclRedOp_t::ncclSum
            && v.comm == std::sync::Arc::as_ptr(self.comm.shared()) as usize
            && v.nranks as usize == self.comm.size()
            && v.takes(
                op.dtype,
                op.elem_bytes,
                (op.send, op.recv),
                op.count,
                captured,
            );
        Ok(takes.then_some(v))
    }

    /// Grouped `ncclSend`/`ncclRecv` with every peer (zero counts skipped):
    /// `send_counts[j]` elements from `op.send + send_displs[j]` to rank j,
    /// `recv_counts[i]` from rank i to `op.recv + recv_displs[i]`, each
    /// reported under `op.name`.
    ///
    /// # Safety
    ///
    /// Every segment lies inside the validated buffers of `op`.
    pub(crate) unsafe fn send_recv_all(
        &self,
        op: &Op,
        send_counts: &[usize],
        send_displs: &[usize],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let lib = self.comm.library().raw();
        // Loaded before the group, as a missing symbol must not open one.
        lib.ncclSend()?;
        lib.ncclRecv()?;
        let group: GroupGuard<'a> = GroupGuard::start_internal()?;
        let on = self.within(&group);
        let e = op.elem_bytes;
        for peer in 0..self.comm.size() {
            let one = |kind, count| Op { kind, count, ..*op }.peer(peer);
            if send_counts[peer] > 0 {
                let p = ptr(op.send, send_displs[peer], e);
                // SAFETY: the segment lies inside the send buffer.
                unsafe { on.launch(&one(Kind::Send, send_counts[peer]).buffers(p, 0)) }?;
            }
            if recv_counts[peer] > 0 {
                let p = ptr(op.recv, recv_displs[peer], e);
                // SAFETY: the segment lies inside the receive buffer.
                unsafe { on.launch(&one(Kind::Recv, recv_counts[peer]).buffers(0, p)) }?;
            }
        }
        group.end()
    }

    /// Gather (every rank's `send` to block i of the root's `recv`) or
    /// scatter (block i of the root's `send` to rank i's `recv`) from
    /// grouped send/recv, with the root's own block copied locally.
    ///
    /// # Safety
    ///
    /// As for [`OnStream::enqueue`].
    unsafe fn rooted_send_recv(&self, op: &Op) -> Result<()> {
        let lib = self.comm.library().raw();
        lib.ncclSend()?;
        lib.ncclRecv()?;
        let (root, count, e) = (op.peer, op.count, op.elem_bytes);
        let gather = op.kind == Kind::Gather;
        let group: GroupGuard<'a> = GroupGuard::start_internal()?;
        let on = self.within(&group);
        let one = |kind, peer, send, recv| Op { kind, ..*op }.peer(peer).buffers(send, recv);
        if self.comm.rank() == root {
            for peer in 0..self.comm.size() {
                // The root's block `peer`: written by gather, read by scatter.
                let block = if gather {
                    ptr(op.recv, peer * count, e)
                } else {
                    ptr(op.send, peer * count, e)
                };
                if peer == root {
                    let (from, to) = if gather {
                        (op.send, block)
                    } else {
                        (block, op.recv)
                    };
                    if from != to {
                        self.local_copy(op.name, from, to, count * e)?;
                    }
                    continue;
                }
                let part = if gather {
                    one(Kind::Recv, peer, 0, block)
                } else {
                    one(Kind::Send, peer, block, 0)
                };
                // SAFETY: block `peer` of the validated root-side buffer.
                unsafe { on.launch(&part) }?;
            }
        } else {
            let part = if gather {
                one(Kind::Send, root, op.send, 0)
            } else {
                one(Kind::Recv, root, 0, op.recv)
            };
            // SAFETY: the validated buffer of this (non-root) rank.
            unsafe { on.launch(&part) }?;
        }
        group.end()
    }

    /// A device-to-device copy of `bytes` on this stream, for the root's
    /// own block in the send/recv forms of gather and scatter.
    fn local_copy(&self, op: &'static str, from: u64, to: u64, bytes: usize) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|source| Error::Cuda { op, source })?;
        // SAFETY: both ranges were validated to lie in device buffers of
        // this device and not to overlap partially; the copy is ordered on
        // the communicator's stream like the NCCL work around it.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(to, from, bytes, self.stream.cu_stream())
        }
        .map_err(|source| Error::Cuda { op, source })
    }
}
