//! Symmetric buffers: NCCL memory (`ncclMemAlloc`) registered as a
//! symmetric window (`NCCL_WIN_COLL_SYMMETRIC`, NCCL 2.27+) on every rank
//! of a communicator. NCCL runs its symmetric kernels for an all-reduce,
//! reduce-scatter or all-gather whose send and receive buffers are both
//! such windows (single node, every pair of GPUs with CUDA P2P); other
//! buffers keep its default path. See
//! `docs/research/nccl-2.28-symmetric-kernels.md`.
//!
//! Making and dropping one are collective: every rank of the communicator
//! makes (and drops) its buffer of the same length in the same order. With
//! a thread or a process per rank that is [`SymmetricBuffer::new`] and the
//! drop; one thread driving several ranks' communicators makes them
//! together with [`SymmetricBuffer::new_all`] and drops them together with
//! [`SymmetricBuffer::drop_all`] (one at a time, each rank's registration
//! or barrier would wait for ranks this thread has not reached: the drop
//! then times out and leaks).
//!
//! - **Creation** can hang inside NCCL: registration ends in a barrier
//!   over every rank, which on a blocking communicator waits with no
//!   deadline for a rank that never comes. So where the communicator has
//!   an observer that gates calls (nccl-dist's watchdog with its liveness
//!   channel), the ranks first meet there and compare the lengths; a
//!   missing rank or a different length is a typed error before NCCL sees
//!   anything ([`crate::Error::CheckFailed`]).
//! - **Drop** must not free memory that a peer's kernels may still read
//!   (they read this rank's buffer directly, and deregistration has no
//!   barrier). It waits for this rank's work on the buffer, then for the
//!   ranks to meet (a one-element all-reduce on the communicator), each
//!   wait bounded by the communicator's timeout; then it deregisters and
//!   frees. When any step fails (a timeout, an aborted communicator, a
//!   group open on this thread, a rank that did not drop its buffer), the
//!   memory is leaked and the window left registered: never freed while a
//!   peer may touch it.
//!
//! A [`crate::capture`]d graph can own symmetric buffers ([`Captured`]):
//! NCCL's symmetric kernels are captured as any other. One thread driving
//! several ranks takes a graph's buffers back
//! ([`crate::CapturedGroup::into_buffers`]) and drops them with
//! [`SymmetricBuffer::drop_all`]: dropped with the graph, each buffer's
//! meeting would wait for ranks the thread has not reached, time out, and
//! leak it.
//!
//! Nothing here has run on a GPU yet.

use std::mem::ManuallyDrop;

use crate::buffer::{Access, DeviceBuffer, DeviceBufferMut};
use crate::capture::{Captured, Opened};
use crate::comm::Comm;
use crate::dtype::NcclType;
use crate::error::{Error, Result};
use crate::memory::{NcclMemory, Window};
use crate::observe::OpInfo;
use crate::reduce_op::ReduceOp;
use cudarc::driver::CudaStream;

/// The name the ranks meet under before registering.
const OP: &str = "ncclCommWindowRegister";

/// NCCL memory registered as a symmetric window on every rank of a
/// communicator (see the module docs). Collectives take it as any buffer.
///
/// ```no_run
/// # fn demo(comm: &nccl_safe::Comm) -> nccl_safe::Result<()> {
/// use nccl_safe::{ReduceOp, SymmetricBuffer};
///
/// // Every rank, the same length, the same order.
/// let send = SymmetricBuffer::<f32>::new(comm, 1 << 18)?;
/// let mut recv = SymmetricBuffer::<f32>::new(comm, 1 << 18)?;
/// comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
/// comm.synchronize(comm.stream())?;
/// # Ok(()) }
/// ```
pub struct SymmetricBuffer<'c, T: NcclType> {
    comm: &'c Comm,
    /// Taken only by the drop, once every rank is done with it.
    window: ManuallyDrop<Window<'c, NcclMemory<T>>>,
}

impl<T: NcclType> std::fmt::Debug for SymmetricBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffer")
            .field("len", &self.window.len())
            .field("device", &self.window.device())
            .finish_non_exhaustive()
    }
}

