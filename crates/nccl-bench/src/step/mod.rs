//! `--step`: a training-like step over a 2-D `DeviceMesh`, through the
//! mesh with default options against the same step in raw nccl-sys calls,
//! in the same run, interleaved.
//!
//! The mesh is `dp` × `tp`: 2 × 1 on 2 GPUs, 2 × 2 on 4, `n/2` × 2 on an
//! even `n` ≥ 4, `n` × 1 otherwise, in rank order (rank = dp index × tp +
//! tp index). One step is, in this order, on one stream per rank:
//!
//! | # | operation | axis | type | bytes per rank | NCCL call |
//! |---|---|---|---|---|---|
//! | 1 | broadcast from tp rank 0, in place | tp | f32 | 8 B (2 elements) | `ncclBroadcast` |
//! | 2 | all_reduce sum, out of place | tp | bf16 | 64 KiB (32768) | `ncclAllReduce` |
//! | 3 | all_to_all | dp | bf16 | 16 KiB (8192, 8192/dp per peer) | `ncclAlltoAll` (grouped send/recv before 2.28) |
//! | 4 | reduce_scatter sum | dp | bf16 | 1 MiB in (524288), 1 MiB/dp out | `ncclReduceScatter` |
//! | 5 | all_gather of 4's shard | dp | bf16 | 1 MiB/dp in, 1 MiB out | `ncclAllGather` |
//! | 6 | ring: send to dp+1, receive from dp−1, one group | dp | f32 | 4 KiB (1024) each way | `ncclSend` + `ncclRecv` in `ncclGroupStart/End` |
//! | 7 | average: all_reduce with PreMulSum(1/dp) | dp | f32 | 256 KiB (65536) | `ncclAllReduce` with `ncclRedOpCreatePreMulSum` (host scalar, made once) |
//! | 8 | all_reduce sum (a loss), out of place | dp | f32 | 8 B (2) | `ncclAllReduce` |
//!
//! Every operation but the broadcast is out of place and no operation
//! writes a buffer that an earlier one of the same step reads, so a step
//! gives the same bytes however often it runs.
//!
//! - `default`: `World` with `WorldOptions::new()` (`--nonblocking`: with
//!   `nonblocking_config()`), `DeviceMesh::new(&world, ..)`, the axis
//!   communicators from `mesh.axis(..)` with nccl-safe's typed calls on
//!   the whole-mesh communicator's stream, `nccl_safe::group` for the
//!   ring and `PreMulSum::host` for the average: watchdog and liveness as
//!   the defaults have them.
//! - `raw`: communicators split from the world's with NCCL's blocking
//!   defaults (`Config::new()`, no watchdog) with the mesh's colors and
//!   keys, driven through their raw handles with nccl-sys function
//!   pointers, on the raw whole communicator's stream.
//! - `raw_mesh` (only with `--step-raw-mesh`): the raw side's calls on the
//!   mesh's own communicators and stream, through their raw handles. It
//!   splits default − raw into what NCCL does differently on the mesh's
//!   communicators (raw_mesh − raw) and what our layers add per call
//!   (default − raw_mesh).
//!
//! Each round times `-n` steps of each side after `-w` warm-up steps
//! (sides take turns going first); the time of a round is the slowest
//! rank's; the report takes the median over `--rounds`. Each side also
//! reports its issue time: the issuing loop alone, per step, before the
//! wait for the GPU (equal to the step's time where the host is the
//! bound). Inputs are small
//! integers (1 to 5, by rank, buffer and element), so every sum and the
//! average by a power of two are exact in bf16 and f32. After the timing
//! every side runs one more step on fresh inputs; its outputs are copied
//! back and compared with the expected values, and raw's and raw_mesh's
//! with default's, bit for bit.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use nccl_dist::nccl_safe::cudarc::driver::{CudaStream, sys};
use nccl_dist::nccl_safe::nccl_sys::{cudaStream_t, ncclRedOp_t, ncclScalarResidence_t};
use nccl_dist::nccl_safe::{Comm, Library, NcclType, PreMulSum, ReduceOp, group, segments};
use nccl_dist::{DeviceMesh, Launch, World};
use serde_json::{Value, json};

mod bufs;
mod raw;

use crate::alloc;
use crate::barrier::HostBarrier;
use crate::cli::{Mode, Opts};
use crate::error::{BoxError, Result};
use crate::fns::Fns;

