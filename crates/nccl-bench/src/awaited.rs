//! `--async`: what awaiting a collective costs. One thread drives every
//! GPU (`Comm::init_all`, an 8 B all_reduce in a group). Measured, as
//! medians over `-n` calls after `-w` warm-up calls, the five ways taking
//! turns within each call so that drift hits them alike:
//!
//! - `sync`: the all_reduce, then a blocking `cuStreamSynchronize` of
//!   every stream;
//! - `await`: the all_reduce, then a `Completion` per stream, `.await`ed
//!   in a tokio current-thread runtime's `block_on` (the runtime parks
//!   the thread until the waker thread wakes the task): the issue's case;
//! - `await_spin`: `await` with `Completion::spin_for(50 µs)` (opt-in:
//!   the task wakes itself while the window lasts, so the runtime polls
//!   again instead of parking);
//! - `wait`: the same, with `Completion::wait` (looks at the work for
//!   50 µs, as a stream sync does, then parks);
//! - `poll`: the same, with the futures polled back to back by this
//!   thread (no waker thread, no park): what tracking itself costs;
//! - `await_cold`: `await` after 2 ms of quiet, when the waker thread has
//!   gone to sleep (over `-n / 10` calls);
//! - the waker thread's CPU time over the `await` calls (from
//!   `/proc/self/task/*/stat`, found by its name), as a share of the wall
//!   time;
//! - throughput with 64 requests in flight: 64 all_reduces submitted, then
//!   their 64 completions awaited in the runtime, repeated.
//!
//! The flat `summary` keys: `await_minus_sync_small_us` (target <= 5),
//! `await_small_us`, `sync_small_us`, `await_spin_minus_sync_small_us`,
//! `wait_minus_sync_small_us`,
//! `poll_minus_sync_small_us`, `await_cold_small_us`, `waker_cpu_share`,
//! `requests_per_s_64_in_flight`.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use nccl_dist::nccl_safe::cudarc::driver::CudaSlice;
use nccl_dist::nccl_safe::{Comm, Completion, Config, ReduceOp, group};
use serde_json::json;

use crate::cli::Opts;
use crate::error::{BoxError, Result};

const IN_FLIGHT: usize = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// User + system CPU seconds of the waker thread so far (0 before it exists).
fn waker_cpu_s() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "nccl-completion" {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the `(name)`: state is field 3; utime 14, stime 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
        return (ticks(11) + ticks(12)) / CLK_TCK;
    }
    0.0
}

/// `sysconf(_SC_CLK_TCK)`: 100 on the Linux ABIs this runs on (x86-64,
/// aarch64); resolution 10 ms, so the share is meaningful over seconds.
const CLK_TCK: f64 = 100.0;

fn issue(comms: &[Comm], bufs: &mut [CudaSlice<f32>]) -> Result<()> {
    group(|g| {
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            g.on(c).all_reduce_in_place(b, ReduceOp::Sum)?;
        }
        Ok(())
    })?;
    Ok(())
}

/// How one call's completions are waited for.
#[derive(Clone, Copy)]
enum Way {
    Sync,
    Await,
    /// `.await` with `Completion::spin_for(SPIN_WINDOW)`.
    AwaitSpin,
    Wait,
    Poll,
}

/// The window of the `await_spin` way.
const SPIN_WINDOW: Duration = Duration::from_micros(50);

