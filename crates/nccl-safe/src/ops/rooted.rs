//! Gather and scatter: native, or built from grouped send/recv.

use std::ffi::c_void;

use crate::Feature;
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::NcclType;
use crate::error::Role;
use crate::group::GroupGuard;
use crate::observe::OpInfo;
use crate::ops::{OnStream, Rooted, ptr};
use crate::validate::Span;
use crate::validate::check_dtype;
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
}
