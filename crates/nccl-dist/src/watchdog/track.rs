//! How the watchdog knows which operations finished, at a fraction of a
//! microsecond per operation.
//!
//! Recording a CUDA event behind every operation costs a driver call each
//! (measured: the watchdog added 4–6 µs to every small collective on H200s
//! that way). Operations on one stream finish in issue order, so one event
//! behind the last of a batch tells the whole batch finished. So:
//!
//! - an operation on a stream the watch keeps alive (the communicator's
//!   own, or one given to `Watched::track_stream`) waits in the watch's
//!   lane (`lane.rs`) until the next look at the watch drains it; there
//!   it joins the open batch;
//! - the watchdog thread, at each poll, drains the lane and closes the
//!   open batch by recording the event itself, on its stream, which the
//!   watch keeps alive: a burst of small collectives pays one record per
//!   poll, none of it on the issuing thread;
//! - an operation on any other stream (a framework's stream handed through
//!   the `Communicator` trait) is recorded at once on the issuing thread,
//!   since nothing here keeps that stream alive for a later record; so is
//!   one that finds the lane full, on a kept stream, at most every
//!   [`SAMPLE`];
//! - a batch whose stream is being captured into a CUDA graph is not
//!   tracked (its operations run when the graph is launched; an event
//!   recorded into the capture would never complete).
//!
//! The timeout counts from the first operation of the oldest unfinished
//! batch. The first call into an empty lane reads the clock and the calls
//! drained with it carry that time: exact for a batch that opens with the
//! first of them, early by less than the time between two drains for one
//! that opens later in the same drain (a switch of stream).
//!
//! One race is left: if another thread begins capturing the
//! communicator's own stream between the watchdog thread's capture check
//! and its record, the record lands in that capture (a harmless
//! event-record dependency) and its batch turns untracked; an event query
//! from this thread during a global-mode capture elsewhere may also make
//! the driver refuse that capture. Capture on a stream the watchdog does
//! not keep, or in thread-local or relaxed mode, to avoid both.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use nccl_safe::ObservedStream;
use nccl_safe::cudarc::driver::{CudaContext, CudaEvent, sys};
use nccl_safe::nccl_sys::cudaStream_t;
use nccl_safe::segments::{self, Seg};

use crate::record::{OpRecord, OpState};

/// An issuing thread that records on a kept stream (a full lane) does so
/// at most once per this interval (per communicator), the watchdog
/// thread's poll interval by default: a record and its two capture checks
/// cost 0.5–0.6 µs in a hot loop on the lent H100s (measured in place),
/// 0.4–0.5 µs a training-like step at 200 µs and under 0.1 µs at 2 ms.
/// The timeout counts from a batch's first operation either way; only the
/// flight recorder's `took` is per batch.
pub(super) const SAMPLE: Duration = Duration::from_millis(2);
/// Room reserved up front, so tracking allocates nothing in steady state.
const RESERVE: usize = 256;

/// Marks the end of a batch's close for `--features segments` (nothing
/// otherwise), whichever way the close returns.
struct Closed;

impl Drop for Closed {
    fn drop(&mut self) {
        segments::mark(Seg::Record);
    }
}

/// Consecutive operations `first..=last` on one stream, behind one event.
struct Batch {
    first: u64,
    last: u64,
    event: CudaEvent,
    issued: Instant,
    /// The stream the event was recorded on: a run of batches on one
    /// stream finishes in order.
    stream: cudaStream_t,
}

/// Operations issued since the last record, not yet behind an event.
#[derive(Clone, Copy)]
pub(super) struct Open {
    pub(super) first: u64,
    last: u64,
    pub(super) issued: Instant,
    stream: cudaStream_t,
}

/// What a watched communicator's operations are doing.
pub(super) struct Tracker {
    pub(super) next_seq: u64,
    batches: VecDeque<Batch>,
    pub(super) open: Option<Open>,
    last_record: Option<Instant>,
    pub(super) history: VecDeque<OpRecord>,
    spare: Vec<CudaEvent>,
    limit: usize,
    /// Streams the watch keeps alive (the communicator's own, and those
    /// given to `Watched::track_stream`): operations on them are batched.
    pub(super) kept: Vec<cudaStream_t>,
}

// SAFETY: the raw stream handle in `Open` is only an identifier and an
// argument to CUDA calls, which are thread-safe; events are `Send`.
unsafe impl Send for Tracker {}

