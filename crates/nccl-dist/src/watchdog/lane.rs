//! The issuing threads' side of a watch: a call on a stream the watch
//! keeps costs a short lock and one record written into a ring, on memory
//! that holds nothing else (one cache line for the lock, the counters and
//! the kept streams; one for the record).
//!
//! The typed path's cost per call is the cache lines it touches, not its
//! instructions: between two calls NCCL's own enqueue (6–9 µs on the lent
//! H100s) pushes our state out of the nearer caches. Recording a call
//! straight into the flight recorder touched the watch's lock, its
//! history ring (two lines a record), its open batch, its list of kept
//! streams and the clock: about half of the typed path's excess over raw
//! NCCL in session ten's measurements. Here the issuing thread only
//! numbers the call and copies what it was; whoever takes the watch's
//! lock next (the watchdog thread every poll, a reader, a failure)
//! drains the ring into the recorder, in order, before looking at
//! anything (`Watch::lock`), and stamps the drained calls with the time
//! it drains them: at most one poll interval after their issue. The
//! watchdog thread closes the batch they join at its next poll (see
//! `track.rs`), which is when a batch's first call counts as issued for
//! the timeout.
//!
//! A call on a stream the watch does not keep is recorded at once on the
//! issuing thread as before (nothing keeps that stream alive for a later
//! event record), and so is a call that finds the ring full (the watchdog
//! thread late by more than [`LANE`] calls): nothing is lost either way.

use std::sync::{Mutex, MutexGuard};

use nccl_safe::OpInfo;
use nccl_safe::nccl_sys::{cudaStream_t, ncclDataType_t, ncclRedOp_t};

/// Calls the ring holds between two drains: at 5 µs a call, 2.5 ms of a
/// hot loop, more than the watchdog's default poll interval (2 ms).
pub(super) const LANE: usize = 512;

/// Streams whose calls go through the ring: the communicator's own, and
/// the first few given to `Watched::track_stream` or inherited from a
/// parent. Calls on further kept streams take the slower path.
const KEPT: usize = 4;

/// An empty place in the list of kept streams (0 is a stream: the
/// legacy default one).
const NONE: usize = usize::MAX;

/// One call as the issuing thread left it: a cache line.
#[derive(Clone, Copy)]
#[repr(align(64))]
pub(super) struct Slot {
    pub(super) op: &'static str,
    pub(super) count: usize,
    pub(super) peer: Option<usize>,
    pub(super) redop: Option<ncclRedOp_t>,
    pub(super) dtype: ncclDataType_t,
    /// The stream's handle, as a number (only an identifier here).
    stream: usize,
}

impl Slot {
    const EMPTY: Slot = Slot {
        op: "",
        count: 0,
        peer: None,
        redop: None,
        dtype: ncclDataType_t::ncclInt8,
        stream: NONE,
    };

    /// The call `info` on `stream`.
    #[inline]
    pub(super) fn of(info: &OpInfo, stream: cudaStream_t) -> Slot {
        Slot {
            op: info.op,
            count: info.count,
            peer: info.peer,
            redop: info.redop,
            dtype: info.dtype,
            stream: stream as usize,
        }
    }

    /// The stream it was issued on.
    pub(super) fn stream(&self) -> cudaStream_t {
        self.stream as cudaStream_t
    }
}

/// The ring and its counters: calls `drained..next_seq` wait in it, call
/// `s` at `s % LANE`. With its lock, one cache line ([`HotLane`]).
pub(super) struct Lane {
    next_seq: u64,
    drained: u64,
    kept: [usize; KEPT],
    ring: Box<[Slot; LANE]>,
}

/// The lane under its lock, alone in its cache line.
#[repr(align(64))]
pub(super) struct HotLane(Mutex<Lane>);

impl HotLane {
    /// A lane whose calls on `own` go through the ring.
    pub(super) fn new(own: cudaStream_t) -> HotLane {
        HotLane(Mutex::new(Lane::new(own)))
    }

    /// The lane (a panic while it was held left nothing half-done: each
    /// change is a store or two).
    #[inline]
    pub(super) fn lock(&self) -> MutexGuard<'_, Lane> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Lane {
    fn new(own: cudaStream_t) -> Lane {
        let ring: Box<[Slot]> = vec![Slot::EMPTY; LANE].into_boxed_slice();
        let Ok(ring) = ring.try_into() else {
            unreachable!("made with LANE slots")
        };
        let mut lane = Lane {
            next_seq: 0,
            drained: 0,
            kept: [NONE; KEPT],
            ring,
        };
        lane.keep(own);
        lane
    }

