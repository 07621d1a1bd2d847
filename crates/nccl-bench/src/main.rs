//! Collective benchmark in nccl-tests' format, through three layers in one
//! run: `raw` (nccl-sys function pointers, no checks), `safe` (nccl-safe's
//! typed API) and `dist` (nccl-dist's `dyn Communicator`), so the cost of
//! each layer is a ratio measured on one machine at one time.
//!
//! Communicators: `raw` and `safe` run on a blocking communicator with no
//! watchdog (split from the world's with NCCL's default configuration);
//! `dist` runs on the world's own communicator made with default options
//! (`World::spawn_local_with_options`/`World::init_with` with
//! `WorldOptions::new()`: blocking, split from a nonblocking init, the
//! watchdog on unless `NCCL_RS_WATCHDOG=0`, liveness as the defaults have
//! it), which is what a user gets. `--nonblocking` makes both nonblocking
//! (`nonblocking_config()`). The optional layer `safe_wd` is `safe` with a
//! watchdog observing the same communicator, set between rounds, so
//! `safe_wd − safe` is the watchdog's cost per call.
//!
//! `--step` times a training-like step over a 2-D `DeviceMesh` instead
//! (see `step.rs` for the exact operations), through the mesh with
//! default options and through raw nccl-sys calls, interleaved.
//!
//! ```text
//! cargo run --release -p nccl-bench -- --mode threads -b 8 -e 2G
//! cargo run --release -p nccl-bench -- --mode single --graph --ops all_reduce -e 8
//! cargo xtask launch -n 4 --bin nccl-bench -- --mode processes
//! cargo run --release -p nccl-bench -- --setup
//! cargo xtask bench        # every mode, the report, the JSON and the plot
//! ```
//!
//! Columns are nccl-tests': size and count (the whole buffer for
//! all_gather, reduce_scatter and all_to_all), type, redop, root, time per
//! call in µs (the slowest rank's), algbw = size / time and busbw = algbw
//! × nccl-tests' factor (2(n-1)/n for all_reduce; (n-1)/n for all_gather,
//! reduce_scatter and all_to_all; 1 otherwise), and #wrong, the elements
//! that differ from the expected result in a check run after the timing.
//! Two more: the layer, and heap allocations per call: every allocation of
//! any thread of the process (the watchdog's and liveness threads
//! included) during the timed calls, over the calls the process issued,
//! counted by this binary's global allocator.

mod alloc;
mod awaited;
mod barrier;
mod check;
mod cli;
mod coll;
mod env;
mod error;
mod fns;
mod host_costs;
mod profile;
mod recover;
mod run;
mod setup;
mod small;
mod spans;
mod step;

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use std::sync::Arc;

use nccl_dist::nccl_safe::cudarc::driver::CudaContext;
use nccl_dist::nccl_safe::{Comm, Config, Library, OpObserver, ReduceOp};
use nccl_dist::{Launch, Watchdog, WatchdogOptions, World, WorldOptions, nonblocking_config};
use serde_json::{Value, json};

