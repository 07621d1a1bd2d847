//! Every collective and point-to-point operation, validated before NCCL
//! sees it.
//!
//! [`OnStream`] (this file) is where operations go: a communicator, a
//! stream, and the group or capture they are issued into. Each operation
//! (`reduce.rs`, `movement.rs`, `rooted.rs`) validates its buffers and
//! builds one `Op` (`op.rs`), whose one enqueue path traces, launches,
//! waits, observes and keeps the buffers' bookkeeping. `forward.rs` gives
//! `Comm` the direct forms, from the list in `crate::for_each_collective!`.
//!
//! Counts come from buffer lengths: the buffer named in each method's docs
//! sets the count, and the other buffer must hold at least what the
//! operation writes or reads. A count of 0 is a no-op that makes no NCCL
//! call. Where NCCL defines an in-place layout, there is an `_in_place`
//! method taking one buffer; two buffers that overlap in any other way are
//! `Error::PartialAlias`.

mod forward;
mod movement;
mod op;
mod reduce;
mod rooted;

use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nccl_sys::{cudaStream_t, ncclComm_t, ncclResult_t};

use crate::buffer::{Access, DeviceBuffer, DeviceBufferMut};
use crate::capture_state::{is_allowed, refuse_capture, without_capture};
use crate::comm::{Comm, Met};
use crate::dtype::NcclType;
use crate::error::Role;
use crate::group::{self, Deferred, GroupGuard, GroupHold, NestedGroup};
use crate::observe::{ObservedStream, Pending};
use crate::reduce_op::Reduction;
use crate::segments::{self, Seg};
use crate::validate::{Check, Span, check_dtype, cold_err};
use crate::{Error, Result};

/// Refuses what NCCL cannot run for `op` on `T`: fp8 scaled sums (Avg,
/// PreMulSum) on a one-rank communicator, whose copy path has no fp8
/// kernels (NCCL answers `ncclInvalidArgument`; seen with 2.28.9).
fn check_reduction<'a, T: NcclType>(comm: &Comm, op: &impl Reduction<'a, T>) -> Result<()> {
    if T::IS_FP8 && comm.size() == 1 && op.scales() {
        return Err(Error::Unsupported {
            what: "fp8 Avg/PreMulSum on a one-rank communicator",
            requires: "at least two ranks".to_string(),
            found: "one rank".to_string(),
        });
    }
    Ok(())
}

/// A communicator and the stream its next operations go on, optionally
/// inside a group (see [`GroupGuard::on`]).
///
/// `'a` is how long buffers stay borrowed: until the call returns outside
/// a group, until the group ends inside one.
pub struct OnStream<'s, 'a> {
    comm: &'a Comm,
    stream: &'a CudaStream,
    /// Where buffers are opened (ordered): `stream`, except inside
    /// [`crate::capture`], where the capturing stream must not be joined
    /// with streams outside the capture; there the buffers are opened on
    /// the caller's stream (to learn their addresses) and each launch
    /// orders them.
    access: &'a CudaStream,
    hold: Option<&'s RefCell<GroupHold<'a>>>,
    /// Inside [`crate::capture`]: the extents (start, end) of the buffers
    /// the graph owns, the only ones a captured call may use.
    capture: Option<&'s [(u64, u64)]>,
}

impl std::fmt::Debug for OnStream<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnStream")
            .field("comm", self.comm)
            .field("grouped", &self.hold.is_some())
            .finish()
    }
}

/// The counts of an all-to-all-v: to each rank, from each rank.
pub(crate) type Counts<'c> = (&'c [usize], &'c [usize]);

