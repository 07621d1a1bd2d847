//! A 2-D (dp × tp) mesh: a tensor-parallel all-reduce inside each row,
//! then a data-parallel all-reduce down each column.
//!
//! Launched by torchrun, `srun`, `mpirun` or `cargo xtask launch -n 4`, a
//! process per rank; started plainly, a thread per local GPU. With an even
//! number of ranks `tp` is 2, else 1. Placement follows NVLink islands, so
//! the two ranks of a `tp` pair share NVLink where the machine has it.
//!
//! ```text
//! cargo xtask launch -n 4 --example mesh_2d
//! ```
//!
//! Rank r starts from `r + 1`. After the `tp` sum each element is the sum
//! over its row; after the `dp` sum, the sum over the whole world,
//! `n (n + 1) / 2`, which every rank checks.

use std::process::ExitCode;
use std::time::Instant;

use nccl_dist::nccl_safe::ReduceOp;
use nccl_dist::{DeviceMesh, Launch, Placement, World};

fn run(world: World) -> nccl_dist::Result<()> {
    let n = world.size();
    let tp = if n.is_multiple_of(2) { 2 } else { 1 };
    let started = Instant::now();
    let mesh = DeviceMesh::new_with(
        &world,
        &[("dp", n / tp), ("tp", tp)],
        Placement::NvlinkIslands,
    )?;
    let built = started.elapsed();
    let (tp_comm, dp_comm) = (mesh.axis("tp")?, mesh.axis("dp")?);
    let stream = tp_comm.stream();
    let mut x = stream.clone_htod(&vec![(world.rank() + 1) as f32; 1 << 20])?;
    mesh.all_reduce_in_place("tp", &mut x, ReduceOp::Sum)?;
    tp_comm.synchronize(stream)?;
    let row = stream.clone_dtoh(&x)?[0];
    // The dp communicator has its own stream; cudarc orders the buffer's
    // use across the two.
    mesh.all_reduce_in_place("dp", &mut x, ReduceOp::Sum)?;
    dp_comm.synchronize(dp_comm.stream())?;
    let all = dp_comm.stream().clone_dtoh(&x)?;
    let want = (n * (n + 1) / 2) as f32;
    let wrong = all.iter().filter(|v| **v != want).count();
    println!(
        "rank {} on GPU {} at {:?} of {}: mesh in {:.1} ms, tp row sum {row}, world sum {} (want {want}), wrong elements: {wrong}",
        world.rank(),
        world.device(),
        mesh.coordinate(),
        mesh.shape(),
        built.as_secs_f64() * 1e3,
        all[0],
    );
    if wrong > 0 {
        return Err(nccl_dist::Error::InvalidArgument {
            op: "mesh_2d",
            reason: format!("{wrong} elements differ from {want}"),
        });
    }
    Ok(())
}

fn main() -> ExitCode {
    let gpus = match nccl_dist::nccl_safe::require_gpus() {
        Ok(n) => n,
        Err(why) => {
            eprintln!(
                "mesh_2d needs an NVIDIA GPU and its driver, and found none: {why}. \
                 Without a GPU, `cargo run -p nccl-sys --example nccl_info` still shows \
                 which libnccl loads; docs/troubleshooting.md says more."
            );
            return ExitCode::FAILURE;
        }
    };
    let outcome = match Launch::detect() {
        Ok(_) => World::init().and_then(run),
        Err(_) => World::spawn_local(gpus, run).map(drop),
    };
    match outcome {
        Ok(()) => {
            println!("proved: a 2-D (dp x tp) mesh, a sum along each axis, every element checked");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mesh_2d: {e}");
            ExitCode::FAILURE
        }
    }
}
