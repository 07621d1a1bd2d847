//! Where a call's host time goes, measured in place (a diagnostic, built
//! only with `--features segments`; without it every mark is empty and
//! compiles to nothing).
//!
//! A profile by sampling sees our frames spread thin; a microbenchmark of
//! each piece alone sees them cheap. Neither says what the pieces cost in
//! the hot loop, between NCCL's calls, with NCCL's working set around
//! them. Here the enqueue path marks the boundaries between its parts with
//! the time-stamp counter: each mark adds the cycles since the thread's
//! previous mark to the part it closes, on this thread only (no shared
//! cache line, no atomic). The bench's raw sides mark around their NCCL
//! calls the same way, so NCCL's own time on the typed path can be set
//! against NCCL's time on the raw one, on the same communicators.
//!
//! A mark costs one `rdtsc` and a thread-local add (about 10 ns): the
//! totals are for comparing parts, not for absolute figures.

/// The part a mark closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
#[non_exhaustive]
pub enum Seg {
    /// Since the thread's last mark, outside our code (the caller's loop,
    /// returns through the caller's frames).
    Outside,
    /// `Comm::on` to the end of the checks every operation starts with
    /// (thread, stream's device, capture status).
    Check,
    /// Opening a buffer for the call (its address and ordering).
    Buffers,
    /// The rest of the operation's validation, up to the enqueue.
    Validate,
    /// The enqueue's own checks: the observer's gate, the trace span.
    Gate,
    /// The communicator's lock, the abort check, the context.
    Lock,
    /// NCCL's enqueue function itself.
    Nccl,
    /// The lock's release, the result's check.
    Unlock,
    /// The observer's record of the call (the watchdog's).
    Observe,
    /// Our part of a group's start and end: the guard, the capture check,
    /// the communicators' release, the observers' reports.
    Group,
    /// `ncclGroupStart` and `ncclGroupEnd`.
    GroupNccl,
    /// The watchdog's event record behind a batch, on the issuing thread
    /// (the rest of its record is `Observe`).
    Record,
}

/// Every part, in [`Seg`] order, with its name.
pub const SEGS: [(Seg, &str); 12] = [
    (Seg::Outside, "outside"),
    (Seg::Check, "check"),
    (Seg::Buffers, "buffers"),
    (Seg::Validate, "validate"),
    (Seg::Gate, "gate"),
    (Seg::Lock, "lock"),
    (Seg::Nccl, "nccl"),
    (Seg::Unlock, "unlock"),
    (Seg::Observe, "observe"),
    (Seg::Group, "group"),
    (Seg::GroupNccl, "group_nccl"),
    (Seg::Record, "record"),
];

/// Closes the part `seg` on this thread: the time since the previous mark
/// is added to it. Nothing without the `segments` feature.
#[inline(always)]
pub fn mark(seg: Seg) {
    #[cfg(feature = "segments")]
    imp::mark(seg);
    let _ = seg;
}

/// This thread's totals since its last `take` (or its first mark), in
/// nanoseconds, with the number of marks, in [`SEGS`] order; the totals
/// restart. Empty without the `segments` feature.
pub fn take() -> Vec<(&'static str, f64, u64)> {
    #[cfg(feature = "segments")]
    {
        imp::take()
    }
    #[cfg(not(feature = "segments"))]
    Vec::new()
}

/// Whether marks are counted (the `segments` feature).
pub const ENABLED: bool = cfg!(feature = "segments");

#[cfg(feature = "segments")]
mod imp {
    use std::cell::Cell;
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    use super::{SEGS, Seg};

    const N: usize = SEGS.len();

    thread_local! {
        static LAST: Cell<u64> = const { Cell::new(0) };
        static TOTAL: [Cell<u64>; N] = const { [const { Cell::new(0) }; N] };
        static COUNT: [Cell<u64>; N] = const { [const { Cell::new(0) }; N] };
    }

    #[inline(always)]
    fn now() -> u64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `rdtsc` reads the time-stamp counter; no memory access.
        unsafe {
            std::arch::x86_64::_rdtsc()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            static START: OnceLock<Instant> = OnceLock::new();
            START.get_or_init(Instant::now).elapsed().as_nanos() as u64
        }
    }

    /// Nanoseconds per count, measured once against the clock.
    fn ns_per_tick() -> f64 {
        static SCALE: OnceLock<f64> = OnceLock::new();
        *SCALE.get_or_init(|| {
            let (t0, c0) = (Instant::now(), now());
            std::thread::sleep(Duration::from_millis(20));
            let (t1, c1) = (Instant::now(), now());
            (t1 - t0).as_nanos() as f64 / (c1.wrapping_sub(c0)).max(1) as f64
        })
    }

    #[inline(always)]
    pub(super) fn mark(seg: Seg) {
        let t = now();
        let last = LAST.with(|l| l.replace(t));
        if last != 0 {
            let i = seg as usize;
            // A counter read lower than the last (another socket's, not
            // in step) adds nothing rather than wrapping.
            TOTAL.with(|s| s[i].set(s[i].get().wrapping_add(t.saturating_sub(last))));
            COUNT.with(|c| c[i].set(c[i].get().wrapping_add(1)));
        }
    }

    pub(super) fn take() -> Vec<(&'static str, f64, u64)> {
        let scale = ns_per_tick();
        LAST.with(|l| l.set(0));
        TOTAL.with(|s| {
            COUNT.with(|c| {
                SEGS.iter()
                    .enumerate()
                    .map(|(i, (_, name))| (*name, s[i].replace(0) as f64 * scale, c[i].replace(0)))
                    .collect()
            })
        })
    }
}
