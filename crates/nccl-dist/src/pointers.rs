//! Which device a raw pointer belongs to, asking the driver once per
//! allocation rather than once per pointer per call.
//!
//! The [`Communicator`](crate::Communicator) methods take device addresses
//! as `u64`. Each must be CUDA memory on the communicator's device, and the
//! check runs before NCCL sees the call. A driver query per pointer costs
//! two of them per collective on the hot path, so each thread remembers the
//! extents of the last [`SLOTS`] allocations the driver described: a
//! buffer that lies inside a remembered extent gets that extent's device
//! without a driver call; any other pointer is asked about, and its
//! allocation remembered.
//!
//! What that gives up: an allocation that is freed and replaced, at an
//! overlapping address, by one on another device is answered from memory
//! until its slot is reused. Handing over freed memory already breaks the
//! trait's contract; the check exists to turn the common slips (a host
//! pointer, a tensor of another GPU, garbage) into errors, and it still does
//! for every pointer the thread has not used before.

use std::cell::RefCell;

use nccl_safe::cudarc::driver::sys;

use crate::error::{Error, Result};

/// Allocations remembered per thread.
pub(crate) const SLOTS: usize = 16;

/// One allocation's extent, `[start, end)`, and its device. `end == 0`:
/// unused.
#[derive(Clone, Copy)]
struct Extent {
    start: u64,
    end: u64,
    device: usize,
}

impl Extent {
    const EMPTY: Extent = Extent {
        start: 0,
        end: 0,
        device: 0,
    };

    /// Whether `[ptr, ptr + bytes)` lies inside.
    fn holds(&self, ptr: u64, bytes: u64) -> bool {
        ptr >= self.start && ptr.checked_add(bytes).is_some_and(|e| e <= self.end)
    }
}

/// The extents one thread has learned, the newest at `next - 1`.
struct Known {
    slots: [Extent; SLOTS],
    next: usize,
}

thread_local! {
    static KNOWN: RefCell<Known> = const {
        RefCell::new(Known {
            slots: [Extent::EMPTY; SLOTS],
            next: 0,
        })
    };
}

impl Known {
    fn find(&self, ptr: u64, bytes: u64) -> Option<usize> {
        // Newest first: a loop over a few buffers hits at once.
        (1..=SLOTS)
            .map(|back| &self.slots[(self.next + SLOTS - back) % SLOTS])
            .find(|e| e.end != 0 && e.holds(ptr, bytes))
            .map(|e| e.device)
    }

    fn learn(&mut self, extent: Extent) {
        // An extent that overlaps the new one is stale (its memory was
        // freed and the address handed out again): forget it.
        for e in &mut self.slots {
            if e.end != 0 && e.start < extent.end && extent.start < e.end {
                *e = Extent::EMPTY;
            }
        }
        self.slots[self.next] = extent;
        self.next = (self.next + 1) % SLOTS;
    }
}

/// The CUDA device of the `bytes` bytes at `ptr`; a pointer the driver
/// does not know (host memory, garbage) is an error here rather than a
/// fault inside NCCL.
pub(crate) fn device_of(op: &'static str, ptr: u64, bytes: u64) -> Result<usize> {
    if let Some(device) = KNOWN.with(|k| k.borrow().find(ptr, bytes)) {
        return Ok(device);
    }
    let device = ask_device(op, ptr)?;
    if let Some((start, size)) = extent_of(ptr) {
        let extent = Extent {
            start,
            end: start.saturating_add(size),
            device,
        };
        KNOWN.with(|k| k.borrow_mut().learn(extent));
    }
    Ok(device)
}

/// The driver's answer for one pointer.
fn ask_device(op: &'static str, ptr: u64) -> Result<usize> {
    let mut ordinal: i32 = -1;
    // SAFETY: one int is written; the driver validates `ptr` itself.
    let code = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    if code != sys::CUresult::CUDA_SUCCESS || ordinal < 0 {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("{ptr:#x} is not CUDA device memory ({code:?})"),
        });
    }
    Ok(ordinal as usize)
}

/// The start and size of the allocation that holds `ptr` (a pointer the
/// driver already knows), or `None` when it will not say.
fn extent_of(ptr: u64) -> Option<(u64, u64)> {
    let mut start: u64 = 0;
    let mut size: usize = 0;
    let mut attributes = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut std::ffi::c_void; 2] = [
        (&mut start as *mut u64).cast(),
        (&mut size as *mut usize).cast(),
    ];
    // SAFETY: two attributes, each written to its own slot of the size the
    // driver documents (a CUdeviceptr and a size_t), both alive for the
    // call.
    let code = unsafe {
        sys::cuPointerGetAttributes(
            attributes.len() as u32,
            attributes.as_mut_ptr(),
            data.as_mut_ptr(),
            ptr,
        )
    };
    let size = size as u64;
    (code == sys::CUresult::CUDA_SUCCESS && start != 0 && ptr >= start && ptr - start < size)
        .then_some((start, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(start: u64, end: u64, device: usize) -> Extent {
        Extent { start, end, device }
    }

    fn known() -> Known {
        Known {
            slots: [Extent::EMPTY; SLOTS],
            next: 0,
        }
    }

    #[test]
    fn a_buffer_inside_a_known_extent_is_answered_from_memory() {
        let mut k = known();
        k.learn(extent(0x1000, 0x2000, 3));
        assert_eq!(k.find(0x1000, 0x1000), Some(3));
        assert_eq!(k.find(0x1800, 8), Some(3));
        // Running past the end, or starting before it: ask the driver.
        assert_eq!(k.find(0x1800, 0x1000), None);
        assert_eq!(k.find(0xff8, 16), None);
        assert_eq!(k.find(u64::MAX - 4, 8), None);
    }

    #[test]
    fn a_new_extent_replaces_every_overlapping_one_and_the_oldest_goes_first() {
        let mut k = known();
        k.learn(extent(0x1000, 0x2000, 0));
        k.learn(extent(0x1800, 0x3000, 1));
        assert_eq!(k.find(0x1000, 8), None);
        assert_eq!(k.find(0x1800, 8), Some(1));
        for i in 0..SLOTS as u64 {
            k.learn(extent(0x10_0000 * (i + 1), 0x10_0000 * (i + 1) + 0x100, 2));
        }
        assert_eq!(k.find(0x1800, 8), None, "the oldest slot was reused");
        assert_eq!(k.find(0x10_0000 * SLOTS as u64, 8), Some(2));
    }
}
