//! Cases where a rank is lost: killed (SIGKILL) mid-collective, during
//! mesh creation or during init, stopped (SIGSTOP), or, with a thread per
//! GPU, its thread panics. Every survivor must get `Error::PeerLost`
//! naming the victim within `LOSS_BOUND` of the death (a stopped rank is
//! not dead: an error within the operation timeout), a kernel must still
//! run on its GPU, and the survivors must be able to make a new world.

use std::time::{Duration, Instant};

use nccl_dist::nccl_safe::ReduceOp;
use nccl_dist::{DeviceMesh, Error, Launch, World};

use crate::hardware::nccl_loaded;
use crate::rejoin::{recover_checked, reuse};
use crate::{
    LOSS_BOUND, OP_TIMEOUT, Rank, TestResult, checked_all_reduce, cuda, die, enqueue_all_reduces,
    expect_error, expect_peer_lost, kernel_runs, options, recover, run_process, run_threads,
};

/// Elements of the large all-reduce (256 MiB of f32).
const BIG: usize = 64 << 20;

/// The victim enqueues 20 large all-reduces and SIGKILLs itself while
/// they run; the others enqueue 40 (a killed process's queued kernels may
/// still finish, so only the extra ones are sure to starve). Every
/// survivor's wait ends in `PeerLost` naming the victim within 2 s of the
/// death, a kernel still runs, and the survivors recover with
/// `World::recover`: a checked all-reduce on the new world, and one into
/// the buffer made before the loss.
fn sigkill_mid_all_reduce(r: &mut Rank) -> TestResult {
    let world = r.world()?;
    checked_all_reduce(&world, BIG)?;
    let comm = world.comm();
    let mut buf = comm.stream().alloc_zeros::<f32>(BIG)?;
    let since = Instant::now();
    let ops = if r.is_victim() { 20 } else { 40 };
    let issued = enqueue_all_reduces(comm, &mut buf, ops);
    if r.is_victim() {
        die(
            r.out(),
            r.case,
            r.rank,
            "SIGKILL after enqueueing 20 all-reduces",
        );
    }
    let waited = issued
        .map_err(|e| crate::explained(&world, e))
        .and_then(|()| nccl_dist::synchronize(comm, comm.stream()));
    expect_peer_lost(r, waited, since)?;
    kernel_runs(r.device)?;
    r.note("kernel", "ok")?;
    // The library's recovery: a world over the survivors, served by the
    // lowest live rank (rank 1 when rank 0 was the victim); the buffer
    // made before the loss all-reduces on it.
    let world = recover_checked(r, world)?;
    reuse(&world, &mut buf)?;
    drop(buf);
    Ok(())
}

/// (a) The last rank is SIGKILLed mid all-reduce.
#[test]
#[ignore]
fn a_sigkill_mid_all_reduce() {
    run_process("a_sigkill_mid_all_reduce", sigkill_mid_all_reduce);
}

/// (a0) Rank 0, the rendezvous and liveness hub, is SIGKILLed mid
/// all-reduce: the survivors lose the hub too, and must still name it.
#[test]
#[ignore]
fn a0_sigkill_rank0_mid_all_reduce() {
    run_process("a0_sigkill_rank0_mid_all_reduce", sigkill_mid_all_reduce);
}