/// Records on `comm` that the ranks `op` needed were met (see
/// [`OnStream::gate_needed`]); `counts` for an all-to-all-v.
fn mark_met(comm: &Comm, op: &op::Op, counts: Option<Counts<'_>>) {
    let (size, me) = (comm.size(), comm.rank());
    let mut reached = comm.shared().lock_reached();
    let reached = &mut *reached;
    if reached.send.len() < size {
        reached.send.resize(size, false);
        reached.recv.resize(size, false);
    }
    let all = |side: &mut Vec<bool>| side.iter_mut().for_each(|s| *s = true);
    match (op.kind, counts) {
        (_, Some((to, from))) => {
            for r in 0..size {
                reached.send[r] |= to.get(r).is_some_and(|n| *n > 0);
                reached.recv[r] |= from.get(r).is_some_and(|n| *n > 0);
            }
            if !reached.firsts.contains(&(op.name, usize::MAX)) {
                reached.firsts.push((op.name, usize::MAX));
            }
        }
        (op::Kind::Send, None) => reached.send[op.peer] = true,
        (op::Kind::Recv, None) => reached.recv[op.peer] = true,
        (op::Kind::AllToAll, None) => {
            all(&mut reached.send);
            all(&mut reached.recv);
            reached.firsts.push((op.name, usize::MAX));
        }
        (op::Kind::Gather | op::Kind::Scatter, None) => {
            let root = op.peer;
            let gathers = op.kind == op::Kind::Gather;
            match (root == me, gathers) {
                (true, true) => all(&mut reached.recv),
                (true, false) => all(&mut reached.send),
                (false, true) => reached.send[root] = true,
                (false, false) => reached.recv[root] = true,
            }
            reached.firsts.push((op.name, root));
        }
        _ => {
            reached.collective = true;
            comm.met.set(Met {
                collective: true,
                ..comm.met.get()
            });
        }
    }
}

/// The address `offset_elems` elements past `address`. Offsets are
/// validated to lie inside the buffer, whose contract promises it is real
/// memory, so this cannot wrap; wrapping keeps a lying implementation from
/// causing a panic here.
fn ptr(address: u64, offset_elems: usize, elem_bytes: usize) -> u64 {
    address.wrapping_add(offset_elems.wrapping_mul(elem_bytes) as u64)
}

impl<'s, 'a> OnStream<'s, 'a> {
    fn direct(comm: &'a Comm, stream: &'a CudaStream) -> Self {
        segments::mark(Seg::Outside);
        OnStream {
            comm,
            stream,
            access: stream,
            hold: None,
            capture: None,
        }
    }

    fn grouped(comm: &'a Comm, stream: &'a CudaStream, hold: &'s RefCell<GroupHold<'a>>) -> Self {
        segments::mark(Seg::Outside);
        OnStream {
            comm,
            stream,
            access: stream,
            hold: Some(hold),
            capture: None,
        }
    }

    /// Calls captured into a graph that owns the buffers at `extents`.
    pub(crate) fn capturing(
        comm: &'a Comm,
        stream: &'a CudaStream,
        home: &'a CudaStream,
        extents: &'s [(u64, u64)],
    ) -> Self {
        OnStream {
            comm,
            stream,
            access: home,
            hold: None,
            capture: Some(extents),
        }
    }

    /// Calls captured into a graph that owns the buffers at `extents`,
    /// issued into the group whose hold is `hold` (one thread capturing a
    /// group over several GPUs: [`crate::capture_group`]).
    pub(crate) fn capturing_grouped(
        comm: &'a Comm,
        stream: &'a CudaStream,
        home: &'a CudaStream,
        extents: &'s [(u64, u64)],
        hold: &'s RefCell<GroupHold<'a>>,
    ) -> Self {
        OnStream {
            comm,
            stream,
            access: home,
            hold: Some(hold),
            capture: Some(extents),
        }
    }

    /// `buffer` opened for reading; while capturing, it must be one the
    /// graph owns.
    fn read_buf<T: NcclType>(
        &self,
        op: &'static str,
        buffer: &'a (impl DeviceBuffer<T> + ?Sized),
    ) -> Result<(u64, Access<'a>)> {
        segments::mark(Seg::Validate);
        let (ptr, access) = buffer.read(self.access);
        self.owned_by_graph(op, ptr, buffer.len() * std::mem::size_of::<T>())?;
        segments::mark(Seg::Buffers);
        Ok((ptr, access))
    }

    /// `buffer` opened for writing; while capturing, it must be one the
    /// graph owns.
    fn write_buf<T: NcclType>(
        &self,
        op: &'static str,
        buffer: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<(u64, Access<'a>)> {
        segments::mark(Seg::Validate);
        let len = buffer.len();
        let (ptr, access) = buffer.write(self.access);
        self.owned_by_graph(op, ptr, len * std::mem::size_of::<T>())?;
        segments::mark(Seg::Buffers);
        Ok((ptr, access))
    }

    /// While capturing: refuses memory the graph does not own (it could be
    /// freed before a launch).
    fn owned_by_graph(&self, op: &'static str, ptr: u64, bytes: usize) -> Result<()> {
        let Some(extents) = self.capture else {
            return Ok(());
        };
        let end = ptr.checked_add(bytes as u64);
        if bytes == 0
            || extents
                .iter()
                .any(|&(s, e)| ptr >= s && end.is_some_and(|x| x <= e))
        {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op,
            reason: "a captured call may only use buffers the graph owns (those given to capture)",
        })
    }

