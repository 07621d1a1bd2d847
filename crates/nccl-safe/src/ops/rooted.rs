//! Gather and scatter. Each validates its buffers and builds one [`Op`];
//! the enqueue runs it natively or as grouped send/recv.

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::NcclType;
use crate::error::Role;
use crate::ops::op::{Kind, Op};
use crate::ops::{OnStream, ptr};
use crate::validate::{Check, Span};
use crate::{Error, Result};

impl<'s, 'a> OnStream<'s, 'a> {
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
        let c = self.begin::<T>(OP, false)?;
        c.rank("root", root)?;
        let mut s = Self::span(send);
        c.device(Role::Send, s)?;
        let count = s.len;
        let total = c.times(count, c.size)?;
        let recv = self.at_root(OP, recv, root, "the root needs a receive buffer")?;
        if let Some(r) = &recv {
            c.holds(Role::Recv, Self::span(&**r), total)?;
        }
        let (sp, sa) = self.read_buf(OP, send)?;
        s.ptr = sp;
        let recv = self.write_at_root(OP, recv)?;
        if let Some((r, _)) = recv {
            c.aliasing(s, count, r, total, Some(root * count))?;
        }
        let (rp, ra) = Self::root_side(recv);
        if count == 0 {
            return Ok(());
        }
        let o = Op::of::<T>(OP, Kind::Gather, count)
            .buffers(sp, rp)
            .peer(root);
        // SAFETY: validated; off the root the root-side address is null,
        // where NCCL does not use it.
        unsafe { self.enqueue(o, [sa].into_iter().chain(ra)) }
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
        let c = self.begin::<T>(OP, false)?;
        c.rank("root", root)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let (count, is_root) = self.in_place_count(&c, b, root)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let (sp, rp) = if is_root {
            (ptr(p, root * count, c.elem_bytes), p)
        } else {
            (p, 0)
        };
        let o = Op::of::<T>(OP, Kind::Gather, count)
            .buffers(sp, rp)
            .peer(root);
        // SAFETY: validated; off the root the root-side address is null,
        // where NCCL does not use it.
        unsafe { self.enqueue(o.in_place(), [a]) }
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
        let c = self.begin::<T>(OP, false)?;
        c.rank("root", root)?;
        let mut r = Self::span(recv);
        c.device(Role::Recv, r)?;
        let count = r.len;
        let total = c.times(count, c.size)?;
        let send = self.at_root(OP, send, root, "the root needs a send buffer")?;
        if let Some(s) = send {
            c.holds(Role::Send, Self::span(s), total)?;
        }
        let send = self.read_at_root(OP, send)?;
        let (rp, ra) = self.write_buf(OP, recv)?;
        r.ptr = rp;
        if let Some((s, _)) = send {
            c.aliasing(r, count, s, total, Some(root * count))
                .map_err(|_| Error::PartialAlias {
                    op: OP,
                    send: s.ptr,
                    send_bytes: total * c.elem_bytes,
                    recv: rp,
                    recv_bytes: count * c.elem_bytes,
                })?;
        }
        let (sp, sa) = Self::root_side(send);
        if count == 0 {
            return Ok(());
        }
        let o = Op::of::<T>(OP, Kind::Scatter, count)
            .buffers(sp, rp)
            .peer(root);
        // SAFETY: validated; off the root the root-side address is null,
        // where NCCL does not use it.
        unsafe { self.enqueue(o, sa.into_iter().chain([ra])) }
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
        let c = self.begin::<T>(OP, false)?;
        c.rank("root", root)?;
        let b = Self::span(buf);
        c.device(Role::InPlace, b)?;
        let (count, is_root) = self.in_place_count(&c, b, root)?;
        if count == 0 {
            return Ok(());
        }
        let (p, a) = self.write_buf(OP, buf)?;
        let (sp, rp) = if is_root {
            (p, ptr(p, root * count, c.elem_bytes))
        } else {
            (0, p)
        };
        let o = Op::of::<T>(OP, Kind::Scatter, count)
            .buffers(sp, rp)
            .peer(root);
        // SAFETY: validated; off the root the root-side address is null,
        // where NCCL does not use it.
        unsafe { self.enqueue(o.in_place(), [a]) }
    }

    /// The count of an in-place gather or scatter: on the root, `b` holds
    /// one block per rank; elsewhere it is the block. With whether this
    /// rank is the root.
    fn in_place_count(&self, c: &Check, b: Span, root: usize) -> Result<(usize, bool)> {
        let is_root = self.comm.rank() == root;
        let count = if is_root {
            c.blocks(
                b.len,
                "the root's buffer length must be a multiple of the number of ranks",
            )?
        } else {
            b.len
        };
        c.times(count, c.size)?;
        Ok((count, is_root))
    }
}
