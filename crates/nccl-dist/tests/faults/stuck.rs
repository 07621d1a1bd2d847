//! Cases where every process lives but work gets stuck or is cut short:
//! mismatched collectives, an abort from another thread (while waiting,
//! and while a group is open), a drop with work in flight, and fifty
//! abort-and-rebuild cycles. All but the last run in both modes.

use std::time::{Duration, Instant};

use nccl_dist::nccl_safe::{self, AbortCause, GroupGuard, ReduceOp};
use nccl_dist::{Divergence, Error, FailureKind, Field, Launch, World};

use crate::hardware::{gpu_used_mib, host_barrier, open_fds, threads};
use crate::{
    OP_TIMEOUT, Rank, TestResult, checked_all_reduce, cuda, env, expect_error, kernel_runs, kind,
    options, run, run_process,
};

/// Elements of the mismatch cases' collectives.
pub(crate) const N: usize = 1 << 20;

/// The mismatch cases: `warm` runs on every rank (the operations both
/// sides of the mismatch use, so that no blocking enqueue waits in NCCL's
/// connection set-up), then every rank runs `op` (the victim differs),
/// then a one-element all-reduce as a barrier; the first error ends it.
/// Every rank must be done within two operation timeouts (the op, then
/// the barrier a faster rank got to), never hang, and nobody may count as
/// lost. An error must be the watchdog's verdict from the flight-recorder
/// exchange ([`FailureKind::Diverged`]) naming the victim and `field`.
/// NCCL exchanges no counts or types, so a mismatch may also complete
/// (with meaningless data): on 2 H200s a count or dtype mismatch of 1M
/// against 2M elements completed at once on both ranks (c1 now uses 1M
/// against 64M, and c2 16M elements, to make a hang likelier). That is recorded
/// as such; the check before launch (`..._checked` cases) catches those.
fn mismatch(
    r: &mut Rank,
    world: World,
    field: Field,
    warm: impl Fn(&World) -> TestResult,
    op: impl FnOnce(&World, bool) -> Result<(), Error>,
) -> TestResult {
    checked_all_reduce(&world, 1024)?;
    warm(&world)?;
    let since = Instant::now();
    let comm = world.comm();
    let waited = op(&world, r.is_victim())
        .and_then(|()| nccl_dist::synchronize(comm, comm.stream()))
        .and_then(|()| {
            let mut token = comm.stream().alloc_zeros::<i32>(1).map_err(cuda)?;
            comm.all_reduce_in_place(&mut token, ReduceOp::Sum)
                .map_err(|e| crate::explained(&world, e))?;
            nccl_dist::synchronize(comm, comm.stream())
        });
    let limit = 2 * OP_TIMEOUT + Duration::from_secs(2);
    if waited.is_ok() {
        let after = since.elapsed();
        r.note("ended_after_ms", after.as_millis())?;
        r.note("deadline_ms", limit.as_millis())?;
        r.note("outcome", "completed (NCCL did not detect the mismatch)")?;
        if after > limit {
            return Err(format!("completed after {after:?}, beyond {limit:?}").into());
        }
    }
    let verdict = match waited {
        Ok(()) => Ok(()),
        Err(e) => {
            let e = expect_error(r, Err(e), since, limit)?;
            let named = names_the_culprit(r, &e, field);
            if named.is_err() {
                // What the watchdog says a moment later, for the log.
                std::thread::sleep(Duration::from_secs(2));
                let later = nccl_dist::Watched::of(comm).and_then(|w| w.failure());
                r.note(
                    "watchdog_2s_later",
                    later.map_or_else(|| "no failure".to_string(), |f| f.to_string()),
                )?;
            }
            named
        }
    };
    // A rank whose calls completed (NCCL matched them up) is still part of
    // the job, as it would be in a real one at its next call: it stays,
    // with its flight records and its liveness channel, until every rank
    // has its outcome, so that a rank that times out later still gets
    // the verdict from every rank's records.
    r.settled_with_peers(limit + Duration::from_secs(3))?;
    verdict?;
    drop(world);
    kernel_runs(r.device)?;
    r.note("kernel", "ok")
}

