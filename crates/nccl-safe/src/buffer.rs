//! Device memory as collectives see it: a pointer, an element count and a
//! device, plus the stream ordering the memory's owner needs.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};

use crate::dtype::NcclType;

/// Keeps the memory owner's stream bookkeeping alive while NCCL work is
/// enqueued; dropping it records that work for the owner (cudarc records
/// an event so later users and the final free wait for it).
#[must_use = "drop it only after the NCCL call that uses the pointer"]
pub struct Access<'a>(Inner<'a>);

enum Inner<'a> {
    None,
    #[allow(dead_code)] // held for its Drop, which records the work
    Cudarc(SyncOnDrop<'a>),
    /// The memory belongs to `own`, the work runs on `target`: on drop,
    /// cudarc records on `target`, then `own` waits for `target`.
    Joined {
        guard: Option<SyncOnDrop<'a>>,
        own: Arc<CudaStream>,
        target: &'a CudaStream,
    },
}

impl<'a> Access<'a> {
    /// No bookkeeping: for memory whose owner orders work by other means.
    pub fn none() -> Access<'a> {
        Access(Inner::None)
    }

    /// Wraps cudarc's guard. A guard with nothing to record or wait for
    /// (memory without event tracking) becomes [`Access::none`].
    pub fn cudarc(guard: SyncOnDrop<'a>) -> Access<'a> {
        match guard {
            SyncOnDrop::Record(None) | SyncOnDrop::Sync(None) => Access(Inner::None),
            guard => Access(Inner::Cudarc(guard)),
        }
    }

    /// For memory whose home is the stream `own` (its drop waits for
    /// `own`'s work): work on another stream `target` is ordered both ways
    /// through `own`. Before the enqueue `target` waits for `own`, which
    /// covers every earlier use of the memory (each was joined into `own`);
    /// after it, `own` waits for `target`, so the next use and the drop's
    /// wait cover this one. Every use of the memory is thus ordered after
    /// the ones before it, whatever streams they ran on. On `own` itself,
    /// nothing to do.
    pub(crate) fn into_own(own: &Arc<CudaStream>, target: &'a CudaStream) -> Access<'a> {
        if own.cu_stream() == target.cu_stream() {
            return Access(Inner::None);
        }
        if target.join(own).is_err() {
            // Cannot order the streams: wait for the earlier uses instead.
            let _ = own.synchronize();
        }
        Access(Inner::Joined {
            guard: None,
            own: Arc::clone(own),
            target,
        })
    }

    /// Whether dropping it does nothing, so it need not be kept.
    pub(crate) fn is_none(&self) -> bool {
        matches!(self.0, Inner::None)
    }
}

/// The accesses a group keeps until its launch: inline up to 16 (two
/// buffers on each of 8 GPUs), so a group allocates nothing on the heap.
pub(crate) type Held<'a> = smallvec::SmallVec<[Access<'a>; 16]>;

impl Drop for Access<'_> {
    fn drop(&mut self) {
        if let Inner::Joined { guard, own, target } = &mut self.0 {
            drop(guard.take());
            if own.join(target).is_err() {
                // Cannot order the streams: wait for the work instead, so the
                // owner never frees memory still in use.
                let _ = target.synchronize();
            }
        }
    }
}

impl std::fmt::Debug for Access<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Inner::None => "Access(none)",
            Inner::Cudarc(_) => "Access(cudarc)",
            Inner::Joined { .. } => "Access(joined)",
        })
    }
}

/// For cudarc memory: on its own stream, cudarc's bookkeeping suffices; on
/// another stream (of the same device), the two are also joined with events
/// in both directions, so the order holds even when cudarc's event tracking
/// is off for the memory's context.
///
/// The owner's stream is cloned only for the join: on its own stream (the
/// hot path) the access holds nothing but cudarc's guard.
fn cudarc_access<'a>(
    own: &Arc<CudaStream>,
    target: &'a CudaStream,
    guarded: (u64, SyncOnDrop<'a>),
) -> (u64, Access<'a>) {
    let (ptr, guard) = guarded;
    if own.cu_stream() == target.cu_stream() {
        return (ptr, Access::cudarc(guard));
    }
    if target.join(own).is_err() {
        let _ = own.synchronize();
    }
    (
        ptr,
        Access(Inner::Joined {
            guard: Some(guard),
            own: Arc::clone(own),
            target,
        }),
    )
}

/// Device memory a collective may read: `len()` elements of `T` on GPU
/// `device()`.
///
/// Implemented for cudarc's `CudaSlice`, `CudaView` and `CudaViewMut`, and
/// for [`crate::NcclMemory`]. Frameworks implement it for their own tensors.
///
/// # Safety
///
/// The pointer [`DeviceBuffer::read`] returns must address `len()` valid
/// elements of `T` in memory of device `device()`, and that memory must stay
/// allocated until the work enqueued on `stream` while the returned
/// [`Access`] lived has finished (free it stream-ordered after that work, or
/// synchronise first). The hidden `one_shot` must be left as it is (it
/// answers `None`), or forward the answer of a live
/// [`crate::SymmetricBuffer`] whose memory `read` returns.
pub unsafe trait DeviceBuffer<T: NcclType> {
    /// Number of elements.
    fn len(&self) -> usize;

