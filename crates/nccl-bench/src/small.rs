//! `--small`: the all-reduce of small messages (sum; `-b` to `-e`, the
//! issue's range 8 B to 16 MiB by ×2; f32 and bf16), a thread per GPU
//! (`--mode threads`) or a process per GPU (`--mode processes`, under a
//! launcher; the ranks meet on the communicator), eager, four ways on one communicator split from the world's with
//! [`nccl_dist::nccl_safe::Config::for_symmetric_kernels`] (`minCTAs`
//! 16: NCCL makes no more channels than its 24 between two NVLink-linked
//! H100s or H200s, so the default path is NCCL's default; the symmetric
//! kernels get at least 16 blocks) and no watchdog, as the raw and safe
//! layers of the sweep:
//!
//! - `raw`: nccl-sys's `ncclAllReduce` on plain (cudarc) buffers, NCCL's
//!   default path;
//! - `plain`: nccl-safe's `all_reduce` on the same plain buffers;
//! - `symmetric`: nccl-safe's `all_reduce` between two
//!   [`SymmetricBuffer`]s (registered as symmetric windows on every rank,
//!   made for each size): our one-shot kernel up to its size limit
//!   (`nccl_safe::one_shot_max_bytes`), NCCL's symmetric kernels above;
//! - `nccl_symmetric`: the same buffers with the one-shot kernel turned
//!   off (`SymmetricBuffer::set_one_shot(false)`): NCCL's symmetric
//!   kernels at every size.
//!
//! Each measurement: `-w` calls, the threads meet, then `-n` calls timed
//! to the stream's end; `--rounds` rounds, the four ways in a rotating
//! order in each, the median per way; the slowest rank's. Then each way
//! runs once more into a zeroed output, checked bit-exact (inputs
//! `rank + 1`, whose sums are exact in both types). Every wait is bounded
//! (`--timeout`). Then the graph mode (rows `<way>_graph`): each way's
//! `-n` calls captured once in a CUDA graph, replayed `--graph-launches`
//! times per round, the ways rotating, the output checked after. PyTorch's
//! side is `python/examples/torch_small.py` (eager).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nccl_dist::nccl_safe::cudarc::driver::{
    CudaGraph, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, sys,
};
use nccl_dist::nccl_safe::{Comm, ReduceOp, SymmetricBuffer};
use nccl_dist::{Error, World};
use serde_json::{Value, json};

use crate::barrier::HostBarrier;
use crate::cli::{Mode, Opts};
use crate::coll::Elem;
use crate::error::{BoxError, Result, cuda_err};
use crate::fns::Fns;

const NCCL_SUCCESS: nccl_dist::nccl_safe::nccl_sys::ncclResult_t =
    nccl_dist::nccl_safe::nccl_sys::ncclResult_t::ncclSuccess;

/// The ways measured, in their interleaved order.
const WAYS: [&str; 4] = ["raw", "plain", "symmetric", "nccl_symmetric"];
/// The same ways captured in CUDA graphs and replayed.
const GRAPH_WAYS: [&str; 4] = [
    "raw_graph",
    "plain_graph",
    "symmetric_graph",
    "nccl_symmetric_graph",
];

/// One rank's results: (dtype, bytes, way) → (median µs, wrong elements).
type Rows = Vec<(&'static str, usize, &'static str, f64, u64)>;

fn bad(reason: String) -> Error {
    Error::InvalidArgument {
        op: "bench --small",
        reason,
    }
}

/// The elements of `recv` (on `stream`) that differ from the sum over
/// `n` ranks of `rank + 1`.
fn wrong<T: Elem>(stream: &Arc<CudaStream>, recv: &CudaSlice<T>, n: usize) -> Result<u64> {
    let want = T::from_f64((n * (n + 1) / 2) as f64);
    let got = stream.clone_dtoh(recv)?;
    Ok(got.iter().filter(|v| **v != want).count() as u64)
}

/// One size's buffers on one rank: the input, a receive buffer per way,
/// and the symmetric pair.
struct Bufs<'c, T: Elem> {
    count: usize,
    send: CudaSlice<T>,
    raw_recv: CudaSlice<T>,
    recv: CudaSlice<T>,
    sym_send: SymmetricBuffer<'c, T>,
    sym_recv: SymmetricBuffer<'c, T>,
}

