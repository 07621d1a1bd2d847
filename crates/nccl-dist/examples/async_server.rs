//! A small async server: many concurrent requests, each a tensor-parallel
//! all_reduce over every local GPU, awaited on a tokio runtime.
//!
//! One process drives every GPU (`Comm::init_all`). The communicators sit
//! behind one async lock: a request issues its group of all_reduces under
//! the lock (so every GPU sees the requests in the same order), lets go,
//! and awaits the `Completion` futures, which own the buffers until the
//! GPUs are done. No thread blocks on a stream; one waker thread serves
//! every request in flight.
//!
//! ```text
//! cargo run --release -p nccl-dist --example async_server
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use nccl_dist::nccl_safe::{self, Comm, Config, ReduceOp, group};
use tokio::sync::Mutex;

const REQUESTS: usize = 256;
const ELEMENTS: usize = 4096;

/// One request: GPU `g` contributes `request + g`; the sum is checked.
async fn serve(comms: Arc<Mutex<Vec<Comm>>>, request: usize) -> nccl_safe::Result<()> {
    let pending = {
        let comms = comms.lock().await;
        let mut bufs = comms
            .iter()
            .enumerate()
            .map(|(g, c)| {
                Ok(c.stream()
                    .clone_htod(&vec![(request + g) as f32; ELEMENTS])?)
            })
            .collect::<nccl_safe::Result<Vec<_>>>()?;
        group(|g| {
            for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
                g.on(comm).all_reduce_in_place(buf, ReduceOp::Sum)?;
            }
            Ok(())
        })?;
        comms
            .iter()
            .zip(bufs)
            .map(|(c, b)| (c.stream().clone(), c.completion(c.stream(), b)))
            .collect::<Vec<_>>()
    };
    let n = pending.len();
    let want = (n * request + n * (n - 1) / 2) as f32;
    for (stream, done) in pending {
        let buf = done.await?;
        let back = stream.clone_dtoh(&buf)?;
        if back.iter().any(|v| *v != want) {
            return Err(nccl_safe::Error::InvalidArgument {
                op: "async_server",
                reason: "a reduced element differs from the sum",
            });
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let gpus = match nccl_safe::require_gpus() {
        Ok(n) => n,
        Err(why) => {
            eprintln!(
                "async_server needs an NVIDIA GPU and its driver, and found none: {why}. \
                 Without a GPU, `cargo run -p nccl-sys --example nccl_info` still shows \
                 which libnccl loads; docs/troubleshooting.md says more."
            );
            return ExitCode::FAILURE;
        }
    };
    let outcome = (|| -> nccl_safe::Result<f64> {
        let devices: Vec<usize> = (0..gpus).collect();
        let comms = Arc::new(Mutex::new(Comm::init_all(&devices, &Config::new())?));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .build()
            .map_err(|_| nccl_safe::Error::InvalidArgument {
                op: "tokio runtime",
                reason: "tokio could not start its runtime",
            })?;
        let started = Instant::now();
        runtime.block_on(async {
            let tasks: Vec<_> = (0..REQUESTS)
                .map(|r| tokio::spawn(serve(Arc::clone(&comms), r)))
                .collect();
            for t in tasks {
                t.await.map_err(|_| nccl_safe::Error::InvalidArgument {
                    op: "async_server",
                    reason: "a request task panicked",
                })??;
            }
            Ok::<_, nccl_safe::Error>(())
        })?;
        Ok(started.elapsed().as_secs_f64())
    })();
    match outcome {
        Ok(secs) => {
            println!(
                "proved: {REQUESTS} concurrent requests, each an all_reduce over {gpus} GPU(s), \
                 awaited on tokio and checked ({:.0} requests/s)",
                REQUESTS as f64 / secs
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("async_server: {e}");
            ExitCode::FAILURE
        }
    }
}
