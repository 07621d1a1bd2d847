//! An object-safe communicator for frameworks that keep their tensors
//! behind raw device pointers and a runtime dtype tag.
//!
//! The typed API of `nccl-safe` wants a Rust type per element type and a
//! buffer type per tensor type. A framework whose tensors are
//! `(ptr, len, dtype)` at run time can instead hold a
//! `Box<dyn Communicator>` and pass pointers. The checks that need no
//! knowledge of the memory still run before NCCL sees the call (dtype
//! support, counts, overflow, ranks, the device of each pointer and of the
//! stream, partial overlap); what only the caller can know is the
//! contract of each `unsafe` method.
//!
//! ```no_run
//! use nccl_dist::{Communicator, DType, World};
//! use nccl_dist::nccl_safe::ReduceOp;
//! use nccl_dist::nccl_safe::cudarc::driver::DevicePtr;
//!
//! let world = World::init()?;
//! let comm: &dyn Communicator = world.comm();
//! let stream = world.comm().stream();
//! let grads = stream.alloc_zeros::<f32>(1024)?;
//! let (ptr, _guard) = grads.device_ptr(stream);
//! // SAFETY: 1024 f32 on this rank's GPU, not touched elsewhere until the
//! // all-reduce on `stream` is done.
//! unsafe {
//!     comm.all_reduce(ptr, ptr, 1024, DType::F32, ReduceOp::Sum, Some(stream.cu_stream()))?;
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use nccl_safe::cudarc::driver::CudaStream;
use nccl_safe::cudarc::driver::sys::CUstream;
use nccl_safe::nccl_sys::ncclDataType_t;
use nccl_safe::{Comm, NcclType, RawBuffer, ReduceOp};

use crate::error::Result;

/// Defines [`DType`] (one tag per type of nccl-safe's list), its `ALL`,
/// and `with_type!`, which runs a body with a type alias bound to a tag's
/// Rust type. `$d` is a `$`, for the inner macro's own variables.
macro_rules! dtypes {
    ($d:tt $($tag:ident = $t:ty => $nccl:ident $([fp8 = $fp8:literal])?, $doc:literal;)*) => {
        /// An element type, known at run time.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum DType {
            $(#[doc = $doc] $tag,)*
        }

        impl DType {
            /// Every tag.
            pub const ALL: [DType; [$(DType::$tag),*].len()] = [$(DType::$tag),*];
        }

        /// Runs `$body` with `$t` bound to the Rust type of `$dtype`.
        macro_rules! with_type {
            ($d dtype:expr, $d alias:ident => $d body:expr) => {
                match $d dtype {
                    $(DType::$tag => {
                        type $d alias = $t;
                        $d body
                    })*
                }
            };
        }
    };
}

nccl_safe::for_each_dtype!(dtypes $);

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        with_type!(self, T => std::mem::size_of::<T>())
    }

    /// NCCL's tag for it.
    pub fn nccl(self) -> ncclDataType_t {
        with_type!(self, T => <T as NcclType>::DATATYPE)
    }

    /// The tag of `T`.
    pub fn of<T: NcclType>() -> DType {
        // Every NcclType is one of the twelve; the lookup cannot miss.
        DType::ALL
            .into_iter()
            .find(|d| d.nccl() == T::DATATYPE)
            .unwrap_or(DType::U8)
    }
}

/// What each method of [`Communicator`] needs: the typed buffers and the
/// stream.
struct Call<'c> {
    comm: &'c Comm,
    stream: Stream<'c>,
}

/// The stream of one call: the communicator's own, borrowed for free, or
/// the wrapper of a caller's stream.
enum Stream<'c> {
    Own(&'c CudaStream),
    Theirs(Arc<CudaStream>),
}

impl std::ops::Deref for Stream<'_> {
    type Target = CudaStream;
    fn deref(&self) -> &CudaStream {
        match self {
            Stream::Own(s) => s,
            Stream::Theirs(s) => s,
        }
    }
}

