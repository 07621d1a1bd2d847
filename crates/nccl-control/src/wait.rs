//! The one way this workspace's control plane and watchdog wait on a
//! condition variable: with a deadline, and taking over a lock whose
//! holder panicked (every writer of the guarded state updates it in one
//! step, so it stays consistent). Imports nothing from the crate.

use std::sync::{Condvar, MutexGuard};
use std::time::{Duration, Instant};

/// Waits on `cv` until `ready` finds what it looks for in the guarded
/// state (checked first, then after every wake-up) or `until` passes:
/// what `ready` found, or `None` at the deadline. The lock is released on
/// return.
///
/// ```
/// use std::sync::{Condvar, Mutex};
/// use std::time::{Duration, Instant};
///
/// let (slot, cv) = (Mutex::new(Some(7)), Condvar::new());
/// let until = Instant::now() + Duration::from_millis(10);
/// let found = nccl_control::wait::until(&cv, slot.lock().unwrap(), until, |s| s.take());
/// assert_eq!(found, Some(7));
/// ```
pub fn until<T, R>(
    cv: &Condvar,
    mut guard: MutexGuard<'_, T>,
    until: Instant,
    mut ready: impl FnMut(&mut T) -> Option<R>,
) -> Option<R> {
    loop {
        if let Some(found) = ready(&mut guard) {
            return Some(found);
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        guard = at_most(cv, guard, left);
    }
}

/// One wait on `cv` of at most `limit` (a wake-up, a spurious one, or the
/// limit): the guard back.
pub fn at_most<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    limit: Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, limit)
        .map(|(g, _)| g)
        .unwrap_or_else(|p| p.into_inner().0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_notified_value_is_found_and_a_missing_one_times_out() {
        let shared = Arc::new((Mutex::new(None::<u32>), Condvar::new()));
        let other = Arc::clone(&shared);
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            *other.0.lock().unwrap() = Some(3);
            other.1.notify_all();
        });
        let (slot, cv) = &*shared;
        let until = Instant::now() + Duration::from_secs(5);
        let got = super::until(cv, slot.lock().unwrap(), until, |v| v.take());
        assert_eq!(got, Some(3));
        setter.join().unwrap();
        let started = Instant::now();
        let until = started + Duration::from_millis(30);
        let got = super::until(cv, slot.lock().unwrap(), until, |v| v.take());
        assert_eq!(got, None);
        assert!(started.elapsed() >= Duration::from_millis(30));
    }
}
