//! Parking ([`crate::Config::park_on_peer_loss`]): an abort asked for
//! because a peer was lost puts the communicator aside instead of
//! `ncclCommAbort`, so that the survivors can shrink it at once
//! ([`crate::Comm::shrink_parked`]) rather than wait for NCCL's teardown.
//!
//! Parking itself only marks the communicator (under its lock): every call
//! is refused from then on. A parked blocking communicator runs the
//! kernels, and they are stopped later ([`Shared::stop_if_pending`]) by a
//! thread that holds no other communicator and has no abort of its own
//! still to do: at the end of the signal's trigger (after the aborts of
//! every communicator that does not park, whose kernels the world's may be
//! queued behind on a stream), by the next call on it, or before a shrink.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use nccl_sys::{ncclComm_t, ncclResult_t};

use crate::abort::{AbortCause, AbortSignal, GroupCalls, GroupEnd, HeldForAbort};
use crate::comm::handle::{Shared, State, make_current};
use crate::comm::poll::async_status;
use crate::config::RawConfig;
use crate::library::Library;
use crate::{Error, Feature, Result};

impl Shared {
    /// Parked and not unparked since (a hint without the lock).
    pub(crate) fn is_parked(&self) -> bool {
        self.parked.load(Ordering::Acquire) && !self.unparked.load(Ordering::Acquire)
    }

    /// Parks the communicator (the caller holds the lock, an abort is
    /// ready) where [`would_park`] says so; returns whether it did. A
    /// blocking one's kernels are left for [`Shared::stop_if_pending`].
    pub(crate) fn park_if_due(&self, state: &State) -> bool {
        let State::Live(raw) = *state else {
            return false;
        };
        let park = would_park(
            self.park_on_loss && !self.unparked.load(Ordering::Acquire),
            self.cause.get(),
            self.signal.as_ref().is_some_and(AbortSignal::parking_ended),
            self.lib.capabilities().has(Feature::Shrink),
            crate::capture_state::graphs_may_exist(),
            || async_status(self.lib, raw).is_ok_and(|s| s == ncclResult_t::ncclSuccess),
        );
        if park {
            tracing::debug!("a communicator parked for its shrink instead of aborted");
            self.stop_pending.store(self.blocking, Ordering::Release);
            self.parked.store(true, Ordering::Release);
        }
        park
    }

    /// Performs a due abort (or parks) now, waiting for the lock, then
    /// stops a parked one's kernels if that is still to do.
    pub(crate) fn settle_due(&self) {
        if !self.abort_due() {
            return;
        }
        let mut state = self.lock();
        let aborted = self.settle_and_stop(&mut state);
        drop(state);
        if aborted {
            self.after_abort();
        }
    }

    /// [`Shared::settle_abort`], then the stop of a parked one's kernels
    /// if that is still to do ([`Shared::stop_if_pending`]), then an abort
    /// asked for during the stop (it is this thread's to do). Returns
    /// whether it aborted.
    pub(crate) fn settle_and_stop(&self, state: &mut MutexGuard<'_, State>) -> bool {
        let mut aborted = self.settle_abort(state);
        aborted |= self.stop_if_pending(state);
        aborted |= self.settle_abort(state);
        aborted
    }

    /// Stops the kernels of a parked blocking communicator if that is still
    /// to do (the caller holds the lock, no other communicator's, and has
    /// no abort of its own left to do: see the file's comment), outside
    /// any group. Where they cannot be stopped the communicator is aborted
    /// instead; returns whether it was (for [`Shared::after_abort`]). Left
    /// for later on a thread with a group open.
    pub(crate) fn stop_if_pending(&self, state: &mut MutexGuard<'_, State>) -> bool {
        if !self.stop_is_pending(state) || crate::group::state::in_group() {
            return false;
        }
        let State::Live(raw) = **state else {
            return false;
        };
        self.stop_pending.store(false, Ordering::Release);
        let stopped = self
            .issue_stop(raw)
            .and_then(|issued| issued.map_or(Ok(None), |i| self.finish_stop(i)));
        self.conclude_stop(state, stopped)
    }

    /// Whether the communicator is live, parked, and its kernels are still
    /// to be stopped (the caller holds the lock).
    pub(crate) fn stop_is_pending(&self, state: &State) -> bool {
        matches!(state, State::Live(_))
            && self.is_parked()
            && self.stop_pending.load(Ordering::Acquire)
            && !self.in_open_group.load(Ordering::Acquire)
    }