/// Whether `e` is a verdict that names the victim and `field`: after a
/// timeout ([`FailureKind::Diverged`]) or an error NCCL noticed
/// ([`FailureKind::Mismatch`]).
fn names_the_culprit(r: &mut Rank, e: &Error, field: Field) -> TestResult {
    let divergence = match e {
        Error::Watchdog(f) => match &f.kind {
            FailureKind::Diverged { divergence, .. } | FailureKind::Mismatch { divergence, .. } => {
                divergence
            }
            _ => return Err(format!("the error names no culprit: {e}").into()),
        },
        _ => return Err(format!("the error names no culprit: {e}").into()),
    };
    names(r, divergence, field)
}

/// Whether `divergence` names the victim and `field`: the victim as the
/// culprit against a majority, or (two ranks, no majority) among the
/// calls listed side by side. Recorded for the table.
pub(crate) fn names(r: &mut Rank, divergence: &Divergence, field: Field) -> TestResult {
    let victim = r.victim()?;
    r.note(
        "culprit",
        format!(
            "{} in the {} at #{}",
            divergence
                .culprit
                .map_or_else(|| "no majority".to_string(), |c| format!("rank {c}")),
            divergence.field,
            divergence.seq
        ),
    )?;
    let named = match divergence.culprit {
        Some(c) => c == victim,
        None => divergence.others.iter().any(|(rank, _)| *rank == victim),
    };
    if !named || divergence.field != field {
        return Err(format!(
            "the verdict does not name rank {victim} and the {field}: {divergence}"
        )
        .into());
    }
    Ok(())
}

/// An all-reduce of `n` zeros of `T` whose buffer outlives the call:
/// after a mismatch NCCL may still use it until the communicator is gone,
/// so it is leaked.
pub(crate) fn leaked_all_reduce<T>(world: &World, n: usize) -> Result<(), Error>
where
    T: nccl_safe::NcclType
        + nccl_safe::cudarc::driver::ValidAsZeroBits
        + nccl_safe::cudarc::driver::DeviceRepr,
{
    let mut buf = world.comm().stream().alloc_zeros::<T>(n).map_err(cuda)?;
    let issued = world.comm().all_reduce_in_place(&mut buf, ReduceOp::Sum);
    std::mem::forget(buf);
    issued.map_err(|e| crate::explained(world, e))
}

/// Runs `op` on every rank and waits for it (the warm-up of a mismatch).
fn together(world: &World, op: impl FnOnce(&World) -> Result<(), Error>) -> TestResult {
    op(world)?;
    nccl_dist::synchronize(world.comm(), world.comm().stream())?;
    Ok(())
}

/// (c1) The victim all-reduces N elements, the others 64N (more steps
/// of NCCL's loop than the victim's, so that the others wait for data that
/// never comes).
#[test]
#[ignore]
fn c1_mismatched_count() {
    run("c1_mismatched_count", |r, world| {
        mismatch(
            r,
            world,
            Field::Count,
            |w| {
                together(w, |w| leaked_all_reduce::<f32>(w, N))?;
                together(w, |w| leaked_all_reduce::<f32>(w, 64 * N))
            },
            |w, odd| leaked_all_reduce::<f32>(w, if odd { N } else { 64 * N }),
        )
    });
}

/// (c2) The victim all-reduces f32, the others f64, same count (16N).
#[test]
#[ignore]
fn c2_mismatched_dtype() {
    run("c2_mismatched_dtype", |r, world| {
        mismatch(
            r,
            world,
            Field::Dtype,
            |w| {
                together(w, |w| leaked_all_reduce::<f32>(w, 16 * N))?;
                together(w, |w| leaked_all_reduce::<f64>(w, 16 * N))
            },
            |w, odd| match odd {
                true => leaked_all_reduce::<f32>(w, 16 * N),
                false => leaked_all_reduce::<f64>(w, 16 * N),
            },
        )
    });
}

/// A broadcast of `N` zeros from `root`, its buffer leaked as above.
pub(crate) fn leaked_broadcast(world: &World, root: usize) -> Result<(), Error> {
    let mut buf = world.comm().stream().alloc_zeros::<f32>(N).map_err(cuda)?;
    let issued = world.comm().broadcast_in_place(&mut buf, root);
    std::mem::forget(buf);
    issued.map_err(|e| crate::explained(world, e))
}

