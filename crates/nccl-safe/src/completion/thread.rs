//! The one waker thread of the process: it watches every tracked
//! operation and wakes its future when the work is done.
//!
//! Started on the first registration and never stopped. With nothing in
//! flight it sleeps on a condition variable (no CPU). With work in flight
//! it looks at every operation (one `cuEventQuery` each) back to back,
//! yielding the CPU between passes, for [`SPIN`] after the last
//! registration or completion, so a short collective is seen finished
//! within a few microseconds; after that it sleeps between passes (a new
//! registration wakes it), 5 µs doubling to 1 ms, so a long wait costs about a thousand event queries a
//! second. The cost is at most one core for [`SPIN`] after each burst of
//! activity.
//!
//! While it has work in flight the thread holds an [`ExitHold`]: the
//! process's exit waits (at most the longest deadline of that work, plus
//! a second) until the thread has let go of every operation. Without it,
//! an exit right after a completion resolved early (a timeout, an abort)
//! ran the exit handlers that tear CUDA down while this thread still
//! queried the operation's event and freed its buffers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::ExitHold;
use crate::completion::state::{Entry, Step};

/// How long the thread polls without sleeping after activity.
const SPIN: Duration = Duration::from_micros(500);
/// The first pause after [`SPIN`]; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_micros(5);
const MAX_PAUSE: Duration = Duration::from_millis(1);

/// The thread's name (the bench finds its CPU time by it).
pub(crate) const THREAD_NAME: &str = "nccl-completion";

struct Registry {
    incoming: Mutex<Vec<Arc<dyn Entry>>>,
    /// Set (under the lock) when `incoming` gains an entry, so a pass of
    /// the thread takes the lock only when there is something to take,
    /// and a registration does not wait behind the thread's every pass.
    fresh: AtomicBool,
    arrived: Condvar,
}

static REGISTRY: OnceLock<Option<Registry>> = OnceLock::new();

/// Hands `entry` to the waker thread, starting it if needed. `false` when
/// the thread cannot be started (the caller then keeps what the entry
/// owns forever rather than free it early).
pub(crate) fn register(entry: Arc<dyn Entry>) -> bool {
    let registry = REGISTRY.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name(THREAD_NAME.to_string())
            .spawn(run);
        spawned.ok().map(|_| Registry {
            incoming: Mutex::new(Vec::new()),
            fresh: AtomicBool::new(false),
            arrived: Condvar::new(),
        })
    });
    let Some(registry) = registry else {
        return false;
    };
    let mut incoming = registry.incoming.lock().unwrap_or_else(|p| p.into_inner());
    incoming.push(entry);
    registry.fresh.store(true, Ordering::Release);
    drop(incoming);
    registry.arrived.notify_one();
    true
}

/// One look at `entry` at `now`: whether to keep watching it. A panic in what
/// the entry runs of its owner's (the executor's waker, the drop of the
/// buffers) must not end this thread, which every other future waits on:
/// it is caught, and what the entry owns is leaked (the device's use of
/// it is not known here, and leaked memory is never used after free).
fn step(entry: &Arc<dyn Entry>, now: Instant) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| entry.step(now))) {
        Ok(next) => next == Step::Keep,
        Err(_) => {
            std::mem::forget(Arc::clone(entry));
            tracing::error!(
                "nccl-completion: a waker or the drop of a completion's buffers panicked; \
                 its buffers are leaked and the other completions go on"
            );
            false
        }
    }
}

/// The thread's loop.
fn run() {
    // The registry is set right after this thread is spawned.
    let registry = loop {
        match REGISTRY.get() {
            Some(Some(r)) => break r,
            Some(None) => return,
            None => std::thread::yield_now(),
        }
    };
    let mut pending: Vec<Arc<dyn Entry>> = Vec::new();
    // Held while `pending` is not empty.
    let mut hold: Option<ExitHold> = None;
    let mut active = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        if pending.is_empty() || registry.fresh.load(Ordering::Acquire) {
            let mut incoming = registry.incoming.lock().unwrap_or_else(|p| p.into_inner());
            while pending.is_empty() && incoming.is_empty() {
                incoming = registry
                    .arrived
                    .wait(incoming)
                    .unwrap_or_else(|p| p.into_inner());
            }
            registry.fresh.store(false, Ordering::Relaxed);
            if !incoming.is_empty() {
                active = Instant::now();
                let limit = incoming
                    .iter()
                    .map(|e| e.remaining(active))
                    .max()
                    .unwrap_or_default()
                    // The work may outlive its deadline until the abort
                    // that the deadline triggers has ended it.
                    .saturating_add(crate::comm::ABORT_ALLOWANCE);
                match &hold {
                    Some(_) => ExitHold::extend(limit),
                    None => hold = Some(ExitHold::new(limit)),
                }
                pending.append(&mut incoming);
                pause = FIRST_PAUSE;
            }
        }
        let now = Instant::now();
        let before = pending.len();
        // Released entries drop here: the buffers of a future that is
        // gone are freed on this thread, after the device is done.
        pending.retain(|entry| step(entry, now));
        if pending.len() != before {
            active = now;
            pause = FIRST_PAUSE;
        }
        if pending.is_empty() {
            if hold.take().is_some() {
                tracing::trace!("nccl-completion: nothing in flight; exit no longer waits");
            }
            continue;
        }
        if now.duration_since(active) < SPIN {
            std::thread::yield_now();
        } else {
            // A sleep that a registration cuts short.
            let incoming = registry.incoming.lock().unwrap_or_else(|p| p.into_inner());
            if incoming.is_empty() {
                drop(registry.arrived.wait_timeout(incoming, pause));
            }
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Panics;

    impl Entry for Panics {
        fn remaining(&self, _: Instant) -> Duration {
            Duration::ZERO
        }

        fn step(&self, _: Instant) -> Step {
            panic!("a waker that panics (on purpose, in a test)");
        }
    }

    struct Flag(Arc<AtomicBool>);

    impl Entry for Flag {
        fn remaining(&self, _: Instant) -> Duration {
            Duration::ZERO
        }

        fn step(&self, _: Instant) -> Step {
            self.0.store(true, Ordering::SeqCst);
            Step::Release
        }
    }

    /// An entry that panics does not end the thread: one registered
    /// after it is still looked at.
    #[test]
    fn a_panicking_entry_does_not_stop_the_others() {
        assert!(register(Arc::new(Panics)));
        let seen = Arc::new(AtomicBool::new(false));
        assert!(register(Arc::new(Flag(Arc::clone(&seen)))));
        let until = Instant::now() + Duration::from_secs(5);
        while !seen.load(Ordering::SeqCst) {
            assert!(Instant::now() < until, "the waker thread stopped");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