impl<T: Elem> Bufs<'_, T> {
    /// `calls` all-reduces of `way` on `comm`'s stream.
    fn issue(&mut self, way: usize, calls: usize, comm: &Comm, fns: &Fns) -> Result<()> {
        let stream = comm.stream();
        match way {
            0 => {
                let (s, _g) = self.send.device_ptr(stream);
                let (r, _h) = self.raw_recv.device_ptr_mut(stream);
                let count = self.count;
                // SAFETY: `count` elements at each pointer, on this
                // communicator's device and stream; the raw handle is used
                // on this thread only, for calls the typed API makes
                // itself, one after another as a C program would.
                unsafe {
                    comm.with_raw(|raw| -> Result<()> {
                        for _ in 0..calls {
                            let code = (fns.all_reduce)(
                                s as *const c_void,
                                r as *mut c_void,
                                count,
                                T::DATATYPE,
                                ReduceOp::Sum.raw(),
                                raw,
                                stream.cu_stream() as _,
                            );
                            if code != NCCL_SUCCESS {
                                return Err(format!("ncclAllReduce: {code:?}").into());
                            }
                        }
                        Ok(())
                    })
                }??;
            }
            1 => {
                for _ in 0..calls {
                    comm.all_reduce(&self.send, &mut self.recv, ReduceOp::Sum)?;
                }
            }
            _ => {
                // Every rank turns the kernel off and on alike.
                self.sym_send.set_one_shot(way == 2);
                for _ in 0..calls {
                    comm.all_reduce(&self.sym_send, &mut self.sym_recv, ReduceOp::Sum)?;
                }
                self.sym_send.set_one_shot(true);
            }
        }
        Ok(())
    }

    /// `way`'s `calls` calls captured in one CUDA graph on `comm`'s stream
    /// (a relaxed capture, as `nccl_safe::capture` begins).
    ///
    /// # Safety
    ///
    /// The graph is launched only while `self` and `comm` live.
    unsafe fn graph(
        &mut self,
        way: usize,
        calls: usize,
        comm: &Comm,
        fns: &Fns,
    ) -> Result<CudaGraph> {
        let stream = comm.stream();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(cuda_err("beginning a capture"))?;
        // SAFETY: the caller's promise: the buffers and the communicator
        // outlive every launch.
        let issued =
            unsafe { nccl_dist::nccl_safe::allow_capture(|| self.issue(way, calls, comm, fns)) };
        // Ended even after a failure, so the stream is not left capturing.
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        issued?;
        graph
            .map_err(cuda_err("ending the capture"))?
            .ok_or_else(|| "the capture recorded nothing".into())
    }

    /// `way`'s output once its work is done: its elements off the sum.
    fn wrong_after(&mut self, way: usize, comm: &Comm, n: usize) -> Result<u64> {
        let stream = comm.stream();
        comm.synchronize(stream)?;
        match way {
            0 => wrong(stream, &self.raw_recv, n),
            1 => wrong(stream, &self.recv, n),
            _ => {
                let mut out = stream.alloc_zeros::<T>(self.count)?;
                self.sym_recv.copy_to(stream, &mut out)?;
                wrong(stream, &out, n)
            }
        }
    }

    /// `way`'s output: zeroed, one call, then its elements off the sum
    /// over `n` ranks (a way that did nothing leaves zeros).
    fn checked(&mut self, way: usize, comm: &Comm, fns: &Fns, n: usize) -> Result<u64> {
        let stream = comm.stream();
        let zeros = stream.alloc_zeros::<T>(self.count)?;
        match way {
            0 => stream.memcpy_dtod(&zeros, &mut self.raw_recv)?,
            1 => stream.memcpy_dtod(&zeros, &mut self.recv)?,
            _ => self.sym_recv.copy_from(stream, &zeros)?,
        }
        self.issue(way, 1, comm, fns)?;
        self.wrong_after(way, comm, n)
    }
}

