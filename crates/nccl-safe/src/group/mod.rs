//! Groups: `ncclGroupStart`/`ncclGroupEnd` as a guard and as a closure.
//!
//! Inside a group NCCL only records calls; `ncclGroupEnd` launches them.
//! One thread driving several GPUs must put the calls for all of them in one
//! group, and concurrent sends and receives must share a group to progress.
//! Groups nest; only the outermost end launches.
//!
//! `state.rs` holds the thread's open group (depth, deferred teardowns)
//! and imports nothing above it; `raw.rs` makes the NCCL calls and keeps
//! the communicators the open group uses; this file is the guard.
//! `GroupGuard::on` lives with the operations (`ops/`), which import the
//! group, not the reverse.

pub(crate) mod raw;
pub(crate) mod state;

use std::cell::RefCell;
use std::marker::PhantomData;

use crate::buffer::Held;
use crate::capture_state::{is_capturing, spoil, without_capture};
use crate::group::state::{in_group, recycle_observed};
use crate::library::Library;
use crate::observe::Pending;
use crate::{Error, Feature, Result};

pub(crate) use raw::{Member, touch};
pub(crate) use state::in_group as is_open;
pub use state::take_dropped_group_error;

/// What a group keeps until its outermost end: the accesses of the buffers
/// its calls use, and its calls for their observers. Both borrow for the
/// group's lifetime `'g`, so the compiler checks that the buffers and the
/// streams outlive the report at the end.
pub(crate) struct GroupHold<'g> {
    pub(crate) accesses: Held<'g>,
    pub(crate) observed: Vec<Pending<'g>>,
    /// The streams of the group's calls, each with whether its call was
    /// allowed onto a capturing stream: NCCL enqueues at the group's end,
    /// so a capture begun after a call was checked is looked for again
    /// there.
    pub(crate) streams: smallvec::SmallVec<[(&'g cudarc::driver::CudaStream, bool); 16]>,
    /// Calls held back to the group's end because they may connect inside
    /// NCCL (and every call after the first such one, so the order stays):
    /// the ranks meet first ([`crate::OpObserver::gate`]), then they are
    /// issued, in order, into the still open group.
    pub(crate) deferred: Vec<Deferred<'g>>,
}

/// A call of a group held back to its end (see [`GroupHold::deferred`]).
pub(crate) struct Deferred<'g> {
    /// The communicator, by the address of its shared state.
    pub(crate) comm: usize,
    /// Its observer, which makes the ranks meet.
    pub(crate) observer: Option<std::sync::Arc<dyn crate::OpObserver>>,
    /// The call, and the communicator ranks it must meet (none: it only
    /// keeps its place in the order).
    pub(crate) info: crate::OpInfo,
    pub(crate) with: smallvec::SmallVec<[usize; 8]>,
    /// Records on the communicator that those ranks were met.
    pub(crate) met: Box<dyn FnOnce() + 'g>,
    /// Issues the call into the open group.
    #[allow(clippy::type_complexity)]
    pub(crate) run: Box<dyn for<'h> FnOnce(&'h RefCell<GroupHold<'g>>) -> Result<()> + 'g>,
}

/// Before the end of a group that holds deferred calls: the ranks meet
/// for each communicator's calls (communicators in the order of their
/// observers' labels, the same on every rank), then the calls are issued
/// in their order. When a meeting fails nothing deferred is issued: the
/// group then ends with the calls before the first deferred one only,
/// which need no connection, and the failure is the end's error.
fn issue_deferred<'g>(held: &RefCell<GroupHold<'g>>) -> Result<()> {
    let deferred = std::mem::take(&mut held.borrow_mut().deferred);
    if deferred.is_empty() {
        return Ok(());
    }
    let mut comms: Vec<(String, usize, std::sync::Arc<dyn crate::OpObserver>)> = Vec::new();
    for d in &deferred {
        if let Some(o) = &d.observer
            && !d.with.is_empty()
            && !comms.iter().any(|(_, c, _)| *c == d.comm)
        {
            comms.push((
                o.gate_label().unwrap_or_default(),
                d.comm,
                std::sync::Arc::clone(o),
            ));
        }
    }
    comms.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, comm, observer) in &comms {
        let requests: Vec<(crate::OpInfo, &[usize])> = deferred
            .iter()
            .filter(|d| d.comm == *comm && !d.with.is_empty())
            .map(|d| (d.info, d.with.as_slice()))
            .collect();
        without_capture(|| observer.gate(&requests)).map_err(|source| Error::CheckFailed {
            op: requests.first().map_or("ncclGroupEnd", |r| r.0.op),
            source,
        })?;
    }
    let mut first_error = Ok(());
    for d in deferred {
        (d.met)();
        let issued = (d.run)(held);
        if first_error.is_ok() {
            first_error = issued;
        }
    }
    first_error
}

