//! Symmetric buffers: NCCL memory (`ncclMemAlloc`) registered as a
//! symmetric window (`NCCL_WIN_COLL_SYMMETRIC`, NCCL 2.27+) on every rank
//! of a communicator. NCCL runs its symmetric kernels for an all-reduce,
//! reduce-scatter or all-gather whose send and receive buffers are both
//! such windows (single node, every pair of GPUs with CUDA P2P); other
//! buffers keep its default path. See
//! `docs/research/nccl-2.28-symmetric-kernels.md`.
//!
//! An all-reduce (sum of f32, bf16 or f16, up to
//! [`crate::one_shot_max_bytes`]: 4 MiB on two ranks) reading one runs on
//! our own one-shot kernel instead, outside groups, where every rank
//! agreed to it when the buffers were made (`crate::one_shot`: 4.2–7.7 µs
//! per call from 8 B to 1 MiB on 2 H100s, against NCCL's 6.6–13 and
//! PyTorch's symmetric memory's 7.9–12.7). [`SymmetricBuffer::set_one_shot`]
//! turns it off; each buffer holds 16 KiB more than asked (the kernel's
//! flags, never part of the elements).
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
//!   channel), the ranks first meet there, after allocating, and a missing
//!   rank is a typed error before NCCL sees anything
//!   ([`crate::Error::CheckFailed`]). With a process per rank the meeting
//!   also compares the lengths; among threads of one process it does not
//!   yet (their channel has no call check). Nonblocking communicators and
//!   streams being captured are refused.
//! - **Drop** must not free memory that a peer's kernels may still read
//!   (they read this rank's buffer directly, and deregistration has no
//!   barrier). It waits for this rank's work on the buffer, then for the
//!   ranks to meet (a one-element all-reduce on the communicator), each
//!   wait bounded by the communicator's timeout; then it deregisters and
//!   frees. When any step fails (a timeout, an aborted communicator, a
//!   group open on this thread, a capture of its stream, a rank that did
//!   not drop its buffer, a deregistration NCCL refused), the memory is
//!   leaked and the window left registered: never freed while a peer may
//!   touch it. A meeting that times out also aborts the communicator (its
//!   synchronisation does, as every bounded wait of a `Comm`).
//!
//! A [`crate::capture`]d graph can own symmetric buffers ([`Captured`]):
//! NCCL's symmetric kernels are captured as any other. One thread driving
//! several ranks takes a graph's buffers back
//! ([`crate::CapturedGroup::into_buffers`]) and drops them with
//! [`SymmetricBuffer::drop_all`]: dropped with the graph, each buffer's
//! meeting would wait for ranks the thread has not reached, time out, and
//! leak it.
//!
//! NCCL sizes a symmetric kernel's grid itself, from the communicator's
//! `minCTAs` up; a communicator made with
//! [`crate::Config::for_symmetric_kernels`] gets at least 16 blocks, which
//! on 2 H100s took a 2 MiB bf16 all-reduce from 0.68 to 0.47 of NCCL's
//! default path's time (`docs/architecture.md`, "Small messages").
//!
//! Run on GPUs: creation, bit-exact all-reduces and drops on every rank in
//! every launch mode, and lengths that differ refused before NCCL with a
//! process per rank (2 H200s and 2 H100s, world 2).

use std::mem::ManuallyDrop;

use crate::buffer::{Access, DeviceBuffer, DeviceBufferMut};
use crate::capture::{Captured, Opened};
use crate::capture_state::is_capturing;
use crate::comm::Comm;
use crate::dtype::NcclType;
use crate::error::{Error, Result};
use crate::memory::{NcclMemory, Window};
use crate::observe::OpInfo;
use crate::one_shot::{self, OneShot};
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
    /// Elements the caller has (the window also holds the one-shot
    /// kernel's flags behind them).
    len: usize,
    /// Its device address.
    base: u64,
    /// The one-shot all-reduce's view, when every rank agreed to it.
    one_shot: Option<OneShot>,
    /// Whether calls use it ([`SymmetricBuffer::set_one_shot`]).
    one_shot_on: bool,
    /// Taken only by the drop, once every rank is done with it.
    window: ManuallyDrop<Window<'c, NcclMemory<T>>>,
}

