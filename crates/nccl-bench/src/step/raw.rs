//! The raw side of `--step`: the same step as nccl-sys function pointers
//! on the raw handles of blocking, unwatched communicators, as a C program
//! would issue it (see `mod.rs` for the step).

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::Arc;

use half::bf16;
use nccl_dist::nccl_safe::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use nccl_dist::nccl_safe::nccl_sys::{cudaStream_t, ncclComm_t, ncclRedOp_t, ncclResult_t};
use nccl_dist::nccl_safe::segments::{self, Seg};
use nccl_dist::nccl_safe::{Comm, NcclType, ReduceOp};

use crate::error::Result;
use crate::fns::Fns;

use super::bufs::{Bufs, Layout};

pub fn ok(what: &str, code: ncclResult_t) -> Result<()> {
    if code == ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(format!("{what} returned {code:?}").into())
    }
}

/// Device addresses of a side's buffers, read once.
pub struct Ptrs {
    pub bcast: u64,
    pub tp_in: u64,
    pub tp_out: u64,
    pub a2a_in: u64,
    pub a2a_out: u64,
    pub grad: u64,
    pub shard: u64,
    pub full: u64,
    pub ring_send: u64,
    pub ring_recv: u64,
    pub avg_in: u64,
    pub avg_out: u64,
    pub loss_in: u64,
    pub loss_out: u64,
}

impl Ptrs {
    pub fn of(b: &Bufs, s: &Arc<CudaStream>) -> Ptrs {
        fn p<T>(b: &CudaSlice<T>, s: &Arc<CudaStream>) -> u64 {
            b.device_ptr(s).0
        }
        Ptrs {
            bcast: p(&b.bcast, s),
            tp_in: p(&b.tp_in, s),
            tp_out: p(&b.tp_out, s),
            a2a_in: p(&b.a2a_in, s),
            a2a_out: p(&b.a2a_out, s),
            grad: p(&b.grad, s),
            shard: p(&b.shard, s),
            full: p(&b.full, s),
            ring_send: p(&b.ring_send, s),
            ring_recv: p(&b.ring_recv, s),
            avg_in: p(&b.avg_in, s),
            avg_out: p(&b.avg_out, s),
            loss_in: p(&b.loss_in, s),
            loss_out: p(&b.loss_out, s),
        }
    }
}

/// A raw side: the handles of blocking communicators, driven with nccl-sys
/// calls that no observer sees (the raw side's split communicators, which
/// nothing watches, or the mesh's own for `raw_mesh`).
pub struct Raw {
    pub f: Fns,
    /// The handles, set while [`Raw::holding`] holds the
    /// communicators (null otherwise).
    pub dp: Cell<ncclComm_t>,
    pub tp: Cell<ncclComm_t>,
    pub stream: cudaStream_t,
    pub avg: ncclRedOp_t,
    pub next: i32,
    pub prev: i32,
    pub l: Layout,
}

/// `call`, marked for `--features segments` (nothing otherwise): NCCL's
/// time here against its time on the typed path.
#[inline(always)]
fn t(call: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    timed(Seg::Nccl, call)
}

/// As [`t`], for `ncclGroupStart` and `ncclGroupEnd`.
#[inline(always)]
fn g(call: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    timed(Seg::GroupNccl, call)
}

#[inline(always)]
fn timed(seg: Seg, call: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    segments::mark(Seg::Outside);
    let code = call();
    segments::mark(seg);
    code
}

