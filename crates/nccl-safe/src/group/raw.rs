//! The raw group calls (`ncclGroupStart`, `ncclGroupEnd`, the simulated
//! end) and the communicators the open group uses, which NCCL refers to
//! until its outermost end.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use nccl_sys::{ncclResult_t, ncclSimInfo_t};

use crate::Result;
use crate::group::state::{in_group, leave, run_deferred};
use crate::library::Library;

thread_local! {
    /// Communicators used in the open group: NCCL refers to them until the
    /// outermost end (an abort from another thread waits for it), and the
    /// nonblocking ones must be polled when `ncclGroupEnd` answers
    /// `ncclInProgress`.
    static TOUCHED: RefCell<Vec<Arc<dyn Member>>> = const { RefCell::new(Vec::new()) };
}

/// What an open group needs of a communicator it has calls on. The
/// communicator's shared state implements it; the trait keeps this module
/// below `comm`, which uses groups.
pub(crate) trait Member: Send + Sync {
    /// Whether its calls block (a nonblocking one is polled at the end).
    fn is_blocking(&self) -> bool;
    /// Waits until a nonblocking communicator's work of the group is in.
    fn wait_ready(&self, op: &'static str) -> Result<()>;
    /// The group no longer refers to it: an abort asked for meanwhile
    /// happens now.
    fn leave_group(&self);
    /// Whether it parks on a loss and an abort is due (no lock taken):
    /// then the group's end settles every communicator it used together
    /// ([`crate::abort::settle_together`]), as the signal's trigger does.
    fn parks_and_due(&self) -> bool;
    /// The group no longer refers to it; nothing is settled here.
    fn leave_group_only(&self);
    /// This one as a signal sees it, to settle several together.
    fn abortable(self: Arc<Self>) -> Arc<dyn crate::abort::Abortable>;
}

/// Records that a communicator is used in the open group (before the call:
/// the communicator marks itself under its lock).
pub(crate) fn touch<M: Member + 'static>(member: &Arc<M>) {
    TOUCHED.with(|t| {
        let mut t = t.borrow_mut();
        let seen = t
            .iter()
            .any(|s| std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(member)));
        if !seen {
            t.push(Arc::clone(member) as Arc<dyn Member>);
        }
    });
}

/// `ncclGroupStart`.
pub(crate) fn start(lib: &'static Library) -> Result<()> {
    let start = lib.raw().ncclGroupStart()?;
    crate::segments::mark(crate::segments::Seg::Group);
    // SAFETY: `ncclGroupStart` has no arguments and no preconditions
    // (groups nest).
    let code = unsafe { start() };
    crate::segments::mark(crate::segments::Seg::GroupNccl);
    lib.check("ncclGroupStart", code, std::ptr::null_mut())
}

/// Runs `calls` between an `ncclGroupStart` and an `ncclGroupEnd` that
/// no guard tracks (a signal's aborts, grouped on the thread that holds
/// their communicators, with no group of this thread open): the end's
/// result. `None`, with `calls` not run, where NCCL lacks either call or
/// the start fails. The group ends even if `calls` unwinds. An error of
/// the end is logged too: NCCL may then have dropped work the group
/// queued (see [`crate::abort::HeldForAbort::abort_again`]).
pub(crate) fn bracket(lib: &'static Library, calls: impl FnOnce()) -> Option<ncclResult_t> {
    /// Ends the group on every way out of `calls`, keeping the result.
    struct EndGroup<'c>(nccl_sys::pfn::ncclGroupEnd, &'c Cell<ncclResult_t>);
    impl Drop for EndGroup<'_> {
        fn drop(&mut self) {
            // SAFETY: no arguments; this thread opened the group in
            // `bracket`, and what ran inside left NCCL's depth as it found
            // it (an abort opens and closes a group of its own).
            let code = unsafe { (self.0)() };
            if code != ncclResult_t::ncclSuccess {
                tracing::warn!(?code, "ncclGroupEnd of a group of aborts failed");
            }
            self.1.set(code);
        }
    }
    let (Ok(start), Ok(end)) = (lib.raw().ncclGroupStart(), lib.raw().ncclGroupEnd()) else {
        return None;
    };
    // SAFETY: `ncclGroupStart` has no arguments and no preconditions.
    if unsafe { start() } != ncclResult_t::ncclSuccess {
        return None;
    }
    let ended = Cell::new(ncclResult_t::ncclSuccess);
    {
        let _end = EndGroup(end, &ended);
        calls();
    }
    Some(ended.get())
}