impl<'g> GroupHold<'g> {
    pub(crate) fn note_stream(&mut self, stream: &'g cudarc::driver::CudaStream, allowed: bool) {
        let raw = stream.cu_stream();
        match self.streams.iter_mut().find(|(s, _)| s.cu_stream() == raw) {
            Some((_, a)) => *a &= allowed,
            None => self.streams.push((stream, allowed)),
        }
    }
}

/// An open NCCL group. Collectives go in through [`GroupGuard::on`];
/// `end()` launches them and returns NCCL's verdict. Dropping the guard
/// without `end()` (an early return, a panic) still ends the group, so
/// NCCL is never left with a group open, and keeps the error for
/// [`take_dropped_group_error`].
///
/// `'g` is how long the buffers given to the group's collectives stay
/// borrowed: NCCL only launches the work at `ncclGroupEnd`, so the buffers
/// must outlive the guard. The guard also keeps each buffer owner's stream
/// bookkeeping until after the launch, and the calls for the communicators'
/// observers, which it reports at the outermost end with their streams
/// (borrowed for `'g` too). Collectives called directly on a `Comm` while
/// a group is open are refused for that reason.
///
/// Not `Send`: NCCL's group state belongs to the thread that opened it.
///
/// ```no_run
/// # fn demo(comms: &[nccl_safe::Comm], bufs: &mut [cudarc::driver::CudaSlice<f32>]) -> nccl_safe::Result<()> {
/// use nccl_safe::{GroupGuard, ReduceOp};
/// let group = GroupGuard::start()?;
/// for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
///     group.on(comm).all_reduce_in_place(buf, ReduceOp::Sum)?;
/// }
/// group.end()?;
/// # Ok(()) }
/// ```
#[must_use = "a group does nothing until it is ended"]
pub struct GroupGuard<'g> {
    lib: &'static Library,
    ended: bool,
    held: RefCell<GroupHold<'g>>,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for GroupGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupGuard")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<'g> GroupGuard<'g> {
    /// `ncclGroupStart`. A group is already open on this thread: use
    /// [`GroupGuard::nest`] on it instead, so the inner group's buffers
    /// stay borrowed until the outer group launches them.
    pub fn start() -> Result<GroupGuard<'g>> {
        if in_group() {
            return Err(Error::InvalidArgument {
                op: "ncclGroupStart",
                reason: "a group is already open on this thread: nest with GroupGuard::nest",
            });
        }
        Self::start_internal()
    }

    /// `ncclGroupStart` without the nesting check, for this crate's own
    /// groups of send/recv, which hold no buffers.
    pub(crate) fn start_internal() -> Result<GroupGuard<'g>> {
        let lib = Library::get()?;
        raw::start(lib)?;
        let observed = state::enter();
        Ok(GroupGuard {
            lib,
            ended: false,
            held: RefCell::new(GroupHold {
                accesses: Held::new(),
                observed,
                streams: smallvec::SmallVec::new(),
                deferred: Vec::new(),
            }),
            _not_send: PhantomData,
        })
    }

    /// What the group keeps until it ends, for the calls issued into it.
    pub(crate) fn held(&self) -> &RefCell<GroupHold<'g>> {
        &self.held
    }

    /// After `ncclGroupEnd` (or its simulation): reports the group's calls
    /// to their observers if NCCL launched them, else forgets them.
    ///
    /// Every stream in the list is borrowed for `'g`, which is live here
    /// (this guard is), so each `ObservedStream` still names a live stream
    /// when its observer gets it. Calls of nested groups are in this list
    /// too (they share this guard's hold); a crate-internal group nested
    /// in this one puts its calls here as well, and one that is itself
    /// outermost has its own list (see `OnStream::within`). The calls
    /// launch only at the outermost end: when a level opened inside this
    /// group was leaked (`mem::forget` of a `NestedGroup`), this end is not
    /// the outermost, nothing launched, and nothing is reported.
    fn report(&self, launched: bool) {
        let mut observed = std::mem::take(&mut self.held.borrow_mut().observed);
        if launched && !in_group() {
            without_capture(|| {
                for p in observed.drain(..) {
                    p.observer.issued(&p.info, p.stream);
                }
            });
        }
        recycle_observed(observed);
    }

    /// Opens a nested group (`ncclGroupStart` again). Its collectives are
    /// held by this, the outer, guard: NCCL launches them only when the
    /// outermost group ends.
    pub fn nest<'s>(&'s self) -> Result<NestedGroup<'s, 'g>> {
        raw::start(self.lib)?;
        state::enter_nested();
        Ok(NestedGroup {
            outer: self,
            ended: false,
        })
    }

    /// `ncclGroupEnd`: launches the group (if outermost) and waits for
    /// nonblocking communicators used in it to finish enqueueing.
    pub fn end(mut self) -> Result<()> {
        crate::segments::mark(crate::segments::Seg::Outside);
        self.ended = true;
        let gated = issue_deferred(&self.held);
        let spoiled = self.spoil_captures();
        let result = raw::finish(self.lib);
        self.report(result.is_ok());
        self.held.borrow_mut().accesses.clear();
        crate::segments::mark(crate::segments::Seg::Group);
        gated.and(spoiled).and(result)
    }

    /// Before NCCL enqueues the group: a stream of a call that was not
    /// allowed onto a capture, captured now (the capture began after the
    /// call was checked), would record work whose buffers and communicator
    /// nothing ties to the graph. Such captures are stopped
    /// ([`crate::capture::spoil`]), and the end answers
    /// [`Error::Capturing`].
    fn spoil_captures(&self) -> Result<()> {
        let held = self.held.borrow();
        let mut spoiled = false;
        for (stream, allowed) in &held.streams {
            if !*allowed && is_capturing(stream) {
                spoil(stream);
                spoiled = true;
            }
        }
        if spoiled {
            return Err(Error::Capturing { op: "ncclGroupEnd" });
        }
        Ok(())
    }

    /// `ncclGroupSimulateEnd`: ends the group without launching it and
    /// returns NCCL's estimate of its time, in microseconds, or `None`
    /// where NCCL gives none (a one-rank communicator has no network cost
    /// to model). NCCL 2.22+.
    ///
    /// On a one-rank communicator NCCL runs collectives at the call rather
    /// than at group end (its one-rank path is a plain copy), so their work
    /// has already happened when the group is simulated.
    ///
    /// On a library that cannot simulate, the error comes back and the
    /// group is ended for real as the guard goes: its work is launched,
    /// and the group is never left open.
    ///
    /// Calls held back for the connection gate (see
    /// [`crate::OpObserver::gate`]: with a gating observer, a group's calls
    /// from the first one that may connect on) are not issued, so they
    /// are not part of the estimate: simulating them would make NCCL's
    /// connections, which is what the gate keeps from happening unmet.
    pub fn simulate(mut self) -> Result<Option<f32>> {
        // Looked up while the guard still owns the group: on an error its
        // drop ends the group (launching the queued work) instead of
        // leaving it open on this thread for good.
        self.lib.capabilities().require(Feature::GroupSimulate)?;
        let simulate = self.lib.raw().ncclGroupSimulateEnd()?;
        self.ended = true;
        // Calls held back for a meeting are not issued: a simulation
        // connects nothing and launches nothing.
        self.held.borrow_mut().deferred.clear();
        let estimate = raw::simulate_end(self.lib, simulate);
        // Nothing was launched: the calls are forgotten, never reported
        // (and never left for a later group to report, with streams that
        // may be gone by then).
        self.report(false);
        self.held.borrow_mut().accesses.clear();
        let estimate = estimate?;
        Ok((estimate >= 0.0).then_some(estimate))
    }
}