impl Raw {
    /// Runs `f` with the handles set, `dp` and `tp` held (alive, not
    /// aborted, used by this thread only) for its duration: a loop of raw
    /// steps inside takes no lock of ours, as a C program's would not. Nothing
    /// inside may call the safe API on `dp` or `tp` (it would wait for this
    /// thread).
    pub fn holding<R>(&self, dp: &Comm, tp: &Comm, f: impl FnOnce() -> Result<R>) -> Result<R> {
        // The handles set for `f`, cleared before the closures return.
        let with = |d: ncclComm_t, t: ncclComm_t| {
            self.dp.set(d);
            self.tp.set(t);
            let out = f();
            self.dp.set(std::ptr::null_mut());
            self.tp.set(std::ptr::null_mut());
            out
        };
        // SAFETY: the handles are used only by `Raw::step` on this thread,
        // for calls the typed API would make itself, and are cleared before
        // the closures return. One rank: both axes of the mesh are its
        // whole communicator, whose lock is taken once.
        let held = unsafe {
            if dp.same_communicator(tp) {
                dp.with_raw(|d| Ok(with(d, d)))
            } else {
                dp.with_raw(|d| tp.with_raw(|t| with(d, t)))
            }
        };
        held??
    }

    /// # Safety
    ///
    /// `ptrs` address live buffers of the layout on this rank's device,
    /// allocated until the stream is idle; the handles are live and used
    /// by this thread only.
    pub unsafe fn step(&self, b: &Ptrs) -> Result<()> {
        let f = &self.f;
        let (bf, fl) = (bf16::DATATYPE, f32::DATATYPE);
        let sum = ReduceOp::Sum.raw();
        let (dp, tp, st, l) = (self.dp.get(), self.tp.get(), self.stream, &self.l);
        let p = |a: u64| a as *const c_void;
        let m = |a: u64| a as *mut c_void;
        // SAFETY: the caller's promise; counts match the buffers of `l`.
        unsafe {
            ok(
                "ncclBroadcast",
                t(|| (f.broadcast)(p(b.bcast), m(b.bcast), l.bcast, fl, 0, tp, st)),
            )?;
            ok(
                "ncclAllReduce",
                t(|| (f.all_reduce)(p(b.tp_in), m(b.tp_out), l.tp_sum, bf, sum, tp, st)),
            )?;
            match f.all_to_all {
                Some(a2a) => ok(
                    "ncclAlltoAll",
                    t(|| a2a(p(b.a2a_in), m(b.a2a_out), l.a2a, bf, dp, st)),
                )?,
                None => {
                    ok("ncclGroupStart", (f.group_start)())?;
                    let mut code = ncclResult_t::ncclSuccess;
                    for peer in 0..l.dp {
                        let off = (peer * l.a2a * 2) as u64;
                        let r = peer as i32;
                        let a = (f.send)(p(b.a2a_in + off), l.a2a, bf, r, dp, st);
                        let c = (f.recv)(m(b.a2a_out + off), l.a2a, bf, r, dp, st);
                        for x in [a, c] {
                            if code == ncclResult_t::ncclSuccess {
                                code = x;
                            }
                        }
                    }
                    let end = (f.group_end)();
                    ok("all_to_all by send/recv", code)?;
                    ok("ncclGroupEnd", end)?;
                }
            }
            ok(
                "ncclReduceScatter",
                t(|| (f.reduce_scatter)(p(b.grad), m(b.shard), l.shard, bf, sum, dp, st)),
            )?;
            ok(
                "ncclAllGather",
                t(|| (f.all_gather)(p(b.shard), m(b.full), l.shard, bf, dp, st)),
            )?;
            ok("ncclGroupStart", g(|| (f.group_start)()))?;
            let a = t(|| (f.send)(p(b.ring_send), l.ring, fl, self.next, dp, st));
            let c = t(|| (f.recv)(m(b.ring_recv), l.ring, fl, self.prev, dp, st));
            let end = g(|| (f.group_end)());
            ok("ncclSend", a)?;
            ok("ncclRecv", c)?;
            ok("ncclGroupEnd", end)?;
            ok(
                "ncclAllReduce (PreMulSum)",
                t(|| (f.all_reduce)(p(b.avg_in), m(b.avg_out), l.avg, fl, self.avg, dp, st)),
            )?;
            ok(
                "ncclAllReduce",
                t(|| (f.all_reduce)(p(b.loss_in), m(b.loss_out), l.loss, fl, sum, dp, st)),
            )?;
        }
        Ok(())
    }
}
