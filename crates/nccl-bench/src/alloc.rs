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

fn bump(size: usize) {
    PROCESS.fetch_add(1, Ordering::Relaxed);
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    if TRACING.load(Ordering::Relaxed) {
        trace(size);
    }
}

/// With `NCCL_RS_BENCH_ALLOC_TRACE=1`: allocations inside timed windows
/// are named (thread and size) on stderr, the first few of them, to find
/// who allocates.
static TRACING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static TRACED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

/// Opens or closes the traced window (when the environment asks for it).
pub fn trace_window(open: bool) {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *WANTED.get_or_init(|| std::env::var_os(crate::env::ALLOC_TRACE).is_some()) {
        TRACING.store(open, Ordering::Relaxed);
    }
}

fn trace(size: usize) {
    if IN_TRACE.try_with(|t| t.replace(true)).unwrap_or(true) {
        return;
    }
    if TRACED.fetch_add(1, Ordering::Relaxed) < 8 {
        let thread = std::thread::current();
        eprintln!(
            "bench: allocation of {size} bytes in a timed window on thread {:?} ({:?})",
            thread.name(),
            thread.id()
        );
        if std::env::var_os(crate::env::ALLOC_TRACE).is_some_and(|v| v == "bt") {
            eprintln!("{}", std::backtrace::Backtrace::force_capture());
        }
    }
    let _ = IN_TRACE.try_with(|t| t.set(false));
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
        bump(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump(layout.size());
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump(new_size);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}
