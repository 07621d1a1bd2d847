//! Every collective and point-to-point operation, validated before NCCL
//! sees it.
//!
//! Counts come from buffer lengths: the buffer named in each method's docs
//! sets the count, and the other buffer must hold at least what the
//! operation writes or reads. A count of 0 is a no-op that makes no NCCL
//! call. Where NCCL defines an in-place layout, there is an `_in_place`
//! method taking one buffer; two buffers that overlap in any other way are
//! `Error::PartialAlias`.

use std::cell::RefCell;
use std::ffi::c_void;

use cudarc::driver::CudaStream;
use nccl_sys::{cudaStream_t, ncclComm_t, ncclResult_t};

use crate::buffer::{Access, DeviceBuffer, DeviceBufferMut};
use crate::capabilities::FP8_REDUCTION_MIN_CC;
use crate::comm::Comm;
use crate::dtype::NcclType;
use crate::error::Role;
use crate::group::{self, GroupGuard, GroupHold};
use crate::observe::OpInfo;
use crate::reduce_op::Reduction;
use crate::validate::{Check, Span};
use crate::{Error, Feature, Result};

/// Refuses `T` where the library (fp8 before 2.24) or, for reductions, the
/// GPU (fp8 below compute capability 9.0) cannot handle it.
pub(crate) fn check_dtype<T: NcclType>(comm: &Comm, op: &'static str, reduces: bool) -> Result<()> {
    if T::IS_FP8 {
        comm.capabilities().require(Feature::Fp8)?;
        let cc = comm.compute_capability();
        if reduces && cc < FP8_REDUCTION_MIN_CC {
            let _ = op;
            return Err(Error::Unsupported {
                what: "fp8 reductions",
                requires: format!(
                    "compute capability {}.{}",
                    FP8_REDUCTION_MIN_CC.0, FP8_REDUCTION_MIN_CC.1
                ),
                found: format!(
                    "compute capability {}.{} on device {}",
                    cc.0,
                    cc.1,
                    comm.device()
                ),
            });
        }
    }
    Ok(())
}

/// Refuses what NCCL cannot run for `op` on `T`: fp8 scaled sums (Avg,
/// PreMulSum) on a one-rank communicator, whose copy path has no fp8
/// kernels (NCCL answers `ncclInvalidArgument`; seen with 2.28.9).
pub(crate) fn check_reduction<'a, T: NcclType>(
    comm: &Comm,
    op: &impl Reduction<'a, T>,
) -> Result<()> {
    if T::IS_FP8 && comm.size() == 1 && op.scales() {
        return Err(Error::Unsupported {
            what: "fp8 Avg/PreMulSum on a one-rank communicator",
            requires: "at least two ranks".to_string(),
            found: "one rank".to_string(),
        });
    }
    Ok(())
}

/// Which way a rooted operation moves data.
#[derive(Clone, Copy)]
enum Rooted {
    Gather,
    Scatter,
}

/// A communicator and the stream its next operations go on, optionally
/// inside a group (see [`GroupGuard::on`]).
///
/// `'a` is how long buffers stay borrowed: until the call returns outside
/// a group, until the group ends inside one.
pub struct OnStream<'s, 'a> {
    comm: &'a Comm,
    stream: &'a CudaStream,
    /// Where buffers are opened (ordered): `stream`, except inside
    /// [`crate::capture`], where the capturing stream must not be joined
    /// with streams outside the capture; there the buffers are opened on
    /// the caller's stream (to learn their addresses) and each launch
    /// orders them.
    access: &'a CudaStream,
    hold: Option<&'s RefCell<GroupHold<'a>>>,
    /// Inside [`crate::capture`]: the extents (start, end) of the buffers
    /// the graph owns, the only ones a captured call may use.
    capture: Option<&'s [(u64, u64)]>,
}

impl std::fmt::Debug for OnStream<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnStream")
            .field("comm", self.comm)
            .field("grouped", &self.hold.is_some())
            .finish()
    }
}

/// The address `offset_elems` elements past `address`. Offsets are
/// validated to lie inside the buffer, whose contract promises it is real
/// memory, so this cannot wrap; wrapping keeps a lying implementation from
/// causing a panic here.
fn ptr(address: u64, offset_elems: usize, elem_bytes: usize) -> u64 {
    address.wrapping_add(offset_elems.wrapping_mul(elem_bytes) as u64)
}

impl<'s, 'a> OnStream<'s, 'a> {
    pub(crate) fn direct(comm: &'a Comm, stream: &'a CudaStream) -> Self {
        OnStream {
            comm,
            stream,
            access: stream,
            hold: None,
            capture: None,
        }
    }

    pub(crate) fn grouped(
        comm: &'a Comm,
        stream: &'a CudaStream,
        hold: &'s RefCell<GroupHold<'a>>,
    ) -> Self {
        OnStream {
            comm,
            stream,
            access: stream,
            hold: Some(hold),
            capture: None,
        }
    }

    /// Calls captured into a graph that owns the buffers at `extents`.
    pub(crate) fn capturing(
        comm: &'a Comm,
        stream: &'a CudaStream,
        home: &'a CudaStream,
        extents: &'s [(u64, u64)],
    ) -> Self {
        OnStream {
            comm,
            stream,
            access: home,
            hold: None,
            capture: Some(extents),
        }
    }

    /// `buffer` opened for reading; while capturing, it must be one the
    /// graph owns.
    fn read_buf<T: NcclType>(
        &self,
        op: &'static str,
        buffer: &'a (impl DeviceBuffer<T> + ?Sized),
    ) -> Result<(u64, Access<'a>)> {
        let (ptr, access) = buffer.read(self.access);
        self.owned_by_graph(op, ptr, buffer.len() * std::mem::size_of::<T>())?;
        Ok((ptr, access))
    }

