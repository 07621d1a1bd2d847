//! Recovery in place: the victim is SIGKILLed; the survivors name it,
//! make a world of their own with `World::recover` (served by the lowest
//! live rank: rank 1 when rank 0 died) and check a bit-exact all-reduce
//! on it; then the new rank 0 starts a replacement process, every
//! survivor admits it (`World::admit`) and the full world checks one
//! again. The replacement is this test binary again, told so by
//! [`REPLACEMENT`]; the survivor that started it waits for its exit.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nccl_dist::nccl_safe::ReduceOp;
use nccl_dist::{Launch, World};

use crate::{
    OP_TIMEOUT, Rank, TestResult, checked_all_reduce, cuda, die, env, expect_peer_lost,
    kernel_runs, options, run_process,
};

/// Set in the replacement's environment (its value: the GPU to use).
const REPLACEMENT: &str = "NCCL_RS_FAULT_REPLACEMENT";

/// The replacement's side: a rank of the grown world, from the launch
/// the survivors gave it, and the same checked all-reduce as theirs.
fn replacement(device: &str) {
    let outcome = (|| -> TestResult {
        let launch = Launch::detect()?;
        let world = World::init_with(launch, &options().device(device.parse()?))?;
        checked_all_reduce(&world, 1 << 20)?;
        println!(
            "[replacement] rank {} of {}: checked all-reduce ok",
            world.rank(),
            world.size()
        );
        Ok(())
    })();
    if let Err(e) = outcome {
        panic!("replacement: {e}");
    }
}

/// Starts the replacement: this binary with this test's arguments, the
/// newcomer's launch in torchrun's variables, and the victim's GPU (on
/// emulated hosts, which share it: this rank's, on a host of its own).
fn start_replacement(r: &Rank, launch: &Launch) -> TestResult<Child> {
    let emulated = std::env::var_os("NCCL_HOSTID").is_some();
    let device = if emulated { r.device } else { r.victim()? };
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(std::env::args().skip(1))
        .env(REPLACEMENT, device.to_string())
        .env("RANK", launch.rank.to_string())
        .env("WORLD_SIZE", launch.world_size.to_string())
        .env("LOCAL_RANK", launch.local_rank.to_string())
        .env("LOCAL_WORLD_SIZE", launch.local_world_size.to_string())
        .env("MASTER_ADDR", &launch.master_addr)
        .env("MASTER_PORT", launch.master_port.to_string())
        .env("NCCL_RS_PORT", launch.master_port.to_string());
    if emulated {
        cmd.env("NCCL_HOSTID", "nccl-rs-host-replacement");
    }
    Ok(cmd.spawn()?)
}

/// Waits for the replacement until `deadline`; kills it after that.
fn wait_replacement(mut child: Child, deadline: Instant) -> TestResult {
    loop {
        if let Some(status) = child.try_wait()? {
            return match status.success() {
                true => Ok(()),
                false => Err(format!("the replacement failed: {status}").into()),
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the replacement did not end in time".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn recover_and_rejoin(r: &mut Rank) -> TestResult {
    let world = r.world()?;
    checked_all_reduce(&world, 1 << 20)?;
    if r.is_victim() {
        die(
            r.out(),
            r.case,
            r.rank,
            "SIGKILL after a checked all-reduce",
        );
    }
    let comm = world.comm();
    let mut buf = comm.stream().alloc_zeros::<f32>(1 << 20).map_err(cuda)?;
    let since = Instant::now();
    let waited = comm
        .all_reduce_in_place(&mut buf, ReduceOp::Sum)
        .map_err(|e| world.explain(e))
        .and_then(|()| nccl_dist::synchronize(comm, comm.stream()));
    expect_peer_lost(r, waited, since)?;
    kernel_runs(r.device)?;
    r.note("kernel", "ok")?;
    let started = Instant::now();
    let was = r.rank;
    let world = world.recover(&options())?;
    checked_all_reduce(&world, 1 << 20)?;
    r.note("rebuilt_ms", started.elapsed().as_millis())?;
    r.note(
        "recovered",
        format!(
            "World::recover: {} ranks, rank {was} is now {}",
            world.size(),
            world.rank()
        ),
    )?;
    let started = Instant::now();
    let child = match world.rank() {
        0 => Some(start_replacement(
            r,
            &world.newcomer_launch(0, 1, &options())?,
        )?),
        _ => None,
    };
    let grown = world.admit(1, &options());
    // The replacement ends by itself once the grown world is made (or
    // cannot be): wait for it before judging.
    let replaced = child.map(|c| wait_replacement(c, Instant::now() + 2 * OP_TIMEOUT));
    let world = grown?;
    checked_all_reduce(&world, 1 << 20)?;
    if let Some(replaced) = replaced {
        replaced?;
    }
    // The buffer made before the loss still works on the grown world.
    let comm = world.comm();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        .map_err(|e| world.explain(e))?;
    nccl_dist::synchronize(comm, comm.stream())?;
    r.note(
        "rejoined",
        format!(
            "World::admit: {} ranks with a replacement, in {} ms",
            world.size(),
            started.elapsed().as_millis()
        ),
    )?;
    Ok(())
}

/// (n) The last rank is killed; the survivors recover, then admit a
/// replacement.
#[test]
#[ignore]
fn n_recover_and_rejoin() {
    if let Ok(device) = env(REPLACEMENT) {
        return replacement(&device);
    }
    run_process("n_recover_and_rejoin", recover_and_rejoin);
}

/// (n0) Rank 0, the rendezvous and liveness hub, is killed: rank 1
/// serves the recovery and the admission.
#[test]
#[ignore]
fn n0_recover_and_rejoin_after_rank0() {
    if let Ok(device) = env(REPLACEMENT) {
        return replacement(&device);
    }
    run_process("n0_recover_and_rejoin_after_rank0", recover_and_rejoin);
}
