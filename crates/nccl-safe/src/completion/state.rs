//! One tracked operation: the buffers it owns, its outcome and the task
//! to wake, and the step the waker thread takes on it. Generic over the
//! [`Source`] it asks (a CUDA event and a communicator in the library, a
//! stand-in in the unit tests), so the state machine is tested without a
//! GPU.

use std::sync::{Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How often a tracked operation asks NCCL for an asynchronous error (the
/// watchdog's period): the cheap checks (the event, an abort asked for)
/// run on every pass.
const DEEP_CHECK: Duration = Duration::from_millis(2);

/// What a tracked operation asks about the work behind it.
pub(crate) trait Source: Send + Sync + 'static {
    /// Whether the work has finished (or an error that makes the device
    /// unusable).
    fn is_complete(&self) -> Result<bool>;
    /// Why the work cannot be trusted to finish well: the communicator was
    /// aborted (with its cause), or, when `deep`, NCCL reports an
    /// asynchronous error (the communicator is aborted then).
    fn failure(&self, op: &'static str, deep: bool) -> Option<Error>;
    /// The deadline passed: stop the work (abort the communicator).
    fn timed_out(&self, op: &'static str);
}

/// What the future will answer.
enum Outcome {
    Waiting,
    /// Finished: `None` is success (the buffers are handed back).
    Resolved(Option<Error>),
    /// The future took the outcome.
    Taken,
}

struct Slot<B> {
    /// The operation's buffers: kept while the device may use them.
    buffers: Option<B>,
    outcome: Outcome,
    waker: Option<Waker>,
    next_deep: Instant,
}

/// One operation in flight, shared (in an `Arc`) by its future and the
/// waker thread: whichever lets go last drops the buffers, and the waker
/// thread lets go only after the work has finished.
pub(crate) struct Tracked<B, S> {
    slot: Mutex<Slot<B>>,
    source: S,
    op: &'static str,
    started: Instant,
    deadline: Instant,
}

/// What the waker thread does with a tracked operation after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Keep it: the device may still use its buffers.
    Keep,
    /// Done with it: the work finished (or can never be known to).
    Release,
}

/// The waker thread's view of a tracked operation, whatever its buffers.
pub(crate) trait Entry: Send + Sync {
    /// Looks at the work once, resolving and waking as it finds.
    fn step(&self, now: Instant) -> Step;

    /// How long the work may still run from `now`: its deadline's
    /// remainder (the process's exit waits that long for it at most).
    fn remaining(&self, now: Instant) -> Duration;
}

impl<B: Send, S: Source> Tracked<B, S> {
    /// An operation on `source` owning `buffers`, resolved early with
    /// `error` when given (its buffers are still kept until the work is
    /// done), at the latest at `started + timeout`.
    pub(crate) fn new(
        op: &'static str,
        source: S,
        buffers: B,
        timeout: Duration,
        error: Option<Error>,
    ) -> Self {
        let started = Instant::now();
        Tracked {
            slot: Mutex::new(Slot {
                buffers: Some(buffers),
                outcome: match error {
                    Some(e) => Outcome::Resolved(Some(e)),
                    None => Outcome::Waiting,
                },
                waker: None,
                next_deep: started + DEEP_CHECK,
            }),
            source,
            op,
            started,
            deadline: started
                .checked_add(timeout)
                .unwrap_or(started + Duration::from_secs(86_400 * 365)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot<B>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The future's poll: the outcome if there is one, else `None` with
    /// `waker` kept for the waker thread.
    ///
    /// The poll looks at the work itself first (one `cuEventQuery`, no
    /// wait): work that has finished is answered at once, without waiting
    /// for the waker thread's next pass. An error from that look is left
    /// to the waker thread, which alone decides that buffers are never
    /// freed.
    pub(crate) fn poll_outcome(&self, waker: &Waker) -> Option<Result<B>> {
        let complete = self.source.is_complete();
        let mut slot = self.lock();
        if matches!(complete, Ok(true)) && matches!(slot.outcome, Outcome::Waiting) {
            // As the waker thread's step does: an abort asked for before
            // the work was seen finished makes it a failure.
            slot.outcome = Outcome::Resolved(self.source.failure(self.op, false));
            // This poll answers: no wake is owed to anyone.
            slot.waker = None;
        }
        match std::mem::replace(&mut slot.outcome, Outcome::Taken) {
            Outcome::Waiting => {
                slot.outcome = Outcome::Waiting;
                match &slot.waker {
                    Some(w) if w.will_wake(waker) => {}
                    _ => slot.waker = Some(waker.clone()),
                }
                None
            }
            Outcome::Resolved(Some(e)) => Some(Err(e)),
            Outcome::Resolved(None) => Some(slot.buffers.take().ok_or(Error::InvalidArgument {
                op: self.op,
                reason: "the completion was polled after it finished",
            })),
            Outcome::Taken => Some(Err(Error::InvalidArgument {
                op: self.op,
                reason: "the completion was polled after it finished",
            })),
        }
    }

    /// When the operation was tracked.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// Whether the buffers are still held (for tests).
    #[cfg(test)]
    pub(crate) fn holds_buffers(&self) -> bool {
        self.lock().buffers.is_some()
    }

    /// Sets the outcome if none is set yet, handing back the waker to wake.
    fn resolve(slot: &mut Slot<B>, error: Option<Error>) -> Option<Waker> {
        if matches!(slot.outcome, Outcome::Waiting) {
            slot.outcome = Outcome::Resolved(error);
            slot.waker.take()
        } else {
            None
        }
    }
}

impl<B: Send, S: Source> Entry for Tracked<B, S> {
    fn remaining(&self, now: Instant) -> Duration {
        self.deadline.saturating_duration_since(now)
    }

    fn step(&self, now: Instant) -> Step {
        let complete = self.source.is_complete();
        let mut slot = self.lock();
        let (wake, release, done) = match complete {
            // The device's state is unknown: never free what it may use.
            Err(e) => {
                let wake = Self::resolve(&mut slot, Some(e));
                std::mem::forget(slot.buffers.take());
                (wake, None, Step::Release)
            }
            // Asked after the work was seen finished: an abort that cut it
            // short was asked for before, so it is seen here.
            Ok(true) => {
                let failure = self.source.failure(self.op, false);
                let wake = Self::resolve(&mut slot, failure);
                // Buffers of a failed operation are no use to the future;
                // they are dropped here (outside the lock), now that the
                // device is done with them.
                let release = match slot.outcome {
                    Outcome::Resolved(None) => None,
                    _ => slot.buffers.take(),
                };
                (wake, release, Step::Release)
            }
            Ok(false) => {
                let mut wake = None;
                if matches!(slot.outcome, Outcome::Waiting) {
                    let deep = now >= slot.next_deep;
                    if deep {
                        slot.next_deep = now + DEEP_CHECK;
                    }
                    if let Some(e) = self.source.failure(self.op, deep) {
                        wake = Self::resolve(&mut slot, Some(e));
                    } else if now >= self.deadline {
                        self.source.timed_out(self.op);
                        let waited = now.saturating_duration_since(self.started);
                        wake = Self::resolve(
                            &mut slot,
                            Some(Error::Timeout {
                                op: self.op,
                                waited,
                            }),
                        );
                    }
                }
                (wake, None, Step::Keep)
            }
        };
        drop(slot);
        drop(release);
        if let Some(w) = wake {
            w.wake();
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Wake, Waker};

    use super::*;

    /// A stand-in for an event and a communicator.
    #[derive(Default)]
    struct Fake {
        complete: AtomicBool,
        aborted: AtomicBool,
        timed_out: AtomicBool,
    }

    impl Source for Arc<Fake> {
        fn is_complete(&self) -> Result<bool> {
            Ok(self.complete.load(Ordering::SeqCst))
        }
        fn failure(&self, op: &'static str, _deep: bool) -> Option<Error> {
            self.aborted
                .load(Ordering::SeqCst)
                .then_some(Error::Aborted {
                    op,
                    cause: crate::AbortCause::Requested,
                })
        }
        fn timed_out(&self, _op: &'static str) {
            self.timed_out.store(true, Ordering::SeqCst);
        }
    }

    /// Counts its wakes.
    #[derive(Default)]
    struct Count(std::sync::atomic::AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A buffer that says when it is dropped.
    struct Buffer(Arc<AtomicBool>);
    impl Drop for Buffer {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    type Made = (Arc<Fake>, Arc<AtomicBool>, Arc<Tracked<Buffer, Arc<Fake>>>);

    fn tracked(timeout: Duration) -> Made {
        let fake = Arc::new(Fake::default());
        let dropped = Arc::new(AtomicBool::new(false));
        let t = Tracked::new(
            "test",
            Arc::clone(&fake),
            Buffer(Arc::clone(&dropped)),
            timeout,
            None,
        );
        (fake, dropped, Arc::new(t))
    }

    #[test]
    fn finished_work_hands_the_buffers_back_and_wakes_once() {
        let (fake, dropped, t) = tracked(Duration::from_secs(60));
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        assert!(t.poll_outcome(&waker).is_none());
        assert_eq!(t.step(Instant::now()), Step::Keep);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        fake.complete.store(true, Ordering::SeqCst);
        assert_eq!(t.step(Instant::now()), Step::Release);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        let buffers = t.poll_outcome(&waker);
        assert!(matches!(buffers, Some(Ok(_))));
        assert!(!dropped.load(Ordering::SeqCst));
        drop(buffers);
        assert!(dropped.load(Ordering::SeqCst));
        assert!(matches!(t.poll_outcome(&waker), Some(Err(_))));
    }

    /// A poll after the work finished answers at once, before the waker
    /// thread looked; the thread's later step releases without a wake.
    #[test]
    fn a_poll_after_the_work_finished_answers_without_the_waker_thread() {
        let (fake, dropped, t) = tracked(Duration::from_secs(60));
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        assert!(t.poll_outcome(&waker).is_none());
        fake.complete.store(true, Ordering::SeqCst);
        let buffers = t.poll_outcome(&waker);
        assert!(matches!(buffers, Some(Ok(_))));
        assert_eq!(t.step(Instant::now()), Step::Release);
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "nobody to wake");
        assert!(!dropped.load(Ordering::SeqCst), "the future owns them");
        drop(buffers);
        assert!(dropped.load(Ordering::SeqCst));
    }

    /// An abort asked for before a poll saw the work finished resolves
    /// that poll to the abort, and the buffers are freed (the device is
    /// done with them) when the waker thread lets go.
    #[test]
    fn a_poll_after_an_abort_and_the_end_of_the_work_is_the_abort() {
        let (fake, dropped, t) = tracked(Duration::from_secs(60));
        fake.aborted.store(true, Ordering::SeqCst);
        fake.complete.store(true, Ordering::SeqCst);
        let waker = Waker::from(Arc::new(Count::default()));
        assert!(matches!(
            t.poll_outcome(&waker),
            Some(Err(Error::Aborted { .. }))
        ));
        assert_eq!(t.step(Instant::now()), Step::Release);
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[test]
    fn a_dropped_future_leaves_the_buffers_held_until_the_work_is_done() {
        let (fake, dropped, t) = tracked(Duration::from_secs(60));
        // The waker thread's reference only: the future is gone.
        let entry: Arc<dyn Entry> = t;
        assert_eq!(entry.step(Instant::now()), Step::Keep);
        assert!(!dropped.load(Ordering::SeqCst));
        fake.complete.store(true, Ordering::SeqCst);
        assert_eq!(entry.step(Instant::now()), Step::Release);
        assert!(!dropped.load(Ordering::SeqCst), "released with the entry");
        drop(entry);
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[test]
    fn an_abort_resolves_at_once_but_keeps_the_buffers_until_the_work_drains() {
        let (fake, dropped, t) = tracked(Duration::from_secs(60));
        let waker = Waker::from(Arc::new(Count::default()));
        assert!(t.poll_outcome(&waker).is_none());
        fake.aborted.store(true, Ordering::SeqCst);
        assert_eq!(t.step(Instant::now()), Step::Keep);
        assert!(matches!(
            t.poll_outcome(&waker),
            Some(Err(Error::Aborted { .. }))
        ));
        assert!(t.holds_buffers() && !dropped.load(Ordering::SeqCst));
        fake.complete.store(true, Ordering::SeqCst);
        assert_eq!(t.step(Instant::now()), Step::Release);
        assert!(
            dropped.load(Ordering::SeqCst),
            "dropped once the device is done"
        );
    }

    #[test]
    fn the_deadline_resolves_with_timeout_and_stops_the_work() {
        let (fake, dropped, t) = tracked(Duration::from_millis(1));
        let later = Instant::now() + Duration::from_millis(5);
        assert_eq!(t.step(later), Step::Keep);
        assert!(fake.timed_out.load(Ordering::SeqCst));
        let waker = Waker::from(Arc::new(Count::default()));
        assert!(matches!(
            t.poll_outcome(&waker),
            Some(Err(Error::Timeout { op: "test", .. }))
        ));
        assert!(!dropped.load(Ordering::SeqCst));
    }

    #[test]
    fn work_seen_finished_after_an_abort_is_not_success() {
        let (fake, dropped, t) = tracked(Duration::from_secs(60));
        fake.aborted.store(true, Ordering::SeqCst);
        fake.complete.store(true, Ordering::SeqCst);
        assert_eq!(t.step(Instant::now()), Step::Release);
        let waker = Waker::from(Arc::new(Count::default()));
        assert!(matches!(
            t.poll_outcome(&waker),
            Some(Err(Error::Aborted { .. }))
        ));
        assert!(dropped.load(Ordering::SeqCst));
    }
}