    /// `buffer` opened for writing; while capturing, it must be one the
    /// graph owns.
    fn write_buf<T: NcclType>(
        &self,
        op: &'static str,
        buffer: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<(u64, Access<'a>)> {
        let len = buffer.len();
        let (ptr, access) = buffer.write(self.access);
        self.owned_by_graph(op, ptr, len * std::mem::size_of::<T>())?;
        Ok((ptr, access))
    }

    /// While capturing: refuses memory the graph does not own (it could be
    /// freed before a launch).
    fn owned_by_graph(&self, op: &'static str, ptr: u64, bytes: usize) -> Result<()> {
        let Some(extents) = self.capture else {
            return Ok(());
        };
        let end = ptr.checked_add(bytes as u64);
        if bytes == 0
            || extents
                .iter()
                .any(|&(s, e)| ptr >= s && end.is_some_and(|x| x <= e))
        {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op,
            reason: "a captured call may only use buffers the graph owns (those given to capture)",
        })
    }

    /// The reduction's NCCL handle; while capturing, a built-in one only (a
    /// PreMulSum is destroyed with its value, before a later launch).
    fn redop<T: NcclType>(
        &self,
        op: &'static str,
        reduction: &impl Reduction<'a, T>,
    ) -> Result<nccl_sys::ncclRedOp_t> {
        let raw = reduction.raw_for(self.comm)?;
        if self.capture.is_some() && raw.is_dynamic() {
            return Err(Error::InvalidArgument {
                op,
                reason: "a captured call may only use a built-in reduction (a PreMulSum could be destroyed before a launch)",
            });
        }
        Ok(raw)
    }

    fn check<T>(&self, op: &'static str) -> Result<Check> {
        if self.hold.is_none() && group::in_group() {
            return Err(Error::InvalidArgument {
                op,
                reason: "a group is open on this thread: issue the call through GroupGuard::on",
            });
        }
        let stream_device = self.stream.context().ordinal();
        if stream_device != self.comm.device() {
            return Err(Error::WrongDevice {
                op,
                role: Role::Stream,
                expected: self.comm.device(),
                found: stream_device,
            });
        }
        if self.capture.is_none() {
            crate::capture::refuse_capture(op, self.stream)?;
        }
        Ok(Check {
            op,
            rank: self.comm.rank(),
            size: self.comm.size(),
            device: self.comm.device(),
            elem_bytes: std::mem::size_of::<T>(),
        })
    }

    fn raw_stream(&self) -> cudaStream_t {
        self.stream.cu_stream() as cudaStream_t
    }

    /// Keeps the accesses until the group ends (inside a group) or drops
    /// them now, after the enqueue (outside one). Accesses whose drop does
    /// nothing are not kept.
    fn settle(&self, accesses: impl IntoIterator<Item = Access<'a>>) {
        if let Some(hold) = self.hold {
            hold.borrow_mut()
                .accesses
                .extend(accesses.into_iter().filter(|a| !a.is_none()));
        }
    }

    /// One NCCL enqueue call on the live communicator, with nonblocking
    /// polling and error capture.
    fn call(
        &self,
        info: OpInfo,
        f: impl FnOnce(ncclComm_t, cudaStream_t) -> ncclResult_t,
    ) -> Result<()> {
        let op = info.op;
        let shared = self.comm.shared();
        let lib = self.comm.library();
        let stream = self.raw_stream();
        let grouped = group::in_group();
        if grouped {
            group::touch(shared);
        }
        let code = shared.with_raw(op, |raw| {
            if grouped {
                shared.enter_group();
            }
            Ok(f(raw, stream))
        })?;
        match code {
            ncclResult_t::ncclSuccess => {}
            ncclResult_t::ncclInProgress if !self.comm.is_blocking() => {
                if !grouped {
                    shared.wait_ready(op)?;
                }
            }
            code => return shared.with_raw(op, |raw| lib.check(op, code, raw)),
        }
        debug_assert!(
            self.hold.is_some() || !grouped,
            "a call inside a group goes through the group's hold"
        );
        if let Some(hold) = self.hold {
            let allowed = self.capture.is_some() || crate::capture::is_allowed();
            hold.borrow_mut().note_stream(self.stream, allowed);
        }
        self.comm.observe(info, self.stream, self.hold);
        Ok(())
    }

