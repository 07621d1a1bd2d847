//! Data movement without a reduction: broadcast, all-gather, all-to-all,
//! and point to point. Each validates its buffers and builds one [`Op`]
//! (all-to-all-v, a set of sends and receives, builds one per peer).

use crate::Result;
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::NcclType;
use crate::error::Role;
use crate::ops::op::{Kind, Op};
use crate::ops::{OnStream, ptr};

impl<'s, 'a> OnStream<'s, 'a> {
    /// `ncclBroadcast`: `root`'s `send` lands in every rank's `recv`.
    /// Count: `recv.len()`. `send` is used (and required) on `root` only.
    pub fn broadcast<T: NcclType, S: DeviceBuffer<T> + ?Sized>(
        &self,
        send: Option<&'a S>,
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclBroadcast";
        let c = self.begin::<T>(OP, false)?;
        c.rank("root", root)?;
        let mut r = Self::span(recv);
        c.device(Role::Recv, r)?;
        let count = r.len;
        c.times(count, 1)?;
        let send = self.at_root(OP, send, root, "the root needs a send buffer")?;
        if let Some(s) = send {
            c.holds(Role::Send, Self::span(s), count)?;
        }
        let send = self.read_at_root(OP, send)?;
        let (rp, ra) = self.write_buf(OP, recv)?;
        r.ptr = rp;
        if let Some((s, _)) = send {
            c.aliasing(s, count, r, count, Some(0))?;
        }
        let (sp, sa) = Self::root_side(send);
        if count == 0 {
            return Ok(());
        }
        let o = Op::of::<T>(OP, Kind::Broadcast, count)
            .buffers(sp, rp)
            .peer(root);
        // SAFETY: validated; `sp` is null off the root, where NCCL does not
        // read the send buffer.
        unsafe { self.enqueue(o, sa.into_iter().chain([ra])) }
    }