    /// Keeps the one-rank communicator a stop made, or, where the stop
    /// failed, aborts this one instead (the caller holds the lock, outside
    /// any group); returns whether it aborted.
    pub(crate) fn conclude_stop(
        &self,
        state: &mut MutexGuard<'_, State>,
        stopped: Result<Option<crate::Comm>>,
    ) -> bool {
        match stopped {
            Ok(stopper) => {
                *self.stopper.lock().unwrap_or_else(|p| p.into_inner()) = stopper;
                false
            }
            Err(error) => {
                tracing::warn!(%error, "a parked communicator's kernels could not be stopped; it is aborted instead");
                self.unparked.store(true, Ordering::Release);
                let _ = self.abort_locked(state);
                true
            }
        }
    }

    /// `ncclCommShrink` of `raw` (live, blocking, parked; the caller holds
    /// the lock) to this rank alone with `NCCL_SHRINK_ABORT`: inside the
    /// call NCCL sets its abort flag, waits on its internal stream (which
    /// every launch joins) until its kernels end, and clears the flag; it
    /// then makes a communicator of one rank, which waits for no peer: at
    /// once, or at the end of the NCCL group the calling thread has open
    /// (the signal's, where the aborts of the others were called first, so
    /// that every flag is set before any wait: a kernel of this one may be
    /// queued behind one of theirs, or theirs behind this one's). `None`
    /// for a communicator of one rank, whose kernels wait for no peer.
    pub(crate) fn issue_stop(&self, raw: ncclComm_t) -> Result<Option<IssuedStop>> {
        match self.prepare_stop(raw)? {
            Some(prepared) => prepared.call(self, raw).map(Some),
            None => Ok(None),
        }
    }

    /// What [`Shared::issue_stop`] passes to NCCL, made before the call
    /// (the caller holds the lock, `raw` live): `None` for a communicator
    /// of one rank.
    fn prepare_stop(&self, raw: ncclComm_t) -> Result<Option<PreparedStop>> {
        make_current(&self.ctx).map_err(|source| Error::Cuda { op: STOP, source })?;
        let query = |get: nccl_sys::pfn::ncclCommCount| -> Result<i32> {
            let mut value = 0;
            // SAFETY: `raw` is live (the caller holds the lock); one int
            // is written.
            let code = unsafe { get(raw, &mut value) };
            self.lib.check(STOP, code, raw)?;
            Ok(value)
        };
        let size = query(self.lib.raw().ncclCommCount()?)?;
        let rank = query(self.lib.raw().ncclCommUserRank()?)?;
        let others: Vec<i32> = (0..size).filter(|&r| r != rank).collect();
        if others.is_empty() {
            return Ok(None);
        }
        let count = i32::try_from(others.len()).map_err(|_| Error::InvalidArgument {
            op: STOP,
            reason: "rank count exceeds i32",
        })?;
        let config = crate::Config::new().timeout(self.timeout);
        Ok(Some(PreparedStop {
            others,
            count,
            config: config.to_raw(self.lib.version())?,
            shrink: self.lib.raw().ncclCommShrink()?,
        }))
    }

    /// The one-rank communicator of an issued stop, once NCCL made it (at
    /// once outside a group, at the group's end inside one).
    pub(crate) fn finish_stop(&self, issued: IssuedStop) -> Result<Option<crate::Comm>> {
        let child = *issued.slot;
        if child.is_null() {
            return Ok(None);
        }
        let parts = crate::comm::Parts {
            lib: self.lib,
            ctx: Arc::clone(&self.ctx),
            blocking: true,
            timeout: self.timeout,
            signal: None,
            park_on_loss: false,
            parentless: false,
        };
        crate::Comm::adopt(child, parts, None, STOP).map(Some)
    }
}