    /// The same communicator and stream, issuing into the crate-internal
    /// `group`: into the caller's group when there is one (the calls launch
    /// at its end, which reports them), else into `group` itself, whose end
    /// launches and reports them. Either way the calls and their streams
    /// stay borrowed until the group that reports them ends.
    fn within<'t>(&'t self, group: &'t GroupGuard<'a>) -> OnStream<'t, 'a> {
        OnStream {
            comm: self.comm,
            stream: self.stream,
            access: self.access,
            hold: Some(self.hold.unwrap_or(group.held())),
            capture: self.capture,
        }
    }

    fn span<T: NcclType>(buffer: &(impl DeviceBuffer<T> + ?Sized)) -> Span {
        Span {
            ptr: 0,
            len: buffer.len(),
            device: buffer.device(),
        }
    }

    // ---- reductions ----------------------------------------------------------

    /// `ncclAllReduce`: every rank's `recv` gets the reduction of all
    /// ranks' `send`. Count: `send.len()`.
    pub fn all_reduce<T: NcclType>(
        &self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        const OP: &str = "ncclAllReduce";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, true)?;
        check_reduction::<T>(self.comm, &op)?;
        let (mut s, mut r) = (Self::span(send), Self::span(recv));
        c.device(Role::Send, s)?;
        c.device(Role::Recv, r)?;
        let count = s.len;
        c.times(count, 1)?;
        c.at_least(Role::Recv, r, count)?;
        let redop = self.redop(OP, &op)?;
        let (sp, sa) = self.read_buf(OP, send)?;
        let (rp, ra) = self.write_buf(OP, recv)?;
        (s.ptr, r.ptr) = (sp, rp);
        c.aliasing(s, count, r, count, Some(0))?;
        if count == 0 {
            return Ok(());
        }
        let scalar = op.scalar_access(self.stream);
        let _span =
            tracing::trace_span!("nccl.all_reduce", count, dtype = ?T::DATATYPE, op = op.name())
                .entered();
        let f = self.comm.library().raw().ncclAllReduce()?;
        // SAFETY: validated: both buffers on this device, `count` elements
        // readable at `sp` and writable at `rp`, no partial overlap; the
        // op belongs to this communicator.
        let enqueued = self.call(OpInfo::new(OP, count, T::DATATYPE), |comm, stream| unsafe {
            f(
                sp as *const c_void,
                rp as *mut c_void,
                count,
                T::DATATYPE,
                redop,
                comm,
                stream,
            )
        });
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([sa, ra].into_iter().chain(scalar));
        enqueued?;
        Ok(())
    }

    /// In-place `ncclAllReduce` on `buf`.
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        const OP: &str = "ncclAllReduce";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, true)?;
        check_reduction::<T>(self.comm, &op)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let count = b.len;
        c.times(count, 1)?;
        let redop = self.redop(OP, &op)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let scalar = op.scalar_access(self.stream);
        let _span = tracing::trace_span!("nccl.all_reduce", count, dtype = ?T::DATATYPE, op = op.name(), in_place = true).entered();
        let f = self.comm.library().raw().ncclAllReduce()?;
        // SAFETY: `count` elements at `p` on this device, read and written
        // in place as NCCL defines for sendbuff == recvbuff.
        let enqueued = self.call(OpInfo::new(OP, count, T::DATATYPE), |comm, stream| unsafe {
            f(
                p as *const c_void,
                p as *mut c_void,
                count,
                T::DATATYPE,
                redop,
                comm,
                stream,
            )
        });
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([a].into_iter().chain(scalar));
        enqueued?;
        Ok(())
    }

    /// `ncclReduce`: `root`'s `recv` gets the reduction of every rank's
    /// `send`. Count: `send.len()`. `recv` is used (and required) on
    /// `root` only.
    pub fn reduce<T: NcclType, R: DeviceBufferMut<T> + ?Sized>(
        &self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: Option<&'a mut R>,
        op: impl Reduction<'a, T>,
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclReduce";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, true)?;
        check_reduction::<T>(self.comm, &op)?;
        c.rank("root", root)?;
        let mut s = Self::span(send);
        c.device(Role::Send, s)?;
        let count = s.len;
        c.times(count, 1)?;
        let is_root = self.comm.rank() == root;
        let recv = match recv {
            Some(r) if is_root => Some(r),
            None if is_root => {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "the root needs a receive buffer",
                });
            }
            _ => None,
        };
        if let Some(r) = &recv {
            let r = Self::span(&**r);
            c.device(Role::Recv, r)?;
            c.at_least(Role::Recv, r, count)?;
        }
        let redop = self.redop(OP, &op)?;
        let (sp, sa) = self.read_buf(OP, send)?;
        s.ptr = sp;
        let (rp, ra) = match recv {
            Some(r) => {
                let mut span = Self::span(&*r);
                let (rp, ra) = self.write_buf(OP, r)?;
                span.ptr = rp;
                c.aliasing(s, count, span, count, Some(0))?;
                (rp, Some(ra))
            }
            None => (0, None),
        };
        if count == 0 {
            return Ok(());
        }
        let scalar = op.scalar_access(self.stream);
        let _span =
            tracing::trace_span!("nccl.reduce", count, dtype = ?T::DATATYPE, op = op.name(), root)
                .entered();
        let f = self.comm.library().raw().ncclReduce()?;
        let root_c = root as i32;
        let enqueued = self.call(
            OpInfo::new(OP, count, T::DATATYPE).peer(root),
            // SAFETY: validated as for all_reduce; `rp` is null off the root,
            // where NCCL does not use the receive buffer.
            |comm, stream| unsafe {
                f(
                    sp as *const c_void,
                    rp as *mut c_void,
                    count,
                    T::DATATYPE,
                    redop,
                    root_c,
                    comm,
                    stream,
                )
            },
        );
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([sa].into_iter().chain(ra).chain(scalar));
        enqueued?;
        Ok(())
    }

    /// In-place `ncclReduce`: `buf` is the input everywhere and the output
    /// on `root`.
    pub fn reduce_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclReduce";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, true)?;
        check_reduction::<T>(self.comm, &op)?;
        c.rank("root", root)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let count = b.len;
        c.times(count, 1)?;
        let redop = self.redop(OP, &op)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let scalar = op.scalar_access(self.stream);
        let _span = tracing::trace_span!("nccl.reduce", count, dtype = ?T::DATATYPE, op = op.name(), root, in_place = true).entered();
        let f = self.comm.library().raw().ncclReduce()?;
        let root_c = root as i32;
        let enqueued = self.call(
            OpInfo::new(OP, count, T::DATATYPE).peer(root),
            // SAFETY: `count` elements at `p` on this device, in place.
            |comm, stream| unsafe {
                f(
                    p as *const c_void,
                    p as *mut c_void,
                    count,
                    T::DATATYPE,
                    redop,
                    root_c,
                    comm,
                    stream,
                )
            },
        );
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([a].into_iter().chain(scalar));
        enqueued?;
        Ok(())
    }

    /// `ncclReduceScatter`: rank i's `recv` gets block i of the reduction
    /// of every rank's `send`. Count per rank: `recv.len()`; `send` holds
    /// at least `size * recv.len()`.
    pub fn reduce_scatter<T: NcclType>(
        &self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        const OP: &str = "ncclReduceScatter";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, true)?;
        check_reduction::<T>(self.comm, &op)?;
        let (mut s, mut r) = (Self::span(send), Self::span(recv));
        c.device(Role::Send, s)?;
        c.device(Role::Recv, r)?;
        let count = r.len;
        let total = c.times(count, c.size)?;
        c.at_least(Role::Send, s, total)?;
        let redop = self.redop(OP, &op)?;
        let (sp, sa) = self.read_buf(OP, send)?;
        let (rp, ra) = self.write_buf(OP, recv)?;
        (s.ptr, r.ptr) = (sp, rp);
        // In place when recv == send + rank * count.
        c.aliasing(Span { ptr: rp, ..r }, count, s, total, Some(c.rank * count))
            .map_err(|_| Error::PartialAlias {
                op: OP,
                send: sp,
                send_bytes: total * c.elem_bytes,
                recv: rp,
                recv_bytes: count * c.elem_bytes,
            })?;
        if count == 0 {
            return Ok(());
        }
        let scalar = op.scalar_access(self.stream);
        let _span = tracing::trace_span!("nccl.reduce_scatter", count, dtype = ?T::DATATYPE, op = op.name()).entered();
        let f = self.comm.library().raw().ncclReduceScatter()?;
        // SAFETY: validated: `size * count` elements readable at `sp`,
        // `count` writable at `rp`, same device, NCCL's layout or disjoint.
        let enqueued = self.call(OpInfo::new(OP, count, T::DATATYPE), |comm, stream| unsafe {
            f(
                sp as *const c_void,
                rp as *mut c_void,
                count,
                T::DATATYPE,
                redop,
                comm,
                stream,
            )
        });
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([sa, ra].into_iter().chain(scalar));
        enqueued?;
        Ok(())
    }

    /// In-place `ncclReduceScatter`: `buf` holds `size * n` inputs; rank
    /// i's result lands in its own block `[i*n, (i+1)*n)`.
    pub fn reduce_scatter_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        const OP: &str = "ncclReduceScatter";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, true)?;
        check_reduction::<T>(self.comm, &op)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        if b.len % c.size != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the buffer length must be a multiple of the number of ranks",
            });
        }
        let count = b.len / c.size;
        let redop = self.redop(OP, &op)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let scalar = op.scalar_access(self.stream);
        let rp = ptr(p, c.rank * count, c.elem_bytes);
        let _span = tracing::trace_span!("nccl.reduce_scatter", count, dtype = ?T::DATATYPE, op = op.name(), in_place = true).entered();
        let f = self.comm.library().raw().ncclReduceScatter()?;
        // SAFETY: `size * count` elements at `p`; the output is this rank's
        // block, NCCL's in-place layout.
        let enqueued = self.call(OpInfo::new(OP, count, T::DATATYPE), |comm, stream| unsafe {
            f(
                p as *const c_void,
                rp as *mut c_void,
                count,
                T::DATATYPE,
                redop,
                comm,
                stream,
            )
        });
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([a].into_iter().chain(scalar));
        enqueued?;
        Ok(())
    }

    // ---- data movement ------------------------------------------------------

    /// `ncclBroadcast`: `root`'s `send` lands in every rank's `recv`.
    /// Count: `recv.len()`. `send` is used (and required) on `root` only.
    pub fn broadcast<T: NcclType, S: DeviceBuffer<T> + ?Sized>(
        &self,
        send: Option<&'a S>,
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclBroadcast";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        c.rank("root", root)?;
        let mut r = Self::span(recv);
        c.device(Role::Recv, r)?;
        let count = r.len;
        c.times(count, 1)?;
        let is_root = self.comm.rank() == root;
        let send = match send {
            Some(s) if is_root => Some(s),
            None if is_root => {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "the root needs a send buffer",
                });
            }
            _ => None,
        };
        if let Some(s) = send {
            let s = Self::span(s);
            c.device(Role::Send, s)?;
            c.at_least(Role::Send, s, count)?;
        }
        let (sp, sa) = match send {
            Some(s) => {
                let (p, a) = self.read_buf(OP, s)?;
                (p, Some(a))
            }
            None => (0, None),
        };
        let (rp, ra) = self.write_buf(OP, recv)?;
        r.ptr = rp;
        if let Some(s) = send {
            c.aliasing(
                Span {
                    ptr: sp,
                    ..Self::span(s)
                },
                count,
                r,
                count,
                Some(0),
            )?;
        }
        if count == 0 {
            return Ok(());
        }
        let _span =
            tracing::trace_span!("nccl.broadcast", count, dtype = ?T::DATATYPE, root).entered();
        let f = self.comm.library().raw().ncclBroadcast()?;
        let root_c = root as i32;
        let enqueued = self.call(
            OpInfo::new(OP, count, T::DATATYPE).peer(root),
            // SAFETY: validated; `sp` is null off the root, where NCCL does not
            // read the send buffer.
            |comm, stream| unsafe {
                f(
                    sp as *const c_void,
                    rp as *mut c_void,
                    count,
                    T::DATATYPE,
                    root_c,
                    comm,
                    stream,
                )
            },
        );
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle(sa.into_iter().chain([ra]));
        enqueued?;
        Ok(())
    }

    /// In-place `ncclBroadcast`: `root`'s `buf` overwrites everyone's.
    pub fn broadcast_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclBroadcast";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        c.rank("root", root)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let count = b.len;
        c.times(count, 1)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let _span = tracing::trace_span!("nccl.broadcast", count, dtype = ?T::DATATYPE, root, in_place = true).entered();
        let f = self.comm.library().raw().ncclBroadcast()?;
        let root_c = root as i32;
        let enqueued = self.call(
            OpInfo::new(OP, count, T::DATATYPE).peer(root),
            // SAFETY: `count` elements at `p` on this device, in place.
            |comm, stream| unsafe {
                f(
                    p as *const c_void,
                    p as *mut c_void,
                    count,
                    T::DATATYPE,
                    root_c,
                    comm,
                    stream,
                )
            },
        );
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([a]);
        enqueued?;
        Ok(())
    }

    /// `ncclAllGather`: rank i's `send` lands at block i of every rank's
    /// `recv`. Count per rank: `send.len()`; `recv` holds at least
    /// `size * send.len()`.
    pub fn all_gather<T: NcclType>(
        &self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        const OP: &str = "ncclAllGather";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        let (mut s, mut r) = (Self::span(send), Self::span(recv));
        c.device(Role::Send, s)?;
        c.device(Role::Recv, r)?;
        let count = s.len;
        let total = c.times(count, c.size)?;
        c.at_least(Role::Recv, r, total)?;
        let (sp, sa) = self.read_buf(OP, send)?;
        let (rp, ra) = self.write_buf(OP, recv)?;
        (s.ptr, r.ptr) = (sp, rp);
        c.aliasing(s, count, r, total, Some(c.rank * count))?;
        if count == 0 {
            return Ok(());
        }
        let _span = tracing::trace_span!("nccl.all_gather", count, dtype = ?T::DATATYPE).entered();
        let f = self.comm.library().raw().ncclAllGather()?;
        // SAFETY: validated: `count` readable at `sp`, `size * count`
        // writable at `rp`, same device, NCCL's layout or disjoint.
        let enqueued = self.call(OpInfo::new(OP, count, T::DATATYPE), |comm, stream| unsafe {
            f(
                sp as *const c_void,
                rp as *mut c_void,
                count,
                T::DATATYPE,
                comm,
                stream,
            )
        });
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([sa, ra]);
        enqueued?;
        Ok(())
    }

    /// In-place `ncclAllGather`: `buf` holds `size * n`; this rank's input
    /// is its own block.
    pub fn all_gather_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        const OP: &str = "ncclAllGather";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        if b.len % c.size != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the buffer length must be a multiple of the number of ranks",
            });
        }
        let count = b.len / c.size;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let sp = ptr(p, c.rank * count, c.elem_bytes);
        let _span =
            tracing::trace_span!("nccl.all_gather", count, dtype = ?T::DATATYPE, in_place = true)
                .entered();
        let f = self.comm.library().raw().ncclAllGather()?;
        // SAFETY: `size * count` elements at `p`; the input is this rank's
        // block, NCCL's in-place layout.
        let enqueued = self.call(OpInfo::new(OP, count, T::DATATYPE), |comm, stream| unsafe {
            f(
                sp as *const c_void,
                p as *mut c_void,
                count,
                T::DATATYPE,
                comm,
                stream,
            )
        });
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([a]);
        enqueued?;
        Ok(())
    }

    /// All-to-all: block j of `send` goes to rank j; block i of `recv`
    /// comes from rank i. `send.len()` must be a multiple of `size`; the
    /// block size is `send.len() / size`. Native `ncclAlltoAll` on NCCL
    /// 2.28+, grouped send/recv otherwise (or when forced).
    pub fn all_to_all<T: NcclType>(
        &self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        const OP: &str = "ncclAlltoAll";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        let (mut s, mut r) = (Self::span(send), Self::span(recv));
        c.device(Role::Send, s)?;
        c.device(Role::Recv, r)?;
        if s.len % c.size != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the send length must be a multiple of the number of ranks",
            });
        }
        let count = s.len / c.size;
        let total = c.times(count, c.size)?;
        c.at_least(Role::Recv, r, total)?;
        let (sp, sa) = self.read_buf(OP, send)?;
        let (rp, ra) = self.write_buf(OP, recv)?;
        (s.ptr, r.ptr) = (sp, rp);
        c.aliasing(s, total, r, total, None)?;
        if count == 0 {
            return Ok(());
        }
        let _span = tracing::trace_span!("nccl.all_to_all", count, dtype = ?T::DATATYPE).entered();
        if self.comm.uses_send_recv(Feature::NativeAllToAll) {
            let e = c.elem_bytes;
            let counts = vec![count; c.size];
            let displs: Vec<usize> = (0..c.size).map(|i| i * count).collect();
            self.send_recv_all::<T>(OP, sp, &counts, &displs, rp, &counts, &displs, e)?;
        } else {
            let f = self.comm.library().raw().ncclAlltoAll()?;
            // SAFETY: validated: `size * count` elements at each address,
            // same device, disjoint.
            self.call(OpInfo::new(OP, count, T::DATATYPE), |comm, stream| unsafe {
                f(
                    sp as *const c_void,
                    rp as *mut c_void,
                    count,
                    T::DATATYPE,
                    comm,
                    stream,
                )
            })?;
        }
        self.settle([sa, ra]);
        Ok(())
    }

    /// All-to-all with per-peer counts and displacements (in elements):
    /// `send_counts[j]` elements from `send[send_displs[j]..]` go to rank j,
    /// `recv_counts[i]` from rank i land at `recv[recv_displs[i]..]`. Built
    /// from grouped send/recv; peers must agree on the counts.
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v<T: NcclType>(
        &self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        const OP: &str = "all_to_all_v";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        let (mut s, mut r) = (Self::span(send), Self::span(recv));
        c.device(Role::Send, s)?;
        c.device(Role::Recv, r)?;
        c.segments(Role::Send, send_counts, send_displs, s.len)?;
        c.segments(Role::Recv, recv_counts, recv_displs, r.len)?;
        let (sp, sa) = self.read_buf(OP, send)?;
        let (rp, ra) = self.write_buf(OP, recv)?;
        (s.ptr, r.ptr) = (sp, rp);
        c.aliasing(s, s.len, r, r.len, None)?;
        if send_counts.iter().chain(recv_counts).all(|n| *n == 0) {
            return Ok(());
        }
        let _span = tracing::trace_span!("nccl.all_to_all_v", dtype = ?T::DATATYPE).entered();
        let enqueued = self.send_recv_all::<T>(
            OP,
            sp,
            send_counts,
            send_displs,
            rp,
            recv_counts,
            recv_displs,
            c.elem_bytes,
        );
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([sa, ra]);
        enqueued?;
        Ok(())
    }

    /// Grouped `ncclSend`/`ncclRecv` with every peer (zero counts skipped).
    #[allow(clippy::too_many_arguments)]
    fn send_recv_all<T: NcclType>(
        &self,
        op: &'static str,
        sp: u64,
        send_counts: &[usize],
        send_displs: &[usize],
        rp: u64,
        recv_counts: &[usize],
        recv_displs: &[usize],
        elem_bytes: usize,
    ) -> Result<()> {
        let lib = self.comm.library();
        let (send, recv) = (lib.raw().ncclSend()?, lib.raw().ncclRecv()?);
        let group: GroupGuard<'a> = GroupGuard::start_internal()?;
        let on = self.within(&group);
        for peer in 0..self.comm.size() {
            let peer_c = peer as i32;
            if send_counts[peer] > 0 {
                let p = ptr(sp, send_displs[peer], elem_bytes);
                let n = send_counts[peer];
                on.call(
                    OpInfo::new(op, n, T::DATATYPE).peer(peer),
                    // SAFETY: the segment was validated to lie inside the send
                    // buffer on this device.
                    |comm, stream| unsafe {
                        send(p as *const c_void, n, T::DATATYPE, peer_c, comm, stream)
                    },
                )?;
            }
            if recv_counts[peer] > 0 {
                let p = ptr(rp, recv_displs[peer], elem_bytes);
                let n = recv_counts[peer];
                on.call(
                    OpInfo::new(op, n, T::DATATYPE).peer(peer),
                    // SAFETY: the segment was validated to lie inside the
                    // receive buffer on this device.
                    |comm, stream| unsafe {
                        recv(p as *mut c_void, n, T::DATATYPE, peer_c, comm, stream)
                    },
                )?;
            }
        }
        group.end()
    }

    /// Gather: every rank's `send` lands at block i of `root`'s `recv`.
    /// Count per rank: `send.len()`; `recv` (root only) holds at least
    /// `size * send.len()`. Native `ncclGather` on NCCL 2.28+.
    pub fn gather<T: NcclType, R: DeviceBufferMut<T> + ?Sized>(
        &self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: Option<&'a mut R>,
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclGather";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        c.rank("root", root)?;
        let mut s = Self::span(send);
        c.device(Role::Send, s)?;
        let count = s.len;
        let total = c.times(count, c.size)?;
        let is_root = self.comm.rank() == root;
        let recv = match recv {
            Some(r) if is_root => Some(r),
            None if is_root => {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "the root needs a receive buffer",
                });
            }
            _ => None,
        };
        if let Some(r) = &recv {
            let r = Self::span(&**r);
            c.device(Role::Recv, r)?;
            c.at_least(Role::Recv, r, total)?;
        }
        let (sp, sa) = self.read_buf(OP, send)?;
        s.ptr = sp;
        let (rp, ra) = match recv {
            Some(r) => {
                let mut span = Self::span(&*r);
                let (rp, ra) = self.write_buf(OP, r)?;
                span.ptr = rp;
                c.aliasing(s, count, span, total, Some(root * count))?;
                (rp, Some(ra))
            }
            None => (0, None),
        };
        if count == 0 {
            return Ok(());
        }
        let _span =
            tracing::trace_span!("nccl.gather", count, dtype = ?T::DATATYPE, root).entered();
        let enqueued = self.rooted_raw::<T>(OP, Rooted::Gather, sp, rp, count, root, is_root);
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([sa].into_iter().chain(ra));
        enqueued?;
        Ok(())
    }

    /// In-place gather. On `root`, `buf` holds `size * n` elements and its
    /// own input is already in block `root`; elsewhere `buf` is the `n`
    /// elements to send. NCCL's in-place layout: send = recv + root * n.
    pub fn gather_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclGather";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        c.rank("root", root)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let is_root = self.comm.rank() == root;
        let count = if is_root {
            if b.len % c.size != 0 {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "the root's buffer length must be a multiple of the number of ranks",
                });
            }
            b.len / c.size
        } else {
            b.len
        };
        c.times(count, c.size)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let (sp, rp) = if is_root {
            (ptr(p, root * count, c.elem_bytes), p)
        } else {
            (p, 0)
        };
        let _span =
            tracing::trace_span!("nccl.gather", count, dtype = ?T::DATATYPE, root, in_place = true)
                .entered();
        let enqueued = self.rooted_raw::<T>(OP, Rooted::Gather, sp, rp, count, root, is_root);
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([a]);
        enqueued?;
        Ok(())
    }

    /// Gather (every rank's `sp` to block i of the root's `rp`) or scatter
    /// (block i of the root's `sp` to rank i's `rp`): native where the
    /// library has it and not forced off, else grouped send/recv with the
    /// root's own block copied locally. Off the root, the root-side address
    /// is null.
    #[allow(clippy::too_many_arguments)]
    fn rooted_raw<T: NcclType>(
        &self,
        op: &'static str,
        rooted: Rooted,
        sp: u64,
        rp: u64,
        count: usize,
        root: usize,
        is_root: bool,
    ) -> Result<()> {
        let lib = self.comm.library();
        if !self.comm.uses_send_recv(Feature::NativeGatherScatter) {
            let f = match rooted {
                Rooted::Gather => lib.raw().ncclGather()?,
                Rooted::Scatter => lib.raw().ncclScatter()?,
            };
            let root_c = root as i32;
            return self.call(
                OpInfo::new(op, count, T::DATATYPE).peer(root),
                // SAFETY: validated; off the root NCCL does not use the root-side
                // buffer, which is null there.
                |comm, stream| unsafe {
                    f(
                        sp as *const c_void,
                        rp as *mut c_void,
                        count,
                        T::DATATYPE,
                        root_c,
                        comm,
                        stream,
                    )
                },
            );
        }
        let (send, recv) = (lib.raw().ncclSend()?, lib.raw().ncclRecv()?);
        let e = std::mem::size_of::<T>();
        let group: GroupGuard<'a> = GroupGuard::start_internal()?;
        let on = self.within(&group);
        if is_root {
            for peer in 0..self.comm.size() {
                // The root's block `peer`: written by gather, read by scatter.
                let block = match rooted {
                    Rooted::Gather => ptr(rp, peer * count, e),
                    Rooted::Scatter => ptr(sp, peer * count, e),
                };
                if peer == root {
                    let (from, to) = match rooted {
                        Rooted::Gather => (sp, block),
                        Rooted::Scatter => (block, rp),
                    };
                    if from != to {
                        self.local_copy::<T>(op, from, to, count)?;
                    }
                    continue;
                }
                let peer_c = peer as i32;
                match rooted {
                    Rooted::Gather => on.call(
                        OpInfo::new(op, count, T::DATATYPE).peer(peer),
                        // SAFETY: block `peer` of the validated receive buffer.
                        |comm, stream| unsafe {
                            recv(
                                block as *mut c_void,
                                count,
                                T::DATATYPE,
                                peer_c,
                                comm,
                                stream,
                            )
                        },
                    )?,
                    Rooted::Scatter => on.call(
                        OpInfo::new(op, count, T::DATATYPE).peer(peer),
                        // SAFETY: block `peer` of the validated send buffer.
                        |comm, stream| unsafe {
                            send(
                                block as *const c_void,
                                count,
                                T::DATATYPE,
                                peer_c,
                                comm,
                                stream,
                            )
                        },
                    )?,
                }
            }
        } else {
            let root_c = root as i32;
            match rooted {
                Rooted::Gather => on.call(
                    OpInfo::new(op, count, T::DATATYPE).peer(root),
                    // SAFETY: the validated send buffer.
                    |comm, stream| unsafe {
                        send(
                            sp as *const c_void,
                            count,
                            T::DATATYPE,
                            root_c,
                            comm,
                            stream,
                        )
                    },
                )?,
                Rooted::Scatter => on.call(
                    OpInfo::new(op, count, T::DATATYPE).peer(root),
                    // SAFETY: the validated receive buffer.
                    |comm, stream| unsafe {
                        recv(rp as *mut c_void, count, T::DATATYPE, root_c, comm, stream)
                    },
                )?,
            }
        }
        group.end()
    }

    /// A device-to-device copy on this stream, for the root's own block in
    /// the send/recv forms of gather and scatter.
    fn local_copy<T: NcclType>(
        &self,
        op: &'static str,
        from: u64,
        to: u64,
        count: usize,
    ) -> Result<()> {
        let bytes = count * std::mem::size_of::<T>();
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

    /// Scatter: block i of `root`'s `send` lands in rank i's `recv`. Count
    /// per rank: `recv.len()`; `send` (root only) holds at least
    /// `size * recv.len()`. Native `ncclScatter` on NCCL 2.28+.
    pub fn scatter<T: NcclType, S: DeviceBuffer<T> + ?Sized>(
        &self,
        send: Option<&'a S>,
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclScatter";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        c.rank("root", root)?;
        let mut r = Self::span(recv);
        c.device(Role::Recv, r)?;
        let count = r.len;
        let total = c.times(count, c.size)?;
        let is_root = self.comm.rank() == root;
        let send = match send {
            Some(s) if is_root => Some(s),
            None if is_root => {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "the root needs a send buffer",
                });
            }
            _ => None,
        };
        if let Some(s) = send {
            let s = Self::span(s);
            c.device(Role::Send, s)?;
            c.at_least(Role::Send, s, total)?;
        }
        let (sp, sa) = match send {
            Some(s) => {
                let (p, a) = self.read_buf(OP, s)?;
                (p, Some(a))
            }
            None => (0, None),
        };
        let (rp, ra) = self.write_buf(OP, recv)?;
        r.ptr = rp;
        if let Some(s) = send {
            let s = Span {
                ptr: sp,
                ..Self::span(s)
            };
            c.aliasing(r, count, s, total, Some(root * count))
                .map_err(|_| Error::PartialAlias {
                    op: OP,
                    send: sp,
                    send_bytes: total * c.elem_bytes,
                    recv: rp,
                    recv_bytes: count * c.elem_bytes,
                })?;
        }
        if count == 0 {
            return Ok(());
        }
        let _span =
            tracing::trace_span!("nccl.scatter", count, dtype = ?T::DATATYPE, root).entered();
        let enqueued = self.rooted_raw::<T>(OP, Rooted::Scatter, sp, rp, count, root, is_root);
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle(sa.into_iter().chain([ra]));
        enqueued?;
        Ok(())
    }

    /// In-place scatter. On `root`, `buf` holds `size * n` elements and
    /// keeps its own block `root` in place; elsewhere `buf` receives `n`
    /// elements. NCCL's in-place layout: recv = send + root * n.
    pub fn scatter_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclScatter";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        c.rank("root", root)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let is_root = self.comm.rank() == root;
        let count = if is_root {
            if b.len % c.size != 0 {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "the root's buffer length must be a multiple of the number of ranks",
                });
            }
            b.len / c.size
        } else {
            b.len
        };
        c.times(count, c.size)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let (sp, rp) = if is_root {
            (p, ptr(p, root * count, c.elem_bytes))
        } else {
            (0, p)
        };
        let _span = tracing::trace_span!("nccl.scatter", count, dtype = ?T::DATATYPE, root, in_place = true).entered();
        let enqueued = self.rooted_raw::<T>(OP, Rooted::Scatter, sp, rp, count, root, is_root);
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([a]);
        enqueued?;
        Ok(())
    }

    // ---- point to point --------------------------------------------------------

    /// `ncclSend` of all of `buf` to `peer`, which must post a matching
    /// `recv`. Pair sends and receives that must progress together in one
    /// group.
    pub fn send<T: NcclType>(
        &self,
        buf: &'a (impl DeviceBuffer<T> + ?Sized),
        peer: usize,
    ) -> Result<()> {
        const OP: &str = "ncclSend";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        c.rank("peer", peer)?;
        let b = Self::span(buf);
        c.device(Role::Send, b)?;
        let count = b.len;
        c.times(count, 1)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.read_buf(OP, buf)?;
        let _span = tracing::trace_span!("nccl.send", count, dtype = ?T::DATATYPE, peer).entered();
        let f = self.comm.library().raw().ncclSend()?;
        let peer_c = peer as i32;
        let enqueued = self.call(
            OpInfo::new(OP, count, T::DATATYPE).peer(peer),
            // SAFETY: `count` readable elements at `p` on this device.
            |comm, stream| unsafe {
                f(p as *const c_void, count, T::DATATYPE, peer_c, comm, stream)
            },
        );
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([a]);
        enqueued?;
        Ok(())
    }

    /// `ncclRecv` of `buf.len()` elements from `peer`.
    pub fn recv<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        peer: usize,
    ) -> Result<()> {
        const OP: &str = "ncclRecv";
        let c = self.check::<T>(OP)?;
        check_dtype::<T>(self.comm, OP, false)?;
        c.rank("peer", peer)?;
        let b = Self::span(buf);
        c.device(Role::Recv, b)?;
        let count = b.len;
        c.times(count, 1)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let _span = tracing::trace_span!("nccl.recv", count, dtype = ?T::DATATYPE, peer).entered();
        let f = self.comm.library().raw().ncclRecv()?;
        let peer_c = peer as i32;
        let enqueued = self.call(
            OpInfo::new(OP, count, T::DATATYPE).peer(peer),
            // SAFETY: `count` writable elements at `p` on this device.
            |comm, stream| unsafe { f(p as *mut c_void, count, T::DATATYPE, peer_c, comm, stream) },
        );
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([a]);
        enqueued?;
        Ok(())
    }
}