    /// The reduction's NCCL handle; while capturing, a built-in one only (a
    /// PreMulSum is destroyed with its value, before a later launch).
    fn redop<T: NcclType>(
        &self,
        op: &'static str,
        reduction: &impl Reduction<'a, T>,
    ) -> Result<nccl_sys::ncclRedOp_t> {
        let raw = reduction.raw_for(self.comm)?;
        if self.capture.is_some() && raw.is_dynamic() {
            return Err(Error::InvalidArgument {
                op,
                reason: "a captured call may only use a built-in reduction (a PreMulSum could be destroyed before a launch)",
            });
        }
        Ok(raw)
    }

    fn check<T>(&self, op: &'static str) -> Result<Check> {
        if self.hold.is_none() && group::is_open() {
            return cold_err(Error::InvalidArgument {
                op,
                reason: "a group is open on this thread: issue the call through GroupGuard::on",
            });
        }
        let stream_device = self.stream.context().ordinal();
        if stream_device != self.comm.device() {
            return cold_err(Error::WrongDevice {
                op,
                role: Role::Stream,
                expected: self.comm.device(),
                found: stream_device,
            });
        }
        if self.capture.is_none() {
            refuse_capture(op, self.stream)?;
        }
        segments::mark(Seg::Check);
        Ok(Check {
            op,
            rank: self.comm.rank(),
            size: self.comm.size(),
            device: self.comm.device(),
            elem_bytes: std::mem::size_of::<T>(),
        })
    }

    fn raw_stream(&self) -> cudaStream_t {
        self.stream.cu_stream() as cudaStream_t
    }

    /// Keeps the accesses until the group ends (inside a group) or drops
    /// them now, after the enqueue (outside one). Accesses whose drop does
    /// nothing are not kept.
    fn settle(&self, accesses: impl IntoIterator<Item = Access<'a>>) {
        if let Some(hold) = self.hold {
            hold.borrow_mut()
                .accesses
                .extend(accesses.into_iter().filter(|a| !a.is_none()));
        }
    }

    /// One NCCL enqueue call on the live communicator, with nonblocking
    /// polling and error capture.
    fn call(
        &self,
        called: &op::Op,
        f: impl FnOnce(ncclComm_t, cudaStream_t) -> ncclResult_t,
    ) -> Result<()> {
        let op = called.name;
        let shared = self.comm.shared();
        let stream = self.raw_stream();
        let grouped = group::is_open();
        if grouped {
            group::touch(shared);
        }
        segments::mark(Seg::Gate);
        let code = shared.with_raw(op, |raw| {
            if grouped {
                shared.enter_group();
            }
            segments::mark(Seg::Lock);
            let code = f(raw, stream);
            segments::mark(Seg::Nccl);
            Ok(code)
        })?;
        segments::mark(Seg::Unlock);
        match code {
            ncclResult_t::ncclSuccess => {}
            ncclResult_t::ncclInProgress if !self.comm.is_blocking() => {
                if !grouped {
                    shared.wait_ready(op)?;
                }
            }
            code => return Self::failed(self.comm, op, code),
        }
        debug_assert!(
            self.hold.is_some() || !grouped,
            "a call inside a group goes through the group's hold"
        );
        if let Some(hold) = self.hold {
            let allowed = self.capture.is_some() || is_allowed();
            hold.borrow_mut().note_stream(self.stream, allowed);
        }
        Self::observe(self.comm, called, self.stream, self.hold);
        segments::mark(Seg::Observe);
        Ok(())
    }

    /// The error of an enqueue NCCL refused with `code` (its text read
    /// under the lock). Out of line and cold, so that the enqueue's own
    /// code stays on as few instruction cache lines as it can: between two
    /// calls NCCL's enqueue pushes it out of the nearer caches, and each
    /// line of ours is fetched again (see `segments.rs`).
    #[cold]
    #[inline(never)]
    fn failed(comm: &Comm, op: &'static str, code: ncclResult_t) -> Result<()> {
        let lib = comm.library();
        comm.shared().with_raw(op, |raw| lib.check(op, code, raw))
    }

