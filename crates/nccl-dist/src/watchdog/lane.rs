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
//! streams and the clock: the largest of the typed path's parts, about a
//! fifth of its excess over raw NCCL in session ten's measurements. Here
//! the issuing thread only numbers the call and copies what it was;
//! whoever takes the watch's lock next (the watchdog thread every poll, a
//! reader, a failure) drains the ring into the recorder, in order, before
//! looking at anything (`Watch::lock`). The first call into an empty ring
//! reads the clock (once per drain, in a cache line of its own): the
//! drained calls and the batch they join count as issued then: exact for
//! the first of them, early by less than the time between two drains for
//! the others (and for a batch that one of them opens, where the timeout
//! counts from). The watchdog thread closes the batch at its next poll
//! (see `track.rs`).
//!
//! A call on a stream the watch does not keep is recorded at once on the
//! issuing thread as before (nothing keeps that stream alive for a later
//! event record); a call that finds the ring full (the watchdog thread
//! late by more than [`LANE`] calls) drains it and joins the batch on the
//! issuing thread: nothing is lost either way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nccl_safe::nccl_sys::{cudaStream_t, ncclDataType_t, ncclRedOp_t};
use nccl_safe::{ObservedStream, OpInfo};

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

/// The per-thread default stream's handle (`CU_STREAM_PER_THREAD`): a
/// different stream on every thread, so never kept (a drain on another
/// thread would record behind its own).
pub(super) const PER_THREAD: usize = 2;

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

/// The lane under its lock, alone in its cache line; in the next line,
/// when the first call waiting in it was issued.
#[repr(C, align(64))]
pub(super) struct HotLane {
    lane: Mutex<Lane>,
    /// Nanoseconds from `began` to the first call into the empty ring,
    /// plus one (0: none waits). Written and read under the lane's lock.
    first: AtomicU64,
    began: Instant,
}

/// The lane, locked: calls go in through [`Locked::push`].
pub(super) struct Locked<'a> {
    lane: MutexGuard<'a, Lane>,
    hot: &'a HotLane,
}

impl HotLane {
    /// A lane whose calls on `own` go through the ring; times count from
    /// `began`.
    pub(super) fn new(own: cudaStream_t, began: Instant) -> HotLane {
        HotLane {
            lane: Mutex::new(Lane::new(own)),
            first: AtomicU64::new(0),
            began,
        }
    }

    /// The lane (a panic while it was held left nothing half-done: each
    /// change is a store or two).
    #[inline]
    pub(super) fn lock(&self) -> Locked<'_> {
        Locked {
            lane: self.lane.lock().unwrap_or_else(|p| p.into_inner()),
            hot: self,
        }
    }
}

