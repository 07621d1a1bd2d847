//! An error that is handled: wrong arguments are refused with a typed error
//! before NCCL sees them, and the communicator keeps working.
//!
//! A thread per local GPU (or a process per rank under a launcher, as in
//! `dp_allreduce`). Every rank asks for a broadcast from a root that does
//! not exist and for an all_reduce into a buffer that is too short, matches
//! each refusal on its variant, then runs the correct all_reduce on the
//! same communicator and checks the sum.
//!
//! ```text
//! cargo run --release -p nccl-dist --example handled_error
//! ```

use std::process::ExitCode;

use nccl_dist::nccl_safe::{self, ReduceOp};
use nccl_dist::{Launch, World};

fn refused(world: &World, what: &str, outcome: nccl_safe::Result<()>) -> nccl_dist::Result<()> {
    match outcome {
        // The errors carry the values that were wrong: a program can
        // correct them, or report them as here.
        Err(e @ (nccl_safe::Error::RankOutOfRange { .. } | nccl_safe::Error::Length { .. })) => {
            println!("rank {}: {what} refused: {e}", world.rank());
            Ok(())
        }
        Err(other) => Err(other.into()),
        Ok(()) => Err(nccl_dist::Error::InvalidArgument {
            op: "handled_error",
            reason: format!("{what} was accepted"),
        }),
    }
}

fn rank(world: World) -> nccl_dist::Result<()> {
    let (n, comm) = (world.size(), world.comm());
    let send = comm
        .stream()
        .clone_htod(&[(world.rank() + 1) as f32; 1024])?;
    let mut recv = comm.stream().alloc_zeros::<f32>(1024)?;

    let mut short = comm.stream().alloc_zeros::<f32>(512)?;
    refused(
        &world,
        "a broadcast from root n",
        comm.broadcast_in_place(&mut recv, n),
    )?;
    refused(
        &world,
        "an all_reduce into a short buffer",
        comm.all_reduce(&send, &mut short, ReduceOp::Sum),
    )?;

    // Nothing reached NCCL, so the communicator is as it was.
    comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
    comm.synchronize(comm.stream())?;
    let back = comm.stream().clone_dtoh(&recv)?;
    let want = (n * (n + 1) / 2) as f32;
    let wrong = back.iter().filter(|v| **v != want).count();
    println!(
        "rank {}/{n}: the same communicator then summed to {} (want {want}), wrong elements: {wrong}",
        world.rank(),
        back[0]
    );
    if wrong > 0 {
        return Err(nccl_dist::Error::InvalidArgument {
            op: "handled_error",
            reason: format!("{wrong} elements differ from {want}"),
        });
    }
    Ok(())
}

fn main() -> ExitCode {
    let gpus = match nccl_safe::require_gpus() {
        Ok(n) => n,
        Err(why) => {
            eprintln!(
                "handled_error needs an NVIDIA GPU and its driver, and found none: {why}. \
                 Without a GPU, `cargo run -p nccl-sys --example nccl_info` still shows \
                 which libnccl loads; docs/troubleshooting.md says more."
            );
            return ExitCode::FAILURE;
        }
    };
    let outcome = match Launch::detect() {
        Ok(_) => World::init().and_then(rank),
        Err(_) => World::spawn_local(gpus, rank).map(drop),
    };
    match outcome {
        Ok(()) => {
            println!(
                "proved: a bad root and a short buffer are typed errors; the communicator still works"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("handled_error: {e}");
            ExitCode::FAILURE
        }
    }
}