impl<'c, T: NcclType> SymmetricBuffer<'c, T> {
    /// A buffer of `len` elements, registered on every rank; its contents
    /// are unspecified until written. Collective. `len` 0 and an open
    /// group are [`Error::InvalidArgument`], a library without windows the
    /// capability check's error, all before any NCCL call.
    pub fn new(comm: &'c Comm, len: usize) -> Result<SymmetricBuffer<'c, T>> {
        if len == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "a symmetric buffer of no element",
            });
        }
        if crate::group::is_open() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "a symmetric buffer is made collectively, outside a group",
            });
        }
        comm.library()
            .capabilities()
            .require(crate::capabilities::Feature::Windows)?;
        meet::<T>(comm, len)?;
        let memory = NcclMemory::<T>::alloc(comm, len)?;
        let window = Window::register(comm, memory, nccl_sys::NCCL_WIN_COLL_SYMMETRIC)?;
        Ok(SymmetricBuffer {
            comm,
            window: ManuallyDrop::new(window),
        })
    }

    /// One buffer of `len` elements per communicator of `comms`, driven by
    /// this thread (one rank each), registered in one group. The checks of
    /// [`SymmetricBuffer::new`] come first; the ranks meet in the group, so
    /// no observer's meeting is asked for.
    pub fn new_all(comms: &[&'c Comm], len: usize) -> Result<Vec<SymmetricBuffer<'c, T>>> {
        if len == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "a symmetric buffer of no element",
            });
        }
        if crate::group::is_open() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "symmetric buffers are made collectively, outside a group",
            });
        }
        for comm in comms {
            comm.library()
                .capabilities()
                .require(crate::capabilities::Feature::Windows)?;
        }
        let memories = comms
            .iter()
            .map(|comm| NcclMemory::<T>::alloc(comm, len))
            .collect::<Result<Vec<_>>>()?;
        let windows = Window::register_all(comms, memories, nccl_sys::NCCL_WIN_COLL_SYMMETRIC)?;
        Ok(windows
            .into_iter()
            .zip(comms)
            .map(|(window, comm)| SymmetricBuffer {
                comm,
                window: ManuallyDrop::new(window),
            })
            .collect())
    }

    /// Drops buffers of [`SymmetricBuffer::new_all`] (one per communicator
    /// this thread drives) together: each one's work done, the ranks met
    /// in one group, then every window deregistered in one group and the
    /// memory freed. When a step fails, every one of them is leaked.
    pub fn drop_all(buffers: Vec<SymmetricBuffer<'c, T>>) {
        let mut parts: Vec<(&'c Comm, Window<'c, NcclMemory<T>>)> = buffers
            .into_iter()
            .map(|b| {
                let mut b = ManuallyDrop::new(b);
                // SAFETY: taken once; `b` is never dropped (ManuallyDrop).
                (b.comm, unsafe { ManuallyDrop::take(&mut b.window) })
            })
            .collect();
        let met = (|| -> Result<()> {
            if crate::group::is_open() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "symmetric buffers are dropped collectively, outside a group",
                });
            }
            let mut ones = Vec::with_capacity(parts.len());
            for (comm, window) in &mut parts {
                if comm.abort_handle().is_aborted() {
                    return Err(Error::InvalidArgument {
                        op: OP,
                        reason: "a communicator was aborted",
                    });
                }
                let (_, access) = window.write(comm.stream());
                drop(access);
                ones.push(
                    comm.stream()
                        .alloc_zeros::<f32>(1)
                        .map_err(|source| Error::Cuda { op: OP, source })?,
                );
            }
            crate::group::group(|g| {
                for ((comm, _), one) in parts.iter().zip(ones.iter_mut()) {
                    g.on(comm).all_reduce_in_place(one, ReduceOp::Sum)?;
                }
                Ok(())
            })?;
            for (comm, _) in &parts {
                comm.synchronize(comm.stream())?;
            }
            Ok(())
        })();
        match met {
            Ok(()) => Window::deregister_all(parts.into_iter().map(|(_, w)| w).collect()),
            Err(e) => {
                tracing::warn!(error = %e, "the ranks did not meet to drop symmetric buffers: leaked");
                std::mem::forget(parts);
            }
        }
    }

    /// The communicator it is registered on.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// Copies `host` into the buffer on `stream`, after the buffer's
    /// earlier uses. `host` must have the buffer's length
    /// ([`Error::InvalidArgument`] else, before any copy).
    pub fn copy_from_host(&mut self, stream: &CudaStream, host: &[T]) -> Result<()> {
        const COPY: &str = "SymmetricBuffer::copy_from_host";
        if host.len() != self.window.len() {
            return Err(Error::InvalidArgument {
                op: COPY,
                reason: "the host slice and the buffer differ in length",
            });
        }
        let (ptr, access) = self.window.write(stream);
        // SAFETY: `ptr` holds `len` elements of `T` on the stream's device
        // (the buffer's own contract); `host` has as many; a copy from
        // pageable memory has read `host` when the call returns, and the
        // access orders later users of the buffer after the copy.
        let copied =
            unsafe { cudarc::driver::result::memcpy_htod_async(ptr, host, stream.cu_stream()) };
        drop(access);
        copied.map_err(|source| Error::Cuda { op: COPY, source })
    }

    /// Copies the buffer into `host` after its earlier uses, and waits for
    /// the copy (at most the communicator's timeout).
    pub fn copy_to_host(&self, stream: &CudaStream, host: &mut [T]) -> Result<()> {
        const COPY: &str = "SymmetricBuffer::copy_to_host";
        if host.len() != self.window.len() {
            return Err(Error::InvalidArgument {
                op: COPY,
                reason: "the host slice and the buffer differ in length",
            });
        }
        let (ptr, access) = self.window.read(stream);
        // SAFETY: as above; a copy into pageable memory returns once it is
        // done, and the stream is waited for below before `host` is used.
        let copied =
            unsafe { cudarc::driver::result::memcpy_dtoh_async(host, ptr, stream.cu_stream()) };
        drop(access);
        copied.map_err(|source| Error::Cuda { op: COPY, source })?;
        self.comm.synchronize(stream)
    }

    /// This rank's work on the buffer done, then every rank met: whether
    /// the memory may be deregistered and freed.
    fn quiesce(&mut self) -> bool {
        if crate::group::is_open() || self.comm.abort_handle().is_aborted() {
            return false;
        }
        let comm = self.comm;
        let stream = comm.stream();
        // Ordered after every use of the buffer so far, on any stream (the
        // buffer's accesses), then the stream waited for (bounded).
        let (_, access) = self.window.write(stream);
        drop(access);
        if let Err(e) = comm.synchronize(stream) {
            tracing::warn!(error = %e, "a symmetric buffer's work did not finish: leaked");
            return false;
        }
        // Every rank past its last use of its peers' buffers.
        let met = (|| -> Result<()> {
            let mut one = stream
                .alloc_zeros::<f32>(1)
                .map_err(|source| Error::Cuda { op: OP, source })?;
            comm.all_reduce_in_place(&mut one, ReduceOp::Sum)?;
            comm.synchronize(stream)
        })();
        if let Err(e) = met {
            tracing::warn!(error = %e, "the ranks did not meet to drop a symmetric buffer: leaked");
            return false;
        }
        true
    }
}