/// (c3) The victim runs an all-reduce then a broadcast; the others the
/// other way round.
#[test]
#[ignore]
fn c3_mismatched_order() {
    run("c3_mismatched_order", |r, world| {
        mismatch(
            r,
            world,
            Field::Op,
            |w| {
                together(w, |w| leaked_all_reduce::<f32>(w, N))?;
                together(w, |w| leaked_broadcast(w, 0))
            },
            |w, odd| match odd {
                true => leaked_all_reduce::<f32>(w, N).and_then(|()| leaked_broadcast(w, 0)),
                false => leaked_broadcast(w, 0).and_then(|()| leaked_all_reduce::<f32>(w, N)),
            },
        )
    });
}

/// (c4) The victim broadcasts from its own rank, the others from rank 0.
#[test]
#[ignore]
fn c4_mismatched_root() {
    run("c4_mismatched_root", |r, world| {
        let last = world.size() - 1;
        mismatch(
            r,
            world,
            Field::Root,
            |w| {
                together(w, |w| leaked_broadcast(w, 0))?;
                together(w, |w| leaked_broadcast(w, last))
            },
            |w, odd| leaked_broadcast(w, if odd { last } else { 0 }),
        )
    });
}

/// Whether `e` is the abort that this rank asked for (directly, or as the
/// watchdog saw it: the communicator aborted under unfinished work).
fn is_requested_abort(e: &Error) -> bool {
    match e {
        Error::Nccl(nccl_safe::Error::Aborted { cause, .. }) => *cause == AbortCause::Requested,
        Error::Watchdog(f) => f.kind == FailureKind::Aborted,
        _ => false,
    }
}

/// (d) The victim never joins an all-reduce (it waits 3 s, then drops its
/// world); on the others a second thread aborts the communicator after
/// 1 s while the first waits in `synchronize`: the waiter wakes with the
/// abort (`Aborted`, or the watchdog's account of it) within 2 s of it,
/// and the communicator says `Aborted`.
#[test]
#[ignore]
fn d_abort_from_another_thread() {
    run("d_abort_from_another_thread", |r, world| {
        checked_all_reduce(&world, N)?;
        if r.is_victim() {
            std::thread::sleep(Duration::from_secs(3));
            let started = Instant::now();
            drop(world);
            r.note("victim_drop_ms", started.elapsed().as_millis())?;
            kernel_runs(r.device)?;
            return r.note("kernel", "ok");
        }
        let comm = world.comm();
        let mut buf = comm.stream().alloc_zeros::<f32>(N)?;
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        let handle = comm.abort_handle();
        let since = Instant::now();
        let aborter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            let at = Instant::now();
            let result = handle.abort();
            (at, at.elapsed(), result)
        });
        let waited = nccl_dist::synchronize(comm, comm.stream());
        let woke = Instant::now();
        let (aborted_at, abort_took, abort_result) =
            aborter.join().map_err(|_| "aborter panicked")?;
        abort_result?;
        r.note("abort_call_ms", abort_took.as_millis())?;
        r.note(
            "wake_after_abort_ms",
            woke.saturating_duration_since(aborted_at).as_millis(),
        )?;
        let e = expect_error(r, waited, since, Duration::from_secs(3))?;
        if !is_requested_abort(&e) {
            return Err(format!("the waiter woke with {}, not the abort", kind(&e)).into());
        }
        if !matches!(comm.status(), Err(nccl_safe::Error::Aborted { .. })) {
            return Err("the communicator does not say Aborted".into());
        }
        drop(buf);
        drop(world);
        kernel_runs(r.device)?;
        r.note("kernel", "ok")
    });
}

/// (e) On a blocking communicator (the default), the victim never joins
/// an all-reduce; the others drop their world with it in flight. The drop
/// waits at most the operation timeout for the work, then aborts: it must
/// return within the timeout + 5 s, and a kernel must run after it.
#[test]
#[ignore]
fn e_drop_with_work_in_flight() {
    run("e_drop_with_work_in_flight", |r, world| {
        checked_all_reduce(&world, N)?;
        if r.is_victim() {
            std::thread::sleep(Duration::from_secs(2));
            drop(world);
            kernel_runs(r.device)?;
            return r.note("kernel", "ok");
        }
        let comm = world.comm();
        let mut buf = comm.stream().alloc_zeros::<f32>(N)?;
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        let limit = OP_TIMEOUT + Duration::from_secs(5);
        let started = Instant::now();
        drop(world);
        let took = started.elapsed();
        r.note("drop_ms", took.as_millis())?;
        r.note("deadline_ms", limit.as_millis())?;
        r.note(
            "outcome",
            "dropped (work unfinished: bounded wait, then abort)",
        )?;
        if took > limit {
            return Err(format!("drop took {took:?}, beyond {limit:?}").into());
        }
        // The buffer outlived the aborted communicator's work.
        drop(buf);
        kernel_runs(r.device)?;
        r.note("kernel", "ok")
    });
}

