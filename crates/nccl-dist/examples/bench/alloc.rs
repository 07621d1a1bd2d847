//! A global allocator that counts how many times memory was asked for:
//! per thread, and in the whole process. The bench reports the process
//! count over its timed windows, so work that the library does on its own
//! threads for each call (the watchdog's, the liveness channel's) is
//! counted too, not only the calling thread's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting.
pub struct Counting;

thread_local! {
    // `const` and without `Drop`: reading it never allocates, so it is
    // safe to touch from inside the allocator.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Every allocation of every thread (a relaxed atomic add: the bench only
/// needs counts read after the threads met on a barrier, which orders them).
static PROCESS: AtomicU64 = AtomicU64::new(0);

fn bump() {
    PROCESS.fetch_add(1, Ordering::Relaxed);
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

/// Allocations (including reallocations) made by this thread so far.
pub fn thread() -> u64 {
    ALLOCATIONS.try_with(Cell::get).unwrap_or(0)
}

/// Allocations (including reallocations) made by any thread of this
/// process so far.
pub fn process() -> u64 {
    PROCESS.load(Ordering::Relaxed)
}

// SAFETY: every method forwards to `System` with the caller's arguments;
// the counters are an atomic and a thread-local `Cell`, neither allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}