    /// Calls on `stream` go through the ring from now on (while there is
    /// room for it in the list).
    pub(super) fn keep(&mut self, stream: cudaStream_t) {
        let s = stream as usize;
        if self.kept.contains(&s) {
            return;
        }
        if let Some(free) = self.kept.iter_mut().find(|k| **k == NONE) {
            *free = s;
        }
    }

    /// Numbers `call` and keeps it for the next drain; `false` (nothing
    /// done) for a stream not in the list or a full ring.
    #[inline]
    pub(super) fn push(&mut self, call: Slot) -> bool {
        if !self.kept.contains(&call.stream) || self.next_seq - self.drained >= LANE as u64 {
            return false;
        }
        self.ring[(self.next_seq % LANE as u64) as usize] = call;
        self.next_seq += 1;
        true
    }

    /// Moves the waiting calls, oldest first, into `out` (emptied first),
    /// returning the number of the first.
    pub(super) fn drain(&mut self, out: &mut Vec<Slot>) -> u64 {
        out.clear();
        let first = self.drained;
        for seq in first..self.next_seq {
            out.push(self.ring[(seq % LANE as u64) as usize]);
        }
        self.drained = self.next_seq;
        first
    }

    /// Numbers a call recorded outside the ring (call [`Lane::drain`]
    /// first, under the same lock, so that none waits behind it).
    pub(super) fn take_seq(&mut self) -> u64 {
        debug_assert_eq!(self.drained, self.next_seq, "drained before");
        let seq = self.next_seq;
        self.next_seq += 1;
        self.drained = self.next_seq;
        seq
    }

    /// The number the next call gets.
    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Whether calls wait in the ring.
    pub(super) fn waiting(&self) -> bool {
        self.drained != self.next_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(count: usize, stream: cudaStream_t) -> Slot {
        Slot {
            op: "ncclAllReduce",
            count,
            peer: Some(count % 3),
            stream: stream as usize,
            ..Slot::EMPTY
        }
    }

    #[test]
    fn a_call_touches_two_cache_lines() {
        // The lock, the counters and the kept streams in one line; a
        // record in another.
        assert_eq!(std::mem::size_of::<HotLane>(), 64);
        assert_eq!(std::mem::align_of::<HotLane>(), 64);
        assert_eq!(std::mem::size_of::<Slot>(), 64);
    }

    #[test]
    fn calls_come_out_in_order_with_their_numbers() {
        let own = 0x1000 as cudaStream_t;
        let mut lane = Lane::new(own);
        let mut out = Vec::with_capacity(LANE);
        for i in 0..10 {
            assert!(lane.push(call(i, own)));
        }
        assert!(lane.waiting());
        assert_eq!(lane.drain(&mut out), 0);
        assert_eq!(
            out.iter().map(|s| s.count).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
        assert!(!lane.waiting());
        // A call recorded outside takes the next number; the ring goes on after it.
        assert_eq!(lane.take_seq(), 10);
        assert!(lane.push(call(11, own)));
        assert_eq!(lane.drain(&mut out), 11);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn other_streams_and_a_full_ring_take_the_slow_path() {
        let own = 0x1000 as cudaStream_t;
        let other = 0x2000 as cudaStream_t;
        let mut lane = Lane::new(own);
        assert!(!lane.push(call(0, other)), "a stream not kept");
        lane.keep(other);
        assert!(lane.push(call(0, other)));
        for i in 1..LANE {
            assert!(lane.push(call(i, own)), "room for {i}");
        }
        assert!(!lane.push(call(LANE, own)), "full");
        let mut out = Vec::new();
        assert_eq!(lane.drain(&mut out), 0);
        assert_eq!(out.len(), LANE);
        assert_eq!(out[0].stream(), other);
        // Wrapped around: the ring's slots are reused in order.
        for i in 0..LANE + 7 {
            assert!(lane.push(call(i, own)));
            if i % 100 == 99 {
                lane.drain(&mut out);
            }
        }
        let first = lane.drain(&mut out);
        assert_eq!(first + out.len() as u64, (2 * LANE + 7) as u64);
        assert_eq!(out.last().map(|s| s.count), Some(LANE + 6));
    }

    #[test]
    fn the_list_of_kept_streams_is_bounded() {
        let mut lane = Lane::new(1 as cudaStream_t);
        for s in 2..20usize {
            lane.keep(s as cudaStream_t);
        }
        lane.keep(1 as cudaStream_t);
        assert!(lane.kept.iter().all(|k| *k != NONE));
        assert!(lane.push(call(0, KEPT as cudaStream_t)));
        assert!(!lane.push(call(0, (KEPT + 1) as cudaStream_t)));
    }
}
