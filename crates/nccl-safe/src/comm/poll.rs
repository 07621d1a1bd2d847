//! Waiting on NCCL: the one polling loop with backoff, and the
//! asynchronous status query it polls.

use std::time::{Duration, Instant};

use nccl_sys::{ncclComm_t, ncclResult_t};

use crate::Result;
use crate::library::Library;

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