impl Tracker {
    pub(super) fn new(history: usize) -> Tracker {
        Tracker {
            next_seq: 0,
            batches: VecDeque::with_capacity(RESERVE),
            open: None,
            last_record: None,
            history: VecDeque::with_capacity(history + 1),
            spare: Vec::with_capacity(RESERVE),
            limit: history,
            kept: Vec::new(),
        }
    }

    pub(super) fn record_mut(&mut self, seq: u64) -> Option<&mut OpRecord> {
        let first = self.history.front()?.seq;
        let index = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.history.get_mut(index)
    }

    fn mark(&mut self, first: u64, last: u64, state: OpState, took: Option<Duration>) {
        for seq in first..=last {
            if let Some(r) = self.record_mut(seq) {
                r.state = state;
                r.took = took;
            }
        }
    }

    /// Whether some operation is not known to have finished.
    pub(super) fn unfinished(&self) -> bool {
        !self.batches.is_empty() || self.open.is_some()
    }

    /// The oldest unfinished operation: its sequence number and when it
    /// was issued.
    pub(super) fn oldest(&self) -> Option<(u64, Instant)> {
        match (self.batches.front(), &self.open) {
            (Some(b), _) => Some((b.first, b.issued)),
            (None, Some(o)) => Some((o.first, o.issued)),
            (None, None) => None,
        }
    }

