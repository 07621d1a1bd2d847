//! A call that must return in time: a regression that hangs fails its
//! test instead of the whole test binary.

use std::time::Duration;

use crate::TestResult;

/// Runs `f` on a thread and fails the test if it has not returned within
/// `limit` (a regression would otherwise hang the whole test binary).
pub fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> TestResult<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .map_err(|_| format!("did not return within {limit:?}").into())
}
