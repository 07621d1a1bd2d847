//! Recovery in place (and, for a mesh, the policy of dropping the replica
//! that lost a rank): the victim is SIGKILLed; the survivors name it,
//! make a world of their own with `World::recover` (served by the lowest
//! live rank: rank 1 when rank 0 died) and check a bit-exact all-reduce
//! on it; then the new rank 0 starts a replacement process, every
//! survivor admits it (`World::admit`) and the full world checks one
//! again. The replacement is this test binary again, told so by
//! [`REPLACEMENT`]; the survivor that started it waits for its exit.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nccl_dist::nccl_safe::ReduceOp;
use nccl_dist::nccl_safe::cudarc::driver::CudaSlice;
use nccl_dist::{DeviceMesh, Error, HostCollectives, Launch, World};

use crate::{
    Mode, OP_TIMEOUT, Rank, TestResult, checked_all_reduce, cuda, die, env, expect_peer_lost,
    kernel_runs, options, run_process,
};

/// The options of every world here, with a rendezvous deadline short
/// enough that a recovery which cannot finish fails within the case.
pub(crate) fn recovery() -> nccl_dist::WorldOptions {
    options().timeout(Duration::from_secs(30))
}

/// Set in the replacement's environment (its value: the GPU to use).
const REPLACEMENT: &str = "NCCL_RS_FAULT_REPLACEMENT";

