//! The second example: an all_reduce on every local GPU from one thread.
//!
//! `Comm::init_all` makes one communicator per GPU; one thread drives them
//! all, so the collectives go in one group. GPU `i` starts from `i + 1`;
//! after the sum every element on every GPU is `n (n + 1) / 2`, which the
//! example checks.
//!
//! ```text
//! cargo run --release -p nccl-safe --example all_reduce
//! ```

use std::process::ExitCode;

use nccl_safe::{Comm, Config, Error, ReduceOp, group};

const ELEMENTS: usize = 1 << 20;

fn all_reduce(n: usize) -> nccl_safe::Result<()> {
    let devices: Vec<usize> = (0..n).collect();
    let comms = Comm::init_all(&devices, &Config::new())?;
    let mut bufs = comms
        .iter()
        .map(|c| {
            let start = (c.rank() + 1) as f32;
            Ok(c.stream().clone_htod(&vec![start; ELEMENTS])?)
        })
        .collect::<nccl_safe::Result<Vec<_>>>()?;
    // One thread drives every GPU: NCCL needs the calls in one group.
    group(|g| {
        for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
            g.on(comm).all_reduce_in_place(buf, ReduceOp::Sum)?;
        }
        Ok(())
    })?;
    let want = (n * (n + 1) / 2) as f32;
    for (comm, buf) in comms.iter().zip(&bufs) {
        comm.synchronize(comm.stream())?;
        let back = comm.stream().clone_dtoh(buf)?;
        let wrong = back.iter().filter(|v| **v != want).count();
        println!(
            "GPU {}: rank {}/{n}, sum {} (want {want}), wrong elements: {wrong}",
            comm.device(),
            comm.rank(),
            back[0],
        );
        if wrong > 0 {
            return Err(Error::InvalidArgument {
                op: "all_reduce example",
                reason: "a GPU holds a wrong sum",
            });
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let n = match nccl_safe::require_gpus() {
        Ok(n) => n,
        Err(why) => {
            eprintln!(
                "all_reduce needs an NVIDIA GPU and its driver, and found none: {why}. \
                 Without a GPU, `cargo run -p nccl-sys --example nccl_info` still shows \
                 which libnccl loads; docs/troubleshooting.md says more."
            );
            return ExitCode::FAILURE;
        }
    };
    match all_reduce(n) {
        Ok(()) => {
            println!("proved: all_reduce (sum) of {ELEMENTS} f32 on {n} GPU(s) from one thread");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("all_reduce: {e}");
            ExitCode::FAILURE
        }
    }
}