impl Drop for GroupGuard<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let gated = issue_deferred(&self.held);
            let spoiled = self.spoil_captures();
            let result = gated.and(raw::finish(self.lib)).and(spoiled);
            self.report(result.is_ok());
            if let Err(e) = result {
                tracing::debug!(error = %e, "group ended by drop failed");
                state::set_dropped_error(e);
            }
        }
        self.held.borrow_mut().accesses.clear();
    }
}

/// A group opened inside another with [`GroupGuard::nest`]. Its
/// collectives are held by the outer guard; ending it launches nothing.
#[must_use = "a nested group must be ended"]
pub struct NestedGroup<'s, 'g> {
    pub(crate) outer: &'s GroupGuard<'g>,
    ended: bool,
}

impl std::fmt::Debug for NestedGroup<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NestedGroup")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<'s, 'g> NestedGroup<'s, 'g> {
    /// `ncclGroupEnd` of the nested level.
    pub fn end(mut self) -> Result<()> {
        self.ended = true;
        raw::finish(self.outer.lib)
    }
}

impl Drop for NestedGroup<'_, '_> {
    fn drop(&mut self) {
        if !self.ended
            && let Err(e) = raw::finish(self.outer.lib)
        {
            state::set_dropped_error(e);
        }
    }
}

/// Runs `f` inside a (new, outermost) group. The group is ended whether `f` succeeds or not;
/// `f`'s error wins over the group's.
///
/// ```no_run
/// # fn demo(comms: &[nccl_safe::Comm], bufs: &mut [cudarc::driver::CudaSlice<f32>]) -> nccl_safe::Result<()> {
/// use nccl_safe::{ReduceOp, group};
/// group(|g| {
///     for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
///         g.on(comm).all_reduce_in_place(buf, ReduceOp::Sum)?;
///     }
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub fn group<'g, R>(f: impl FnOnce(&GroupGuard<'g>) -> Result<R>) -> Result<R> {
    crate::segments::mark(crate::segments::Seg::Outside);
    let guard = GroupGuard::start()?;
    crate::segments::mark(crate::segments::Seg::Group);
    match f(&guard) {
        Ok(value) => {
            guard.end()?;
            Ok(value)
        }
        Err(e) => {
            drop(guard);
            let _ = take_dropped_group_error();
            Err(e)
        }
    }
}