/// The replacement's side: a rank of the grown world, from the launch
/// the survivors gave it, and the same checked all-reduce as theirs.
fn replacement(device: &str) {
    nccl_testkit::trace_if_asked();
    let outcome = (|| -> TestResult {
        let launch = Launch::detect()?;
        println!(
            "[replacement] joining as rank {} of {} at {}:{} ({:?})",
            launch.rank, launch.world_size, launch.master_addr, launch.master_port, launch.launcher
        );
        let world = World::init_with(launch, &recovery().device(device.parse()?))?;
        println!("[replacement] in the world");
        checked_all_reduce(&world, 1 << 20)?;
        // The survivors' all-reduce into their old buffer.
        let mut buf = world
            .comm()
            .stream()
            .alloc_zeros::<f32>(1 << 20)
            .map_err(cuda)?;
        reuse(&world, &mut buf)?;
        println!(
            "[replacement] rank {} of {}: checked all-reduce ok",
            world.rank(),
            world.size()
        );
        let dropping = Instant::now();
        drop(buf);
        drop(world);
        println!("[replacement] world dropped in {:?}", dropping.elapsed());
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

/// The victim SIGKILLs itself (`how`); every survivor's all-reduce on
/// `world` must end in `PeerLost` naming it within the bound, and a
/// kernel must still run on its GPU. Gives the survivor's buffer of that
/// all-reduce, which recovery must leave usable.
pub(crate) fn lose_the_victim(
    r: &mut Rank,
    world: &World,
    how: &str,
) -> TestResult<CudaSlice<f32>> {
    if r.is_victim() {
        die(r.out(), r.case, r.rank, how);
    }
    let comm = world.comm();
    let mut buf = comm.stream().alloc_zeros::<f32>(1 << 20).map_err(cuda)?;
    let since = Instant::now();
    let waited = comm
        .all_reduce_in_place(&mut buf, ReduceOp::Sum)
        .map_err(|e| crate::explained(world, e))
        .and_then(|()| nccl_dist::synchronize(comm, comm.stream()));
    expect_peer_lost(r, waited, since)?;
    kernel_runs(r.device)?;
    r.note("kernel", "ok")?;
    Ok(buf)
}

/// The survivors' `World::recover` (served by the lowest live rank), a
/// checked all-reduce on the new world, and what it took.
///
/// Then the old communicators a recovery by shrink kept are released
/// ([`release`]).
pub(crate) fn recover_checked(r: &mut Rank, world: World) -> TestResult<World> {
    let started = Instant::now();
    let was = r.rank;
    let mut world = world.recover(&recovery())?;
    checked_all_reduce(&world, 1 << 20)?;
    r.note("rebuilt_ms", started.elapsed().as_millis())?;
    release(r, &mut world)?;
    r.note(
        "recovered",
        format!(
            "World::recover: {} ranks, rank {was} is now {}",
            world.size(),
            world.rank()
        ),
    )?;
    Ok(world)
}

/// `World::release_retired` on a world `World::recover` made (every
/// survivor calls it here, as a thread per GPU requires): the handles it
/// let go of, the GPU memory in use that went (with a thread per GPU,
/// the other survivors' teardowns are on other GPUs) and the time it
/// took are noted; with a thread per GPU it may instead be refused where
/// the old world of a silent rank still lives in the process. Either way
/// the world must still all-reduce right after it.
fn release(r: &mut Rank, world: &mut World) -> TestResult {
    let ctx = world.comm().stream().context().clone();
    let free = || ctx.mem_get_info().map(|(free, _)| free);
    let (before, started) = (free()?, Instant::now());
    // A thread per GPU: the lost rank's thread may still be dropping its
    // old world (h), or a silent one still holds it (s1–s4); the release
    // is refused while it lives. Asked again for a while, as a program
    // would; every survivor does the same, and the release waits for all.
    let refused_since = Instant::now();
    let released = loop {
        match world.release_retired() {
            Err(Error::InvalidArgument { reason, .. })
                if r.mode == Mode::Threads
                    && reason.contains("something else")
                    && refused_since.elapsed() < OTHER_WORLD_GONE =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            other => break other,
        }
    };
    let took = started.elapsed();
    let freed = free()?.saturating_sub(before);
    let note = match (r.mode, released) {
        (_, Ok(count)) => format!(
            "{count} old handles in {} ms, {} MiB freed",
            took.as_millis(),
            freed >> 20
        ),
        (Mode::Threads, Err(Error::InvalidArgument { reason, .. }))
            if reason.contains("something else") =>
        {
            format!(
                "refused for {} ms: another World lives in the process",
                took.as_millis()
            )
        }
        (mode, other) => {
            return Err(format!("World::release_retired with {mode:?}: {other:?}").into());
        }
    };
    checked_all_reduce(world, 1 << 20)?;
    r.note("released", note)
}

/// How long a survivor with a thread per GPU asks again while another
/// `World` lives in the process: shorter than the release's own wait for
/// the other survivors (the operation timeout), and over before the
/// silent rank of s1–s4 wakes (14 s into the case; the survivors ask
/// from about 9.1 s). Once one survivor is let in, the others are at
/// their next ask: the count of worlds only goes down.
const OTHER_WORLD_GONE: Duration = Duration::from_secs(3);

/// An all-reduce into `buf`, made before the loss, on `world`, made
/// after it: the buffer is still good.
pub(crate) fn reuse(world: &World, buf: &mut CudaSlice<f32>) -> TestResult {
    let comm = world.comm();
    comm.all_reduce_in_place(buf, ReduceOp::Sum)
        .map_err(|e| crate::explained(world, e))?;
    nccl_dist::synchronize(comm, comm.stream())?;
    Ok(())
}

fn recover_and_rejoin(r: &mut Rank) -> TestResult {
    let world = r.world()?;
    checked_all_reduce(&world, 1 << 20)?;
    let mut buf = lose_the_victim(r, &world, "SIGKILL after a checked all-reduce")?;
    let world = recover_checked(r, world)?;
    let started = Instant::now();
    let child = match world.rank() {
        0 => Some(start_replacement(
            r,
            &world.newcomer_launch(0, 1, &recovery())?,
        )?),
        _ => None,
    };
    let grown = world.admit(1, &recovery());
    // The replacement runs the same checked all-reduce as the survivors,
    // then ends: wait for it once they have run theirs (or, when the
    // grown world could not be made, at once).
    let wait =
        |child: Option<Child>| child.map(|c| wait_replacement(c, Instant::now() + 2 * OP_TIMEOUT));
    let world = match grown {
        Ok(world) => world,
        Err(e) => {
            let theirs = match wait(child) {
                Some(Err(r)) => format!("; the replacement: {r}"),
                Some(Ok(())) => "; the replacement passed".to_string(),
                None => String::new(),
            };
            return Err(format!("admitting the replacement failed: {e}{theirs}").into());
        }
    };
    checked_all_reduce(&world, 1 << 20)?;
    // The buffer made before the loss still works on the grown world.
    reuse(&world, &mut buf)?;
    if let Some(replaced) = wait(child) {
        replaced?;
    }
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

/// Every rank of a 2x2 (dp, tp) mesh all-reduces `rank + 1` along tp
/// (host values, bit-exact against the group's members).
fn mesh_2x2_tp_exact(world: &World) -> TestResult<DeviceMesh> {
    let mesh = DeviceMesh::new(world, &[("dp", 2), ("tp", 2)])?;
    tp_exact(world, &mesh)?;
    Ok(mesh)
}

/// `rank + 1` all-reduced along `mesh`'s tp axis, checked bit-exact.
fn tp_exact(world: &World, mesh: &DeviceMesh) -> TestResult {
    let mut values = [(world.rank() + 1) as f32; 1024];
    mesh.axis("tp")?
        .all_reduce_host(&mut values, ReduceOp::Sum)?;
    let members = mesh.shape().group_members(mesh.position(), &["tp"])?;
    let expected: f32 = members.iter().map(|&p| (p + 1) as f32).sum();
    if values.iter().any(|&v| v != expected) {
        return Err(format!("tp all-reduce gave {} instead of {expected}", values[0]).into());
    }
    Ok(())
}

/// Where the kept world's rank 0 says it is about to admit newcomers.
fn admit_file(r: &Rank) -> std::path::PathBuf {
    r.out().join(format!("{}.admit", r.case))
}

/// Waits for `path` to exist, until `deadline`.
fn wait_for(path: &std::path::Path, deadline: Instant) -> TestResult {
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(format!("{} did not appear in time", path.display()).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The launch a dropped replica's survivor (a spare) rejoins with, as
/// newcomer 0 of 2 after the kept world of 2: that world's rank 0 is the
/// old rank 0, at the job's rendezvous address and port.
fn spare_launch() -> TestResult<Launch> {
    let detected = Launch::detect()?;
    let port = match std::env::var("NCCL_RS_PORT") {
        Ok(p) => p.parse()?,
        Err(_) => detected.master_port,
    };
    Ok(Launch::explicit(2, 4, 0, 1, detected.master_addr, port)?)
}

/// (m) A 2x2 (dp, tp) mesh loses its last rank. The survivors name it;
/// the policy drops the data-parallel replica that lost it
/// (`DeviceMesh::without_replicas`); the ranks of the other replica make
/// a world and a (dp=1, tp=2) mesh of their own (`World::recover_keeping`)
/// and all-reduce along tp bit-exact, while the survivor of the dropped
/// replica is told it has no place (`None`). Then the kept world admits
/// two newcomers (`World::admit`): that spare and a replacement for the
/// dead rank, started by the kept world's rank 0; the 2x2 mesh is made
/// again and all-reduces along tp bit-exact on all four. Needs 4 ranks.
#[test]
#[ignore]
fn m_mesh_drops_the_replica_that_lost_a_rank() {
    if let Ok(device) = env(REPLACEMENT) {
        return mesh_replacement(&device);
    }
    run_process("m_mesh_drops_the_replica_that_lost_a_rank", |r| {
        let world = r.world()?;
        if world.size() != 4 {
            return Err(format!("the mesh case needs 4 ranks, not {}", world.size()).into());
        }
        let mesh = mesh_2x2_tp_exact(&world)?;
        checked_all_reduce(&world, 1 << 20)?;
        drop(lose_the_victim(r, &world, "SIGKILL inside a 2x2 mesh")?);
        let (shape, keep) = mesh.without_replicas("dp", &world.lost_ranks())?;
        drop(mesh);
        r.note("policy", format!("{shape}, keeping ranks {keep:?}"))?;
        let started = Instant::now();
        let was = r.rank;
        let Some(world) = world.recover_keeping(&keep, &recovery())? else {
            // A spare: it rejoins once the kept world admits newcomers
            // (told so by its rank 0, as an orchestrator would: before
            // that, the same port serves the kept world's own rendezvous,
            // which would refuse a rank of a world of 4 for good).
            wait_for(&admit_file(r), Instant::now() + 3 * OP_TIMEOUT)?;
            let world = World::init_with(spare_launch()?, &recovery().device(r.device))?;
            mesh_2x2_tp_exact(&world)?;
            return r.note(
                "recovered",
                format!(
                    "rank {was}: its replica was dropped (spare); rejoined as rank {} of {}",
                    world.rank(),
                    world.size()
                ),
            );
        };
        let mesh = DeviceMesh::new(&world, &shape.axes())?;
        tp_exact(&world, &mesh)?;
        r.note("rebuilt_ms", started.elapsed().as_millis())?;
        r.note(
            "recovered",
            format!(
                "rank {was} is rank {} of a {} mesh; tp all-reduce exact",
                world.rank(),
                mesh.shape()
            ),
        )?;
        drop(mesh);
        let child = match world.rank() {
            0 => Some(start_replacement(
                r,
                &world.newcomer_launch(1, 2, &recovery())?,
            )?),
            _ => None,
        };
        if world.rank() == 0 {
            std::fs::write(admit_file(r), b"")?;
        }
        let world = world.admit(2, &recovery())?;
        mesh_2x2_tp_exact(&world)?;
        if let Some(c) = child {
            wait_replacement(c, Instant::now() + 2 * OP_TIMEOUT)?;
        }
        r.note(
            "rejoined",
            format!(
                "a (dp=2, tp=2) mesh again with the spare and a replacement: tp all-reduce exact on {} ranks",
                world.size()
            ),
        )
    });
}

/// The mesh case's replacement: newcomer 1 of the kept world's two, then
/// the same 2x2 mesh and tp all-reduce as the others.
fn mesh_replacement(device: &str) {
    let outcome = (|| -> TestResult {
        let world = World::init_with(Launch::detect()?, &recovery().device(device.parse()?))?;
        mesh_2x2_tp_exact(&world)?;
        println!(
            "[replacement] rank {} of the 2x2 mesh: tp all-reduce exact",
            world.rank()
        );
        Ok(())
    })();
    if let Err(e) = outcome {
        panic!("replacement: {e}");
    }
}