/// (b) The victim stops itself (SIGSTOP) before the next all-reduce. It is
/// not dead (its connections stay open), so the survivors' error is the
/// watchdog's timeout, or `PeerLost` naming the victim if its silence is
/// noticed first; either within the operation timeout (+2 s). Then a
/// fresh world among them works; the harness kills the stopped victim.
#[test]
#[ignore]
fn b_sigstop_then_rebuild() {
    run_process("b_sigstop_then_rebuild", |r| {
        let world = r.world()?;
        checked_all_reduce(&world, 1 << 20)?;
        if r.is_victim() {
            // SAFETY: raise(3) with SIGSTOP stops this process; no memory
            // is involved. The harness kills it later.
            unsafe { libc::raise(libc::SIGSTOP) };
            return Err("the victim was resumed".into());
        }
        let comm = world.comm();
        let mut buf = comm.stream().alloc_zeros::<f32>(1 << 20).map_err(cuda)?;
        let since = Instant::now();
        let waited = comm
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .map_err(|e| crate::explained(&world, e))
            .and_then(|()| nccl_dist::synchronize(comm, comm.stream()));
        let e = expect_error(r, waited, since, OP_TIMEOUT + Duration::from_secs(2))?;
        let victim = r.victim()?;
        match &e {
            Error::Watchdog(_) => {}
            Error::PeerLost(p) if p.rank == victim => {}
            other => {
                return Err(format!(
                    "neither the watchdog's timeout nor the loss of rank {victim}: {other}"
                )
                .into());
            }
        }
        drop(buf);
        drop(world);
        recover(r)
    });
}

/// The axes of the mesh the mesh cases make: two axes where the world
/// allows (more splits, so the kill lands inside one), else one.
fn mesh_axes(n: usize) -> Vec<(&'static str, usize)> {
    if n >= 4 && n.is_multiple_of(2) {
        vec![("dp", n / 2), ("tp", 2)]
    } else {
        vec![("dp", n)]
    }
}