impl Shared {
    /// [`crate::abort::Abortable::hold_for_abort`]: the lock, for a
    /// grouped abort, or, for one that parks (now or before) and whose
    /// kernels are still to be stopped, for a stop in the group after the
    /// others' aborts; `None` otherwise (see the trait).
    pub(crate) fn hold(&self) -> Option<Box<dyn HeldForAbort + '_>> {
        let state = self.try_lock()?;
        // One that parks (now or before) is held to stop its kernels in
        // the group, after the others' aborts, where a stop is still to do.
        let stops = if self.abort_ready(&state) {
            self.park_if_due(&state) && self.stop_is_pending(&state)
        } else if self.stop_is_pending(&state) {
            true
        } else {
            return None;
        };
        if !stops && self.is_parked() {
            return None;
        }
        Some(Box::new(Held {
            shared: self,
            state: Some(state),
            aborted: false,
            stop: stops.then_some(None),
            in_group: None,
            failed: false,
        }))
    }
}

/// Runs `calls` in one NCCL group of the process's library (every
/// communicator's: there is one, [`Library::get`]).
fn in_one_group(calls: &mut dyn FnMut()) -> GroupEnd {
    match Library::get()
        .ok()
        .and_then(|lib| crate::group::raw::bracket(lib, calls))
    {
        None => GroupEnd::NotOpened,
        Some(ncclResult_t::ncclSuccess) => GroupEnd::Ended,
        Some(_) => GroupEnd::Failed,
    }
}

/// A communicator's lock, held for an abort grouped with others
/// ([`crate::abort::AbortSignal::trigger`]).
struct Held<'a> {
    shared: &'a Shared,
    /// `None` once let go.
    state: Option<MutexGuard<'a, State>>,
    /// Whether the abort was done through it (live to aborted).
    aborted: bool,
    /// `Some` for one parked, held to stop its kernels instead: the stop
    /// issued in the group (`Some` inside), its child adopted at `unlock`.
    stop: Option<Option<Result<Option<IssuedStop>>>>,
    /// The handle it aborted inside the group, while the group's end may
    /// still drop the reclaim ([`HeldForAbort::abort_again`]).
    in_group: Option<ncclComm_t>,
    /// Whether an NCCL call it made in the group returned an error.
    failed: bool,
}

impl Held<'_> {
    /// `ncclCommAbort` inside the group (the lock held, live): the handle
    /// is kept for [`HeldForAbort::abort_again`].
    fn abort_in_group(&mut self) {
        let Some(state) = &mut self.state else {
            return;
        };
        let State::Live(raw) = **state else {
            return;
        };
        // Its error, like a lone abort's where nobody waits for it, has
        // nobody to go to; the communicator is aborted either way. Only an
        // error of the call itself (not a missing symbol: no call) fails
        // the group.
        if let Err(Error::Nccl { .. }) = self.shared.abort_locked(state) {
            self.failed = true;
        }
        self.in_group = Some(raw);
        self.aborted = true;
    }
}