/// Decrements the depth; at depth 0 returns the communicators to poll
/// (give the vector back with [`recycle_touched`]).
fn leave_group() -> Vec<Arc<dyn Member>> {
    if leave() {
        TOUCHED.with(|t| std::mem::take(&mut *t.borrow_mut()))
    } else {
        Vec::new()
    }
}

/// `ncclGroupEnd` of the innermost open level; at the outermost, waits for
/// the nonblocking communicators it used and runs what waited for the end.
pub(crate) fn finish(lib: &'static Library) -> Result<()> {
    let end = lib.raw().ncclGroupEnd()?;
    crate::segments::mark(crate::segments::Seg::Group);
    // SAFETY: `ncclGroupEnd` has no arguments; a group is open (the guard
    // exists).
    let code = unsafe { end() };
    crate::segments::mark(crate::segments::Seg::GroupNccl);
    let touched = leave_group();
    let result = if code == ncclResult_t::ncclInProgress {
        touched
            .iter()
            .filter(|shared| !shared.is_blocking())
            .try_for_each(|shared| shared.wait_ready("ncclGroupEnd"))
    } else {
        lib.check("ncclGroupEnd", code, std::ptr::null_mut())
    };
    // Aborts deferred to this end first, then teardowns deferred to it
    // (which may wait), so neither delays the other.
    after_end(touched);
    result
}

/// `ncclGroupSimulateEnd` (looked up by the caller while its group is still
/// open): ends the level without launching it.
pub(crate) fn simulate_end(
    lib: &'static Library,
    simulate: nccl_sys::pfn::ncclGroupSimulateEnd,
) -> Result<f32> {
    let mut info = ncclSimInfo_t::initializer();
    // SAFETY: `info` is an initialized ncclSimInfo_t NCCL may write.
    let code = unsafe { simulate(&mut info) };
    after_end(leave_group());
    lib.check("ncclGroupSimulateEnd", code, std::ptr::null_mut())?;
    Ok(info.estimatedTime)
}

/// After an end: the communicators the group used are released (aborts
/// asked for meanwhile happen now), then, past the outermost end, the
/// teardowns that waited for it run.
fn after_end(touched: Vec<Arc<dyn Member>>) {
    // One that parks, with an abort due (a loss while the group was open):
    // every due abort and its stop go together, so that neither waits in
    // NCCL behind a kernel the other's abort would end. Rare; allocates.
    if touched.iter().any(|m| m.parks_and_due()) {
        for shared in &touched {
            shared.leave_group_only();
        }
        let members: Vec<_> = touched.iter().map(|m| Arc::clone(m).abortable()).collect();
        crate::abort::settle_together(&members);
    } else {
        for shared in &touched {
            shared.leave_group();
        }
    }
    recycle_touched(touched);
    if !in_group() {
        run_deferred();
    }
}

/// Puts the emptied list of polled communicators back, so the next group
/// reuses its memory instead of allocating.
fn recycle_touched(mut touched: Vec<Arc<dyn Member>>) {
    touched.clear();
    let _ = TOUCHED.try_with(|t| {
        let mut t = t.borrow_mut();
        if t.capacity() == 0 {
            *t = touched;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bracket_runs_the_calls_once_and_closes_nccls_group() {
        // The real libnccl, as `cargo xtask test` points `NCCL_LIBRARY` at
        // it (no GPU needed for a group with nothing in it).
        if std::env::var_os("NCCL_LIBRARY").is_none() {
            eprintln!("skipped: NCCL_LIBRARY is not set (`cargo xtask test` sets it)");
            return;
        }
        let lib = Library::get().expect("NCCL_LIBRARY names a loadable libnccl");
        let mut ran = 0;
        assert_eq!(bracket(lib, || ran += 1), Some(ncclResult_t::ncclSuccess));
        assert_eq!(ran, 1);
        // Closed: one more `ncclGroupEnd` has no group to end.
        let end = lib.raw().ncclGroupEnd().expect("ncclGroupEnd");
        // SAFETY: no arguments; NCCL answers an end without a group with
        // an error.
        assert_ne!(unsafe { end() }, ncclResult_t::ncclSuccess);
        // Calls that unwind still leave NCCL's group closed.
        let unwound = std::panic::catch_unwind(|| bracket(lib, || panic!("calls unwind")));
        assert!(unwound.is_err());
        // SAFETY: as above.
        assert_ne!(unsafe { end() }, ncclResult_t::ncclSuccess);
    }
}