/// (i) Every rank opens a group and enqueues an all-reduce in it; before
/// the group ends, another thread aborts the communicator through its
/// abort handle. The abort must not wait for the group (it is deferred to
/// its end, never freeing what the group refers to), the group's end may
/// return an error or Ok but must return within the operation timeout,
/// and afterwards the communicator and every later call say `Aborted`;
/// the process must not crash.
#[test]
#[ignore]
fn i_abort_while_group_open() {
    run("i_abort_while_group_open", |r, world| {
        const M: usize = 1 << 16;
        checked_all_reduce(&world, M)?;
        let comm = world.comm();
        let mut buf = comm.stream().alloc_zeros::<f32>(M)?;
        let handle = comm.abort_handle();
        let since = Instant::now();
        let group = GroupGuard::start()?;
        group
            .on(comm)
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        let aborter = std::thread::spawn(move || {
            let at = Instant::now();
            let result = handle.abort();
            (at.elapsed(), result, handle.is_aborted())
        });
        let (took, aborted, flagged) = aborter.join().map_err(|_| "aborter panicked")?;
        r.note("abort_call_ms", took.as_millis())?;
        r.note("abort_result", format!("{aborted:?}"))?;
        if took > Duration::from_secs(2) {
            return Err(format!("the abort waited {took:?} for the open group").into());
        }
        if !flagged {
            return Err("the abort handle does not say aborted".into());
        }
        // The group's end launches the work, then runs the deferred abort.
        let ended = group.end();
        let after = since.elapsed();
        r.note("group_end", format!("{ended:?}"))?;
        r.note("error_after_ms", after.as_millis())?;
        r.note("deadline_ms", OP_TIMEOUT.as_millis())?;
        if after > OP_TIMEOUT {
            return Err(format!("the group's end and the abort took {after:?}").into());
        }
        match comm.status() {
            Err(nccl_safe::Error::Aborted { .. }) => {}
            other => return Err(format!("after the group: status {other:?}").into()),
        }
        let later = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum);
        r.note("outcome", format!("later call: {later:?}"))?;
        if !matches!(later, Err(nccl_safe::Error::Aborted { .. })) {
            return Err(format!("a call after the abort returned {later:?}").into());
        }
        drop(buf);
        drop(world);
        kernel_runs(r.device)?;
        r.note("kernel", "ok")
    });
}

/// (r) Recovery: 50 cycles of (new world, checked all-reduce, abort). Open
/// fds, threads and device memory after cycle 10 and cycle 50, sampled
/// once every rank has aborted, must match (small slack for the
/// allocator).
#[test]
#[ignore]
fn r_fifty_abort_rebuild_cycles() {
    run_process("r_fifty_abort_rebuild_cycles", |r| {
        let port: u16 = env("NCCL_RS_FAULT_PORT2")?.parse()?;
        let mut samples = Vec::new();
        let started = Instant::now();
        for cycle in 1..=50 {
            let launch = Launch::explicit(r.rank, r.size, r.rank, r.size, "127.0.0.1", port)?;
            let world = World::init_with(launch, &options().device(r.device))?;
            checked_all_reduce(&world, 1 << 20)?;
            world.into_comm().abort()?;
            if [1, 10, 25, 50].contains(&cycle) {
                // GPU memory is counted for the whole device, and a peer
                // that has not aborted yet still holds this GPU's buffers it
                // imported: sample once every rank has aborted.
                host_barrier(r, port)?;
                let s = (cycle, open_fds(), threads(), gpu_used_mib(r.device)?);
                r.note(
                    &format!("cycle{cycle}"),
                    format!("fds={} threads={} gpu_used_mib={}", s.1, s.2, s.3),
                )?;
                samples.push(s);
            }
        }
        r.note("total_s", format!("{:.1}", started.elapsed().as_secs_f64()))?;
        let (at10, at50) = (samples[1], samples[3]);
        if at50.1 > at10.1 + 2 || at50.2 > at10.2 + 1 || at50.3 > at10.3 + 64 {
            return Err(
                format!("resources grew from cycle 10 {at10:?} to cycle 50 {at50:?}").into(),
            );
        }
        r.note("outcome", "flat")
    });
}
