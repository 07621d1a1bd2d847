//! Data movement without a root: broadcast, all-gather, all-to-all, and
//! point to point.

use std::ffi::c_void;

use crate::Feature;
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::NcclType;
use crate::error::Role;
use crate::group::GroupGuard;
use crate::observe::OpInfo;
use crate::ops::{OnStream, ptr};
use crate::validate::Span;
use crate::validate::check_dtype;
use crate::{Error, Result};

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