    /// The sequence numbers not known to have finished, oldest first.
    pub(super) fn unfinished_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.batches
            .iter()
            .map(|b| (b.first, b.last))
            .chain(self.open.iter().map(|o| (o.first, o.last)))
    }

    /// An operation was issued on `stream` at `now` (the issuing thread).
    ///
    /// `stream` is live until this returns (`ObservedStream`'s promise), so
    /// a batch on it may be closed here; one left open when this returns is
    /// on a kept stream, which the watch keeps alive for a later close.
    pub(super) fn issued(
        &mut self,
        record: OpRecord,
        stream: ObservedStream<'_>,
        ctx: &std::sync::Arc<CudaContext>,
        now: Instant,
    ) {
        let stream = stream.as_raw();
        let own = self.kept.contains(&stream);
        self.join(record, stream, ctx, now);
        let due = !own || self.last_record.is_none_or(|t| now - t >= SAMPLE);
        if due {
            self.close(ctx, now);
        }
    }

    /// An operation joins the open batch (`now`: when it was issued, as
    /// far as the watch knows). An open batch on another stream is closed
    /// first (a batch is one stream), with the watch's context made
    /// current for the record and the thread's own restored after. Calls
    /// drained from the lane (any thread) come here and stay open until
    /// the watchdog thread's next poll; `issued` (the issuing thread)
    /// closes its own when due.
    pub(super) fn join(
        &mut self,
        record: OpRecord,
        stream: cudaStream_t,
        ctx: &std::sync::Arc<CudaContext>,
        now: Instant,
    ) {
        let seq = record.seq;
        self.untracked(record);
        if let Some(open) = self.open
            && open.stream != stream
        {
            self.close(ctx, now);
        }
        match &mut self.open {
            Some(open) => open.last = seq,
            None => {
                self.open = Some(Open {
                    first: seq,
                    last: seq,
                    issued: now,
                    stream,
                })
            }
        }
    }

    /// An operation into the flight recorder only (the watch failed:
    /// nothing is tracked any more; or as the first step of tracking).
    pub(super) fn untracked(&mut self, record: OpRecord) {
        self.next_seq = self.next_seq.max(record.seq + 1);
        self.history.push_back(record);
        while self.history.len() > self.limit {
            self.history.pop_front();
        }
    }

    /// The watchdog thread, each poll: closes the open batch, on a stream
    /// the watch keeps alive (the calls drained from the lane joined it;
    /// closed here at most once a poll, one event record for all of them).
    pub(super) fn settle(&mut self, ctx: &std::sync::Arc<CudaContext>) {
        if let Some(open) = self.open
            && self.kept.contains(&open.stream)
        {
            let _ = ctx.bind_to_thread();
            self.close(ctx, Instant::now());
        }
    }

    /// Records an event behind the open batch, or marks it untracked when
    /// its stream is capturing (or an event cannot be had).
    fn close(&mut self, ctx: &std::sync::Arc<CudaContext>, now: Instant) {
        let Some(open) = self.open.take() else {
            return;
        };
        segments::mark(Seg::Observe);
        let _record = Closed;
        self.last_record = Some(now);
        // A drain on a thread whose current context is another (or none):
        // the watch's for the record, the thread's own back after it. Where
        // it cannot be made current, nothing binds it for good (cudarc's
        // event creation would): the batch is untracked.
        let Some(_current) = Current::make(ctx) else {
            self.mark(open.first, open.last, OpState::Untracked, None);
            return;
        };
        // SAFETY: `open.stream` is a live stream of this context: either
        // this runs inside `issued` for the stream it was handed (live for
        // that call, as `ObservedStream` promises), or the batch stayed
        // open past its `issued`, which only a kept stream's batch does
        // (`due` closes any other at once), and the watch keeps those
        // alive.
        let event = if unsafe { capturing(open.stream) } {
            None
        } else {
            match self.spare.pop() {
                Some(e) => Some(e),
                None => ctx.new_event(None).ok(),
            }
        };
        let Some(event) = event else {
            self.mark(open.first, open.last, OpState::Untracked, None);
            return;
        };
        // SAFETY: the event and the stream belong to this context; the
        // stream is live (as above); the event outlives the record.
        let recorded = unsafe {
            nccl_safe::cudarc::driver::result::event::record(event.cu_event(), open.stream as _)
        };
        if recorded.is_err() {
            self.spare.push(event);
            self.mark(open.first, open.last, OpState::Untracked, None);
            return;
        }
        // A capture that began between the check above and the record may
        // hold the record, and `retire` trusts a batch's event without
        // asking it when a later one on the stream finished. Asked again:
        // capturing now, the event is trusted for nothing and never reused
        // (a graph may refer to it, so it is left allocated).
        // SAFETY: as for the first query.
        if unsafe { capturing(open.stream) } {
            std::mem::forget(event);
            self.mark(open.first, open.last, OpState::Untracked, None);
            return;
        }
        self.batches.push_back(Batch {
            first: open.first,
            last: open.last,
            event,
            issued: open.issued,
            stream: open.stream,
        });
    }

    /// Retires the finished batches (the watchdog thread); returns whether
    /// any did.
    ///
    /// Each event query is a driver call (1.3–1.5 µs on the lent VMs), made
    /// under the watch's lock, which the issuing thread takes for every
    /// operation; asking batch after batch held that lock for one query per
    /// batch recorded since the last poll (about ten per poll in a hot
    /// loop). Batches on one stream finish in order, so the front's run on
    /// its stream finishes as a prefix: its first batch is asked, then its
    /// last, then a binary search between them finds the end of the
    /// prefix. A burst costs two queries per poll, a stall one, and a long
    /// backlog O(log n). Only a stream the watch keeps alive counts as one
    /// stream for a run: another's handle may be reused by a new stream
    /// meanwhile, and the per-thread default stream has one handle on
    /// every thread. A batch on any other stream is asked by itself.
    pub(super) fn retire(&mut self) -> bool {
        let mut any = false;
        while let Some(front) = self.batches.front() {
            let stream = front.stream;
            let run = if self.one_stream(stream) {
                self.batches
                    .iter()
                    .take_while(|b| b.stream == stream)
                    .count()
            } else {
                1
            };
            let done = match finished_prefix(run, |i| self.finished(i)) {
                Some(done) => done,
                // The driver cannot answer for one of them (an event
                // recorded into a capture that began between the check
                // and the record): the front alone, asked by itself.
                None => match self.finished(0) {
                    Some(true) => 1,
                    Some(false) => 0,
                    None => {
                        if let Some(b) = self.batches.pop_front() {
                            // Untracked, never a false timeout; the event
                            // is not reused.
                            self.mark(b.first, b.last, OpState::Untracked, None);
                        }
                        any = true;
                        continue;
                    }
                },
            };
            for _ in 0..done {
                let Some(b) = self.batches.pop_front() else {
                    break;
                };
                self.mark(b.first, b.last, OpState::Done, Some(b.issued.elapsed()));
                self.spare.push(b.event);
            }
            any |= done > 0;
            if done < run {
                break;
            }
        }
        any
    }

    /// Whether the batches on `stream` are known to be on one stream (see
    /// [`Tracker::retire`]): a stream the watch keeps alive, other than
    /// the legacy and per-thread default streams' special handles.
    fn one_stream(&self, stream: cudaStream_t) -> bool {
        (stream as usize) > 2 && self.kept.contains(&stream)
    }

    /// Whether batch `i` finished; `None` when the driver cannot say.
    fn finished(&self, i: usize) -> Option<bool> {
        self.batches.get(i)?.event.try_is_complete().ok()
    }
}

/// The watch's context made current for a while: pushed when another (or
/// none) was current, popped on drop, so the thread's own comes back.
struct Current(bool);

