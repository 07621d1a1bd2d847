//! `--setup`: how long it takes from nothing to a usable mesh. Each
//! repetition makes the world (communicator init), a 2-D `DeviceMesh`
//! (`dp` × `tp`, 2 × 2 on 4 GPUs) and a first one-element all-reduce on
//! each axis; the first repetition also pays for CUDA context creation
//! (cold), the later ones do not (warm). Each phase's time is the slowest
//! rank's; so is mesh + first calls, taken on each rank before the
//! maximum (a rank done with its mesh early waits for the others in its
//! first call, so the phases' maxima, kept as `phase_maxima_sum_ms`, can
//! add up to more than any rank took).
//!
//! Each repetition also breaks the set-up down by the crates' `tracing`
//! spans (`spans.rs`): library load, rendezvous, communicator init, splits
//! the topology probe, the connection gates and the world's connection
//! (`WorldOptions::lazy_connect`), summed per rank (the
//! slowest rank's, or in one process the slowest thread's). They nest
//! inside world, mesh and the first calls. With a thread or a process per
//! rank, each first call is also split into making its buffer, the call
//! and the stream's synchronisation.
//!
//! `--fresh-process` (a process per rank): the first repetition is timed
//! from after the process made its CUDA context, not from process start
//! (state `fresh`): a fresh process's first world, like for like with
//! PyTorch's side, whose every rep is a fresh launch.
//!
//! With a process per rank, a warm repetition starts on every rank 2 s
//! after the ranks last met in the one before, so that the teardown of
//! the previous world (which ends at different moments on different
//! ranks) does not count as the next world's rendezvous.
//!
//! The worlds are made with default options (`WorldOptions::new()`;
//! `World::local`'s configuration in single mode), as a user gets them:
//! a nonblocking init, the blocking communicator split from it, the
//! watchdog on. `--nonblocking` passes `nonblocking_config()` instead.

use std::time::Instant;

use nccl_dist::nccl_safe::cudarc::driver::CudaContext;
use nccl_dist::nccl_safe::{Comm, Config, Library, ReduceOp, group};
use nccl_dist::{DeviceMesh, Launch, World, default_config, nonblocking_config};
use serde_json::json;

use crate::cli::{Mode, Opts};
use crate::error::{BoxError, Result};
use crate::ms;

/// The spans reported per phase: (JSON key, column, the span names summed).
const SPAN_PHASES: [(&str, &str, &[&str]); 7] = [
    ("library_load_ms", "load", &["nccl.library_load"]),
    (
        "rendezvous_ms",
        "rendezvous",
        &["nccl.rendezvous_serve", "nccl.rendezvous_join"],
    ),
    ("init_ms", "init", &["nccl.init_rank", "nccl.init_all"]),
    ("split_ms", "splits", &["nccl.split"]),
    ("topology_probe_ms", "probe", &["nccl.topology_probe"]),
    ("gate_ms", "gates", &["nccl.gate"]),
    ("connect_ms", "connect", &["nccl.connect"]),
];

/// The parts of each first call (JSON keys), per axis: the one-element
/// buffer made and filled, the all-reduce call returning, and the stream
/// synchronised.
const FIRST_PARTS: [&str; 6] = [
    "first_dp_alloc_ms",
    "first_dp_call_ms",
    "first_dp_sync_ms",
    "first_tp_alloc_ms",
    "first_tp_call_ms",
    "first_tp_sync_ms",
];

/// Milliseconds of each phase, on one rank.
#[derive(Debug, Clone, Copy, Default)]
struct Phases {
    world: f64,
    mesh: f64,
    first_dp: f64,
    first_tp: f64,
    /// This rank's mesh and first calls together. The slowest rank's is
    /// not the sum of the slowest mesh and the slowest first calls: a rank
    /// done with its mesh early waits in its first call for the others.
    total: f64,
    /// [`SPAN_PHASES`], in order.
    spans: [f64; SPAN_PHASES.len()],
    /// [`FIRST_PARTS`], in order (thread or process per rank only).
    parts: [f64; FIRST_PARTS.len()],
}