use bufs::{B_A2A, B_AVG, B_BCAST, B_GRAD, B_LOSS, B_RING, B_TP, Bufs, Layout, Output, value};
use raw::{Ptrs, Raw, ok};

/// NCCL calls in one step (the ring is two).
const CALLS_PER_STEP: usize = 9;

/// `dp` × `tp` for `n` ranks.
fn axes(n: usize) -> (usize, usize) {
    let tp = if n >= 4 && n.is_multiple_of(2) { 2 } else { 1 };
    (n / tp, tp)
}

/// Where this rank sits: its dp and tp index and the world rank at any
/// (dp, tp) coordinate.
struct Place {
    d: usize,
    t: usize,
    ranks: Vec<Vec<usize>>,
}

impl Place {
    fn at(&self, d: usize, t: usize) -> usize {
        self.ranks[d][t]
    }
}

/// What every output of rank `p` must hold, in `Bufs::outputs` order.
fn expected(l: &Layout, p: &Place) -> Vec<Vec<f64>> {
    let (dp, tp) = (l.dp, l.tp);
    let (d, t) = (p.d, p.t);
    let sum_dp = |buf: usize, i: usize| (0..dp).map(|q| value(p.at(q, t), buf, i)).sum::<f64>();
    vec![
        (0..l.bcast)
            .map(|i| value(p.at(d, 0), B_BCAST, i))
            .collect(),
        (0..l.tp_sum)
            .map(|i| (0..tp).map(|j| value(p.at(d, j), B_TP, i)).sum())
            .collect(),
        (0..l.a2a * dp)
            .map(|i| value(p.at(i / l.a2a, t), B_A2A, d * l.a2a + i % l.a2a))
            .collect(),
        (0..l.shard)
            .map(|k| sum_dp(B_GRAD, d * l.shard + k))
            .collect(),
        (0..l.shard * dp).map(|i| sum_dp(B_GRAD, i)).collect(),
        (0..l.ring)
            .map(|i| value(p.at((d + dp - 1) % dp, t), B_RING, i))
            .collect(),
        (0..l.avg)
            .map(|i| {
                (0..dp)
                    .map(|q| value(p.at(q, t), B_AVG, i) * f64::from(1.0f32 / dp as f32))
                    .sum()
            })
            .collect(),
        (0..l.loss).map(|i| sum_dp(B_LOSS, i)).collect(),
    ]
}

/// The default side: the mesh's communicators as `World` and
/// `DeviceMesh` make them.
struct DefaultSide<'m> {
    stream: Arc<CudaStream>,
    dp: &'m Comm,
    tp: &'m Comm,
    avg: PreMulSum<'m, f32>,
    next: usize,
    prev: usize,
}

impl DefaultSide<'_> {
    fn step(&self, b: &mut Bufs) -> Result<()> {
        let s = &self.stream;
        self.tp.on(s).broadcast_in_place(&mut b.bcast, 0)?;
        self.tp
            .on(s)
            .all_reduce(&b.tp_in, &mut b.tp_out, ReduceOp::Sum)?;
        self.dp.on(s).all_to_all(&b.a2a_in, &mut b.a2a_out)?;
        self.dp
            .on(s)
            .reduce_scatter(&b.grad, &mut b.shard, ReduceOp::Sum)?;
        self.dp.on(s).all_gather(&b.shard, &mut b.full)?;
        group(|g| {
            g.on_stream(self.dp, s).send(&b.ring_send, self.next)?;
            g.on_stream(self.dp, s).recv(&mut b.ring_recv, self.prev)
        })?;
        self.dp
            .on(s)
            .all_reduce(&b.avg_in, &mut b.avg_out, &self.avg)?;
        self.dp
            .on(s)
            .all_reduce(&b.loss_in, &mut b.loss_out, ReduceOp::Sum)?;
        Ok(())
    }
}

/// Waits for `stream` by polling (no sleep), within the deadline; on
/// timeout aborts `comms` and fails.
fn wait(stream: &CudaStream, opts: &Opts, comms: &[&Comm]) -> Result<()> {
    let started = Instant::now();
    loop {
        // SAFETY: a live stream of this process.
        match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => return Ok(()),
            sys::CUresult::CUDA_ERROR_NOT_READY => {}
            other => return Err(format!("waiting for the GPU: {other:?}").into()),
        }
        if started.elapsed() > opts.timeout {
            for c in comms {
                let _ = c.abort_handle().abort();
            }
            return Err(format!(
                "the step did not finish within {:?}; communicators aborted",
                opts.timeout
            )
            .into());
        }
        std::hint::spin_loop();
    }
}