impl Locked<'_> {
    /// Numbers `call` and keeps it for the next drain; `false` (nothing
    /// done) for a stream not in the list or a full ring. The first call
    /// into the empty ring reads the clock.
    #[inline]
    pub(super) fn push(&mut self, call: Slot) -> bool {
        let empty = !self.lane.waiting();
        if !self.lane.push(call) {
            return false;
        }
        if empty {
            let nanos = u64::try_from(self.hot.began.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
            self.hot.first.store(nanos + 1, Ordering::Relaxed);
        }
        true
    }

    /// Moves the waiting calls, oldest first, into `out` (emptied first):
    /// the number of the first, and when the first was issued (`None`
    /// when none waited).
    pub(super) fn drain(&mut self, out: &mut Vec<Slot>) -> (u64, Option<Instant>) {
        let first = self.lane.drain(out);
        let at = match self.hot.first.swap(0, Ordering::Relaxed) {
            0 => None,
            n => self.hot.began.checked_add(Duration::from_nanos(n - 1)),
        };
        (first, at)
    }

    /// See [`Lane::keep`].
    pub(super) fn keep(&mut self, stream: cudaStream_t) {
        self.lane.keep(stream);
    }

    /// See [`Lane::take_seq`].
    pub(super) fn take_seq(&mut self) -> u64 {
        self.lane.take_seq()
    }

    /// See [`Lane::next_seq`].
    pub(super) fn next_seq(&self) -> u64 {
        self.lane.next_seq()
    }

    /// See [`Lane::waiting`].
    pub(super) fn waiting(&self) -> bool {
        self.lane.waiting()
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
    /// room for it in the list; never the per-thread default stream).
    fn keep(&mut self, stream: cudaStream_t) {
        let s = stream as usize;
        if s == PER_THREAD || self.kept.contains(&s) {
            return;
        }
        if let Some(free) = self.kept.iter_mut().find(|k| **k == NONE) {
            *free = s;
        }
    }

    /// Numbers `call` and keeps it for the next drain; `false` (nothing
    /// done) for a stream not in the list or a full ring.
    #[inline]
    fn push(&mut self, call: Slot) -> bool {
        if !self.kept.contains(&call.stream) || self.next_seq - self.drained >= LANE as u64 {
            return false;
        }
        self.ring[(self.next_seq % LANE as u64) as usize] = call;
        self.next_seq += 1;
        true
    }

    /// Moves the waiting calls, oldest first, into `out` (emptied first),
    /// returning the number of the first.
    fn drain(&mut self, out: &mut Vec<Slot>) -> u64 {
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
    fn take_seq(&mut self) -> u64 {
        debug_assert_eq!(self.drained, self.next_seq, "drained before");
        let seq = self.next_seq;
        self.next_seq += 1;
        self.drained = self.next_seq;
        seq
    }

    /// The number the next call gets.
    fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Whether calls wait in the ring.
    fn waiting(&self) -> bool {
        self.drained != self.next_seq
    }
}

impl super::Watch {
    /// A call the lane did not take: on another stream (recorded now,
    /// while it is live) or with the lane full. Out of line, so that
    /// `issued`'s lane path spans as few instruction cache lines as it
    /// can (`nccl_safe::segments`).
    #[inline(never)]
    pub(super) fn issued_past_the_lane(&self, call: Slot, stream: ObservedStream<'_>) {
        // Another stream (recorded now, while it is live) or a full lane:
        // everything waiting goes first, then this call, under one lock.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let (first, at, seq) = {
            let mut lane = self.lane.lock();
            let (first, at) = lane.drain(&mut st.drained);
            (first, at, lane.take_seq())
        };
        self.take_drained(&mut st, first, at.unwrap_or(now));
        let record = self.record(seq, &call, st.failure.is_some(), now);
        if st.failure.is_some() {
            st.untracked(record);
            return;
        }
        st.tracker.issued(record, stream, &self.ctx, now);
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
        // record in another (the clock's line only for the first call
        // after a drain).
        assert_eq!(std::mem::size_of::<Mutex<Lane>>(), 64);
        assert_eq!(std::mem::offset_of!(HotLane, lane), 0);
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
        // Streams 0x11, 0x12, ...: the first KEPT are kept, in order.
        let stream = |i: usize| (0x10 + i) as cudaStream_t;
        let mut lane = Lane::new(stream(1));
        for i in 2..20 {
            lane.keep(stream(i));
        }
        lane.keep(stream(1));
        assert!(lane.kept.iter().all(|k| *k != NONE));
        assert!(lane.push(call(0, stream(KEPT))));
        assert!(!lane.push(call(0, stream(KEPT + 1))));
    }
}

#[cfg(test)]
mod threaded {
    use std::sync::Arc;

    use super::*;

    /// Issuing threads pushing (and taking the slow path when the ring is
    /// full or the stream is not kept) while a drainer empties the lane:
    /// every call comes out once, numbered without a gap, and each
    /// thread's calls in the order it made them.
    const CALLS: usize = 3000;

    /// A drain's calls, numbered from `first`, as (number, thread, the
    /// thread's call index): each call's count is `thread * CALLS + index`.
    fn came_out(out: &mut Vec<(u64, usize, usize)>, first: u64, taken: &[Slot]) {
        for (seq, c) in (first..).zip(taken) {
            out.push((seq, c.count / CALLS, c.count % CALLS));
        }
    }

    #[test]
    fn calls_from_many_threads_come_out_once_in_order_and_gap_free() {
        const THREADS: usize = 4;
        let (own, other) = (0x1000usize, 0x3000usize);
        let hot = Arc::new(HotLane::new(own as cudaStream_t, Instant::now()));
        // What came out, by number: (thread, its call index).
        let out = Arc::new(Mutex::new(Vec::<(u64, usize, usize)>::new()));
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (hot, out, done) = (Arc::clone(&hot), Arc::clone(&out), Arc::clone(&done));
                s.spawn(move || {
                    let mut taken = Vec::with_capacity(LANE);
                    for i in 0..CALLS {
                        let stream = if i % 97 == 0 { other } else { own };
                        let slot = Slot {
                            op: "ncclAllReduce",
                            count: t * CALLS + i,
                            stream,
                            ..Slot::EMPTY
                        };
                        let mut lane = hot.lock();
                        if lane.push(slot) {
                            continue;
                        }
                        // The slow path, as `Watch::issued` takes it: what
                        // waits first, then this call, under one lock.
                        let (first, _) = lane.drain(&mut taken);
                        let seq = lane.take_seq();
                        let mut out = out.lock().unwrap();
                        came_out(&mut out, first, &taken);
                        out.push((seq, t, i));
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
            let (hot, out) = (Arc::clone(&hot), Arc::clone(&out));
            s.spawn(move || {
                let mut taken = Vec::with_capacity(LANE);
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::SeqCst) == THREADS;
                    {
                        let mut lane = hot.lock();
                        let (first, at) = lane.drain(&mut taken);
                        assert_eq!(
                            at.is_some(),
                            !taken.is_empty(),
                            "a time for each drain with calls"
                        );
                        came_out(&mut out.lock().unwrap(), first, &taken);
                    }
                    if finished {
                        break;
                    }
                    std::thread::yield_now();
                }
            });
        });
        let mut out = out.lock().unwrap().clone();
        out.sort();
        assert_eq!(out.len(), THREADS * CALLS, "every call once");
        for (k, (seq, _, _)) in out.iter().enumerate() {
            assert_eq!(*seq, k as u64, "numbers without a gap");
        }
        for t in 0..THREADS {
            let mine: Vec<usize> = out.iter().filter(|c| c.1 == t).map(|c| c.2).collect();
            assert_eq!(
                mine,
                (0..CALLS).collect::<Vec<_>>(),
                "thread {t}'s calls in its order"
            );
        }
    }

    #[test]
    fn the_per_thread_default_stream_is_never_kept() {
        let hot = HotLane::new(PER_THREAD as cudaStream_t, Instant::now());
        let mut lane = hot.lock();
        let slot = Slot {
            stream: PER_THREAD,
            ..Slot::EMPTY
        };
        assert!(!lane.push(slot));
        lane.keep(PER_THREAD as cudaStream_t);
        assert!(!lane.push(slot));
    }
}