    /// `true` when there are no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// CUDA device ordinal of the memory.
    fn device(&self) -> usize;

    /// The device address for reading on `stream`, after making `stream`
    /// wait for pending writes to this memory.
    fn read<'a>(&'a self, stream: &'a CudaStream) -> (u64, Access<'a>);

    /// The one-shot all-reduce's view of this buffer: only
    /// [`crate::SymmetricBuffer`] has one (the type cannot be made
    /// elsewhere, and a call checks that it reads exactly that buffer).
    #[doc(hidden)]
    fn one_shot(&self) -> Option<crate::OneShot> {
        None
    }
}

/// Device memory a collective may write.
///
/// # Safety
///
/// As for [`DeviceBuffer`], for [`DeviceBufferMut::write`], which must also
/// make `stream` wait for pending reads and writes of this memory.
pub unsafe trait DeviceBufferMut<T: NcclType>: DeviceBuffer<T> {
    /// The device address for writing on `stream`.
    fn write<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, Access<'a>);
}

fn ordinal_of(stream: &CudaStream) -> usize {
    stream.context().ordinal()
}

/// `DeviceBuffer` for cudarc's slice and views, `DeviceBufferMut` for the
/// mutable ones: the same four lines for each.
macro_rules! cudarc_buffer {
    ($($ty:ty),* ; mut $($mut_ty:ty),*) => {
        $(
            // SAFETY: a cudarc slice owns `len` elements on its stream's
            // device (a view borrows its slice, which stays allocated for the
            // view's lifetime); `device_ptr` orders `stream` after pending
            // writes and its guard records the read; the slice's `Drop` frees
            // after recorded work.
            unsafe impl<T: NcclType> DeviceBuffer<T> for $ty {
                fn len(&self) -> usize {
                    DeviceSlice::len(self)
                }
                fn device(&self) -> usize {
                    ordinal_of(DeviceSlice::stream(self))
                }
                fn read<'a>(&'a self, stream: &'a CudaStream) -> (u64, Access<'a>) {
                    let guarded = self.device_ptr(stream);
                    cudarc_access(DeviceSlice::stream(self), stream, guarded)
                }
            }
        )*
        $(
            // SAFETY: as above, with `device_ptr_mut` ordering after pending
            // reads and writes.
            unsafe impl<T: NcclType> DeviceBufferMut<T> for $mut_ty {
                fn write<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, Access<'a>) {
                    if DeviceSlice::stream(self).cu_stream() == stream.cu_stream() {
                        let (ptr, guard) = self.device_ptr_mut(stream);
                        return (ptr, Access::cudarc(guard));
                    }
                    // The guard borrows the slice mutably: its stream is
                    // cloned first, for the join.
                    let own = Arc::clone(DeviceSlice::stream(self));
                    cudarc_access(&own, stream, self.device_ptr_mut(stream))
                }
            }
        )*
    };
}

cudarc_buffer!(CudaSlice<T>, CudaView<'_, T>, CudaViewMut<'_, T>; mut CudaSlice<T>, CudaViewMut<'_, T>);

/// Device memory known only by its address: `len` elements of `T` at a
/// device address on one GPU, with no owner whose stream must be ordered
/// with the work (its [`Access`] is [`Access::none`]). For memory that
/// frameworks hand over as a pointer; made only by the `unsafe`
/// [`RawBuffer::from_raw_parts`], whose caller answers for it.
pub struct RawBuffer<T> {
    ptr: u64,
    len: usize,
    device: usize,
    _type: PhantomData<T>,
}

impl<T> std::fmt::Debug for RawBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}

impl<T: NcclType> RawBuffer<T> {
    /// `len` elements of `T` at the device address `ptr` on CUDA device
    /// `device`.
    ///
    /// # Safety
    ///
    /// Unless `len` is 0: `ptr` is the address of `len` elements of `T` in
    /// one live allocation on `device`, which stays allocated until every
    /// operation given this buffer has finished on its stream (for an
    /// operation captured into a CUDA graph: every launch of the graph);
    /// meanwhile no other work writes the memory, nor reads it while an
    /// operation writes it. Ordering that work with the operation's stream
    /// is the caller's: the buffer orders nothing.
    pub unsafe fn from_raw_parts(ptr: u64, len: usize, device: usize) -> RawBuffer<T> {
        RawBuffer {
            ptr,
            len,
            device,
            _type: PhantomData,
        }
    }
}

// SAFETY: `from_raw_parts`'s caller promised `len` elements of `T` at `ptr`
// on `device`, allocated and unraced until the work on the given stream is
// done; the stream order is the caller's, so there is nothing to record.
unsafe impl<T: NcclType> DeviceBuffer<T> for RawBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn device(&self) -> usize {
        self.device
    }
    fn read<'a>(&'a self, _stream: &'a CudaStream) -> (u64, Access<'a>) {
        (self.ptr, Access::none())
    }
}

// SAFETY: as above, for writing.
unsafe impl<T: NcclType> DeviceBufferMut<T> for RawBuffer<T> {
    fn write<'a>(&'a mut self, _stream: &'a CudaStream) -> (u64, Access<'a>) {
        (self.ptr, Access::none())
    }
}