/// The four ways of one size, each captured once (`-n` calls in a graph)
/// and replayed `--graph-launches` times per round, the ways rotating;
/// then each output checked against the sum.
fn graphs<T: Elem>(
    b: &mut Bufs<'_, T>,
    comm: &Comm,
    fns: &Fns,
    opts: &Opts,
    met: &Meet<'_>,
    n: usize,
    rows: &mut Rows,
) -> Result<()> {
    let stream = comm.stream();
    let mut graphs = Vec::with_capacity(WAYS.len());
    for way in 0..WAYS.len() {
        met.wait()?;
        // SAFETY: the graphs are dropped at the end of this function,
        // before `b` and `comm`.
        graphs.push(unsafe { b.graph(way, opts.iters, comm, fns) }?);
    }
    let mut times: [Vec<f64>; 4] = Default::default();
    for round in 0..opts.rounds {
        for k in 0..WAYS.len() {
            let way = (round + k) % WAYS.len();
            graphs[way]
                .launch()
                .map_err(cuda_err("launching a graph"))?;
            comm.synchronize(stream)?;
            met.wait()?;
            let t = Instant::now();
            for _ in 0..opts.graph_launches {
                graphs[way]
                    .launch()
                    .map_err(cuda_err("launching a graph"))?;
            }
            comm.synchronize(stream)?;
            let calls = (opts.iters * opts.graph_launches) as f64;
            times[way].push(t.elapsed().as_secs_f64() * 1e6 / calls);
        }
    }
    for (way, mut t) in times.into_iter().enumerate() {
        let wrong = b.wrong_after(way, comm, n)?;
        rows.push((
            T::NAME,
            b.count * std::mem::size_of::<T>(),
            GRAPH_WAYS[way],
            crate::median(&mut t),
            wrong,
        ));
    }
    drop(graphs);
    Ok(())
}

/// Where the ranks meet between measurements: the threads of this process
/// (a host barrier with a deadline), or the processes (a barrier on the
/// communicator, bounded by its timeout).
enum Meet<'a> {
    Host(&'a HostBarrier),
    Comm(&'a Comm),
}

impl Meet<'_> {
    fn wait(&self) -> Result<()> {
        match self {
            Meet::Host(h) => h.wait(),
            Meet::Comm(c) => Ok(nccl_dist::Communicator::barrier(*c)?),
        }
    }
}

/// Both types on one rank.
fn rank_rows(world: &World, comm: &Comm, fns: &Fns, opts: &Opts, met: &Meet<'_>) -> Result<Rows> {
    let mut rows = Rows::new();
    sizes::<f32>(world, comm, fns, opts, met, &mut rows)?;
    sizes::<half::bf16>(world, comm, fns, opts, met, &mut rows)?;
    Ok(rows)
}

/// A thread per GPU: every rank's rows, and the ranks.
fn threads(opts: &Opts, fns: &Fns) -> Result<(Vec<Rows>, usize)> {
    let devices = crate::devices(opts)?;
    let n = devices.len();
    if n < 2 {
        return Err(format!("--small needs 2 GPUs or more ({n} visible)").into());
    }
    // Bounded: a thread that failed makes the others fail, not hang.
    let host = HostBarrier::new(n, opts.timeout);
    let all: Mutex<Vec<Rows>> = Mutex::new(Vec::new());
    World::spawn_local_with_options(&devices, &crate::world_options(opts), |world| {
        let config = crate::config(opts).for_symmetric_kernels();
        let comm = crate::bare_comm_with(&world, &config).map_err(|e| bad(e.to_string()))?;
        let rows = rank_rows(&world, &comm, fns, opts, &Meet::Host(&host))
            .map_err(|e| bad(e.to_string()))?;
        all.lock().unwrap_or_else(|p| p.into_inner()).push(rows);
        Ok::<(), Error>(())
    })?;
    Ok((all.into_inner().unwrap_or_else(|p| p.into_inner()), n))
}

/// A process per GPU (under a launcher): on global rank 0, the rows with
/// the slowest rank's times and every rank's wrong elements (reduced over
/// the communicator), and the ranks; `None` elsewhere.
fn processes(opts: &Opts, fns: &Fns) -> Result<Option<(Vec<Rows>, usize)>> {
    let launch = nccl_dist::Launch::detect()
        .map_err(|e| format!("--small --mode processes needs a launcher ({e})"))?;
    let world = World::init_with(launch, &crate::world_options(opts))?;
    let n = world.size();
    if n < 2 {
        return Err(format!("--small needs 2 ranks or more ({n})").into());
    }
    let config = crate::config(opts).for_symmetric_kernels();
    let comm = crate::bare_comm_with(&world, &config)?;
    let mut rows = rank_rows(&world, &comm, fns, opts, &Meet::Comm(&comm))?;
    let stream = comm.stream();
    let mut times = stream.clone_htod(&rows.iter().map(|r| r.3).collect::<Vec<f64>>())?;
    let mut wrong = stream.clone_htod(&rows.iter().map(|r| r.4 as f64).collect::<Vec<f64>>())?;
    comm.all_reduce_in_place(&mut times, ReduceOp::Max)?;
    comm.all_reduce_in_place(&mut wrong, ReduceOp::Sum)?;
    comm.synchronize(stream)?;
    let (times, wrong) = (stream.clone_dtoh(&times)?, stream.clone_dtoh(&wrong)?);
    for ((row, t), w) in rows.iter_mut().zip(times).zip(wrong) {
        (row.3, row.4) = (t, w as u64);
    }
    Ok((world.rank() == 0).then_some((vec![rows], n)))
}