impl<T: NcclType> std::fmt::Debug for SymmetricBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffer")
            .field("len", &self.len)
            .field("device", &self.window.device())
            .field("one_shot", &self.one_shot.is_some())
            .finish_non_exhaustive()
    }
}

impl<'c, T: NcclType> SymmetricBuffer<'c, T> {
    /// A buffer of `len` elements, registered on every rank; its contents
    /// are unspecified until written. Collective. `len` 0 and an open
    /// group are [`Error::InvalidArgument`], a library without windows the
    /// capability check's error, all before any NCCL call.
    pub fn new(comm: &'c Comm, len: usize) -> Result<SymmetricBuffer<'c, T>> {
        refuse_unsuited(&[comm], len)?;
        // Allocated before the ranks meet: a rank whose allocation fails
        // never reaches the meeting, where the others are refused within
        // the timeout, instead of inside NCCL's registration barrier.
        let memory = padded::<T>(comm, len)?;
        let base = memory.device_ptr();
        meet::<T>(comm, len)?;
        let window = Window::register(comm, memory, nccl_sys::NCCL_WIN_COLL_SYMMETRIC)?;
        let mut buffer = Self::registered(comm, len, base, window);
        agree(std::slice::from_mut(&mut buffer))?;
        Ok(buffer)
    }

    /// One buffer of `len` elements per communicator of `comms`, driven by
    /// this thread (one rank each, every rank of them), registered in one
    /// group. The checks of [`SymmetricBuffer::new`] come first; no
    /// meeting over the liveness channel is asked for (this thread holds
    /// every rank), so a rank missing from `comms` leaves the registration
    /// waiting inside NCCL.
    pub fn new_all(comms: &[&'c Comm], len: usize) -> Result<Vec<SymmetricBuffer<'c, T>>> {
        refuse_unsuited(comms, len)?;
        let memories = comms
            .iter()
            .map(|comm| padded::<T>(comm, len))
            .collect::<Result<Vec<_>>>()?;
        let bases: Vec<u64> = memories.iter().map(NcclMemory::device_ptr).collect();
        let windows = Window::register_all(comms, memories, nccl_sys::NCCL_WIN_COLL_SYMMETRIC)?;
        let mut buffers: Vec<_> = windows
            .into_iter()
            .zip(comms)
            .zip(bases)
            .map(|((window, comm), base)| Self::registered(comm, len, base, window))
            .collect();
        agree(&mut buffers)?;
        Ok(buffers)
    }

    /// The value around a registered window of `len` elements at `base`,
    /// before the ranks agree on the one-shot kernel.
    fn registered(
        comm: &'c Comm,
        len: usize,
        base: u64,
        window: Window<'c, NcclMemory<T>>,
    ) -> SymmetricBuffer<'c, T> {
        SymmetricBuffer {
            comm,
            len,
            base,
            one_shot: None,
            one_shot_on: true,
            window: ManuallyDrop::new(window),
        }
    }

    /// Whether an all-reduce (sum of f32, bf16 or f16, at most
    /// [`crate::one_shot_max_bytes`]) reading this buffer runs on our
    /// one-shot kernel instead of NCCL: every rank agreed to it when the
    /// buffers were made (NCCL 2.28+, the ranks mapped into one another,
    /// at most [`crate::ONE_SHOT_MAX_RANKS`], the kernel loaded).
    pub fn uses_one_shot(&self) -> bool {
        self.one_shot_on && self.one_shot.is_some()
    }

    /// Turns the one-shot kernel off (or back on, where it was agreed) for
    /// this buffer: all-reduces reading it then go to NCCL (its symmetric
    /// kernels). Every rank must choose alike, before the calls it changes.
    /// Returns whether the kernel is now used.
    pub fn set_one_shot(&mut self, on: bool) -> bool {
        self.one_shot_on = on;
        self.uses_one_shot()
    }

    /// Drops buffers of [`SymmetricBuffer::new_all`] (one per communicator
    /// this thread drives) together: each one's work done, the ranks met
    /// in one group, then every window deregistered in one group and the
    /// memory freed. When a step fails, every one of them is leaked.
    pub fn drop_all(buffers: Vec<SymmetricBuffer<'c, T>>) {
        // Kept from their drop until the ranks met: a failure or a panic on
        // the way leaks them.
        let mut parts: Vec<(&'c Comm, ManuallyDrop<Window<'c, NcclMemory<T>>>)> = buffers
            .into_iter()
            .map(|b| {
                let mut b = ManuallyDrop::new(b);
                // SAFETY: taken once; `b` is never dropped (ManuallyDrop).
                (
                    b.comm,
                    ManuallyDrop::new(unsafe { ManuallyDrop::take(&mut b.window) }),
                )
            })
            .collect();
        let met = crate::capture_state::without_capture(|| -> Result<()> {
            if crate::group::is_open() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "symmetric buffers are dropped collectively, outside a group",
                });
            }
            let mut ones = Vec::with_capacity(parts.len());
            for (comm, window) in &mut parts {
                if comm.abort_handle().is_aborted() || is_capturing(comm.stream()) {
                    return Err(Error::InvalidArgument {
                        op: OP,
                        reason: "a communicator was aborted or its stream is being captured",
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
        });
        if let Err(e) = met {
            tracing::warn!(error = %e, "the ranks did not meet to drop symmetric buffers: leaked");
            return;
        }
        for (_, window) in parts {
            release(ManuallyDrop::into_inner(window));
        }
    }

    /// The communicator it is registered on.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// Copies `src` into the buffer on `stream`, after the earlier uses of
    /// both (device to device: no host memory is involved). Another length
    /// or device is [`Error::InvalidArgument`], before any copy.
    pub fn copy_from(&mut self, stream: &CudaStream, src: &impl DeviceBuffer<T>) -> Result<()> {
        let (len, device) = (self.len, self.window.device());
        check_copy(stream, (src.len(), src.device()), (len, device))?;
        let (from, src_access) = src.read(stream);
        let (to, dst_access) = self.window.write(stream);
        copy_on(stream, to, from, len * std::mem::size_of::<T>())?;
        drop((src_access, dst_access));
        Ok(())
    }

    /// Copies the buffer into `dst` on `stream`, after the earlier uses of
    /// both. Another length or device is [`Error::InvalidArgument`].
    pub fn copy_to(&self, stream: &CudaStream, dst: &mut impl DeviceBufferMut<T>) -> Result<()> {
        let (len, device) = (self.len, self.window.device());
        check_copy(stream, (len, device), (dst.len(), dst.device()))?;
        let (from, src_access) = self.window.read(stream);
        let (to, dst_access) = dst.write(stream);
        copy_on(stream, to, from, len * std::mem::size_of::<T>())?;
        drop((src_access, dst_access));
        Ok(())
    }

    /// This rank's work on `window` (this buffer's, taken out by the
    /// drop) done, then every rank met: whether the memory may be
    /// deregistered and freed.
    fn quiesce_window(&self, window: &mut Window<'c, NcclMemory<T>>) -> bool {
        let comm = self.comm;
        let stream = comm.stream();
        // Inside a group the meeting cannot run; on an aborted communicator
        // or a stream being captured (the meeting would be recorded, not
        // run) it would not show that the peers are done.
        if crate::group::is_open() || comm.abort_handle().is_aborted() || is_capturing(stream) {
            tracing::warn!(
                "a symmetric buffer dropped in a group, after an abort or during a capture: leaked"
            );
            return false;
        }
        // Ordered after every use of the buffer so far, on any stream (the
        // buffer's accesses), then the stream waited for (bounded).
        // Written here: ordered after every earlier use, reads included.
        let (_, access) = window.write(stream);
        drop(access);
        if let Err(e) = comm.synchronize(stream) {
            tracing::warn!(error = %e, "a symmetric buffer's work did not finish: leaked");
            return false;
        }
        // Every rank past its last use of its peers' buffers.
        let met = crate::capture_state::without_capture(|| -> Result<()> {
            let mut one = stream
                .alloc_zeros::<f32>(1)
                .map_err(|source| Error::Cuda { op: OP, source })?;
            comm.all_reduce_in_place(&mut one, ReduceOp::Sum)?;
            comm.synchronize(stream)
        });
        if let Err(e) = met {
            tracing::warn!(error = %e, "the ranks did not meet to drop a symmetric buffer: leaked");
            return false;
        }
        true
    }
}

/// NCCL memory for `len` elements and the one-shot kernel's flags behind
/// them (at the next 16-byte boundary), the flags zeroed before any rank
/// can signal (registration, which follows, waits for every rank).
fn padded<T: NcclType>(comm: &Comm, len: usize) -> Result<NcclMemory<T>> {
    let elem = std::mem::size_of::<T>();
    let flags_at = len
        .checked_mul(elem)
        .map(|b| b.next_multiple_of(16))
        .ok_or(Error::Overflow {
            op: OP,
            count: len,
            factor: elem,
        })?;
    let total = flags_at.saturating_add(one_shot::PAD_BYTES).div_ceil(elem);
    let memory = NcclMemory::<T>::alloc(comm, total)?;
    let stream = comm.stream();
    let cuda = |source| Error::Cuda { op: OP, source };
    stream.context().bind_to_thread().map_err(cuda)?;
    // SAFETY: the flags lie inside the fresh allocation (`total` elements
    // hold `flags_at + PAD_BYTES` bytes); nothing else uses it yet.
    unsafe {
        cudarc::driver::result::memset_d8_async(
            memory.device_ptr() + flags_at as u64,
            0,
            one_shot::PAD_BYTES,
            stream.cu_stream(),
        )
    }
    .map_err(cuda)?;
    comm.synchronize(stream)?;
    Ok(memory)
}

/// This rank's view for the one-shot kernel, when it can take part: NCCL
/// 2.28+ (the window descriptor's layout), 2 to `MAX_RANKS` ranks, the
/// kernel loaded, its words made, and NCCL's descriptor naming this rank
/// both in the world and in its LSA team (so, on the last rank, a team of
/// every rank).
fn candidate<T: NcclType>(b: &SymmetricBuffer<'_, T>) -> Option<OneShot> {
    let comm = b.comm;
    let n = comm.size();
    let version = comm.library().version();
    // The descriptor's layout was read from the headers of 2.28 to 2.30.
    let known = version.at_least(2, 28, 0) && !version.at_least(2, 31, 0);
    if !(2..=one_shot::MAX_RANKS).contains(&n) || !known {
        return None;
    }
    let ctx = comm.stream().context();
    let kernels = one_shot::kernels(ctx)?;
    let words = comm.shared().kernel_words()?;
    // SAFETY: a live window of this communicator, NCCL 2.28+ (checked).
    let view = unsafe { one_shot::read_window(ctx, b.window.raw() as u64) }?;
    let rank = comm.rank() as i32;
    if view.world_rank != rank || view.lsa_rank != rank || view.stride == 0 || view.flat == 0 {
        tracing::debug!(
            ?view,
            rank,
            "the one-shot kernel is not used on this window"
        );
        return None;
    }
    Some(OneShot {
        comm: std::sync::Arc::as_ptr(comm.shared()) as usize,
        kernels,
        words,
        base: b.base,
        len: b.len,
        flat: view.flat,
        stride: view.stride,
        pad: (b.len * std::mem::size_of::<T>()).next_multiple_of(16) as u64,
        rank: rank as u32,
        nranks: n as u32,
        timeout_ns: u64::try_from(comm.timeout().as_nanos()).unwrap_or(u64::MAX),
    })
}

/// The ranks agree whether the one-shot kernel is used on these buffers
/// (one per communicator this thread drives, made together), and compare
/// their lengths: one all-reduce (in one group) of the minimum over the
/// ranks of `[`[`candidate`]`, len, u64::MAX - len]`. Lengths that differ
/// are [`Error::InvalidArgument`] on every rank (the buffers are then
/// dropped, collectively).
fn agree<T: NcclType>(buffers: &mut [SymmetricBuffer<'_, T>]) -> Result<()> {
    if buffers.iter().all(|b| b.comm.size() < 2) {
        return Ok(());
    }
    let cuda = |source| Error::Cuda { op: OP, source };
    let mine: Vec<Option<OneShot>> = buffers.iter().map(candidate).collect();
    let mut flags = buffers
        .iter()
        .zip(&mine)
        .map(|(b, m)| {
            let len = b.len as u64;
            let v = [u64::from(m.is_some()), len, u64::MAX - len];
            b.comm.stream().clone_htod(&v).map_err(cuda)
        })
        .collect::<Result<Vec<_>>>()?;
    if let ([b], [flag]) = (&*buffers, &mut flags[..]) {
        b.comm.all_reduce_in_place(flag, ReduceOp::Min)?;
    } else {
        crate::group::group(|g| {
            for (b, flag) in buffers.iter().zip(flags.iter_mut()) {
                g.on(b.comm).all_reduce_in_place(flag, ReduceOp::Min)?;
            }
            Ok(())
        })?;
    }
    let mut differ = false;
    for ((b, flag), m) in buffers.iter_mut().zip(&flags).zip(mine) {
        let stream = b.comm.stream();
        b.comm.synchronize(stream)?;
        let got = stream.clone_dtoh(flag).map_err(cuda)?;
        let (least, most) = (got[1], u64::MAX - got[2]);
        differ |= least != most;
        if got[0] == 1 && !differ {
            b.one_shot = m;
        }
    }
    if differ {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: "the ranks made symmetric buffers of different lengths",
        });
    }
    Ok(())
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
        // SAFETY: taken once, here.
        let mut window = unsafe { ManuallyDrop::take(&mut self.window) };
        if self.quiesce_window(&mut window) {
            release(window);
        } else {
            // A peer may still read it: never freed, never deregistered.
            std::mem::forget(window);
        }
    }
}

/// Deregisters a window every rank is done with and frees its memory; when
/// NCCL did not let go of it, the memory is leaked instead.
fn release<T: NcclType>(mut window: Window<'_, NcclMemory<T>>) {
    if window.try_deregister() {
        drop(window);
    } else {
        tracing::warn!("ncclCommWindowDeregister failed: the symmetric buffer's memory is leaked");
        std::mem::forget(window);
    }
}

/// Refuses what symmetric buffers of `len` elements cannot be made on
/// safely: no element, an open group (they are made collectively), a
/// library without windows, a nonblocking communicator (NCCL would
/// register in the background while an error here frees the memory), or
/// a communicator whose stream is being captured.
fn refuse_unsuited(comms: &[&Comm], len: usize) -> Result<()> {
    let refuse = |reason| Err(Error::InvalidArgument { op: OP, reason });
    if len == 0 {
        return refuse("a symmetric buffer of no element");
    }
    if crate::group::is_open() {
        return refuse("symmetric buffers are made collectively, outside a group");
    }
    for comm in comms {
        comm.library()
            .capabilities()
            .require(crate::capabilities::Feature::Windows)?;
        if !comm.is_blocking() {
            return refuse("symmetric buffers need a blocking communicator");
        }
        if is_capturing(comm.stream()) {
            return Err(Error::Capturing { op: OP });
        }
    }
    Ok(())
}

/// A copy's lengths and devices checked: `(src len, src device)` and
/// `(dst len, dst device)` on `stream`'s device.
fn check_copy(stream: &CudaStream, src: (usize, usize), dst: (usize, usize)) -> Result<()> {
    const COPY: &str = "SymmetricBuffer copy";
    let here = stream.context().ordinal();
    if src.0 != dst.0 {
        return Err(Error::InvalidArgument {
            op: COPY,
            reason: "the two buffers differ in length",
        });
    }
    if src.1 != here || dst.1 != here {
        return Err(Error::InvalidArgument {
            op: COPY,
            reason: "a buffer is not on the stream's device",
        });
    }
    Ok(())
}

/// `bytes` bytes from `from` to `to` on `stream` (device to device).
fn copy_on(stream: &CudaStream, to: u64, from: u64, bytes: usize) -> Result<()> {
    const COPY: &str = "SymmetricBuffer copy";
    let cuda = |source| Error::Cuda { op: COPY, source };
    stream.context().bind_to_thread().map_err(cuda)?;
    // SAFETY: both ranges hold `bytes` bytes on the stream's device (the
    // buffers' contracts, lengths checked); the accesses the callers hold
    // order the copy after earlier uses and later uses after it.
    unsafe { cudarc::driver::result::memcpy_dtod_async(to, from, bytes, stream.cu_stream()) }
        .map_err(cuda)
}

// SAFETY: forwards to the registered NCCL memory, whose contract holds.
unsafe impl<T: NcclType> DeviceBuffer<T> for SymmetricBuffer<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn one_shot(&self) -> Option<OneShot> {
        self.one_shot.filter(|_| self.one_shot_on)
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
