//! Cases where a rank is alive but silent at a call that makes a
//! connection inside NCCL (s1–s4): every other rank must end within the
//! operation timeout + 2 s with the connection gate's refusal naming the
//! silent rank (`CheckFailure::Silent`), before entering NCCL; the silent
//! rank, when it wakes and calls, gets a typed error too; the others then
//! `World::recover` without it (a process per GPU through the rendezvous,
//! a thread per GPU in memory) and all-reduce bit-exact.

use std::time::{Duration, Instant};

use nccl_dist::nccl_safe::{GroupGuard, ReduceOp};
use nccl_dist::{CheckFailure, DeviceMesh, Error, World};

use crate::rejoin::recover_checked;
use crate::{OP_TIMEOUT, Rank, TestResult, checked_all_reduce, cuda, run, run_lazy};

/// How long the silent rank sleeps before its call: past the others'
/// timeout and their report of it.
const SILENCE: Duration = Duration::from_secs(OP_TIMEOUT.as_secs() + 4);

/// The gate's refusal inside `e`, if it is one.
fn silent_ranks(e: &Error) -> Option<Vec<usize>> {
    match e {
        Error::Nccl(inner) => CheckFailure::of(inner)?
            .silent_ranks()
            .map(<[usize]>::to_vec),
        _ => None,
    }
}

/// One case: the victim sleeps, then runs `call`; every other rank runs
/// `call` at once and must get the gate's refusal naming the victim
/// within the timeout + 2 s. `bystander`: ranks that take no part in the
/// call (a point-to-point case) only wait to learn of the loss.
fn silent_case(
    r: &mut Rank,
    world: World,
    call: impl Fn(&World) -> Result<(), Error>,
    bystander: impl Fn(usize) -> bool,
) -> TestResult {
    let victim = r.victim()?;
    let limit = OP_TIMEOUT + Duration::from_secs(2);
    if r.is_victim() {
        std::thread::sleep(SILENCE);
        let since = Instant::now();
        let got =
            call(&world).and_then(|()| nccl_dist::synchronize(world.comm(), world.comm().stream()));
        let e = match got {
            Ok(()) => return Err("the silent rank's late call succeeded".into()),
            Err(e) => e,
        };
        r.note("victim_error", &e)?;
        r.note("outcome", format!("late call refused: {}", crate::kind(&e)))?;
        r.note("victim_error_after_ms", since.elapsed().as_millis())?;
        return Ok(());
    }
    let since = Instant::now();
    if bystander(r.rank) {
        while world.lost_ranks().is_empty() && since.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        let got = call(&world);
        let after = since.elapsed();
        r.note("error_after_ms", after.as_millis())?;
        r.note("deadline_ms", limit.as_millis())?;
        let e = match got {
            Ok(()) => return Err("the call with a silent peer went through".into()),
            Err(e) => e,
        };
        r.note("error", &e)?;
        let named = silent_ranks(&e).ok_or_else(|| format!("not the gate's refusal: {e}"))?;
        r.note(
            "outcome",
            format!("refused before launch, silent rank(s) {named:?} named"),
        )?;
        if !named.contains(&victim) {
            return Err(format!("the refusal names {named:?}, not rank {victim}").into());
        }
        if after > limit {
            return Err(format!("refused after {after:?}, beyond {limit:?}").into());
        }
    }
    // Every survivor, a process or a thread, recovers and all-reduces
    // bit-exact on the world without the silent rank.
    let world = recover_checked(r, world)?;
    checked_all_reduce(&world, 1 << 16)?;
    Ok(())
}

fn all_reduce(world: &World) -> Result<(), Error> {
    let comm = world.comm();
    let mut buf = comm.stream().alloc_zeros::<f32>(1 << 16).map_err(cuda)?;
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
    nccl_dist::synchronize(comm, comm.stream())
}

/// (s1) Silent before its first collective on a world that leaves its
/// connections to it ([`nccl_dist::WorldOptions::lazy_connect`]).
#[test]
#[ignore]
fn s1_silent_before_the_first_collective() {
    run_lazy("s1_silent_before_the_first_collective", |r, world| {
        silent_case(r, world, all_reduce, |_| false)
    });
}

/// (s2) Silent before its first call on a mesh axis with a communicator
/// of its own (the world is connected first; an axis in the world's order
/// shares the world's communicator, so the axis is the mesh's two axes
/// flattened into one: a split, connected at its first call).
#[test]
#[ignore]
fn s2_silent_before_the_first_call_on_an_axis() {
    run("s2_silent_before_the_first_call_on_an_axis", |r, world| {
        checked_all_reduce(&world, 1024)?;
        let n = world.size();
        let mut mesh = DeviceMesh::new(&world, &[("dp", 1), ("tp", n)])?;
        mesh.flatten(&["dp", "tp"], "all")?;
        let result = silent_case(
            r,
            world,
            |_| {
                let tp = mesh.axis("all")?;
                let mut buf = tp.stream().alloc_zeros::<f32>(1 << 16).map_err(cuda)?;
                tp.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
                nccl_dist::synchronize(tp, tp.stream())
            },
            |_| false,
        );
        drop(mesh);
        result
    });
}

/// (s3) Silent mid-job at its first send/recv: 100 all-reduces on the
/// world, then rank 0 sends to the last rank (the victim), which sleeps
/// before its receive. A first send/recv between two ranks connects them
/// inside NCCL (NCCL's point-to-point connections are made at the first
/// call with each peer, whatever `NCCL_RUNTIME_CONNECT` says).
#[test]
#[ignore]
fn s3_silent_at_the_first_send_recv() {
    run("s3_silent_at_the_first_send_recv", |r, world| {
        for _ in 0..100 {
            let comm = world.comm();
            let mut buf = comm.stream().alloc_zeros::<f32>(1024).map_err(cuda)?;
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        }
        nccl_dist::synchronize(world.comm(), world.comm().stream())?;
        let last = world.size() - 1;
        silent_case(
            r,
            world,
            |w| {
                let comm = w.comm();
                let mut buf = comm.stream().alloc_zeros::<f32>(1 << 16).map_err(cuda)?;
                if w.rank() == 0 {
                    comm.send(&buf, last)?;
                } else {
                    comm.recv(&mut buf, 0)?;
                }
                nccl_dist::synchronize(comm, comm.stream())
            },
            |rank| rank != 0 && rank != last,
        )
    });
}

/// (s4) Silent while the others are inside an open group: they open a
/// group on the world's fresh (lazy) communicator and all-reduce in it;
/// the victim sleeps before its group.
#[test]
#[ignore]
fn s4_silent_while_the_others_are_in_a_group() {
    run_lazy("s4_silent_while_the_others_are_in_a_group", |r, world| {
        silent_case(
            r,
            world,
            |w| {
                let comm = w.comm();
                let mut buf = comm.stream().alloc_zeros::<f32>(1 << 16).map_err(cuda)?;
                let group = GroupGuard::start()?;
                let issued = group.on(comm).all_reduce_in_place(&mut buf, ReduceOp::Sum);
                let ended = group.end();
                issued?;
                ended?;
                nccl_dist::synchronize(comm, comm.stream())
            },
            |_| false,
        )
    });
}