/// The sides of the step, in the order of a round's values.
const SIDES: [&str; 3] = ["default", "raw", "raw_mesh"];
/// Values per side in a round: seconds per step, allocations per step
/// (process-wide), seconds per step of the issuing loop alone.
const PER_SIDE: usize = 3;

/// What one rank measured: per round, `PER_SIDE` values for each side
/// run, and the check's counts.
struct Measured {
    rounds: Vec<Vec<f64>>,
    wrong_default: u64,
    wrong_raw: u64,
    /// Zero without the raw_mesh side.
    wrong_raw_mesh: u64,
    /// Elements where raw (or raw_mesh) differs from default, bit for bit.
    differ: u64,
}

/// Makes a host-immediate PreMulSum(`scale`) on `comm` through nccl-sys.
fn premul(f: &Fns, comm: &Comm, scale: f32) -> Result<ncclRedOp_t> {
    let mut avg = ncclRedOp_t::ncclSum;
    let mut scalar = scale;
    // SAFETY: `scalar` is one f32 on the host, read before the call
    // returns; the handle is held for the call.
    let created = unsafe {
        comm.with_raw(|c| {
            (f.premul_create)(
                &mut avg,
                (&mut scalar as *mut f32).cast(),
                f32::DATATYPE,
                ncclScalarResidence_t::ncclScalarHostImmediate,
                c,
            )
        })
    }?;
    ok("ncclRedOpCreatePreMulSum", created)?;
    Ok(avg)
}

/// Destroys `op`, made by [`premul`] on `comm`, whose last use returned.
fn destroy_premul(f: &Fns, comm: &Comm, op: ncclRedOp_t) -> Result<()> {
    // SAFETY: made on `comm` by `premul`; the handle is held for the call.
    let destroyed = unsafe { comm.with_raw(|c| (f.premul_destroy)(op, c)) };
    ok("ncclRedOpDestroy", destroyed?)
}