/// The victim dies right before `DeviceMesh::new` (`delay` None) or
/// `delay` into it (a thread of its own kills the process while the main
/// thread is in the splits). Every survivor's `DeviceMesh::new` must fail
/// with `PeerLost` naming the victim within 2 s of the death. With a
/// delay, a mesh that was finished before the kill landed is recorded and
/// its first collective must fail the same way instead; so must the
/// first collective of a mesh that needed no split (every axis in the
/// world's order shares the world's communicator: nothing collective
/// happens in `DeviceMesh::new`, as with one axis of every rank).
fn kill_around_mesh(r: &mut Rank, delay: Option<Duration>) -> TestResult {
    let world = r.world()?;
    checked_all_reduce(&world, 1 << 20)?;
    let axes = mesh_axes(r.size);
    if r.is_victim() {
        let (out, case, rank) = (r.out().to_path_buf(), r.case, r.rank);
        match delay {
            None => die(&out, case, rank, "SIGKILL right before DeviceMesh::new"),
            Some(d) => {
                std::thread::spawn(move || {
                    std::thread::sleep(d);
                    die(&out, case, rank, "SIGKILL during DeviceMesh::new")
                });
            }
        }
        let made = DeviceMesh::new(&world, &axes);
        // The killer ends this process whatever the splits do.
        r.note("victim_mesh", format!("{:?}", made.as_ref().map(|_| ())))?;
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let since = Instant::now();
    match DeviceMesh::new(&world, &axes) {
        Err(e) => {
            r.note("mesh", "refused")?;
            expect_peer_lost(r, Err(e), since)?;
        }
        Ok(mesh) if delay.is_some() || shares_the_world(&mesh, &world, &axes) => {
            let made = if shares_the_world(&mesh, &world, &axes) {
                "made without a split (the world's communicator)"
            } else {
                "made before the kill landed"
            };
            r.note("mesh", made)?;
            let axis = axes[0].0;
            let comm = mesh.axis(axis)?;
            let mut buf = comm.stream().alloc_zeros::<f32>(1 << 20).map_err(cuda)?;
            let waited = mesh
                .all_reduce_in_place(axis, &mut buf, ReduceOp::Sum)
                .and_then(|()| nccl_dist::synchronize(comm, comm.stream()));
            expect_peer_lost(r, waited, since)?;
        }
        Ok(_) => return Err("DeviceMesh::new succeeded though the victim never called it".into()),
    }
    drop(world);
    recover(r)
}

/// Whether every axis of `mesh` is the world's communicator (shared).
fn shares_the_world(mesh: &DeviceMesh, world: &World, axes: &[(&str, usize)]) -> bool {
    axes.iter().all(|(a, _)| {
        mesh.axis(a)
            .is_ok_and(|c| c.same_communicator(world.comm()))
    })
}

/// (f1) The last rank is SIGKILLed right before `DeviceMesh::new`.
#[test]
#[ignore]
fn f1_kill_before_mesh() {
    run_process("f1_kill_before_mesh", |r| kill_around_mesh(r, None));
}

/// (f2) Rank 0 is SIGKILLed 5 ms into `DeviceMesh::new` (a split takes
/// far longer: an all-gather over the parent, then a communicator init).
#[test]
#[ignore]
fn f2_kill_during_mesh() {
    run_process("f2_kill_during_mesh", |r| {
        kill_around_mesh(r, Some(Duration::from_millis(5)))
    });
}

/// (g) The victim dies during `World::init_with`, after the rendezvous:
/// a thread of its own watches for libnccl to be mapped (the victim, not
/// rank 0, loads it first when it starts making its communicators with
/// the id it received) and SIGKILLs the process then. Every survivor's
/// `World::init_with` must return `PeerLost` naming the victim within 2 s
/// of the death, instead of waiting in NCCL's init for a rank that is
/// gone.
#[test]
#[ignore]
fn g_kill_during_init() {
    run_process("g_kill_during_init", |r| {
        if r.is_victim() {
            if r.rank == 0 || nccl_loaded() {
                return Err("the victim must be a rank other than 0 that has not \
                            loaded libnccl before World::init_with"
                    .into());
            }
            let (out, case, rank) = (r.out().to_path_buf(), r.case, r.rank);
            std::thread::spawn(move || {
                let started = Instant::now();
                while !nccl_loaded() && started.elapsed() < Duration::from_secs(120) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                die(
                    &out,
                    case,
                    rank,
                    "SIGKILL when World::init_with loaded libnccl",
                )
            });
            let made = World::init_with(Launch::detect()?, &options());
            r.note("victim_init", format!("{:?}", made.as_ref().map(|_| ())))?;
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        let since = Instant::now();
        let made = World::init_with(Launch::detect()?, &options()).map(drop);
        expect_peer_lost(r, made, since)?;
        recover(r)
    });
}

/// (h) A thread per GPU: the victim's thread enqueues one all-reduce and
/// panics; the others enqueue ten and wait. Their waits must return
/// `PeerLost` naming it within 2 s of the panic, a kernel must still run,
/// and `spawn_local_with_options` must return `RankPanicked` naming it.
#[test]
#[ignore]
fn h_thread_panics_mid_collective() {
    run_threads("h_thread_panics_mid_collective", true, |r, world| {
        checked_all_reduce(&world, 1 << 20)?;
        let comm = world.comm();
        let mut buf = comm.stream().alloc_zeros::<f32>(1 << 20)?;
        let since = Instant::now();
        let ops = if r.is_victim() { 1 } else { 10 };
        let issued = enqueue_all_reduces(comm, &mut buf, ops);
        if r.is_victim() {
            r.record_death("panic after enqueueing an all-reduce");
            panic!(
                "rank {} panics on purpose with an all-reduce in flight",
                r.rank
            );
        }
        let waited = issued
            .map_err(|e| crate::explained(&world, e))
            .and_then(|()| nccl_dist::synchronize(comm, comm.stream()));
        expect_peer_lost(r, waited, since)?;
        drop(buf);
        // The survivors rebuild without the panicked thread, in memory.
        let world = recover_checked(r, world)?;
        drop(world);
        kernel_runs(r.device)?;
        r.note("kernel", "ok")
    });
}

/// `LOSS_BOUND` is what the cases above check against; keep it below the
/// operation timeout, or a watchdog timeout would pass for a loss.
const _: () = assert!(LOSS_BOUND.as_secs() < OP_TIMEOUT.as_secs());
