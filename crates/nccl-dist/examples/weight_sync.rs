//! Weight sync for reinforcement learning: rank 0 broadcasts a model's
//! bf16 parameters (21 tensors, 446 MB) to inference ranks, then every
//! rank all_reduces per-tensor checksums (max and min) to prove the copies
//! are bit-exact. Rank 0 is PyTorch (`python/examples/weight_sync.py`,
//! through CuPy's NCCL binding) or this program; the id comes over our
//! authenticated rendezvous (`NCCL_RS_SECRET` on every rank).
//!
//! ```text
//! python python/examples/weight_sync.py --world 2 --port 29555    # rank 0, PyTorch
//! weight_sync join 127.0.0.1:29555 1 2                             # a Rust rank
//! weight_sync serve 2 29555                                        # or rank 0 in Rust
//! ```
//!
//! With `--all-reduce` the ranks instead sum a float32 buffer of `rank + 1`
//! (the Rust ranks of `python/examples/cupy_allreduce.py`).
//!
//! Python and Rust must load the same libnccl (`NCCL_LIBRARY` at the
//! wheel in the Python environment); `docs/python.md` has the details.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use half::bf16;
use nccl_dist::nccl_safe::{ReduceOp, UniqueId};
use nccl_dist::{Secret, World, WorldOptions, rendezvous};

/// The model: an embedding, then per layer a norm, qkv, o, up and down
/// (`weight_sync.py` has the same list).
fn layout() -> Vec<usize> {
    let (vocab, hidden, ffn, layers) = (32000, 2048, 5504, 4);
    let mut sizes = vec![vocab * hidden];
    for _ in 0..layers {
        sizes.extend([hidden, hidden * 3 * hidden, hidden * hidden]);
        sizes.extend([hidden * ffn, ffn * hidden]);
    }
    sizes
}
const ROUNDS: usize = 5;

/// Position-weighted sum of the bf16 bit patterns, wrapping (the Python
/// side computes the same in int64).
fn checksum(values: &[bf16]) -> u64 {
    values.iter().enumerate().fold(0u64, |acc, (i, v)| {
        acc.wrapping_add((i as u64 + 1) * u64::from(v.to_bits()))
    })
}

fn sync(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let num = |i: usize| -> Result<usize, String> {
        let text = args
            .get(i)
            .ok_or("usage: weight_sync serve WORLD PORT | join ADDR RANK WORLD")?;
        text.parse()
            .map_err(|_| format!("{text:?} is not a number"))
    };
    let secret = Secret::from_env()?;
    let wait = Duration::from_secs(300);
    let (id, rank, size) = match args.first().map(String::as_str) {
        Some("serve") => {
            let (size, port) = (num(1)?, num(2)? as u16);
            let id = UniqueId::new()?;
            let listener = std::net::TcpListener::bind(("0.0.0.0", port))?;
            rendezvous::serve(&listener, size, &secret, &id.raw(), wait)?;
            (id, 0, size)
        }
        Some("join") => {
            let (rank, size) = (num(2)?, num(3)?);
            (
                UniqueId::from(rendezvous::join(
                    args[1].as_str(),
                    rank,
                    size,
                    &secret,
                    wait,
                )?),
                rank,
                size,
            )
        }
        _ => return Err("usage: weight_sync serve WORLD PORT | join ADDR RANK WORLD".into()),
    };
    // One ncclCommInitRank, as the Python rank makes (nonblocking, so
    // its creation is bounded by the operation timeout).
    let world = World::from_unique_id(&id, rank, size, &WorldOptions::new())?;
    if args.iter().any(|a| a == "--all-reduce") {
        return all_reduce(&world);
    }
    broadcast(&world)
}

/// Every rank adds `rank + 1`; every element must be `n (n + 1) / 2`.
fn all_reduce(world: &World) -> Result<(), Box<dyn std::error::Error>> {
    let (comm, stream, n) = (world.comm(), world.comm().stream(), world.size());
    let mut buf = stream.clone_htod(&vec![(world.rank() + 1) as f32; 1 << 24])?;
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
    let want = (n * (n + 1) / 2) as f32;
    let wrong = stream
        .clone_dtoh(&buf)?
        .iter()
        .filter(|v| **v != want)
        .count();
    println!(
        "rank {}/{n}: all_reduce sum, wrong elements: {wrong}",
        world.rank()
    );
    if wrong > 0 {
        return Err(format!("{wrong} elements differ from {want}").into());
    }
    println!("proved: Rust and Python ranks summed in one all_reduce");
    Ok(())
}

/// Rank 0's tensors to every rank, timed, then the checksums compared.
fn broadcast(world: &World) -> Result<(), Box<dyn std::error::Error>> {
    let (rank, size) = (world.rank(), world.size());
    let (comm, stream) = (world.comm(), world.comm().stream());
    let mut params = Vec::new();
    for (t, n) in layout().into_iter().enumerate() {
        params.push(if rank == 0 {
            let fill: Vec<bf16> = (0..n)
                .map(|i| bf16::from_bits((i * 2_654_435_761 + t * 40_503) as u16))
                .collect();
            stream.clone_htod(&fill)?
        } else {
            stream.alloc_zeros::<bf16>(n)?
        });
    }
    let bytes: usize = params.iter().map(|p| p.len() * 2).sum();
    let mut tick = stream.clone_htod(&[1u64])?;
    let mut best = Duration::MAX;
    for _ in 0..ROUNDS {
        comm.all_reduce_in_place(&mut tick, ReduceOp::Sum)?; // start together
        comm.synchronize(stream)?;
        let started = Instant::now();
        for p in &mut params {
            comm.broadcast_in_place(p, 0)?;
        }
        comm.synchronize(stream)?;
        best = best.min(started.elapsed());
    }
    let mut sums = Vec::new();
    for p in &params {
        sums.push(checksum(&stream.clone_dtoh(p)?));
    }
    let (mut hi, mut lo) = (stream.clone_htod(&sums)?, stream.clone_htod(&sums)?);
    comm.all_reduce_in_place(&mut hi, ReduceOp::Max)?;
    comm.all_reduce_in_place(&mut lo, ReduceOp::Min)?;
    let (hi, lo) = (stream.clone_dtoh(&hi)?, stream.clone_dtoh(&lo)?);
    let gbps = bytes as f64 / best.as_secs_f64() / 1e9;
    println!(
        "rank {rank}/{size} on GPU {}: broadcast of {} tensors ({} MB) in {:.2} ms (best of {ROUNDS}): {gbps:.1} GB/s",
        world.device(),
        sums.len(),
        bytes / 1_000_000,
        best.as_secs_f64() * 1e3
    );
    if hi != lo || hi != sums {
        return Err(format!("checksums differ between ranks: max {hi:x?}, min {lo:x?}").into());
    }
    println!(
        "proved: every rank holds bit-exact copies of rank 0's {} tensors",
        sums.len()
    );
    Ok(())
}

fn main() -> ExitCode {
    if let Err(why) = nccl_dist::nccl_safe::require_gpus() {
        eprintln!(
            "weight_sync needs an NVIDIA GPU and its driver, and found none: {why}. \
             Without a GPU, `cargo xtask py` still tests the rendezvous with Python; \
             docs/troubleshooting.md says more."
        );
        return ExitCode::FAILURE;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match sync(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weight_sync: {e}");
            ExitCode::FAILURE
        }
    }
}
