//! The reductions: all-reduce, reduce, reduce-scatter. Each validates its
//! buffers and builds one [`Op`].

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::NcclType;
use crate::error::Role;
use crate::ops::op::{Kind, Op};
use crate::ops::{OnStream, ptr};
use crate::reduce_op::Reduction;
use crate::validate::Span;
use crate::{Error, Result};

impl<'s, 'a> OnStream<'s, 'a> {
    /// `ncclAllReduce`: every rank's `recv` gets the reduction of all
    /// ranks' `send`. Count: `send.len()`.
    pub fn all_reduce<T: NcclType>(
        &self,
        send: &'a (impl DeviceBuffer<T> + ?Sized),
        recv: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        const OP: &str = "ncclAllReduce";
        let c = self.begin_reducing::<T>(OP, &op)?;
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
        let o = Op::of::<T>(OP, Kind::AllReduce, count)
            .buffers(sp, rp)
            .reduce(redop, op.name());
        let o = o.fast(self.one_shot_for(send.one_shot(), &o)?);
        // SAFETY: validated: both buffers on this device, `count` elements
        // readable at `sp` and writable at `rp`, no partial overlap; the
        // op belongs to this communicator.
        unsafe { self.enqueue(o, [sa, ra].into_iter().chain(scalar)) }
    }

    /// In-place `ncclAllReduce` on `buf`.
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        const OP: &str = "ncclAllReduce";
        let c = self.begin_reducing::<T>(OP, &op)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let count = b.len;
        c.times(count, 1)?;
        let redop = self.redop(OP, &op)?;
        if count == 0 {
            return Ok(());
        }
        let view = buf.one_shot();
        let (p, a) = self.write_buf(OP, buf)?;
        let scalar = op.scalar_access(self.stream);
        let o = Op::of::<T>(OP, Kind::AllReduce, count)
            .buffers(p, p)
            .reduce(redop, op.name())
            .in_place();
        let o = o.fast(self.one_shot_for(view, &o)?);
        // SAFETY: `count` elements at `p` on this device, read and written
        // in place as NCCL defines for sendbuff == recvbuff.
        unsafe { self.enqueue(o, [a].into_iter().chain(scalar)) }
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
        let c = self.begin_reducing::<T>(OP, &op)?;
        c.rank("root", root)?;
        let mut s = Self::span(send);
        c.device(Role::Send, s)?;
        let count = s.len;
        c.times(count, 1)?;
        let recv = self.at_root(OP, recv, root, "the root needs a receive buffer")?;
        if let Some(r) = &recv {
            c.holds(Role::Recv, Self::span(&**r), count)?;
        }
        let redop = self.redop(OP, &op)?;
        let (sp, sa) = self.read_buf(OP, send)?;
        s.ptr = sp;
        let recv = self.write_at_root(OP, recv)?;
        if let Some((r, _)) = recv {
            c.aliasing(s, count, r, count, Some(0))?;
        }
        let (rp, ra) = Self::root_side(recv);
        if count == 0 {
            return Ok(());
        }
        let scalar = op.scalar_access(self.stream);
        let o = Op::of::<T>(OP, Kind::Reduce, count)
            .buffers(sp, rp)
            .peer(root);
        // SAFETY: validated as for all_reduce; `rp` is null off the root,
        // where NCCL does not use the receive buffer.
        unsafe {
            self.enqueue(
                o.reduce(redop, op.name()),
                [sa].into_iter().chain(ra).chain(scalar),
            )
        }
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
        let c = self.begin_reducing::<T>(OP, &op)?;
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
        let o = Op::of::<T>(OP, Kind::Reduce, count)
            .buffers(p, p)
            .peer(root);
        // SAFETY: `count` elements at `p` on this device, in place.
        unsafe {
            self.enqueue(
                o.reduce(redop, op.name()).in_place(),
                [a].into_iter().chain(scalar),
            )
        }
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
        let c = self.begin_reducing::<T>(OP, &op)?;
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
        let o = Op::of::<T>(OP, Kind::ReduceScatter, count).buffers(sp, rp);
        // SAFETY: validated: `size * count` elements readable at `sp`,
        // `count` writable at `rp`, same device, NCCL's layout or disjoint.
        unsafe {
            self.enqueue(
                o.reduce(redop, op.name()),
                [sa, ra].into_iter().chain(scalar),
            )
        }
    }

    /// In-place `ncclReduceScatter`: `buf` holds `size * n` inputs; rank
    /// i's result lands in its own block `[i*n, (i+1)*n)`.
    pub fn reduce_scatter_in_place<T: NcclType>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
        op: impl Reduction<'a, T>,
    ) -> Result<()> {
        const OP: &str = "ncclReduceScatter";
        let c = self.begin_reducing::<T>(OP, &op)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let count = c.blocks(
            b.len,
            "the buffer length must be a multiple of the number of ranks",
        )?;
        let redop = self.redop(OP, &op)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let scalar = op.scalar_access(self.stream);
        let rp = ptr(p, c.rank * count, c.elem_bytes);
        let o = Op::of::<T>(OP, Kind::ReduceScatter, count).buffers(p, rp);
        // SAFETY: `size * count` elements at `p`; the output is this rank's
        // block, NCCL's in-place layout.
        unsafe {
            self.enqueue(
                o.reduce(redop, op.name()).in_place(),
                [a].into_iter().chain(scalar),
            )
        }
    }
}