impl<'c> Call<'c> {
    /// # Safety
    ///
    /// `stream`, when given, is a live stream of the communicator's device.
    unsafe fn new(comm: &'c Comm, stream: Option<CUstream>) -> Call<'c> {
        let stream = match stream {
            None => Stream::Own(comm.stream()),
            Some(raw) if raw == comm.stream().cu_stream() => Stream::Own(comm.stream()),
            // SAFETY: the caller's promise. The wrapper is remembered by
            // the communicator, so naming one stream on every call
            // allocates once.
            Some(raw) => Stream::Theirs(unsafe { comm.borrowed_stream(raw) }),
        };
        Call { comm, stream }
    }

    /// The caller's `len` elements at `ptr`, on the device the driver
    /// says the pointer belongs to.
    ///
    /// # Safety
    ///
    /// The trait contract for `ptr` and `len`.
    unsafe fn buf<T: NcclType>(
        &self,
        op: &'static str,
        ptr: u64,
        len: usize,
    ) -> Result<RawBuffer<T>> {
        let device = if len == 0 {
            self.comm.device()
        } else {
            let bytes = len.saturating_mul(std::mem::size_of::<T>()) as u64;
            crate::pointers::device_of(op, ptr, bytes)?
        };
        // SAFETY: the caller's promise (the trait contract).
        Ok(unsafe { RawBuffer::from_raw_parts(ptr, len, device) })
    }
}

/// Element count times `n`, refused when it overflows.
fn times(op: &'static str, count: usize, n: usize) -> Result<usize> {
    count.checked_mul(n).ok_or_else(|| {
        nccl_safe::Error::Overflow {
            op,
            count,
            factor: n,
        }
        .into()
    })
}

/// The frame of each method of `impl Communicator for Comm`: the call's
/// stream `$c` and, with capture allowed, `$body` run with `$t` the Rust
/// type of `$dtype`.
macro_rules! typed_call {
    ($comm:expr, $stream:expr, $dtype:expr, |$c:ident, $t:ident| $body:block) => {{
        let (comm, stream) = ($comm, $stream);
        // SAFETY: the caller's promise about `stream`.
        let $c = unsafe { Call::new(comm, stream) };
        // Built outside the `unsafe` block: each unsafe step of `$body`
        // has its own block and SAFETY comment.
        let body = || -> Result<()> {
            with_type!($dtype, $t => $body);
            Ok(())
        };
        // SAFETY: the trait's contract covers graph capture: the memory
        // and the communicator outlive every launch of a captured call.
        unsafe { nccl_safe::allow_capture(body) }
    }};
}

/// A communicator as a framework sees it: raw device pointers (as `u64`
/// device addresses), a dtype tag and a stream, behind `dyn`.
///
/// # Contract of the `unsafe` methods
///
/// For every pointer and the count the method's docs give it: the memory
/// is a live device allocation of at least that many elements of `dtype`,
/// it stays allocated until the operation has finished on `stream`, and no
/// other work touches it meanwhile (for the buffers the operation writes)
/// or writes it (for those it reads). `stream`, when `Some`, is a live
/// stream of this communicator's device; `None` uses the communicator's
/// own stream. The operation is queued on that stream: wait for it as for
/// any other CUDA work. When the stream is being captured into a CUDA
/// graph, "finished" means every launch of every graph made from the
/// capture has finished, and the communicator must stay alive (not
/// aborted or dropped) until then too.
///
/// Checked for you, before NCCL is called: pointers known to the CUDA
/// driver and on this communicator's device, dtype supported by the
/// library and GPU, counts that do not overflow, roots and peers in range,
/// buffers that overlap other than in NCCL's in-place layout. The driver is
/// asked about a pointer once per allocation: each thread remembers the
/// extents of the last 16 allocations it passed, so a buffer inside one of
/// them costs no driver call (an allocation freed and replaced at the same
/// address by one on another device is therefore not caught until the
/// thread forgets it).
pub trait Communicator: Send {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// CUDA device ordinal.
    fn device(&self) -> usize;

    /// All-reduce of `count` elements from `send` into `recv` (equal
    /// pointers: in place).
    ///
    /// # Safety
    ///
    /// See the [trait contract](Communicator): `count` elements at each.
    unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: Option<CUstream>,
    ) -> Result<()>;

