//! The thread's open group: how deep it is, the teardowns waiting for its
//! end, the error of a group a dropped guard ended, and the spare memory of
//! its list of observed calls. Imports nothing above it, so the
//! communicator's own state can defer its teardown here.

use std::cell::RefCell;

use crate::error::Error;
use crate::observe::Pending;

#[derive(Default)]
struct GroupState {
    depth: usize,
    /// The error of a group that a guard's `Drop` ended.
    dropped_error: Option<Error>,
    /// Teardown that must wait until the outermost group has ended
    /// (communicators dropped while a group that may use them is open).
    deferred: Vec<Box<dyn FnOnce()>>,
    /// The memory of the last ended group's list of observed calls, empty:
    /// the next group takes it, so a watched group allocates nothing.
    spare_observed: Vec<Pending<'static>>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// Whether this thread is inside a group.
pub(crate) fn in_group() -> bool {
    // During thread teardown the state may be gone: no group is open then.
    GROUP.try_with(|g| g.borrow().depth > 0).unwrap_or(false)
}

/// Runs `action` now, or after the outermost group of this thread ends.
pub(crate) fn after_group(action: Box<dyn FnOnce()>) {
    let mut action = Some(action);
    let _ = GROUP.try_with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0
            && let Some(a) = action.take()
        {
            g.deferred.push(a);
        }
    });
    if let Some(action) = action {
        action();
    }
}

pub(crate) fn run_deferred() {
    let actions = GROUP.with(|g| std::mem::take(&mut g.borrow_mut().deferred));
    for action in actions {
        action();
    }
}

/// Gives the emptied list of a group's observed calls back, so the next
/// group with an observer (a watchdog) reuses its memory.
pub(crate) fn recycle_observed(mut observed: Vec<Pending<'_>>) {
    if observed.capacity() == 0 {
        return;
    }
    observed.clear();
    // An empty list borrows nothing: rebuilt with the `'static` lifetime
    // the thread-local needs. The element type keeps its layout, so the
    // collection reuses the allocation in place.
    #[allow(
        clippy::unnecessary_filter_map,
        reason = "the point is the new lifetime, which `filter` would not give"
    )]
    let observed: Vec<Pending<'static>> = observed.into_iter().filter_map(|_| None).collect();
    let _ = GROUP.try_with(|g| {
        let mut g = g.borrow_mut();
        if g.spare_observed.capacity() == 0 {
            g.spare_observed = observed;
        }
    });
}

/// One level deeper: a guard's group was opened. Returns the spare list of
/// observed calls for the guard to fill.
pub(crate) fn enter<'g>() -> Vec<Pending<'g>> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.depth += 1;
        // An empty `Vec<Pending<'static>>` is a `Vec<Pending<'g>>`.
        std::mem::take(&mut g.spare_observed)
    })
}

/// One level deeper: a nested group was opened.
pub(crate) fn enter_nested() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// One level up: a group was ended. Returns whether it was the outermost.
pub(crate) fn leave() -> bool {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.depth = g.depth.saturating_sub(1);
        g.depth == 0
    })
}

/// Keeps the error of a group that a guard's drop ended.
pub(crate) fn set_dropped_error(error: Error) {
    GROUP.with(|g| g.borrow_mut().dropped_error = Some(error));
}

/// The error of the last group on this thread that a dropped guard ended,
/// if it failed.
pub fn take_dropped_group_error() -> Option<Error> {
    GROUP.with(|g| g.borrow_mut().dropped_error.take())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_groups_observed_list_is_reused_without_allocating() {
        let list: Vec<Pending<'_>> = Vec::with_capacity(24);
        let memory = list.as_ptr() as usize;
        recycle_observed(list);
        // The next group starts with the same memory, typed for its own
        // lifetime: the lifetime change did not reallocate.
        let next: Vec<Pending<'_>> =
            GROUP.with(|g| std::mem::take(&mut g.borrow_mut().spare_observed));
        assert_eq!(next.as_ptr() as usize, memory);
        assert!(next.capacity() >= 24 && next.is_empty());
        // A list that never allocated leaves nothing to reuse.
        recycle_observed(Vec::new());
        assert_eq!(GROUP.with(|g| g.borrow().spare_observed.capacity()), 0);
    }
}
