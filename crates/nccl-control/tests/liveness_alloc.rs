//! The liveness channel's steady state allocates nothing: once a hub and a
//! member are up, heartbeats in both directions and idle poll rounds make
//! no heap allocation on any thread. This is its own test binary because
//! the counting allocator below is global to the binary; it counts only
//! inside the measured window.

mod common;
use common::random_id;

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use nccl_control::Secret;
use nccl_control::liveness::LivenessOptions;
use nccl_control::rendezvous;

/// Counts allocations (and reallocations) on every thread while `COUNTING`.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);

impl Counting {
    fn note(size: usize) {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(size, Ordering::Relaxed);
        }
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are this allocator's; the counting
// touches only atomics and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::note(new_size);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract
        // (`ptr` came from this allocator, that is from `System`).
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `GlobalAlloc::dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_heartbeats_make_no_allocation() {
    let heartbeat = Duration::from_millis(5);
    // Short enough that a heartbeat missing in the window would be a loss,
    // long enough for a busy machine.
    let options = LivenessOptions::new()
        .heartbeat(heartbeat)
        .silence_limit(Duration::from_millis(150));
    let secret =
        Secret::from_bytes(b"the secret of the allocation test".to_vec(), "test").expect("secret");
    let id = random_id();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let timeout = Duration::from_secs(10);

    let hub = {
        let (secret, options) = (secret.clone(), options.clone());
        std::thread::spawn(move || {
            rendezvous::serve_live(&listener, 2, &secret, &id, timeout, &options)
                .expect("serve_live")
        })
    };
    let (got, member) =
        rendezvous::join_live(addr, 1, 2, &secret, timeout, &options).expect("join_live");
    assert_eq!(got, id);
    let (hub, refused) = hub.join().expect("hub thread");
    assert!(refused.is_empty(), "{refused:?}");

    // Up: let the roster and the first heartbeats through, so every
    // buffer has its working size.
    std::thread::sleep(Duration::from_millis(200));
    assert!(hub.losses().is_empty() && member.losses().is_empty());

    let window = Duration::from_millis(300);
    COUNTING.store(true, Ordering::SeqCst);
    std::thread::sleep(window);
    COUNTING.store(false, Ordering::SeqCst);
    let (allocs, bytes) = (ALLOCS.load(Ordering::SeqCst), BYTES.load(Ordering::SeqCst));

    // Both sides still heard each other: heartbeats flowed both ways
    // (about 60 each) through the window.
    assert!(
        hub.losses().is_empty() && member.losses().is_empty(),
        "hub {:?}, member {:?}",
        hub.losses(),
        member.losses()
    );
    assert_eq!(
        allocs, 0,
        "{allocs} allocations ({bytes} bytes) in {window:?} of steady state \
         (heartbeat {heartbeat:?})"
    );
    member.leave();
    hub.leave();
}