    /// Broadcast of `count` elements from `root`'s `send` into every
    /// rank's `recv` (equal pointers: in place; `send` is read on `root`
    /// only).
    ///
    /// # Safety
    ///
    /// See the [trait contract](Communicator): `count` elements at each.
    unsafe fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        root: usize,
        stream: Option<CUstream>,
    ) -> Result<()>;

    /// Reduction of every rank's `count` elements at `send` into `root`'s
    /// `recv` (equal pointers: in place; `recv` is written on `root` only).
    ///
    /// # Safety
    ///
    /// See the [trait contract](Communicator): `count` elements at each
    /// (`recv` on `root` only).
    #[allow(clippy::too_many_arguments)]
    unsafe fn reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: Option<CUstream>,
    ) -> Result<()>;

    /// All-gather: `count` elements from each rank's `send`, concatenated
    /// in rank order into `recv` (`size() * count` elements). In place when
    /// `send` is `recv`'s slot for this rank.
    ///
    /// # Safety
    ///
    /// See the [trait contract](Communicator): `count` at `send`,
    /// `size() * count` at `recv`.
    unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        stream: Option<CUstream>,
    ) -> Result<()>;

    /// Reduce-scatter: `recv` gets block `rank()` (of `count` elements) of
    /// the reduction of every rank's `send` (`size() * count` elements). In
    /// place when `recv` is `send`'s block for this rank.
    ///
    /// # Safety
    ///
    /// See the [trait contract](Communicator): `size() * count` at `send`,
    /// `count` at `recv`.
    unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: Option<CUstream>,
    ) -> Result<()>;

    /// All-to-all: block j (of `count` elements) of `send` goes to rank j,
    /// block i of `recv` comes from rank i.
    ///
    /// # Safety
    ///
    /// See the [trait contract](Communicator): `size() * count` at each.
    unsafe fn all_to_all(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        stream: Option<CUstream>,
    ) -> Result<()>;

    /// Sends `count` elements at `buf` to `peer`.
    ///
    /// # Safety
    ///
    /// See the [trait contract](Communicator): `count` elements at `buf`.
    unsafe fn send(
        &self,
        buf: u64,
        count: usize,
        dtype: DType,
        peer: usize,
        stream: Option<CUstream>,
    ) -> Result<()>;

    /// Receives `count` elements from `peer` into `buf`.
    ///
    /// # Safety
    ///
    /// See the [trait contract](Communicator): `count` elements at `buf`.
    unsafe fn recv(
        &self,
        buf: u64,
        count: usize,
        dtype: DType,
        peer: usize,
        stream: Option<CUstream>,
    ) -> Result<()>;

    /// A send to `send_peer` and a receive from `recv_peer` in one NCCL
    /// group, so a ring or pipeline exchange where every rank sends and
    /// receives cannot deadlock.
    ///
    /// # Safety
    ///
    /// See the [trait contract](Communicator): `send_count` elements at
    /// `send`, `recv_count` at `recv`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn send_recv(
        &self,
        send: u64,
        send_count: usize,
        send_peer: usize,
        recv: u64,
        recv_count: usize,
        recv_peer: usize,
        dtype: DType,
        stream: Option<CUstream>,
    ) -> Result<()>;

    /// Returns once every rank has reached the barrier: a one-element
    /// all-reduce, waited for with the communicator's deadline (which, when
    /// it runs out, aborts the communicator: see `Comm::synchronize`).
    fn barrier(&self) -> Result<()>;
}

impl Communicator for Comm {
    fn rank(&self) -> usize {
        Comm::rank(self)
    }

    fn size(&self) -> usize {
        Comm::size(self)
    }

    fn device(&self) -> usize {
        Comm::device(self)
    }

    unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: Option<CUstream>,
    ) -> Result<()> {
        const OP: &str = "Communicator::all_reduce";
        typed_call!(self, stream, dtype, |c, T| {
            // SAFETY: the trait's contract for `recv` (count elements).
            let mut r = unsafe { c.buf::<T>(OP, recv, count) }?;
            if send == recv {
                self.on(&c.stream).all_reduce_in_place(&mut r, op)?;
            } else {
                // SAFETY: the trait's contract for `send` (count elements).
                let s = unsafe { c.buf::<T>(OP, send, count) }?;
                self.on(&c.stream).all_reduce(&s, &mut r, op)?;
            }
        })
    }

    unsafe fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        root: usize,
        stream: Option<CUstream>,
    ) -> Result<()> {
        const OP: &str = "Communicator::broadcast";
        typed_call!(self, stream, dtype, |c, T| {
            // SAFETY: the trait's contract for `recv` (count elements).
            let mut r = unsafe { c.buf::<T>(OP, recv, count) }?;
            if send == recv {
                self.on(&c.stream).broadcast_in_place(&mut r, root)?;
            } else {
                let on_root = Comm::rank(self) == root;
                // SAFETY: the trait's contract for `send` (`count` elements on the root).
                let s = unsafe { c.buf::<T>(OP, send, if on_root { count } else { 0 }) }?;
                self.on(&c.stream)
                    .broadcast(on_root.then_some(&s), &mut r, root)?;
            }
        })
    }

    unsafe fn reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: Option<CUstream>,
    ) -> Result<()> {
        const OP: &str = "Communicator::reduce";
        typed_call!(self, stream, dtype, |c, T| {
            // SAFETY: the trait's contract for `send` (count elements).
            let mut s = unsafe { c.buf::<T>(OP, send, count) }?;
            if send == recv {
                self.on(&c.stream).reduce_in_place(&mut s, op, root)?;
            } else {
                let on_root = Comm::rank(self) == root;
                // SAFETY: the trait's contract for `recv` (`count` elements on the root).
                let mut r = unsafe { c.buf::<T>(OP, recv, if on_root { count } else { 0 }) }?;
                self.on(&c.stream)
                    .reduce(&s, on_root.then_some(&mut r), op, root)?;
            }
        })
    }

    unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        stream: Option<CUstream>,
    ) -> Result<()> {
        const OP: &str = "Communicator::all_gather";
        let total = times(OP, count, Comm::size(self))?;
        let own_slot = times(OP, times(OP, count, Comm::rank(self))?, dtype.size())?;
        typed_call!(self, stream, dtype, |c, T| {
            // SAFETY: the trait's contract for `recv` (total elements).
            let mut r = unsafe { c.buf::<T>(OP, recv, total) }?;
            if recv.checked_add(own_slot as u64) == Some(send) {
                self.on(&c.stream).all_gather_in_place(&mut r)?;
            } else {
                // SAFETY: the trait's contract for `send` (count elements).
                let s = unsafe { c.buf::<T>(OP, send, count) }?;
                self.on(&c.stream).all_gather(&s, &mut r)?;
            }
        })
    }

    unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: Option<CUstream>,
    ) -> Result<()> {
        const OP: &str = "Communicator::reduce_scatter";
        let total = times(OP, count, Comm::size(self))?;
        let own_slot = times(OP, times(OP, count, Comm::rank(self))?, dtype.size())?;
        typed_call!(self, stream, dtype, |c, T| {
            // SAFETY: the trait's contract for `send` (total elements).
            let mut s = unsafe { c.buf::<T>(OP, send, total) }?;
            if send.checked_add(own_slot as u64) == Some(recv) {
                self.on(&c.stream).reduce_scatter_in_place(&mut s, op)?;
            } else {
                // SAFETY: the trait's contract for `recv` (count elements).
                let mut r = unsafe { c.buf::<T>(OP, recv, count) }?;
                self.on(&c.stream).reduce_scatter(&s, &mut r, op)?;
            }
        })
    }

    unsafe fn all_to_all(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        stream: Option<CUstream>,
    ) -> Result<()> {
        const OP: &str = "Communicator::all_to_all";
        let total = times(OP, count, Comm::size(self))?;
        typed_call!(self, stream, dtype, |c, T| {
            // SAFETY: the trait's contract for `send` (total elements).
            let s = unsafe { c.buf::<T>(OP, send, total) }?;
            // SAFETY: the trait's contract for `recv` (total elements).
            let mut r = unsafe { c.buf::<T>(OP, recv, total) }?;
            self.on(&c.stream).all_to_all(&s, &mut r)?;
        })
    }

    unsafe fn send(
        &self,
        buf: u64,
        count: usize,
        dtype: DType,
        peer: usize,
        stream: Option<CUstream>,
    ) -> Result<()> {
        const OP: &str = "Communicator::send";
        typed_call!(self, stream, dtype, |c, T| {
            // SAFETY: the trait's contract for `buf` (count elements).
            let b = unsafe { c.buf::<T>(OP, buf, count) }?;
            self.on(&c.stream).send(&b, peer)?;
        })
    }

    unsafe fn recv(
        &self,
        buf: u64,
        count: usize,
        dtype: DType,
        peer: usize,
        stream: Option<CUstream>,
    ) -> Result<()> {
        const OP: &str = "Communicator::recv";
        typed_call!(self, stream, dtype, |c, T| {
            // SAFETY: the trait's contract for `buf` (count elements).
            let mut b = unsafe { c.buf::<T>(OP, buf, count) }?;
            self.on(&c.stream).recv(&mut b, peer)?;
        })
    }

    unsafe fn send_recv(
        &self,
        send: u64,
        send_count: usize,
        send_peer: usize,
        recv: u64,
        recv_count: usize,
        recv_peer: usize,
        dtype: DType,
        stream: Option<CUstream>,
    ) -> Result<()> {
        const OP: &str = "Communicator::send_recv";
        typed_call!(self, stream, dtype, |c, T| {
            // SAFETY: the trait's contract for `send` (send_count elements).
            let s = unsafe { c.buf::<T>(OP, send, send_count) }?;
            // SAFETY: the trait's contract for `recv` (recv_count elements).
            let mut r = unsafe { c.buf::<T>(OP, recv, recv_count) }?;
            nccl_safe::group(|g| {
                g.on_stream(self, &c.stream).send(&s, send_peer)?;
                g.on_stream(self, &c.stream).recv(&mut r, recv_peer)
            })?;
        })
    }

    fn barrier(&self) -> Result<()> {
        crate::host::barrier(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_round_trips_through_its_rust_type() {
        for d in DType::ALL {
            let back = with_type!(d, T => DType::of::<T>());
            assert_eq!(back, d);
            assert_eq!(
                d.size(),
                match d {
                    DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 => 1,
                    DType::F16 | DType::BF16 => 2,
                    DType::I32 | DType::U32 | DType::F32 => 4,
                    _ => 8,
                }
            );
        }
    }

    #[test]
    fn the_trait_is_object_safe_and_send() {
        fn takes(_: Option<&dyn Communicator>) {}
        takes(None);
        fn send<T: Send + ?Sized>() {}
        send::<Box<dyn Communicator>>();
    }
}