    /// The same communicator and stream, issuing into the crate-internal
    /// `group`: into the caller's group when there is one (the calls launch
    /// at its end, which reports them), else into `group` itself, whose end
    /// launches and reports them. Either way the calls and their streams
    /// stay borrowed until the group that reports them ends.
    fn within<'t>(&'t self, group: &'t GroupGuard<'a>) -> OnStream<'t, 'a> {
        OnStream {
            comm: self.comm,
            stream: self.stream,
            access: self.access,
            hold: Some(self.hold.unwrap_or(group.held())),
            capture: self.capture,
        }
    }

    /// The checks every operation starts with (thread, stream, capture,
    /// and whether `T` can run here; `reduces` for a reduction).
    fn begin<T: NcclType>(&self, op: &'static str, reduces: bool) -> Result<Check> {
        let c = self.check::<T>(op)?;
        check_dtype::<T>(self.comm, op, reduces)?;
        Ok(c)
    }

    /// As [`OnStream::begin`] for a reduction, which NCCL must also be
    /// able to run on `T` here.
    fn begin_reducing<T: NcclType>(
        &self,
        op: &'static str,
        reduction: &impl Reduction<'a, T>,
    ) -> Result<Check> {
        let c = self.begin::<T>(op, true)?;
        check_reduction::<T>(self.comm, reduction)?;
        Ok(c)
    }

    /// The root-side buffer of a rooted operation: required on `root`
    /// (else `reason`), not used elsewhere.
    fn at_root<B>(
        &self,
        op: &'static str,
        buffer: Option<B>,
        root: usize,
        reason: &'static str,
    ) -> Result<Option<B>> {
        let is_root = self.comm.rank() == root;
        match buffer {
            Some(b) if is_root => Ok(Some(b)),
            None if is_root => Err(Error::InvalidArgument { op, reason }),
            _ => Ok(None),
        }
    }

    /// The root-side buffer of a rooted operation opened for reading, as
    /// a span with its address (`None` off the root).
    fn read_at_root<T: NcclType, S: DeviceBuffer<T> + ?Sized>(
        &self,
        op: &'static str,
        buffer: Option<&'a S>,
    ) -> Result<Option<(Span, Access<'a>)>> {
        let open = |b: &'a S| {
            let (ptr, access) = self.read_buf(op, b)?;
            Ok((
                Span {
                    ptr,
                    ..Self::span(b)
                },
                access,
            ))
        };
        buffer.map(open).transpose()
    }

    /// As [`OnStream::read_at_root`], for writing.
    fn write_at_root<T: NcclType, R: DeviceBufferMut<T> + ?Sized>(
        &self,
        op: &'static str,
        buffer: Option<&'a mut R>,
    ) -> Result<Option<(Span, Access<'a>)>> {
        let open = |b: &'a mut R| {
            let span = Self::span(&*b);
            let (ptr, access) = self.write_buf(op, b)?;
            Ok((Span { ptr, ..span }, access))
        };
        buffer.map(open).transpose()
    }

    /// The address and access of an opened root-side buffer: 0 and none
    /// off the root (NCCL does not use the buffer there).
    fn root_side(opened: Option<(Span, Access<'a>)>) -> (u64, Option<Access<'a>>) {
        opened.map_or((0, None), |(span, access)| (span.ptr, Some(access)))
    }

    fn span<T: NcclType>(buffer: &(impl DeviceBuffer<T> + ?Sized)) -> Span {
        Span {
            ptr: 0,
            len: buffer.len(),
            device: buffer.device(),
        }
    }

    /// The observer's check of `op` before its launch (see
    /// [`crate::OpObserver::before`]): only outside a group and a capture.
    #[cold]
    fn before(&self, op: &op::Op) -> Result<()> {
        if self.hold.is_some() || self.capture.is_some() || is_allowed() {
            return Ok(());
        }
        // A clone, not the borrow: the check may wait (for the other
        // ranks), and `set_observer` must not find the cell borrowed.
        let Some(observer) = self.comm.observer.borrow().clone() else {
            return Ok(());
        };
        let info = op.info();
        without_capture(|| observer.before(&info)).map_err(|source| Error::CheckFailed {
            op: info.op,
            source,
        })
    }

    /// Whether `op` (not an all-to-all-v, whose counts decide) may go to
    /// NCCL without a meeting (see [`crate::OpObserver::gate`]): what it
    /// connects was met already. A collective once the first was met, an
    /// all-to-all once the first was, a send or receive once its peer's
    /// first was (peers below 64): the handle's copy (`Comm::met`, a
    /// `Cell`); otherwise the shared record, under its lock.
    #[inline]
    fn gate_met(&self, op: &op::Op) -> bool {
        let met = self.comm.met.get();
        let bit = Met::bit(op.peer);
        let cached = match op.kind {
            op::Kind::Send => met.send & bit != 0,
            op::Kind::Recv => met.recv & bit != 0,
            op::Kind::AllToAll => {
                // One flag for the one all-to-all (an all-to-all-v counts
                // by direction and never comes here).
                debug_assert_eq!(op.name, "ncclAlltoAll");
                met.all_to_all
            }
            op::Kind::Gather | op::Kind::Scatter => false,
            _ => met.collective || self.comm.size() < 2,
        };
        if cached {
            return true;
        }
        self.gate_met_shared(op)
    }

    /// [`OnStream::gate_met`] from the shared record, under its lock; a
    /// yes is kept in the handle's copy.
    #[cold]
    fn gate_met_shared(&self, op: &op::Op) -> bool {
        let reached = self.comm.shared().lock_reached();
        let me = self.comm.rank();
        let side = |v: &Vec<bool>, r: usize| r == me || v.get(r).copied().unwrap_or(false);
        let yes = match op.kind {
            op::Kind::Send => side(&reached.send, op.peer),
            op::Kind::Recv => side(&reached.recv, op.peer),
            op::Kind::AllToAll => reached.firsts.contains(&(op.name, usize::MAX)),
            op::Kind::Gather | op::Kind::Scatter => {
                return reached.firsts.contains(&(op.name, op.peer));
            }
            _ => reached.collective,
        };
        if yes {
            let mut met = self.comm.met.get();
            match op.kind {
                op::Kind::Send => met.send |= Met::bit(op.peer),
                op::Kind::Recv => met.recv |= Met::bit(op.peer),
                op::Kind::AllToAll => met.all_to_all = true,
                _ => met.collective = true,
            }
            self.comm.met.set(met);
        }
        yes
    }

    /// The communicator ranks `op` must meet before it goes to NCCL, when
    /// it may connect: every rank (this one included) for the first
    /// collective, the first all-to-all or all-to-all-v, and the first
    /// gather or scatter of a root (calls every rank makes); for a send, a
    /// receive or a later all-to-all-v (`counts`), the peers of the
    /// directions not connected yet (this rank not included).
    fn gate_needed(
        &self,
        op: &op::Op,
        counts: Option<Counts<'_>>,
    ) -> smallvec::SmallVec<[usize; 8]> {
        let (size, me) = (self.comm.size(), self.comm.rank());
        if size < 2 {
            return smallvec::SmallVec::new();
        }
        if let Some((to, from)) = counts {
            let reached = self.comm.shared().lock_reached();
            // The first all-to-all-v meets every rank (every rank makes
            // it): then no rank can pass its meetings while another
            // refuses. Later ones meet the peers of new directions.
            if !reached.firsts.contains(&(op.name, usize::MAX)) {
                return (0..size).collect();
            }
            let unmet = |v: &Vec<bool>, r: usize| !v.get(r).copied().unwrap_or(false);
            return (0..size)
                .filter(|&r| r != me)
                .filter(|&r| {
                    (to.get(r).is_some_and(|n| *n > 0) && unmet(&reached.send, r))
                        || (from.get(r).is_some_and(|n| *n > 0) && unmet(&reached.recv, r))
                })
                .collect();
        }
        if self.gate_met(op) {
            return smallvec::SmallVec::new();
        }
        match op.kind {
            op::Kind::Send | op::Kind::Recv => smallvec::smallvec![op.peer],
            _ => (0..size).collect(),
        }
    }

    /// The observer's gate of one call outside a group (or inside a
    /// capture): the ranks meet now, when the call may connect.
    #[inline]
    fn gate(&self, op: &op::Op, counts: Option<Counts<'_>>) -> Result<()> {
        if counts.is_none() && self.gate_met(op) {
            return Ok(());
        }
        self.gate_now(op, counts)
    }

    #[cold]
    fn gate_now(&self, op: &op::Op, counts: Option<Counts<'_>>) -> Result<()> {
        let with = self.gate_needed(op, counts);
        if with.is_empty() {
            return Ok(());
        }
        // A clone, not the borrow, as for `before`: the gate may wait.
        let Some(observer) = self.comm.observer.borrow().clone() else {
            return Ok(());
        };
        let info = op.info();
        without_capture(|| observer.gate(&[(info, &with)])).map_err(|source| {
            Error::CheckFailed {
                op: info.op,
                source,
            }
        })?;
        mark_met(self.comm, op, counts);
        Ok(())
    }

    /// Holds `op` back to the end of the group (`hold`), where its ranks
    /// meet before it is issued (see [`crate::OpObserver::gate`]).
    ///
    /// # Safety
    ///
    /// As for [`OnStream::enqueue`]; the group keeps the buffers' accesses
    /// until its end, when the call is issued.
    #[cold]
    unsafe fn defer(&self, op: op::Op, hold: &RefCell<GroupHold<'a>>) {
        self.defer_with(
            &op,
            None,
            hold,
            Box::new(move |on: OnStream<'_, 'a>| {
                // SAFETY: the caller's promise for `op`, whose buffers the
                // group held until now, its end.
                unsafe { on.dispatch(&op) }
            }),
        );
    }

    /// As [`OnStream::defer`], issuing with `run`; `gate_op` (with the
    /// `counts` of an all-to-all-v) says which ranks the call meets.
    #[allow(clippy::type_complexity)]
    fn defer_with(
        &self,
        gate_op: &op::Op,
        counts: Option<Counts<'_>>,
        hold: &RefCell<GroupHold<'a>>,
        run: Box<dyn for<'h> FnOnce(OnStream<'h, 'a>) -> Result<()> + 'a>,
    ) {
        let with = self.gate_needed(gate_op, counts);
        let observer = self.comm.observer.borrow().clone();
        let (comm, stream, access) = (self.comm, self.stream, self.access);
        let op = *gate_op;
        let owned = counts.map(|(to, from)| (to.to_vec(), from.to_vec()));
        let needs = !with.is_empty();
        hold.borrow_mut().deferred.push(Deferred {
            comm: Arc::as_ptr(comm.shared()) as usize,
            observer,
            info: gate_op.info(),
            with,
            met: Box::new(move || {
                if needs {
                    mark_met(comm, &op, owned.as_ref().map(|(t, f)| (&t[..], &f[..])));
                }
            }),
            run: Box::new(move |hold| {
                run(OnStream {
                    comm,
                    stream,
                    access,
                    hold: Some(hold),
                    capture: None,
                })
            }),
        });
    }

    /// Whether a call inside a group is held back to its end: it may
    /// connect, or an earlier call of the group was held back.
    fn defers(
        &self,
        op: &op::Op,
        counts: Option<Counts<'_>>,
    ) -> Option<&'s RefCell<GroupHold<'a>>> {
        if !self.comm.gates.get() || self.capture.is_some() {
            return None;
        }
        let hold = self.hold?;
        let waiting = !hold.borrow().deferred.is_empty();
        (waiting || !self.gate_needed(op, counts).is_empty()).then_some(hold)
    }

    /// Reports an accepted call on `stream` to the observer: now, or, for
    /// a call issued into a group, at that group's outermost end (the
    /// group's `hold` keeps it, with the stream borrowed for as long).
    fn observe<'o>(
        comm: &Comm,
        op: &op::Op,
        stream: &'o CudaStream,
        hold: Option<&RefCell<GroupHold<'o>>>,
    ) {
        let observer = comm.observer.borrow();
        let Some(observer) = observer.as_ref() else {
            return;
        };
        // What observers are told, built only when there is one.
        let info = op.info();
        let stream = ObservedStream::new(stream);
        match hold {
            Some(hold) => hold.borrow_mut().observed.push(Pending {
                observer: Arc::clone(observer),
                info,
                stream,
            }),
            None => without_capture(|| observer.issued(&info, stream)),
        }
    }
}

impl<'g> GroupGuard<'g> {
    /// Issues collectives of `comm` (on its stream) into this group.
    pub fn on<'s>(&'s self, comm: &'g Comm) -> OnStream<'s, 'g> {
        OnStream::grouped(comm, comm.stream(), self.held())
    }

    /// Issues collectives of `comm` on `stream` into this group.
    pub fn on_stream<'s>(
        &'s self,
        comm: &'g Comm,
        stream: &'g cudarc::driver::CudaStream,
    ) -> OnStream<'s, 'g> {
        OnStream::grouped(comm, stream, self.held())
    }
}

impl<'s, 'g> NestedGroup<'s, 'g> {
    /// Issues collectives of `comm` into the nested group.
    pub fn on(&self, comm: &'g Comm) -> OnStream<'s, 'g> {
        OnStream::grouped(comm, comm.stream(), self.outer.held())
    }
}