    /// In-place `ncclBroadcast`: `root`'s `buf` overwrites everyone's.
    pub fn broadcast_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        root: usize,
    ) -> Result<()> {
        const OP: &str = "ncclBroadcast";
        let c = self.begin::<T>(OP, false)?;
        c.rank("root", root)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let count = b.len;
        c.times(count, 1)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let o = Op::of::<T>(OP, Kind::Broadcast, count)
            .buffers(p, p)
            .peer(root);
        // SAFETY: `count` elements at `p` on this device, in place.
        unsafe { self.enqueue(o.in_place(), [a]) }
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
        let c = self.begin::<T>(OP, false)?;
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
        let o = Op::of::<T>(OP, Kind::AllGather, count).buffers(sp, rp);
        // SAFETY: validated: `count` readable at `sp`, `size * count`
        // writable at `rp`, same device, NCCL's layout or disjoint.
        unsafe { self.enqueue(o, [sa, ra]) }
    }

    /// In-place `ncclAllGather`: `buf` holds `size * n`; this rank's input
    /// is its own block.
    pub fn all_gather_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<()> {
        const OP: &str = "ncclAllGather";
        let c = self.begin::<T>(OP, false)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let count = c.blocks(
            b.len,
            "the buffer length must be a multiple of the number of ranks",
        )?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let sp = ptr(p, c.rank * count, c.elem_bytes);
        let o = Op::of::<T>(OP, Kind::AllGather, count).buffers(sp, p);
        // SAFETY: `size * count` elements at `p`; the input is this rank's
        // block, NCCL's in-place layout.
        unsafe { self.enqueue(o.in_place(), [a]) }
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
        let c = self.begin::<T>(OP, false)?;
        let (mut s, mut r) = (Self::span(send), Self::span(recv));
        c.device(Role::Send, s)?;
        c.device(Role::Recv, r)?;
        let count = c.blocks(
            s.len,
            "the send length must be a multiple of the number of ranks",
        )?;
        let total = c.times(count, c.size)?;
        c.at_least(Role::Recv, r, total)?;
        let (sp, sa) = self.read_buf(OP, send)?;
        let (rp, ra) = self.write_buf(OP, recv)?;
        (s.ptr, r.ptr) = (sp, rp);
        c.aliasing(s, total, r, total, None)?;
        if count == 0 {
            return Ok(());
        }
        let o = Op::of::<T>(OP, Kind::AllToAll, count).buffers(sp, rp);
        // SAFETY: validated: `size * count` elements at each address, same
        // device, disjoint.
        unsafe { self.enqueue(o, [sa, ra]) }
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
        let c = self.begin::<T>(OP, false)?;
        let (mut s, mut r) = (Self::span(send), Self::span(recv));
        c.device(Role::Send, s)?;
        c.device(Role::Recv, r)?;
        c.segments(Role::Send, send_counts, send_displs, s.len)?;
        c.segments(Role::Recv, recv_counts, recv_displs, r.len)?;
        let (sp, sa) = self.read_buf(OP, send)?;
        let (rp, ra) = self.write_buf(OP, recv)?;
        (s.ptr, r.ptr) = (sp, rp);
        c.aliasing(s, s.len, r, r.len, None)?;
        // Each peer's part is a send or a receive of its own count.
        let o = Op::of::<T>(OP, Kind::Send, 0).buffers(sp, rp);
        // Gated by the directions its non-zero counts connect (the same
        // pairs on both sides when the counts agree), the first one by
        // every rank. Inside a group it may be held back to the group's
        // end (see `defers`).
        let counts = Some((send_counts, recv_counts));
        if send_counts.iter().chain(recv_counts).all(|n| *n == 0) {
            // Nothing to send or receive; but at the first all-to-all-v
            // this rank still meets the others, who wait for every rank.
            if !self.comm.gates.get() || self.gate_needed(&o, counts).is_empty() {
                return Ok(());
            }
            if let Some(hold) = self.defers(&o, counts) {
                self.defer_with(&o, counts, hold, Box::new(|_| Ok(())));
                return Ok(());
            }
            return self.gate(&o, counts);
        }
        let _span = tracing::trace_span!("nccl.all_to_all_v", dtype = ?T::DATATYPE).entered();
        if let Some(hold) = self.defers(&o, counts) {
            let owned = [send_counts, send_displs, recv_counts, recv_displs].map(<[usize]>::to_vec);
            self.defer_with(
                &o,
                counts,
                hold,
                Box::new(move |on| {
                    let [sc, sd, rc, rd] = &owned;
                    // SAFETY: as below; the group held the buffers until
                    // now, its end.
                    unsafe { on.send_recv_all(&o, sc, sd, rc, rd) }
                }),
            );
            self.settle([sa, ra]);
            return Ok(());
        }
        if self.comm.gates.get()
            && (self.hold.is_none() || self.capture.is_some())
            && let Err(e) = self.gate(&o, counts)
        {
            self.settle([sa, ra]);
            return Err(e);
        }
        // SAFETY: every segment was validated to lie inside its buffer on
        // this device; the buffers do not overlap.
        let enqueued =
            unsafe { self.send_recv_all(&o, send_counts, send_displs, recv_counts, recv_displs) };
        // Settled even on error: work queued before the failure keeps its
        // buffers' bookkeeping until the group launches it.
        self.settle([sa, ra]);
        enqueued
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
        let c = self.begin::<T>(OP, false)?;
        c.rank("peer", peer)?;
        let b = Self::span(buf);
        c.device(Role::Send, b)?;
        let count = b.len;
        c.times(count, 1)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.read_buf(OP, buf)?;
        let o = Op::of::<T>(OP, Kind::Send, count).buffers(p, 0).peer(peer);
        // SAFETY: `count` readable elements at `p` on this device.
        unsafe { self.enqueue(o, [a]) }
    }

    /// `ncclRecv` of `buf.len()` elements from `peer`.
    pub fn recv<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        peer: usize,
    ) -> Result<()> {
        const OP: &str = "ncclRecv";
        let c = self.begin::<T>(OP, false)?;
        c.rank("peer", peer)?;
        let b = Self::span(buf);
        c.device(Role::Recv, b)?;
        let count = b.len;
        c.times(count, 1)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let o = Op::of::<T>(OP, Kind::Recv, count).buffers(0, p).peer(peer);
        // SAFETY: `count` writable elements at `p` on this device.
        unsafe { self.enqueue(o, [a]) }
    }
}