impl Current {
    /// `None` when `ctx` is not current and could not be pushed.
    fn make(ctx: &std::sync::Arc<CudaContext>) -> Option<Current> {
        let mut now: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: one handle is written.
        let known = unsafe { sys::cuCtxGetCurrent(&mut now) } == sys::CUresult::CUDA_SUCCESS;
        if known && now == ctx.cu_ctx() {
            return Some(Current(false));
        }
        // SAFETY: the context is live (the watch holds it); popped on drop.
        let pushed =
            unsafe { sys::cuCtxPushCurrent_v2(ctx.cu_ctx()) } == sys::CUresult::CUDA_SUCCESS;
        pushed.then_some(Current(true))
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        if self.0 {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops what `make` pushed on this thread; one handle
            // is written.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

/// Whether `stream` is being captured into a CUDA graph now; a query the
/// driver refuses counts as yes (the batch is then untracked, never a
/// false timeout).
///
/// # Safety
///
/// `stream` is a live stream.
unsafe fn capturing(stream: cudaStream_t) -> bool {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the caller's promise; one status is written.
    let queried = unsafe { sys::cuStreamIsCapturing(stream as _, &mut status) };
    queried != sys::CUresult::CUDA_SUCCESS
        || status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// How many of `run` batches on one stream finished, asking `finished`
/// about as few as it can: they finish in order, so a prefix. The first is
/// asked, then the last, then a binary search between them. `None` when
/// `finished` cannot answer for a batch it was asked about.
fn finished_prefix(run: usize, finished: impl Fn(usize) -> Option<bool>) -> Option<usize> {
    if run == 0 || !finished(0)? {
        return Some(0);
    }
    if run == 1 {
        return Some(1);
    }
    if finished(run - 1)? {
        return Some(run);
    }
    // Batch `lo` finished, batch `hi` did not.
    let (mut lo, mut hi) = (0, run - 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if finished(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo + 1)
}

/// cudarc loads each driver function on its first use, and loading
/// allocates: the first event query is made here, at set-up, so the
/// watchdog thread's first query does not allocate in the middle of the
/// program's hot loop (the bench saw it as one allocation in its first
/// timed window). Once per process: the symbol is global.
pub(super) fn load_event_query(ctx: &std::sync::Arc<CudaContext>) {
    static LOADED: std::sync::Once = std::sync::Once::new();
    LOADED.call_once(|| {
        if let Ok(event) = ctx.new_event(None) {
            let _ = event.try_is_complete();
        }
        // The push and pop of `Current` too (a drain's close on a thread
        // where another context is current).
        let mut now: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pushes a live context and pops it again at once; one
        // handle is written each time.
        unsafe {
            if sys::cuCtxPushCurrent_v2(ctx.cu_ctx()) == sys::CUresult::CUDA_SUCCESS {
                let _ = sys::cuCtxPopCurrent_v2(&mut now);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::finished_prefix;

    /// The prefix found for every length of run and every number of
    /// finished batches, with the queries it took.
    #[test]
    fn the_finished_prefix_is_found_with_few_queries() {
        for run in 0..200usize {
            for done in 0..=run {
                let asked = Cell::new(0);
                let found = finished_prefix(run, |i| {
                    assert!(i < run, "asked about batch {i} of {run}");
                    asked.set(asked.get() + 1);
                    Some(i < done)
                });
                assert_eq!(found, Some(done), "run {run}, {done} finished");
                // One query when nothing finished, two when all did, and
                // a binary search between.
                let bound = 2 + (usize::BITS - run.leading_zeros()) as usize;
                assert!(asked.get() <= bound, "run {run}: {} queries", asked.get());
                if done == 0 && run > 0 {
                    assert_eq!(asked.get(), 1);
                }
                if done == run && run > 0 {
                    assert!(asked.get() <= 2);
                }
                if run == 1 {
                    assert_eq!(asked.get(), 1, "a batch alone is asked once");
                }
            }
        }
    }

    /// A batch the driver cannot answer for ends the search with `None`.
    #[test]
    fn an_unanswered_query_gives_none() {
        assert_eq!(finished_prefix(10, |i| (i != 0).then_some(true)), None);
        assert_eq!(finished_prefix(10, |i| (i != 9).then_some(true)), None);
        assert_eq!(
            finished_prefix(10, |i| if i == 4 { None } else { Some(i < 6) }),
            None
        );
        // Batch 3 is never asked about on the way to a prefix of one.
        assert_eq!(
            finished_prefix(10, |i| if i == 3 { None } else { Some(i < 1) }),
            Some(1)
        );
    }
}