/// One call: the all_reduce on every GPU, then its end waited for `way`;
/// the wall time in µs.
fn one_call(
    comms: &[Comm],
    bufs: &mut [CudaSlice<f32>],
    rt: &tokio::runtime::Runtime,
    way: Way,
) -> Result<f64> {
    let t = Instant::now();
    issue(comms, bufs)?;
    match way {
        Way::Sync => {
            for c in comms {
                c.stream().synchronize()?;
            }
        }
        Way::Await | Way::AwaitSpin => {
            let mut pending = completions(comms);
            if matches!(way, Way::AwaitSpin) {
                pending = pending
                    .into_iter()
                    .map(|p| p.spin_for(SPIN_WINDOW))
                    .collect();
            }
            rt.block_on(async {
                for p in pending {
                    p.await?;
                }
                Ok::<_, BoxError>(())
            })?;
        }
        Way::Wait => {
            for p in completions(comms) {
                p.wait()?;
            }
        }
        Way::Poll => {
            let mut cx = Context::from_waker(Waker::noop());
            for p in completions(comms) {
                let mut p = pin!(p);
                loop {
                    match p.as_mut().poll(&mut cx) {
                        Poll::Ready(r) => break r?,
                        Poll::Pending => std::hint::spin_loop(),
                    }
                }
            }
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6)
}

fn completions(comms: &[Comm]) -> Vec<Completion<()>> {
    comms.iter().map(|c| c.completion(c.stream(), ())).collect()
}

/// Runs the phase and prints (and with `--json` writes) its figures.
pub fn run(opts: &Opts) -> Result<()> {
    let devices = crate::devices(opts)?;
    let comms = Comm::init_all(&devices, &Config::new().timeout(opts.timeout))?;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let mut bufs = comms
        .iter()
        .map(|c| c.stream().alloc_zeros::<f32>(2))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let ways = [Way::Sync, Way::Await, Way::AwaitSpin, Way::Wait, Way::Poll];
    let mut times: [Vec<f64>; 5] = Default::default();
    let mut cpu_s = 0.0;
    let mut await_wall_s = 0.0;
    for i in 0..opts.warmup + opts.iters {
        for (k, way) in ways.iter().enumerate() {
            let cpu0 = waker_cpu_s();
            let us = one_call(&comms, &mut bufs, &rt, *way)?;
            if i >= opts.warmup {
                times[k].push(us);
                if matches!(way, Way::Await) {
                    cpu_s += waker_cpu_s() - cpu0;
                    await_wall_s += us / 1e6;
                }
            }
        }
    }
    // After quiet: the waker thread asleep (it sleeps once nothing is in
    // flight), so the registration wakes it first.
    let mut cold = Vec::new();
    for _ in 0..(opts.iters / 10).max(1) {
        std::thread::sleep(Duration::from_millis(2));
        cold.push(one_call(&comms, &mut bufs, &rt, Way::Await)?);
    }
    let mut requests = Vec::new();
    for _ in 0..IN_FLIGHT {
        requests.push(
            comms
                .iter()
                .map(|c| c.stream().alloc_zeros::<f32>(2))
                .collect::<std::result::Result<Vec<_>, _>>()?,
        );
    }
    let t = Instant::now();
    let rounds = opts.iters.div_ceil(IN_FLIGHT).max(1);
    for _ in 0..rounds {
        let mut pending = Vec::with_capacity(IN_FLIGHT);
        for mut bufs in requests.drain(..) {
            issue(&comms, &mut bufs)?;
            let per_rank: Vec<_> = comms
                .iter()
                .zip(bufs)
                .map(|(c, b)| c.completion(c.stream(), b))
                .collect();
            pending.push(per_rank);
        }
        rt.block_on(async {
            for per_rank in pending {
                let mut back = Vec::with_capacity(per_rank.len());
                for c in per_rank {
                    back.push(c.await?);
                }
                requests.push(back);
            }
            Ok::<_, BoxError>(())
        })?;
    }
    let per_s = (rounds * IN_FLIGHT) as f64 / t.elapsed().as_secs_f64();
    let [s, a, spin, w, p] = times.map(median);
    let cold = median(cold);
    let share = if await_wall_s > 0.0 {
        cpu_s / await_wall_s
    } else {
        0.0
    };
    println!(
        "# nccl-rs bench --async: {} GPU(s), 8 B all_reduce, {} calls",
        comms.len(),
        opts.iters
    );
    println!(
        "  sync {s:.2} us  await {a:.2} us (+{:.2})  await spin_for(50 us) {spin:.2} us (+{:.2})  \
         wait {w:.2} us (+{:.2})  poll {p:.2} us (+{:.2})  \
         await after quiet {cold:.2} us  waker cpu {:.0}%  {per_s:.0} req/s with {IN_FLIGHT} in flight",
        a - s,
        spin - s,
        w - s,
        p - s,
        share * 100.0
    );
    if let Some(path) = &opts.json {
        let doc = json!({
            "meta": { "async": true, "ranks": comms.len(), "iters": opts.iters },
            "summary": {
                "await_minus_sync_small_us": a - s,
                "await_small_us": a,
                "sync_small_us": s,
                "await_spin_minus_sync_small_us": spin - s,
                "wait_minus_sync_small_us": w - s,
                "poll_minus_sync_small_us": p - s,
                "await_cold_small_us": cold,
                "waker_cpu_share": share,
                "requests_per_s_64_in_flight": per_s,
            },
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .map_err(|e| BoxError::from(format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}