/// Direct forms on the communicator's own stream (outside groups).
impl Comm {
    /// Operations on `stream` instead of the communicator's own.
    pub fn on<'a>(&'a self, stream: &'a CudaStream) -> OnStream<'a, 'a> {
        OnStream::direct(self, stream)
    }

    fn own(&self) -> OnStream<'_, '_> {
        OnStream::direct(self, self.stream())
    }

    /// See [`OnStream::all_reduce`].
    pub fn all_reduce<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        self.own().all_reduce(send, recv, op)
    }

    /// See [`OnStream::all_reduce_in_place`].
    pub fn all_reduce_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        self.own().all_reduce_in_place(buf, op)
    }

    /// See [`OnStream::reduce`].
    pub fn reduce<'a, T: NcclType, R: DeviceBufferMut<T> + ?Sized>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: Option<&'a mut R>,
        op: impl Reduction<'a, T>,
        root: usize,
    ) -> Result<()> {
        self.own().reduce(send, recv, op, root)
    }

    /// See [`OnStream::reduce_in_place`].
    pub fn reduce_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
        root: usize,
    ) -> Result<()> {
        self.own().reduce_in_place(buf, op, root)
    }

    /// See [`OnStream::reduce_scatter`].
    pub fn reduce_scatter<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        self.own().reduce_scatter(send, recv, op)
    }

    /// See [`OnStream::reduce_scatter_in_place`].
    pub fn reduce_scatter_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        self.own().reduce_scatter_in_place(buf, op)
    }

    /// See [`OnStream::broadcast`].
    pub fn broadcast<'a, T: NcclType, S: DeviceBuffer<T> + ?Sized>(
        &'a self,
        send: Option<&'a S>,
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().broadcast(send, recv, root)
    }

    /// See [`OnStream::broadcast_in_place`].
    pub fn broadcast_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().broadcast_in_place(buf, root)
    }

    /// See [`OnStream::all_gather`].
    pub fn all_gather<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        self.own().all_gather(send, recv)
    }

    /// See [`OnStream::all_gather_in_place`].
    pub fn all_gather_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        self.own().all_gather_in_place(buf)
    }

    /// See [`OnStream::all_to_all`].
    pub fn all_to_all<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        self.own().all_to_all(send, recv)
    }

    /// See [`OnStream::all_to_all_v`].
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v<'a, T: NcclType>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        self.own().all_to_all_v(
            send,
            send_counts,
            send_displs,
            recv,
            recv_counts,
            recv_displs,
        )
    }

    /// See [`OnStream::gather`].
    pub fn gather<'a, T: NcclType, R: DeviceBufferMut<T> + ?Sized>(
        &'a self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: Option<&'a mut R>,
        root: usize,
    ) -> Result<()> {
        self.own().gather(send, recv, root)
    }

    /// See [`OnStream::gather_in_place`].
    pub fn gather_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().gather_in_place(buf, root)
    }

    /// See [`OnStream::scatter_in_place`].
    pub fn scatter_in_place<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().scatter_in_place(buf, root)
    }

    /// See [`OnStream::scatter`].
    pub fn scatter<'a, T: NcclType, S: DeviceBuffer<T> + ?Sized>(
        &'a self,
        send: Option<&'a S>,
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        self.own().scatter(send, recv, root)
    }

    /// See [`OnStream::send`].
    pub fn send<'a, T: NcclType>(
        &'a self,
        buf: &'a (impl DeviceBuffer<T> + ?Sized),
        peer: usize,
    ) -> Result<()> {
        self.own().send(buf, peer)
    }

    /// See [`OnStream::recv`].
    pub fn recv<'a, T: NcclType>(
        &'a self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        peer: usize,
    ) -> Result<()> {
        self.own().recv(buf, peer)
    }
}