/// The step on one rank (a thread or a process per rank); `host` is the
/// barrier of this process's rank threads.
fn per_rank(world: &World, host: &HostBarrier, opts: &Opts) -> Result<Option<Value>> {
    let n = world.size();
    let me = world.rank();
    let (dp, tp) = axes(n);
    let l = Layout::new(dp, tp);
    let mesh = DeviceMesh::new(world, &[("dp", dp), ("tp", tp)])?;
    let (mdp, mtp) = (mesh.axis("dp")?, mesh.axis("tp")?);
    let place = Place {
        d: mesh.local_rank("dp")?,
        t: mesh.local_rank("tp")?,
        ranks: (0..dp)
            .map(|d| {
                (0..tp)
                    .map(|t| {
                        mesh.world_rank_of(&[d, t])
                            .ok_or("no rank at a mesh coordinate")
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()
            })
            .collect::<std::result::Result<Vec<_>, _>>()?,
    };
    if place.at(place.d, place.t) != me {
        return Err("the mesh places this rank elsewhere than its coordinate says".into());
    }

    // The raw side's communicators: the same groups, NCCL's blocking
    // defaults, nothing watching them.
    let bare = nccl_dist::nccl_safe::Config::new();
    let split = |parent: &Comm, color: u32, key: i32| -> Result<Comm> {
        let c = parent
            .split(Some(color), key, Some(&bare))?
            .ok_or("ncclCommSplit gave no communicator")?;
        c.set_observer(None);
        Ok(c)
    };
    let position = mesh.position();
    let raw_whole = split(world.comm(), 0, position as i32)?;
    let (c, k) = mesh.shape().split_for(position, &["dp"])?;
    let raw_dp = split(&raw_whole, c, k)?;
    let (c, k) = mesh.shape().split_for(position, &["tp"])?;
    let raw_tp = split(&raw_whole, c, k)?;
    if (raw_dp.rank(), raw_dp.size(), raw_tp.rank(), raw_tp.size())
        != (mdp.rank(), mdp.size(), mtp.rank(), mtp.size())
    {
        return Err("the raw communicators do not match the mesh's axes".into());
    }

    let ds = Arc::clone(mesh.comm().stream());
    let rs = Arc::clone(raw_whole.stream());
    if !opts.cudarc_events {
        // SAFETY: each side's buffers are used on that side's one stream
        // only (collectives, fills and read-backs), so cudarc's
        // cross-stream events have nothing to order.
        unsafe { ds.context().disable_event_tracking() };
    }
    let (next, prev) = ((place.d + 1) % dp, (place.d + dp - 1) % dp);
    let scale = 1.0f32 / dp as f32;
    let default = DefaultSide {
        stream: Arc::clone(&ds),
        dp: mdp,
        tp: mtp,
        avg: PreMulSum::host(mdp, scale)?,
        next,
        prev,
    };
    // A raw side on `dp`'s and `tp`'s handles (set while held) and
    // `stream`, with its own PreMulSum on `dp`.
    let raw_side = |dp: &Comm, stream: &CudaStream| -> Result<Raw> {
        let f = Fns::load()?;
        Ok(Raw {
            avg: premul(&f, dp, scale)?,
            f,
            dp: Cell::new(std::ptr::null_mut()),
            tp: Cell::new(std::ptr::null_mut()),
            stream: stream.cu_stream() as cudaStream_t,
            next: next as i32,
            prev: prev as i32,
            l,
        })
    };
    let raw = raw_side(&raw_dp, &rs)?;
    // `--step-raw-mesh`: the same raw calls on the mesh's communicators
    // and stream (default's buffers), nothing of ours per call.
    let raw_mesh = if opts.step_raw_mesh {
        Some(raw_side(mdp, &ds)?)
    } else {
        None
    };
    let all: [&Comm; 6] = [mdp, mtp, mesh.comm(), &raw_dp, &raw_tp, &raw_whole];

    let measured = (|| -> Result<Measured> {
        let mut db = Bufs::new(&ds, &l)?;
        let mut rb = Bufs::new(&rs, &l)?;
        db.reset(&ds, &l, me)?;
        rb.reset(&rs, &l, me)?;
        let rp = Ptrs::of(&rb, &rs);
        let dpt = Ptrs::of(&db, &ds);
        let sides = if raw_mesh.is_some() { 3 } else { 2 };
        let mut rounds = Vec::with_capacity(opts.rounds);
        // `--features segments`: each side's parts, summed over rounds.
        let mut segs = vec![Vec::new(); sides];
        for round in 0..opts.rounds {
            let mut row = vec![0.0; sides * PER_SIDE];
            // Sides take turns going first.
            for k in 0..sides {
                let side = (round + k) % sides;
                // Everyone idle and here, then warm up, then time.
                wait(&ds, opts, &all)?;
                wait(&rs, opts, &all)?;
                nccl_dist::Communicator::barrier(&raw_whole)?;
                // `n` steps; a raw side's inside one hold of its handles.
                let run = |n: usize, b: &mut Bufs| -> Result<()> {
                    match (side, &raw_mesh) {
                        (0, _) => (0..n).try_for_each(|_| default.step(b)),
                        (1, _) => raw.holding(&raw_dp, &raw_tp, || {
                            (0..n).try_for_each(|_| {
                                // SAFETY: `rp` are `rb`'s addresses; `rb`
                                // lives until after the last wait below.
                                unsafe { raw.step(&rp) }
                            })
                        }),
                        (_, Some(m)) => m.holding(mdp, mtp, || {
                            (0..n).try_for_each(|_| {
                                // SAFETY: `dpt` are `db`'s addresses, used
                                // on `ds` only; `db` lives until after the
                                // last wait below.
                                unsafe { m.step(&dpt) }
                            })
                        }),
                        (_, None) => Err("no raw_mesh side".into()),
                    }
                };
                let (b, s) = if side == 1 {
                    (&mut rb, &rs)
                } else {
                    (&mut db, &ds)
                };
                run(opts.warmup, b)?;
                wait(s, opts, &all)?;
                nccl_dist::Communicator::barrier(&raw_whole)?;
                // `--features segments`: what the warm-up and the barrier
                // marked is dropped (before the allocation count: taking
                // allocates with the feature); nothing marks until `t0`.
                segments::take();
                host.wait()?;
                let a0 = alloc::process();
                host.wait()?;
                let t0 = Instant::now();
                let issued = run(opts.iters, b);
                let issue = t0.elapsed();
                host.wait()?;
                let allocs = alloc::process() - a0;
                // Nobody moves on (and allocates) before all have read.
                host.wait()?;
                // After every rank's count: `take` allocates its list (with
                // the feature). No mark comes between: nothing of ours ran.
                add_segments(&mut segs[side], segments::take());
                issued?;
                wait(s, opts, &all)?;
                let at = side * PER_SIDE;
                row[at] = t0.elapsed().as_secs_f64() / opts.iters as f64;
                // Per step of this process: its rank threads each ran
                // `iters` steps.
                row[at + 1] = allocs as f64 / (opts.iters * host.threads()) as f64;
                row[at + 2] = issue.as_secs_f64() / opts.iters as f64;
            }
            rounds.push(row);
        }
        if segments::ENABLED {
            let steps = (opts.iters * opts.rounds) as f64;
            for (side, parts) in segs.iter().enumerate() {
                let line: Vec<String> = parts
                    .iter()
                    .filter(|(_, _, n)| *n > 0)
                    .map(|(name, ns, n)| {
                        format!("{name} {:.0} ns ({:.1})", ns / steps, *n as f64 / steps)
                    })
                    .collect();
                eprintln!(
                    "bench --step segments: rank {me} {} per step: {}",
                    SIDES[side],
                    line.join(", ")
                );
            }
        }
        // The check: fresh inputs, one step each, everything copied back.
        db.reset(&ds, &l, me)?;
        rb.reset(&rs, &l, me)?;
        nccl_dist::Communicator::barrier(&raw_whole)?;
        default.step(&mut db)?;
        wait(&ds, opts, &all)?;
        // SAFETY: as above.
        raw.holding(&raw_dp, &raw_tp, || unsafe { raw.step(&rp) })?;
        wait(&rs, opts, &all)?;
        let want = expected(&l, &place);
        let (dout, rout) = (db.outputs(&ds)?, rb.outputs(&rs)?);
        // The raw_mesh side on default's buffers, after default's outputs
        // were read: the same bytes as default's, and the expected values.
        let mout = match &raw_mesh {
            Some(m) => {
                db.reset(&ds, &l, me)?;
                nccl_dist::Communicator::barrier(&raw_whole)?;
                // SAFETY: as above.
                m.holding(mdp, mtp, || unsafe { m.step(&dpt) })?;
                wait(&ds, opts, &all)?;
                let out = db.outputs(&ds)?;
                if out.len() != dout.len() {
                    return Err("raw_mesh: read back the wrong number of outputs".into());
                }
                Some(out)
            }
            None => None,
        };
        let (mut wrong_default, mut wrong_raw, mut differ) = (0u64, 0u64, 0u64);
        let mut wrong_raw_mesh = 0u64;
        for (i, ((d, r), w)) in dout.iter().zip(&rout).zip(&want).enumerate() {
            // Exact everywhere, except the average by 1/dp where dp is not
            // a power of two (NCCL's summation order is its own).
            let exact = d.name != "premul_avg" || dp.is_power_of_two();
            let bad = |g: &f64, w: &f64| {
                if exact {
                    g != w
                } else {
                    (g - w).abs() > 1e-6 * w.abs().max(1.0)
                }
            };
            // Elements off the expected values, and bits unlike default's.
            let wrong = |o: &Output| -> Result<u64> {
                if o.values.len() != w.len() {
                    return Err(
                        format!("{}: read back the wrong number of elements", o.name).into(),
                    );
                }
                Ok(o.values.iter().zip(w).filter(|(g, w)| bad(g, w)).count() as u64)
            };
            let unlike =
                |o: &Output| d.bits.iter().zip(&o.bits).filter(|(a, b)| a != b).count() as u64;
            let (wd, wr, df) = (wrong(d)?, wrong(r)?, unlike(r));
            if wd + wr + df > 0 && !opts.quiet {
                eprintln!(
                    "bench --step: rank {me} {}: {wd} wrong (default), {wr} wrong (raw), {df} differ",
                    d.name
                );
            }
            wrong_default += wd;
            wrong_raw += wr;
            differ += df;
            if let Some(m) = mout.as_ref().and_then(|m| m.get(i)) {
                let (wm, dm) = (wrong(m)?, unlike(m));
                if wm + dm > 0 && !opts.quiet {
                    eprintln!(
                        "bench --step: rank {me} {}: {wm} wrong (raw_mesh), {dm} differ from default",
                        d.name
                    );
                }
                wrong_raw_mesh += wm;
                differ += dm;
            }
        }
        Ok(Measured {
            rounds,
            wrong_default,
            wrong_raw,
            wrong_raw_mesh,
            differ,
        })
    })();
    let destroyed = destroy_premul(&raw.f, &raw_dp, raw.avg);
    let destroyed_mesh = match &raw_mesh {
        Some(m) => destroy_premul(&m.f, mdp, m.avg),
        None => Ok(()),
    };
    let m = measured?;
    destroyed?;
    destroyed_mesh?;

    // The slowest rank's time per round; counts summed over ranks.
    let mut flat: Vec<f64> = m.rounds.iter().flatten().copied().collect();
    let max = over(&raw_whole, &rs, &flat, ReduceOp::Max)?;
    let sums = over(
        &raw_whole,
        &rs,
        &[
            m.wrong_default as f64,
            m.wrong_raw as f64,
            m.differ as f64,
            m.wrong_raw_mesh as f64,
        ],
        ReduceOp::Sum,
    )?;
    flat.clear();
    drop(default);
    // The threads meet before communicators are dropped (see
    // `World::spawn_local_with_options`).
    host.wait()?;
    if me != 0 {
        return Ok(None);
    }
    let sides = max.len() / (opts.rounds * PER_SIDE);
    Ok(Some(report(
        opts,
        n,
        &l,
        &max,
        sides,
        &sums,
        world.watchdog().is_some(),
    )?))
}

/// Adds one timed run's parts (`--features segments`) to a side's sums.
fn add_segments(sum: &mut Vec<(&'static str, f64, u64)>, run: Vec<(&'static str, f64, u64)>) {
    if sum.is_empty() {
        *sum = run;
        return;
    }
    for (s, r) in sum.iter_mut().zip(run) {
        s.1 += r.1;
        s.2 += r.2;
    }
}

/// Element-wise `op` over every rank, through `comm` on `stream`.
fn over(comm: &Comm, stream: &Arc<CudaStream>, v: &[f64], op: ReduceOp) -> Result<Vec<f64>> {
    let mut buf = stream.clone_htod(v)?;
    comm.on(stream).all_reduce_in_place(&mut buf, op)?;
    comm.synchronize(stream)?;
    Ok(stream.clone_dtoh(&buf)?)
}

/// Prints the result and builds the JSON (rank 0); `max` holds, per
/// round, `PER_SIDE` values for each of the first `sides` of [`SIDES`].
fn report(
    opts: &Opts,
    n: usize,
    l: &Layout,
    max: &[f64],
    sides: usize,
    sums: &[f64],
    watchdog: bool,
) -> Result<Value> {
    let rounds: Vec<&[f64]> = max.chunks(sides * PER_SIDE).collect();
    let col = |side: usize, i: usize| {
        rounds
            .iter()
            .map(|r| r[side * PER_SIDE + i])
            .collect::<Vec<f64>>()
    };
    let time = |side: usize| crate::median(&mut col(side, 0));
    let allocs = |side: usize| col(side, 1).into_iter().fold(0.0, f64::max);
    let issue = |side: usize| crate::median(&mut col(side, 2));
    let (d, r) = (time(0), time(1));
    let (wrong_default, wrong_raw, differ) = (sums[0] as u64, sums[1] as u64, sums[2] as u64);
    let wrong_raw_mesh = sums[3] as u64;
    let lib = Library::get()?;
    println!(
        "# nccl-rs bench --step: mode {}, {n} ranks, mesh dp={} x tp={}, NCCL {}, {} steps x {} rounds (warm-up {}), watchdog {}",
        opts.mode.name(),
        l.dp,
        l.tp,
        lib.version(),
        opts.iters,
        opts.rounds,
        opts.warmup,
        if watchdog { "on" } else { "off" },
    );
    println!(
        "# {:>8} {:>14} {:>14} {:>14} {:>10} {:>8} {:>8}",
        "side", "median(us)", "min(us)", "issue(us)", "allocs/step", "#wrong", "#differ"
    );
    let min = |v: Vec<f64>| v.into_iter().fold(f64::INFINITY, f64::min);
    for (side, name) in SIDES.iter().enumerate().take(sides) {
        let w = match side {
            0 => wrong_default.to_string(),
            1 => wrong_raw.to_string(),
            _ => wrong_raw_mesh.to_string(),
        };
        println!(
            "  {name:>8} {:>14.2} {:>14.2} {:>14.2} {:>10.3} {w:>8} {differ:>8}",
            time(side) * 1e6,
            min(col(side, 0)) * 1e6,
            issue(side) * 1e6,
            allocs(side),
        );
    }
    println!("# default / raw = {:.4}", d / r);
    let us = |v: Vec<f64>| v.iter().map(|x| x * 1e6).collect::<Vec<_>>();
    let mut step = json!({
        "default_us": d * 1e6,
        "raw_us": r * 1e6,
        "default_over_raw": d / r,
        "default_rounds_us": us(col(0, 0)),
        "raw_rounds_us": us(col(1, 0)),
        "default_issue_us": issue(0) * 1e6,
        "raw_issue_us": issue(1) * 1e6,
        "allocs_per_step_default": allocs(0),
        "allocs_per_step_raw": allocs(1),
        "allocs_per_call_default": allocs(0) / CALLS_PER_STEP as f64,
        "wrong_default": wrong_default,
        "wrong_raw": wrong_raw,
        "differ": differ,
    });
    if sides > 2 {
        // Paired by round: each round's difference, then the median.
        let paired = |a: usize, b: usize| {
            crate::median(
                &mut col(a, 0)
                    .iter()
                    .zip(col(b, 0))
                    .map(|(x, y)| (x - y) * 1e6)
                    .collect::<Vec<f64>>(),
            )
        };
        step["raw_mesh_us"] = json!(time(2) * 1e6);
        step["raw_mesh_issue_us"] = json!(issue(2) * 1e6);
        step["raw_mesh_rounds_us"] = json!(us(col(2, 0)));
        step["raw_mesh_minus_raw_us"] = json!(paired(2, 1));
        step["default_minus_raw_mesh_us"] = json!(paired(0, 2));
        step["wrong_raw_mesh"] = json!(wrong_raw_mesh);
        println!(
            "# raw_mesh - raw = {:+.2} us, default - raw_mesh = {:+.2} us (paired medians)",
            paired(2, 1),
            paired(0, 2)
        );
    }
    let doc = json!({
        "meta": {
            "step": true,
            "mode": opts.mode.name(),
            "ranks": n,
            "mesh": {"dp": l.dp, "tp": l.tp},
            "nccl": lib.version().to_string(),
            "iters": opts.iters,
            "warmup": opts.warmup,
            "rounds": opts.rounds,
            "nonblocking": opts.nonblocking,
            "default_watchdog": watchdog,
            "calls_per_step": CALLS_PER_STEP,
            "ops": l.describe(),
            "sides": &SIDES[..sides],
        },
        "step": step,
    });
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .map_err(|e| BoxError::from(format!("writing {}: {e}", path.display())))?;
        eprintln!("bench: wrote {}", path.display());
    }
    if wrong_default + wrong_raw + wrong_raw_mesh + differ > 0 {
        return Err(format!(
            "step check failed: {wrong_default} wrong (default), {wrong_raw} wrong (raw), {wrong_raw_mesh} wrong (raw_mesh), {differ} elements differ between the sides"
        )
        .into());
    }
    Ok(doc)
}

pub fn run(opts: &Opts) -> Result<()> {
    match opts.mode {
        Mode::Single => {
            Err("--step needs a thread or a process per GPU (--mode threads or processes)".into())
        }
        Mode::Threads => {
            let devices = crate::devices(opts)?;
            let host = HostBarrier::new(devices.len(), opts.timeout);
            let host = &host;
            World::spawn_local_with_options(&devices, &crate::world_options(opts), |world| {
                per_rank(&world, host, opts).map_err(|e| nccl_dist::Error::InvalidArgument {
                    op: "bench --step",
                    reason: e.to_string(),
                })
            })?;
            Ok(())
        }
        Mode::Processes => {
            let launch =
                Launch::detect().map_err(|e| format!("--mode processes needs a launcher ({e})"))?;
            let world = World::init_with(launch, &crate::world_options(opts))?;
            let host = HostBarrier::new(1, opts.timeout);
            per_rank(&world, &host, opts)?;
            Ok(())
        }
    }
}
