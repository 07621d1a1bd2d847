//! Data-parallel gradient all-reduce over every GPU.
//!
//! Launched by torchrun, `srun`, `mpirun` or `cargo xtask launch -n 4`, it
//! runs one rank per process ([`World::init`]; the launcher's variables
//! plus `NCCL_RS_SECRET`). Started plainly, it runs one rank per local GPU
//! on a thread each ([`World::spawn_local`]).
//!
//! ```text
//! cargo run --release -p nccl-dist --example dp_allreduce
//! cargo xtask launch -n 4 --example dp_allreduce
//! NCCL_RS_SECRET=$(openssl rand -hex 32) torchrun --standalone --nproc-per-node 4 \
//!     --no-python target/release/examples/dp_allreduce
//! ```
//!
//! Every rank fills its gradients with `rank + 1`, averages them, and
//! checks that every element is the mean, `(n + 1) / 2`.

use std::process::ExitCode;
use std::time::Instant;

use nccl_dist::nccl_safe::ReduceOp;
use nccl_dist::{Communicator, DeviceMesh, Launch, World};

const ELEMENTS: usize = 64 << 20; // 256 MiB of f32 per rank
const STEPS: usize = 5;

fn step(world: World) -> nccl_dist::Result<()> {
    let n = world.size();
    let mesh = DeviceMesh::new(&world, &[("dp", n)])?;
    let comm = mesh.axis("dp")?;
    let stream = comm.stream();
    let fill = vec![(world.rank() + 1) as f32; ELEMENTS];
    let mut grads = stream.clone_htod(&fill)?;
    let mut took = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        // Every rank starts the clock together.
        Communicator::barrier(comm)?;
        let started = Instant::now();
        comm.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
        comm.synchronize(stream)?;
        took.push(started.elapsed());
        // Back to this rank's own gradients for the next step.
        stream.memcpy_htod(&fill, &mut grads)?;
    }
    comm.all_reduce_in_place(&mut grads, ReduceOp::Avg)?;
    comm.synchronize(stream)?;
    let back = stream.clone_dtoh(&grads)?;
    let want = (n + 1) as f32 / 2.0;
    let wrong = back.iter().filter(|v| **v != want).count();
    let best = took.iter().min().copied().unwrap_or_default();
    let bytes = (ELEMENTS * 4) as f64;
    let busbw = bytes * 2.0 * (n as f64 - 1.0) / n as f64 / best.as_secs_f64() / 1e9;
    println!(
        "rank {}/{n} on GPU {}: all_reduce of {} MiB avg in {:.2} ms (best of {STEPS}, busbw {busbw:.1} GB/s), mean {want}, wrong elements: {wrong}",
        world.rank(),
        world.device(),
        (ELEMENTS * 4) >> 20,
        best.as_secs_f64() * 1e3,
    );
    if wrong > 0 {
        return Err(nccl_dist::Error::InvalidArgument {
            op: "dp_allreduce",
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
                "dp_allreduce needs an NVIDIA GPU and its driver, and found none: {why}. \
                 Without a GPU, `cargo run -p nccl-sys --example nccl_info` still shows \
                 which libnccl loads; docs/troubleshooting.md says more."
            );
            return ExitCode::FAILURE;
        }
    };
    let outcome = match Launch::detect() {
        Ok(_) => World::init().and_then(step),
        Err(_) => {
            println!("no launcher: a thread per GPU on {gpus} local GPU(s)");
            World::spawn_local(gpus, step).map(drop)
        }
    };
    match outcome {
        Ok(()) => {
            println!(
                "proved: a data-parallel step (all_reduce avg of the gradients) on every rank, every element checked"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dp_allreduce: {e}");
            ExitCode::FAILURE
        }
    }
}