impl HeldForAbort for Held<'_> {
    fn group(&self) -> Option<GroupCalls> {
        // Asked again with every lock held: a graph begun after the first
        // look, on a communicator that was free then, is counted by now
        // (before its capture's first call on it let go of the lock).
        (!crate::capture_state::graphs_may_exist()).then_some(in_one_group as GroupCalls)
    }

    fn stops(&self) -> bool {
        self.stop.is_some()
    }

    fn stop(&mut self) {
        let Some(state) = &mut self.state else {
            return;
        };
        let State::Live(raw) = **state else {
            return;
        };
        if !matches!(self.stop, Some(None)) || !self.shared.stop_is_pending(state) {
            return;
        }
        self.shared.stop_pending.store(false, Ordering::Release);
        // A shrink that fails inside the group fails the group's end, and
        // NCCL then drops the reclaims of the others' aborts (they are
        // aborted again, `abort_again`): one NCCL already reports an error
        // on (it parked before that), which its shrink would fail on, is
        // aborted in the group instead.
        if async_status(self.shared.lib, raw).is_ok_and(|s| s == ncclResult_t::ncclSuccess) {
            let issued = match self.shared.prepare_stop(raw) {
                Ok(Some(prepared)) => {
                    let called = prepared.call(self.shared, raw);
                    self.failed |= called.is_err();
                    called.map(Some)
                }
                other => other.map(|_| None),
            };
            self.stop = Some(Some(issued));
        } else {
            self.shared.unparked.store(true, Ordering::Release);
            self.stop = None;
            self.abort_in_group();
        }
    }

    fn abort(&mut self) {
        if self.stop.is_none() {
            self.abort_in_group();
        }
    }

    fn failed_in_group(&self) -> bool {
        self.failed
    }

    fn abort_again(&mut self) {
        if self.state.is_none() {
            return;
        }
        let Some(raw) = self.in_group.take() else {
            return;
        };
        if let Ok(abort) = self.shared.lib.raw().ncclCommAbort() {
            let _ = self.shared.ctx.bind_to_thread();
            // SAFETY: `raw` is the handle this hold aborted inside the
            // group, whose end failed, and in which an NCCL call returned
            // an error (so it recorded the group's error: every NCCL
            // release with shrink, 2.27.3 to 2.30.7, does before
            // returning one). NCCL's end then frees the queued jobs
            // without running them (`groupCleanup`), so the reclaim never
            // ran and the handle is still allocated, its abort flags set.
            // The state says Aborted and the lock is still held, so nobody
            // else uses or frees it; this is the one call that frees it.
            let code = unsafe { abort(raw) };
            if code != ncclResult_t::ncclSuccess {
                tracing::warn!(?code, "ncclCommAbort, again after a failed group of aborts");
            }
        }
    }

    fn unlock(&mut self) {
        // NCCL may have freed it since (its reclaim ran at the group's end).
        self.in_group = None;
        // The group has ended: a stop's child is written by now.
        if let (Some(state), Some(Some(issued))) = (&mut self.state, self.stop.take()) {
            let stopped = issued.and_then(|i| i.map_or(Ok(None), |i| self.shared.finish_stop(i)));
            self.aborted |= self.shared.conclude_stop(state, stopped);
        }
        self.state = None;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.state = None;
        if self.aborted {
            self.shared.after_abort();
        }
    }
}

/// The operation a stop's errors name.
const STOP: &str = "ncclCommShrink (stopping a parked communicator's kernels)";

/// A stop's arguments, ready for `ncclCommShrink`
/// ([`Shared::issue_stop`]).
struct PreparedStop {
    others: Vec<i32>,
    count: i32,
    config: RawConfig,
    shrink: nccl_sys::pfn::ncclCommShrink,
}

impl PreparedStop {
    /// The `ncclCommShrink` call; an error is its own (inside a group,
    /// NCCL then fails the group's end, dropping every job queued in it).
    fn call(mut self, shared: &Shared, raw: ncclComm_t) -> Result<IssuedStop> {
        let mut slot: Box<ncclComm_t> = Box::new(std::ptr::null_mut());
        // SAFETY: `raw` is live and blocking (the caller holds the lock);
        // the list, the out-slot (on the heap, kept in the returned value
        // until the child is adopted, after any group's end, when NCCL
        // writes it) and the configuration (kept likewise) outlive NCCL's
        // use of them.
        let code = unsafe {
            (self.shrink)(
                raw,
                self.others.as_mut_ptr(),
                self.count,
                &mut *slot,
                &mut self.config.raw,
                nccl_sys::NCCL_SHRINK_ABORT,
            )
        };
        shared.lib.check(STOP, code, raw)?;
        Ok(IssuedStop {
            slot,
            _config: self.config,
            _others: self.others,
        })
    }
}

/// A stop issued ([`Shared::issue_stop`]), its one-rank communicator not
/// adopted yet: what NCCL may still write (the out-slot) or read lives
/// here until then.
pub(crate) struct IssuedStop {
    slot: Box<ncclComm_t>,
    _config: RawConfig,
    _others: Vec<i32>,
}

/// Whether an abort due now parks the communicator instead
/// ([`crate::Config::park_on_peer_loss`]): it was made to park and is not
/// unparked (`may`), the cause is a lost peer, its signal still lets
/// members park, the library can shrink it, no CUDA graph may refer to it
/// (a replay could start its kernels again), and NCCL reports no error on
/// it (`ncclCommShrink` refuses a communicator with one); `healthy` is
/// asked last, being an NCCL call.
pub(crate) fn would_park(
    may: bool,
    cause: Option<&AbortCause>,
    parking_ended: bool,
    can_shrink: bool,
    graphs: bool,
    healthy: impl FnOnce() -> bool,
) -> bool {
    may && matches!(cause, Some(AbortCause::PeerLost { .. }))
        && !parking_ended
        && can_shrink
        && !graphs
        && healthy()
}