impl Phases {
    fn to_vec(self) -> Vec<f64> {
        let mut v = vec![
            self.world,
            self.mesh,
            self.first_dp,
            self.first_tp,
            self.total,
        ];
        v.extend(self.spans);
        v.extend(self.parts);
        v
    }

    /// Sets the span phases from what `spans.rs` timed since the last look.
    fn with_spans(mut self) -> Phases {
        let times = crate::spans::take();
        for (slot, (_, _, names)) in self.spans.iter_mut().zip(SPAN_PHASES) {
            *slot = names.iter().filter_map(|n| times.get(n)).sum();
        }
        self
    }
}

/// How long after the ranks last met a warm rep with a process per rank
/// starts: past the previous rep's teardown on every rank.
const ALIGN: std::time::Duration = std::time::Duration::from_secs(2);

/// `dp` × `tp` for `n` ranks: 2 × 2 on 4, `n/2` × 2 when even, else n × 1.
fn axes(n: usize) -> [(&'static str, usize); 2] {
    let tp = if n.is_multiple_of(2) { 2 } else { 1 };
    [("dp", n / tp), ("tp", tp)]
}

/// One first all-reduce per axis on one rank (thread or process per
/// rank), with its parts ([`FIRST_PARTS`]).
fn first_on_axes(mesh: &DeviceMesh, phases: &mut Phases) -> Result<()> {
    for (axis, name) in ["dp", "tp"].into_iter().enumerate() {
        let t = Instant::now();
        let comm = mesh.axis(name)?;
        let mut x = comm.stream().clone_htod(&[1f32])?;
        let made = ms(t);
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        let called = ms(t);
        comm.synchronize(comm.stream())?;
        let total = ms(t);
        *(if axis == 0 {
            &mut phases.first_dp
        } else {
            &mut phases.first_tp
        }) = total;
        phases.parts[3 * axis..3 * axis + 3].copy_from_slice(&[
            made,
            called - made,
            total - called,
        ]);
    }
    phases.total = phases.mesh + phases.first_dp + phases.first_tp;
    Ok(())
}

/// The slowest rank's phases (max over the world), on every rank.
fn slowest(world: &Comm, p: Phases) -> Result<Phases> {
    let stream = world.stream();
    let mut buf = stream.clone_htod(&p.to_vec())?;
    world.all_reduce_in_place(&mut buf, ReduceOp::Max)?;
    world.synchronize(stream)?;
    let v = stream.clone_dtoh(&buf)?;
    let mut spans = [0.0; SPAN_PHASES.len()];
    let rest = &v[5..];
    spans.copy_from_slice(&rest[..SPAN_PHASES.len()]);
    let mut parts = [0.0; FIRST_PARTS.len()];
    parts.copy_from_slice(&rest[SPAN_PHASES.len()..]);
    Ok(Phases {
        world: v[0],
        mesh: v[1],
        first_dp: v[2],
        first_tp: v[3],
        total: v[4],
        spans,
        parts,
    })
}

/// One repetition in a thread (or process) per rank, after the world;
/// `dropped` runs once the mesh is gone. `own_spans`: this rank is the
/// process, so it reads the span times before the ranks take the slowest.
/// Also returns when the ranks met last (the slowest-rank all-reduce's
/// end).
/// `keep`: the mesh keeps the world (`DeviceMesh::from_world`, sharing
/// its communicator where the ranks are the same) instead of
/// `DeviceMesh::new`.
fn per_rank(
    world: World,
    mut p: Phases,
    own_spans: bool,
    keep: bool,
    dropped: impl Fn(),
) -> Result<(Phases, Instant)> {
    let n = world.size();
    let t = Instant::now();
    let (mesh, world) = if keep {
        (DeviceMesh::from_world(world, &axes(n))?, None)
    } else {
        (DeviceMesh::new(&world, &axes(n))?, Some(world))
    };
    p.mesh = ms(t);
    first_on_axes(&mesh, &mut p)?;
    if own_spans {
        p = p.with_spans();
    }
    let comm = world
        .as_ref()
        .or(mesh.world())
        .ok_or("the mesh kept no world")?
        .comm();
    let worst = slowest(comm, p)?;
    let met = Instant::now();
    drop(mesh);
    drop(world);
    dropped();
    Ok((worst, met))
}

/// One repetition with one thread driving every GPU.
fn single(devices: &[usize], config: &Config) -> Result<Phases> {
    let mut p = Phases::default();
    let t = Instant::now();
    let worlds = World::local_with(devices, config)?;
    p.world = ms(t);
    let n = worlds.len();
    let t = Instant::now();
    let meshes = DeviceMesh::new_all(&worlds, &axes(n), Default::default())?;
    p.mesh = ms(t);
    for (name, slot) in [("dp", &mut p.first_dp), ("tp", &mut p.first_tp)] {
        let t = Instant::now();
        let mut xs = meshes
            .iter()
            .map(|m| Ok(m.axis(name)?.stream().clone_htod(&[1f32])?))
            .collect::<Result<Vec<_>>>()?;
        group(|g| {
            for (m, x) in meshes.iter().zip(xs.iter_mut()) {
                g.on(m.axis(name).map_err(to_safe)?)
                    .all_reduce_in_place(x, ReduceOp::Sum)?;
            }
            Ok(())
        })?;
        for m in &meshes {
            let c = m.axis(name)?;
            c.synchronize(c.stream())?;
        }
        *slot = ms(t);
    }
    p.total = p.mesh + p.first_dp + p.first_tp;
    Ok(p)
}

fn to_safe(e: nccl_dist::Error) -> nccl_dist::nccl_safe::Error {
    nccl_dist::nccl_safe::Error::InvalidArgument {
        op: "bench",
        reason: if matches!(e, nccl_dist::Error::InvalidArgument { .. }) {
            "no such mesh axis"
        } else {
            "mesh axis lookup failed"
        },
    }
}

pub fn run(opts: &Opts) -> Result<()> {
    let started = Instant::now();
    if !crate::spans::install() {
        eprintln!("bench: another tracing subscriber is installed; the span phases read 0");
    }
    let mut reps = Vec::new();
    let mut leader = true;
    let mut n = 0;
    // Processes: when the ranks last met (the end of a rep's slowest-rank
    // all-reduce, the same moment on every rank to within microseconds).
    let mut met: Option<Instant> = None;
    for rep in 0..opts.setup_reps {
        let p = match opts.mode {
            Mode::Single => {
                let devices = crate::devices(opts)?;
                n = devices.len();
                let config = if opts.nonblocking {
                    nonblocking_config()
                } else {
                    default_config()
                };
                single(&devices, &config)?.with_spans()
            }
            Mode::Threads => {
                let devices = crate::devices(opts)?;
                n = devices.len();
                let t = Instant::now();
                // With a thread per GPU the threads meet on the host after
                // dropping their meshes (see `World::spawn_local_with`).
                let dropped = std::sync::Barrier::new(n);
                let options = crate::world_options(opts);
                let out = World::spawn_local_with_options(&devices, &options, |world| {
                    let p = Phases {
                        world: ms(t),
                        ..Phases::default()
                    };
                    per_rank(world, p, false, opts.mesh_keeps_world, || {
                        dropped.wait();
                    })
                    .map(|(p, _)| p)
                    .map_err(|e| nccl_dist::Error::InvalidArgument {
                        op: "bench --setup",
                        reason: e.to_string(),
                    })
                })?;
                // `world` above is each thread's own start-to-ready time;
                // every rank then agreed on the slowest. The spans: the
                // slowest thread's.
                out[0].with_spans()
            }
            Mode::Processes => {
                let launch = Launch::detect()
                    .map_err(|e| format!("--mode processes needs a launcher ({e})"))?;
                leader = launch.rank == 0;
                // A warm rep starts on every rank at once: each waits until
                // ALIGN after the ranks last met, so the previous rep's
                // teardown (which ends at different times on different
                // ranks) is not counted as the next world's rendezvous.
                if let Some(at) = met {
                    let left = (at + ALIGN).saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        eprintln!(
                            "bench: rep {rep}: the teardown outlasted {ALIGN:?}; this rep starts unaligned"
                        );
                    }
                    std::thread::sleep(left);
                }
                // The first world counts from process start: what a job
                // pays before its first collective. `--fresh-process`: from
                // after this process made its CUDA context instead (a fresh
                // process's first world, as PyTorch's side times its
                // `init_process_group`).
                let context = if rep == 0 && opts.fresh_process {
                    Some(CudaContext::new(launch.local_rank)?)
                } else {
                    None
                };
                let t = if rep == 0 && context.is_none() {
                    started
                } else {
                    Instant::now()
                };
                let world = World::init_with(launch, &crate::world_options(opts))?;
                drop(context);
                n = world.size();
                let p = Phases {
                    world: ms(t),
                    ..Phases::default()
                };
                let (worst, at) = per_rank(world, p, true, opts.mesh_keeps_world, || ())?;
                met = Some(at);
                worst
            }
        };
        reps.push(p);
    }
    if !leader {
        return Ok(());
    }
    let lib = Library::get()?;
    let [(_, dp), (_, tp)] = axes(n);
    println!(
        "# nccl-rs bench --setup: mode {}, {n} ranks, mesh dp={dp} x tp={tp}, NCCL {}",
        opts.mode.name(),
        lib.version()
    );
    println!(
        "# {:>4} {:>5} {:>12} {:>10} {:>14} {:>14} {:>18}",
        "rep", "state", "world(ms)", "mesh(ms)", "first dp(ms)", "first tp(ms)", "mesh+firsts(ms)"
    );
    let mut rows = Vec::new();
    for (i, p) in reps.iter().enumerate() {
        let state = match (i, opts.fresh_process) {
            (0, true) => "fresh",
            (0, false) => "cold",
            _ => "warm",
        };
        // The slowest rank's own total; the sum of the phases' maxima
        // (each perhaps another rank's) is kept beside it.
        let mesh_total = p.total;
        let maxima = p.mesh + p.first_dp + p.first_tp;
        println!(
            "  {:>4} {:>5} {:>12.1} {:>10.1} {:>14.1} {:>14.1} {:>18.1}",
            i, state, p.world, p.mesh, p.first_dp, p.first_tp, mesh_total
        );
        let mut row = json!({
            "rep": i,
            "state": state,
            "world_ms": p.world,
            "mesh_ms": p.mesh,
            "first_all_reduce_dp_ms": p.first_dp,
            "first_all_reduce_tp_ms": p.first_tp,
            "mesh_and_first_all_reduces_ms": mesh_total,
            "phase_maxima_sum_ms": maxima,
        });
        for ((key, _, _), ms) in SPAN_PHASES.iter().zip(p.spans) {
            row[*key] = json!(ms);
        }
        if opts.mode != Mode::Single {
            for (key, ms) in FIRST_PARTS.iter().zip(p.parts) {
                row[*key] = json!(ms);
            }
        }
        rows.push(row);
    }
    println!("# spans (ms, inside world and mesh), per rep:");
    for (i, p) in reps.iter().enumerate() {
        let cells: Vec<String> = SPAN_PHASES
            .iter()
            .zip(p.spans)
            .map(|((_, col, _), ms)| format!("{col} {ms:.1}"))
            .collect();
        let parts: Vec<String> = FIRST_PARTS
            .iter()
            .zip(p.parts)
            .map(|(key, ms)| format!("{} {ms:.2}", &key[..key.len() - 3]))
            .collect();
        println!("  {i:>4} {}; {}", cells.join(", "), parts.join(", "));
    }
    if let Some(path) = &opts.json {
        let doc = json!({
            "meta": {
                "setup": true,
                "mode": opts.mode.name(),
                "ranks": n,
                "mesh": [dp, tp],
                "nonblocking": opts.nonblocking,
                "nccl": lib.version().to_string(),
            },
            "setup": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .map_err(|e| BoxError::from(format!("writing {}: {e}", path.display())))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(())
}