/// Every size of one type on one rank, the four ways interleaved.
fn sizes<T: Elem>(
    world: &World,
    comm: &Comm,
    fns: &Fns,
    opts: &Opts,
    met: &Meet<'_>,
    rows: &mut Rows,
) -> Result<()> {
    let stream = comm.stream();
    if !opts.cudarc_events {
        // SAFETY: this phase's buffers are used on this one stream only
        // (collectives, fills and read-backs), so cudarc's cross-stream
        // events have nothing to order (as in the sweep's layers).
        unsafe { stream.context().disable_event_tracking() };
    }
    let n = world.size();
    let me = (world.rank() + 1) as f64;
    let elem = std::mem::size_of::<T>();
    let mut bytes = opts.min_bytes.max(elem);
    while bytes <= opts.max_bytes {
        let count = bytes / elem;
        let send = stream.clone_htod(&vec![T::from_f64(me); count])?;
        let mut sym_send = SymmetricBuffer::<T>::new(comm, count)?;
        sym_send.copy_from(stream, &send)?;
        let mut b = Bufs {
            count,
            raw_recv: stream.alloc_zeros::<T>(count)?,
            recv: stream.alloc_zeros::<T>(count)?,
            sym_recv: SymmetricBuffer::<T>::new(comm, count)?,
            send,
            sym_send,
        };
        let mut times: [Vec<f64>; 4] = Default::default();
        for round in 0..opts.rounds {
            // The ways in a rotating order, so none is always first.
            for k in 0..WAYS.len() {
                let way = (round + k) % WAYS.len();
                b.issue(way, opts.warmup, comm, fns)?;
                comm.synchronize(stream)?;
                // The ranks start the timed calls together.
                met.wait()?;
                let t = Instant::now();
                b.issue(way, opts.iters, comm, fns)?;
                comm.synchronize(stream)?;
                times[way].push(t.elapsed().as_secs_f64() * 1e6 / opts.iters as f64);
            }
        }
        let mut bad = [0u64; 4];
        for (way, slot) in bad.iter_mut().enumerate() {
            met.wait()?;
            *slot = b.checked(way, comm, fns, n)?;
        }
        for (way, mut t) in times.into_iter().enumerate() {
            // At least one round (`--rounds` is checked): never empty.
            rows.push((
                T::NAME,
                count * elem,
                WAYS[way],
                crate::median(&mut t),
                bad[way],
            ));
        }
        graphs(&mut b, comm, fns, opts, met, n, rows)?;
        drop(b);
        bytes *= 2;
    }
    Ok(())
}

pub fn run(opts: &Opts) -> Result<()> {
    let fns = Fns::load()?;
    let (all, n) = match opts.mode {
        Mode::Threads => threads(opts, &fns)?,
        Mode::Processes => match processes(opts, &fns)? {
            Some(done) => done,
            // Only global rank 0 reports.
            None => return Ok(()),
        },
        Mode::Single => {
            return Err("--small runs with a thread or a process per GPU".into());
        }
    };
    // The slowest rank's time and every rank's wrong elements, per row.
    let first = all.first().ok_or("no rank reported")?;
    let mut results: Vec<Value> = Vec::new();
    println!(
        "# nccl-rs bench --small: {n} ranks ({}), all_reduce sum, µs per call (slowest rank)",
        opts.mode.name()
    );
    println!(
        "# {:>6} {:>10} {:>10} {:>10} {:>8}",
        "dtype", "bytes", "way", "time(us)", "#wrong"
    );
    for (i, (dtype, bytes, way, _, _)) in first.iter().enumerate() {
        let time = all.iter().map(|r| r[i].3).fold(f64::MIN, f64::max);
        let wrong: u64 = all.iter().map(|r| r[i].4).sum();
        println!("  {dtype:>6} {bytes:>10} {way:>10} {time:>10.2} {wrong:>8}");
        results.push(json!({
            "dtype": dtype,
            "bytes": bytes,
            "layer": way,
            "coll": "all_reduce",
            "time_us": time,
            "wrong": wrong,
        }));
    }
    if let Some(path) = &opts.json {
        let doc = json!({
            "meta": {"small": true, "mode": opts.mode.name(), "ranks": n,
                     "iters": opts.iters, "warmup": opts.warmup, "rounds": opts.rounds},
            "small": results,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .map_err(|e| BoxError::from(format!("writing {}: {e}", path.display())))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(())
}