/// The ranks meet before registering, through the communicator's observer
/// when it gates calls, and compare the length: a missing rank or another
/// length is refused before NCCL's registration barrier.
fn meet<T: NcclType>(comm: &Comm, len: usize) -> Result<()> {
    if comm.size() < 2 {
        return Ok(());
    }
    let Some(observer) = comm.observer.borrow().clone() else {
        return Ok(());
    };
    if !observer.gates() {
        return Ok(());
    }
    let info = OpInfo::new(OP, len, T::DATATYPE);
    let all: Vec<usize> = (0..comm.size()).collect();
    let refused = |source| Error::CheckFailed { op: OP, source };
    crate::capture_state::without_capture(|| observer.gate(&[(info, &all)])).map_err(refused)?;
    crate::capture_state::without_capture(|| observer.before(&info)).map_err(refused)
}

impl<T: NcclType> Drop for SymmetricBuffer<'_, T> {
    fn drop(&mut self) {
        if self.quiesce() {
            // SAFETY: taken once, here; every rank is done with it.
            unsafe { ManuallyDrop::drop(&mut self.window) };
        } else {
            // A peer may still read it: never freed, never deregistered.
            // SAFETY: taken once, here, then forgotten.
            std::mem::forget(unsafe { ManuallyDrop::take(&mut self.window) });
        }
    }
}

// SAFETY: forwards to the registered NCCL memory, whose contract holds.
unsafe impl<T: NcclType> DeviceBuffer<T> for SymmetricBuffer<'_, T> {
    fn len(&self) -> usize {
        self.window.len()
    }
    fn device(&self) -> usize {
        self.window.device()
    }
    fn read<'a>(&'a self, stream: &'a CudaStream) -> (u64, Access<'a>) {
        self.window.read(stream)
    }
}

// SAFETY: as above.
unsafe impl<T: NcclType> DeviceBufferMut<T> for SymmetricBuffer<'_, T> {
    fn write<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, Access<'a>) {
        self.window.write(stream)
    }
}

// SAFETY: one buffer, opened through its own `write`. Its drop orders the
// communicator's stream after the work joined into the buffer (a graph's
// launches included: `CapturedGraph` waits for them before its buffers
// go), waits for it and for the ranks to meet, and leaks the memory when
// either does not finish.
unsafe impl<T: NcclType> Captured for SymmetricBuffer<'_, T> {
    fn open<'a>(&'a mut self, stream: &'a CudaStream, out: &mut Opened<'a>) {
        let bytes = self.window.len() * std::mem::size_of::<T>();
        let (ptr, access) = self.window.write(stream);
        out.push(ptr, bytes, access);
    }
}
