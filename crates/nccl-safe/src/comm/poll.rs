//! Waiting on NCCL: the one polling loop with backoff, and the
//! asynchronous status query it polls.

use std::time::{Duration, Instant};

use nccl_sys::{ncclComm_t, ncclResult_t};

use crate::comm::handle::{Shared, State, make_current};
use crate::library::Library;
use crate::{Error, Result};

/// How long a wait polls without sleeping. A nonblocking group launch
/// (NCCL hands it to a new thread) finishes in tens of microseconds, and
/// the shortest sleep Linux gives is about 50 µs: sleeping at once would
/// double the cost of every small nonblocking collective (seen: +30 µs per
/// 8 B all_reduce on H200, NCCL 2.28.9).
const SPIN: Duration = Duration::from_millis(1);

/// Calls `done` until it answers `true` (then `Ok(None)`) or `timeout` has
/// passed (then `Ok(Some(elapsed))`): back to back (yielding the CPU) for
/// the first [`SPIN`], then pausing 5 µs, doubling up to 1 ms. An error
/// from `done` ends it.
pub(crate) fn poll_with_backoff(
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<Option<Duration>> {
    let started = Instant::now();
    let mut pause = Duration::from_micros(5);
    loop {
        if done()? {
            return Ok(None);
        }
        let elapsed = started.elapsed();
        if elapsed >= timeout {
            return Ok(Some(elapsed));
        }
        if elapsed < SPIN {
            std::thread::yield_now();
            continue;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

pub(crate) fn async_status(lib: &Library, raw: ncclComm_t) -> Result<ncclResult_t> {
    let get = lib.raw().ncclCommGetAsyncError()?;
    let mut status = ncclResult_t::ncclSuccess;
    // SAFETY: `raw` is live (caller holds the lock); one result is written.
    let code = unsafe { get(raw, &mut status) };
    lib.check("ncclCommGetAsyncError", code, raw)?;
    Ok(status)
}

impl Shared {
    /// Polls a nonblocking init (a communicator with no parent) until NCCL
    /// no longer reports `ncclInProgress`, against the communicator's
    /// deadline, like [`Shared::wait_ready`], except that it answers
    /// [`Error::Aborted`] as soon as an abort is due and never waits for
    /// the lock.
    ///
    /// Meanwhile no other thread aborts the communicator
    /// ([`Shared::creating`]): NCCL's `ncclCommAbort` of a communicator
    /// being initialised first joins its init thread, which does not look at
    /// the abort flag while it loads NCCL's kernels (the first
    /// communicator of a process; up to 2 s with four processes loading
    /// at once on 4 H100s). The thread that asked (the liveness channel's,
    /// which names no other loss meanwhile) would wait there, and this one
    /// for the lock. The handle's drop makes the abort instead, on a
    /// teardown thread that the signal counts
    /// ([`crate::AbortSignal::wait_settled`] and
    /// [`crate::AbortSignal::wait_quiet`] wait for it). Nothing the caller
    /// owns is in NCCL's hands during a creation.
    pub(crate) fn wait_created(&self, op: &'static str) -> Result<()> {
        let mut failed = None;
        let timed_out = poll_with_backoff(self.timeout, || {
            if self.abort_due() {
                return Err(self.aborted(op));
            }
            let Some(state) = self.try_lock() else {
                return Ok(false);
            };
            let raw = match *state {
                State::Live(raw) => raw,
                State::Aborted => return Err(self.aborted(op)),
                State::Closed => return Err(Error::Finalized { op }),
            };
            make_current(&self.ctx).map_err(|source| Error::Cuda { op, source })?;
            match async_status(self.lib, raw)? {
                ncclResult_t::ncclSuccess => Ok(true),
                ncclResult_t::ncclInProgress => Ok(false),
                code => {
                    failed = Some(self.lib.check(op, code, raw));
                    Ok(true)
                }
            }
        })?;
        match (failed, timed_out) {
            (Some(error), _) => error,
            (None, None) => Ok(()),
            (None, Some(waited)) => Err(Error::Timeout { op, waited }),
        }
    }
}