use barrier::HostBarrier;
use cli::{Mode, Opts};
use coll::{Coll, Elem, Layer, Spec};
use error::Result;
use run::{Driver, RankComms};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match cli::parse(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("bench: {e}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if let Err(why) = gpus_present() {
        eprintln!("bench: {why}: nothing to measure. Run it on a host with NVIDIA GPUs.");
        return ExitCode::from(3);
    }
    // One arm per type of nccl-safe's dtype list, named as the tag in
    // lower case (`f32`, `bf16`, `f8e4m3`).
    macro_rules! by_dtype {
        ($name:expr; $($tag:ident = $t:ty => $nccl:ident $([fp8 = $fp8:literal])?, $doc:literal;)*) => {
            match $name {
                $(name if name.eq_ignore_ascii_case(stringify!($tag)) => main_typed::<$t>(&opts),)*
                other => Err(format!("--dtype: unknown `{other}`").into()),
            }
        };
    }
    let profile = match opts
        .profile
        .as_deref()
        .map(profile::Profile::start)
        .transpose()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = nccl_dist::nccl_safe::for_each_dtype!(by_dtype opts.dtype.as_str(););
    if let Some(p) = profile {
        match p.finish() {
            Ok(path) => eprintln!("bench: wrote the profile to {}", path.display()),
            Err(e) => eprintln!("bench: {e}"),
        }
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Ok when the CUDA driver loads and sees a GPU.
fn gpus_present() -> std::result::Result<(), String> {
    // SAFETY: only tries to load libcuda and reports whether it could.
    if !unsafe { nccl_dist::nccl_safe::cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so) on this machine".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err("the CUDA driver sees no GPU".into()),
        Err(e) => Err(format!("the CUDA driver reports {e}")),
    }
}

/// The configuration of the raw and safe layers' communicators: NCCL's
/// blocking default, or NCCL's nonblocking mode with `--nonblocking`.
pub fn config(opts: &Opts) -> Config {
    if opts.nonblocking {
        nonblocking_config()
    } else {
        Config::new()
    }
}

/// The options of the world (the dist layer, the step's mesh): the
/// defaults, or the defaults with a nonblocking configuration.
pub fn world_options(opts: &Opts) -> WorldOptions {
    if opts.nonblocking {
        WorldOptions::new().config(nonblocking_config())
    } else {
        WorldOptions::new()
    }
}

/// The raw and safe layers' communicator for one rank: split from the
/// world's, with `config(opts)` and no observer (so no watchdog).
pub fn bare_comm(world: &World, opts: &Opts) -> Result<Comm> {
    bare_comm_with(world, &config(opts))
}

/// As [`bare_comm`], split with `config`.
pub fn bare_comm_with(world: &World, config: &Config) -> Result<Comm> {
    let comm = world
        .comm()
        .split(Some(0), world.rank() as i32, Some(config))?
        .ok_or("ncclCommSplit gave no communicator")?;
    // Only `World` and `DeviceMesh` set observers; make sure.
    comm.set_observer(None);
    Ok(comm)
}

/// A watchdog observer for `comm` when the `safe_wd` layer is measured:
/// the world's watchdog (or a new one, where the environment turned it
/// off), set on `comm` and taken off again, for `Driver` to toggle.
///
/// The safe layers issue on `stream` (the dist communicator's, so every
/// layer uses one stream): the watch keeps it alive and tracks it in
/// batches, as it tracks a communicator's own stream.
fn watch_for(
    comm: &Comm,
    stream: &Arc<nccl_dist::nccl_safe::cudarc::driver::CudaStream>,
    watchdog: Option<&Watchdog>,
    opts: &Opts,
) -> Result<Option<Arc<dyn OpObserver>>> {
    if !opts.layers.contains(&Layer::SafeWd) {
        return Ok(None);
    }
    let started;
    let watchdog = match watchdog {
        Some(w) => w,
        None => {
            started = Watchdog::start(WatchdogOptions::new())?;
            &started
        }
    };
    let watched = watchdog.watch(comm, format!("bench/safe[{}]", comm.rank()));
    watched.track_stream(Arc::clone(stream))?;
    let observer = comm.observer().ok_or("the watchdog set no observer")?;
    comm.set_observer(None);
    Ok(Some(observer))
}

fn to_dist(e: error::BoxError) -> nccl_dist::Error {
    nccl_dist::Error::InvalidArgument {
        op: "bench",
        reason: e.to_string(),
    }
}

/// Devices `0..--gpus` (all by default), refusing more than there are.
fn devices(opts: &Opts) -> Result<Vec<usize>> {
    let visible = CudaContext::device_count()? as usize;
    let n = opts.gpus.unwrap_or(visible);
    if n > visible {
        return Err(format!("--gpus {n}: only {visible} GPU(s) visible").into());
    }
    Ok((0..n).collect())
}

fn main_typed<T: Elem>(opts: &Opts) -> Result<()> {
    let op = coll::parse_op(&opts.op).ok_or_else(|| format!("--op: unknown `{}`", opts.op))?;
    if opts.setup {
        return setup::run(opts);
    }
    if opts.step_phase {
        return step::run(opts);
    }
    if opts.async_phase {
        return awaited::run(opts);
    }
    if opts.recover_phase {
        return recover::run(opts);
    }
    if opts.small_phase {
        return small::run(opts);
    }
    let mut opts = opts.clone();
    if opts.mode == Mode::Single && opts.layers.contains(&Layer::Dist) {
        opts.layers.retain(|l| *l != Layer::Dist);
        if !opts.quiet {
            eprintln!(
                "bench: the dist layer (dyn Communicator) issues one call per rank outside a group; skipped in single mode"
            );
        }
    }
    if opts.layers.is_empty() {
        return Err("no layer to measure".into());
    }
    let started = Instant::now();
    match opts.mode {
        Mode::Single => {
            // No World: one thread, no dist layer; the safe_wd layer gets
            // a watchdog of its own.
            let comms = Comm::init_all(&devices(&opts)?, &config(&opts))?;
            let host = HostBarrier::new(1, opts.timeout);
            let watchdog = if opts.layers.contains(&Layer::SafeWd) {
                Some(Watchdog::start(WatchdogOptions::new())?)
            } else {
                None
            };
            let ranks = comms
                .iter()
                .map(|comm| {
                    Ok(RankComms {
                        comm,
                        dist: None,
                        watch: watch_for(comm, comm.stream(), watchdog.as_ref(), &opts)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            sweep::<T>(ranks, &host, &opts, op, started, None)
        }
        Mode::Threads => {
            let devices = devices(&opts)?;
            let o = &opts;
            let host = HostBarrier::new(devices.len(), opts.timeout);
            let host = &host;
            World::spawn_local_with_options(&devices, &world_options(o), |world| {
                let run = || -> Result<()> {
                    let bare = bare_comm(&world, o)?;
                    let watch = watch_for(&bare, world.comm().stream(), world.watchdog(), o)?;
                    let ranks = vec![RankComms {
                        comm: &bare,
                        dist: Some(world.comm()),
                        watch,
                    }];
                    let swept = sweep::<T>(ranks, host, o, op, started, world.watchdog());
                    // The threads meet before any communicator is dropped
                    // (see `World::spawn_local_with_options`).
                    let met = host.wait();
                    swept?;
                    met
                };
                run().map_err(to_dist)
            })?;
            Ok(())
        }
        Mode::Processes => {
            let launch = Launch::detect().map_err(|e| {
                format!(
                    "--mode processes needs a launcher ({e}); try `cargo xtask launch -n 4 --bin nccl-bench -- --mode processes`"
                )
            })?;
            let world = World::init_with(launch, &world_options(&opts))?;
            let bare = bare_comm(&world, &opts)?;
            let host = HostBarrier::new(1, opts.timeout);
            let ranks = vec![RankComms {
                comm: &bare,
                dist: Some(world.comm()),
                watch: watch_for(&bare, world.comm().stream(), world.watchdog(), &opts)?,
            }];
            sweep::<T>(ranks, &host, &opts, op, started, world.watchdog())
        }
    }
}

/// The whole sweep on this thread's ranks; global rank 0 prints and writes.
fn sweep<T: Elem>(
    ranks: Vec<RankComms<'_>>,
    host: &HostBarrier,
    opts: &Opts,
    op: ReduceOp,
    started: Instant,
    dist_watchdog: Option<&Watchdog>,
) -> Result<()> {
    let comms: Vec<&Comm> = ranks.iter().map(|r| r.comm).collect();
    let comms = &comms[..];
    let dist_watchdog = dist_watchdog.is_some();
    let mut d = Driver::<T>::new(ranks, host, opts)?;
    let n = d.size();
    let leader = comms[0].rank() == 0;
    let sizes = cli::sizes(opts);
    let placements: Vec<bool> = [(opts.out_of_place, false), (opts.in_place, true)]
        .into_iter()
        .filter_map(|(on, ip)| on.then_some(ip))
        .collect();
    let total = opts.ops.len() * sizes.len();
    let mut records = Vec::new();
    let mut step = 0;
    if leader {
        print_preamble::<T>(opts, comms, n)?;
    }
    // Before any timed call, while the other ranks wait at the first
    // barrier: the host's cost of each piece of the enqueue path, only
    // where the JSON that keeps it is written.
    let host_costs = if leader && opts.json.is_some() {
        host_costs::measure(comms[0].stream())?
    } else {
        Value::Null
    };
    for &c in &opts.ops {
        if leader {
            print_header(c);
        }
        for &bytes in &sizes {
            step += 1;
            let Some(shape) = c.shape(bytes, std::mem::size_of::<T>(), n) else {
                continue;
            };
            if leader && !opts.quiet {
                eprintln!(
                    "bench: [{step}/{total}] {} {} ({:.1} s)",
                    c.name(),
                    human(shape.bytes),
                    started.elapsed().as_secs_f64()
                );
            }
            d.prepare(&shape)?;
            let mut rows: Vec<Row> = opts.layers.iter().map(|&l| Row::new(l)).collect();
            for &in_place in &placements {
                if in_place && !c.has_in_place() {
                    continue;
                }
                let spec = Spec {
                    coll: c,
                    shape,
                    in_place,
                    op,
                    root: opts.root.min(n - 1),
                };
                let mut times: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
                let mut issues: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
                let mut allocs = vec![(0f64, 0f64); rows.len()];
                for round in 0..opts.rounds {
                    // Each round starts one layer later, so that no layer
                    // always runs first (on a GPU just idle) or last.
                    for k in 0..rows.len() {
                        let i = (k + round) % rows.len();
                        let row = &rows[i];
                        let s = d.measure(row.layer, &spec, opts.graph)?;
                        times[i].push(s.seconds);
                        issues[i].push(s.issue_seconds * 1e6);
                        allocs[i].0 = allocs[i].0.max(s.allocs_per_call);
                        allocs[i].1 = allocs[i].1.max(s.allocs_per_call_thread);
                    }
                }
                for (i, row) in rows.iter_mut().enumerate() {
                    let wrong = d.check(row.layer, &spec)?;
                    // In round order (the median sorts): the report pairs
                    // the layers round by round.
                    let rounds_us: Vec<f64> = times[i].iter().map(|s| s * 1e6).collect();
                    let result = Measured {
                        seconds: median(&mut times[i]),
                        wrong,
                        allocs_per_call: allocs[i].0,
                        allocs_per_call_thread: allocs[i].1,
                    };
                    let mut rec = record::<T>(opts, n, &spec, row.layer, &result);
                    rec["rounds_us"] = json!(rounds_us);
                    // The host's part: the issuing loop alone, per call
                    // (NaN, written as null, for graph replays).
                    rec["issue_rounds_us"] = json!(issues[i]);
                    rec["issue_us"] = json!(median(&mut issues[i]));
                    records.push(rec);
                    row.set(in_place, result);
                }
            }
            if leader {
                for row in &rows {
                    print_row::<T>(&spec_line(c, &shape, op, opts.root.min(n - 1)), row, n, c);
                }
            }
        }
    }
    if leader {
        let wrong: u64 = records
            .iter()
            .filter_map(|r| r["wrong"].as_u64())
            .sum::<u64>();
        println!("# wrong elements in total: {wrong}");
        if let Some(path) = &opts.json {
            let doc = json!({
                "meta": meta::<T>(opts, comms, n, dist_watchdog, host_costs)?,
                "results": records,
            });
            std::fs::write(path, serde_json::to_string_pretty(&doc)?)
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            eprintln!("bench: wrote {}", path.display());
        }
        if wrong > 0 {
            return Err(format!("{wrong} wrong elements").into());
        }
    }
    Ok(())
}

/// One layer's results at one size.
struct Row {
    layer: Layer,
    out_of_place: Option<Measured>,
    in_place: Option<Measured>,
}

#[derive(Clone, Copy)]
struct Measured {
    seconds: f64,
    wrong: Option<u64>,
    allocs_per_call: f64,
    allocs_per_call_thread: f64,
}

impl Row {
    fn new(layer: Layer) -> Row {
        Row {
            layer,
            out_of_place: None,
            in_place: None,
        }
    }

    fn set(&mut self, in_place: bool, m: Measured) {
        if in_place {
            self.in_place = Some(m);
        } else {
            self.out_of_place = Some(m);
        }
    }
}

/// Milliseconds since `t`.
fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spec_line(
    c: Coll,
    shape: &coll::Shape,
    op: ReduceOp,
    root: usize,
) -> (usize, usize, String, String) {
    let redop = if c.reduces() {
        coll::op_name(op)
    } else {
        "none"
    };
    let root = if c.rooted() {
        root.to_string()
    } else {
        "-1".into()
    };
    (shape.bytes, shape.elements, redop.to_string(), root)
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn print_preamble<T: Elem>(opts: &Opts, comms: &[&Comm], n: usize) -> Result<()> {
    let lib = Library::get()?;
    println!(
        "# nccl-rs bench: {} ranks, mode {}, {} communicators, {}dtype {}, op {}, iters {}, warmup {}, rounds {}{}",
        n,
        opts.mode.name(),
        if opts.nonblocking {
            "nonblocking"
        } else {
            "blocking"
        },
        if opts.graph {
            format!("CUDA graphs ({} replays), ", opts.graph_launches)
        } else {
            String::new()
        },
        T::NAME,
        opts.op,
        opts.iters,
        opts.warmup,
        opts.rounds,
        if opts.cudarc_events {
            ", cudarc event tracking on"
        } else {
            ""
        }
    );
    println!("# NCCL {}", lib.version());
    for c in comms {
        let ctx = c.stream().context();
        println!(
            "#  rank {} on GPU {} ({})",
            c.rank(),
            c.device(),
            ctx.name().unwrap_or_else(|_| "?".into())
        );
    }
    Ok(())
}

fn print_header(c: Coll) {
    println!("#");
    println!("# {}", c.name());
    println!(
        "# {:>12} {:>12} {:>7} {:>6} {:>4} {:>5}   {:>10} {:>8} {:>8} {:>6}   {:>10} {:>8} {:>8} {:>6}   {:>7}",
        "size(B)",
        "count",
        "type",
        "redop",
        "root",
        "layer",
        "time(us)",
        "algbw",
        "busbw",
        "#wrong",
        "time(us)",
        "algbw",
        "busbw",
        "#wrong",
        "allocs"
    );
    println!(
        "# {:>51}   {:^36}   {:^36}   {:>7}",
        "", "out-of-place", "in-place", "/call"
    );
}

fn print_row<T: Elem>(line: &(usize, usize, String, String), row: &Row, n: usize, c: Coll) {
    let (bytes, count, redop, root) = line;
    let cell = |m: &Option<Measured>| match m {
        None => format!("{:>10} {:>8} {:>8} {:>6}", "n/a", "", "", ""),
        Some(m) => {
            let algbw = *bytes as f64 / m.seconds / 1e9;
            format!(
                "{:>10.2} {:>8.2} {:>8.2} {:>6}",
                m.seconds * 1e6,
                algbw,
                algbw * c.bus_factor(n),
                m.wrong.map_or("-".to_string(), |w| w.to_string())
            )
        }
    };
    let allocs = [row.out_of_place, row.in_place]
        .iter()
        .flatten()
        .map(|m| m.allocs_per_call)
        .fold(0.0, f64::max);
    println!(
        "  {:>12} {:>12} {:>7} {:>6} {:>4} {:>5}   {}   {}   {:>7.2}",
        bytes,
        count,
        T::NAME,
        redop,
        root,
        row.layer.name(),
        cell(&row.out_of_place),
        cell(&row.in_place),
        allocs
    );
    let _ = std::io::stdout().flush();
}

fn record<T: Elem>(opts: &Opts, n: usize, spec: &Spec, layer: Layer, m: &Measured) -> Value {
    let algbw = spec.shape.bytes as f64 / m.seconds / 1e9;
    json!({
        "mode": opts.mode.name(),
        "graph": opts.graph,
        "cudarc_events": opts.cudarc_events,
        "nonblocking": opts.nonblocking,
        "ranks": n,
        "coll": spec.coll.name(),
        "bytes": spec.shape.bytes,
        "count": spec.shape.elements,
        "dtype": T::NAME,
        "redop": if spec.coll.reduces() { coll::op_name(spec.op) } else { "none" },
        "root": if spec.coll.rooted() { spec.root as i64 } else { -1 },
        "layer": layer.name(),
        "in_place": spec.in_place,
        "time_us": m.seconds * 1e6,
        "algbw_gbs": algbw,
        "busbw_gbs": algbw * spec.coll.bus_factor(n),
        "wrong": m.wrong,
        "allocs_per_call": m.allocs_per_call,
        "allocs_per_call_thread": m.allocs_per_call_thread,
    })
}

fn meta<T: Elem>(
    opts: &Opts,
    comms: &[&Comm],
    n: usize,
    dist_watchdog: bool,
    host_costs: Value,
) -> Result<Value> {
    let lib = Library::get()?;
    let gpus: Vec<String> = comms
        .iter()
        .map(|c| c.stream().context().name().unwrap_or_default())
        .collect();
    Ok(json!({
        "nccl": lib.version().to_string(),
        "ranks": n,
        "gpus_of_leader_thread": gpus,
        "mode": opts.mode.name(),
        "dtype": T::NAME,
        "op": opts.op,
        "iters": opts.iters,
        "warmup": opts.warmup,
        "rounds": opts.rounds,
        "min_ms": opts.min_ms,
        "nonblocking": opts.nonblocking,
        "graph": opts.graph,
        "graph_launches": opts.graph_launches,
        "cudarc_events": opts.cudarc_events,
        "check": format!("{:?}", opts.check).to_lowercase(),
        "layers": opts.layers.iter().map(|l| l.name()).collect::<Vec<_>>(),
        "raw_safe_comm": if opts.nonblocking { "nonblocking_config(), no watchdog" } else { "Config::new() (NCCL's blocking defaults), no watchdog" },
        "dist_comm": if opts.nonblocking { "World with WorldOptions::new().config(nonblocking_config())" } else { "World with WorldOptions::new() (defaults)" },
        "dist_watchdog": dist_watchdog,
        "allocs_counted_on": "every thread of the process",
        "host_costs_ns": host_costs,
    }))
}
