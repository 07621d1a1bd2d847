//! The summary figures and the targets they are held to: the flat
//! `summary` object of `bench.json` and the targets table of the report.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::Result;
use crate::bench::json::{f, results, s, same};

mod stats;
pub use stats::{
    at_least, at_most, human, large_busbw_ratio, least, paired_excess, paired_step_ratio,
    point_label, small_points, smallest, upper_median, worst,
};

/// The median over a set-up document's warm reps of `key`, and how many.
fn warm_median(doc: &Value, key: &str) -> Option<(f64, usize)> {
    let warm: Vec<f64> = doc["setup"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| s(r, "state") == "warm")
        .map(|r| f(r, key))
        .collect();
    let n = warm.len();
    Some((upper_median(warm)?, n))
}

/// One figure of the targets table.
pub struct Target {
    key: &'static str,
    /// `None`: the phase that measures it did not run.
    value: Option<(f64, String)>,
    limit: f64,
    unit: &'static str,
    /// What produces it, for the "not measured" line.
    phase: &'static str,
    /// The limit is a floor (the value must be at least it), not a
    /// ceiling.
    floor: bool,
}

impl Target {
    /// A figure held to at most `limit`.
    fn ceiling(
        key: &'static str,
        value: Option<(f64, String)>,
        limit: f64,
        unit: &'static str,
        phase: &'static str,
    ) -> Target {
        Target {
            key,
            value,
            limit,
            unit,
            phase,
            floor: false,
        }
    }

    /// Whether `v` meets the limit (NaN: never).
    fn meets(&self, v: f64) -> bool {
        if self.floor {
            at_least(v, self.limit)
        } else {
            at_most(v, self.limit)
        }
    }

    /// Met only when measured and within the limit (NaN: not met).
    fn met(&self) -> bool {
        self.value.as_ref().is_some_and(|(v, _)| self.meets(*v))
    }

    /// `v` as the report shows it: rounding never turns a miss into a hit.
    fn shown(&self, v: f64) -> String {
        shown_by(v, |x| self.meets(x))
    }
}

/// The modes whose latency jobs count for the targets: a thread and a
/// process per GPU, blocking.
pub const TARGET_MODES: &[&str] = &["threads", "processes"];

/// The summary figures (see the module docs and `docs/bench/README.md`):
///
/// - `default_minus_raw_small_us_max`: the largest, over every collective,
///   size ≤ 1 KiB and placement of the latency jobs in threads and
///   processes mode, of the dist layer's µs per call (the world made
///   with default options) minus raw's, measured in the same run: the
///   median over rounds of each round's difference ([`paired_excess`]).
/// - `watchdog_overhead_us`: the largest, over collectives and those
///   modes, of `safe_wd − safe` (µs per call, paired by round as above)
///   at each collective's smallest size, out of place: the same
///   communicator with and without the watchdog's observer, interleaved.
/// - `default_step_over_raw`: the largest over the step jobs (threads,
///   processes) of default step / raw step, paired by round
///   ([`paired_step_ratio`]); `default_step_over_raw_medians` beside it
///   (not a target) is the ratio of the two medians, as reports before
///   session ten took it; `default_step_raw_us` beside it (not a target)
///   is raw's µs per step in the same job, which tells a host-bound run
///   from a GPU-bound one.
/// - `await_minus_sync_small_us`: from the async phase, `.await`ing an
///   8 B all_reduce's completion future in a tokio runtime minus a
///   blocking stream sync (its `await_small_us`, `sync_small_us`,
///   `await_spin_minus_sync_small_us`, `wait_minus_sync_small_us`, `poll_minus_sync_small_us`,
///   `await_cold_small_us`, `waker_cpu_share` and
///   `requests_per_s_64_in_flight` are copied beside it, not targets).
/// - `setup_ms`: from the setup phase, per blocking mode (single,
///   threads, processes) the median over the warm reps of `DeviceMesh::new`
///   plus the first all_reduce on each axis (the slowest rank's own
///   total; the bench's `mesh_and_first_all_reduces_ms`); the worst mode.
/// - `small_allreduce_over_nccl_2mib`: from the small phase, ours with
///   symmetric buffers over raw NCCL's default, all_reduce of 2 MiB of
///   bf16 (medians of interleaved rounds, slowest rank).
/// - `small_allreduce_over_torch_symm_max` (with `--python`): the largest,
///   over bf16 sizes of 8 B to 4 MiB and over our modes (a thread and a
///   process per GPU, where each ran), of ours with symmetric buffers over
///   the better of PyTorch's symmetric-memory one-shot and two-shot
///   all-reduce in the same run (NaN, a miss, where PyTorch gave none);
///   each mode's own is `small_allreduce_over_torch_symm_max_threads` and
///   `_processes` (not targets).
/// - `small_wrong`: the small phase's wrong elements over every size,
///   type and way (bit-exact expected), PyTorch's rows (`--python`)
///   included.
/// - `recover_ms`: from the recover phase (the last rank lost on
///   purpose), the median over reps of the slowest survivor's time from
///   the loss known to the first all-reduce done on the world
///   `World::recover` made; the slower of the modes that ran: a thread
///   per GPU (job `recover-threads`, its reps) and a process per GPU
///   (jobs `recover-processes-N`, a rep a launch). Each mode's own is
///   `recover_ms_threads` and `recover_ms_processes` (not targets).
/// - `recover_give_up_ms` (not a target): the median over reps of the
///   slowest survivor's span `nccl.recover_give_up`, the wait until
///   NCCL's aborts of the old world's communicators are done: from the
///   job `recover-threads-give-up` where it ran, else (runs from before
///   recovery by shrink was the default) of `recover_ms`.
/// - `recover_by_shrink_ms` (not a target): as `recover_ms`, from the
///   job `recover-threads-shrink` (`WorldOptions::recover_by_shrink`, in
///   runs from when it was opt-in).
/// - `recover_without_shrink_ms` (not a target): as `recover_ms`, from
///   the job `recover-threads-give-up` (`recover_by_shrink(false)`: the
///   old world aborted and given up).
/// - `mesh_over_torch`, `world_over_torch` (with `--python`): processes
///   mode's warm median of mesh + first call per axis, and of the world's
///   init (the median of the `setup-processes-fresh-*` jobs' first world
///   in a fresh process where they ran), over PyTorch's (`init_device_mesh` and the first all_reduce
///   per axis; `init_process_group` with `device_id`) in the same run.
/// - `ready_over_torch` (with `--python`, not a target): the fresh
///   world's init plus the warm mesh and first calls (processes) over
///   PyTorch's `init_process_group` plus `init_device_mesh` and first
///   calls, so that moving the connection from one phase to the other
///   shows as what it is.
/// - `graph_single_minus_threads_us`: the safe layer's 8 B all_reduce
///   replayed from a CUDA graph, one thread capturing every GPU minus a
///   thread per GPU (the `graph` phase's two jobs); missing when either
///   job gave no such result (a capture that failed).
/// - `step_over_torch` (with `--python`): the processes step job's median
///   default step over PyTorch's same step (`torch-step`), same run.
/// - `busbw_large_over_raw_min`: from the sweep (a thread per GPU), the
///   least busbw of the safe and dist layers over raw's at the same size
///   and placement (each paired by round: the median of raw's time over
///   the layer's, round by round), over every collective and size from
///   128 MiB up; a floor (≥ 0.99), unlike the others.
/// - `allocs_per_call_max`: the most heap allocations per call, counted
///   on every thread of the process during the timed calls, in any
///   measurement of any phase, and per NCCL call of the default step.
pub fn summary(docs: &BTreeMap<String, Value>) -> (Value, Vec<Target>) {
    let latency: Vec<(&str, &Value)> = TARGET_MODES
        .iter()
        .filter_map(|m| docs.get(&format!("latency-{m}")).map(|d| (*m, d)))
        .collect();
    let measured = |v: Option<(f64, String)>, ran: bool| {
        if ran {
            // The phase ran but gave nothing to compare: a NaN, never a hit.
            Some(v.unwrap_or((f64::NAN, "no records to compare".into())))
        } else {
            None
        }
    };

    let small = worst(latency.iter().flat_map(|(mode, doc)| {
        small_points(doc, "dist")
            .into_iter()
            .map(|(v, r)| (v, point_label(mode, r)))
    }));

    let watchdog = worst(latency.iter().flat_map(|(mode, doc)| {
        smallest(doc, "safe_wd")
            .into_iter()
            .map(|(coll, on)| {
                let over = results(doc)
                    .find(|q| s(q, "layer") == "safe" && same(q, on))
                    .map_or(f64::NAN, |off| paired_excess(on, off));
                (
                    over,
                    format!("{mode} {coll} {}", human(on["bytes"].as_u64().unwrap_or(0))),
                )
            })
            .collect::<Vec<_>>()
    }));

    let steps: Vec<(&str, &Value)> = TARGET_MODES
        .iter()
        .filter_map(|m| docs.get(&format!("step-{m}")).map(|d| (*m, d)))
        .collect();
    let step = worst(
        steps
            .iter()
            .map(|(mode, d)| (paired_step_ratio(&d["step"]), mode.to_string())),
    );
    // The ratio of the sides' medians, as earlier reports took it (not a
    // target: one side's median can fall in a fast stretch and the other's
    // in a slow one).
    // Raw's µs per step in the job `default_step_over_raw` comes from
    // (not a target): which of the step's two speeds the run got (host- or
    // GPU-bound, `docs/bench/README.md`, "Build profile").
    let step_raw_us = step.as_ref().and_then(|(_, at)| {
        steps
            .iter()
            .find(|(mode, _)| mode == at)
            .map(|(mode, d)| (f(&d["step"], "raw_us"), mode.to_string()))
    });
    let step_medians = worst(
        steps
            .iter()
            .map(|(mode, d)| (f(&d["step"], "default_over_raw"), mode.to_string())),
    );

    let allocs = worst(
        docs.iter()
            .flat_map(|(name, doc)| {
                results(doc).map(move |r| {
                    (
                        f(r, "allocs_per_call"),
                        format!(
                            "{name} {} {} {}",
                            s(r, "layer"),
                            s(r, "coll"),
                            human(r["bytes"].as_u64().unwrap_or(0))
                        ),
                    )
                })
            })
            .chain(steps.iter().map(|(mode, d)| {
                (
                    f(&d["step"], "allocs_per_call_default"),
                    format!("step-{mode} default step"),
                )
            })),
    );
    let any_results = docs.values().any(|d| results(d).next().is_some()) || !steps.is_empty();
    // The async phase's own summary (one thread, every GPU): awaiting a
    // small all_reduce against a blocking sync.
    let awaited = docs
        .iter()
        .filter(|(name, _)| name.starts_with("async-"))
        .map(|(name, d)| (name.as_str(), &d["summary"]))
        .collect::<Vec<_>>();
    let await_excess = worst(awaited.iter().map(|(name, sum)| {
        (
            f(sum, "await_minus_sync_small_us"),
            format!("{name} all_reduce 8 B"),
        )
    }));

    // Set-up: per blocking mode, the median of the warm reps' mesh +
    // first call per axis (slowest rank); the worst mode.
    let setups: Vec<(&str, &Value)> = ["single", "threads", "processes"]
        .iter()
        .filter_map(|m| docs.get(&format!("setup-{m}")).map(|d| (*m, d)))
        .collect();
    let setup = worst(setups.iter().filter_map(|(mode, d)| {
        let (median, reps) = warm_median(d, "mesh_and_first_all_reduces_ms")?;
        Some((median, format!("setup-{mode}, median of {reps} warm reps")))
    }));
    // Over PyTorch's (`--python`): processes, warm medians, same run.
    let torch = docs.get("setup-torch");
    let over_torch = |key: &str| {
        let ours = warm_median(docs.get("setup-processes")?, key)?.0;
        let theirs = warm_median(torch?, key)?.0;
        Some((
            ours / theirs,
            format!("setup-processes {ours:.1} ms over setup-torch {theirs:.1} ms, warm medians"),
        ))
    };
    // Our default step (processes) over PyTorch's, same run.
    let torch_step = docs.get("torch-step");
    let step_over_torch = (|| {
        let ours = f(&docs.get("step-processes")?["step"], "default_us");
        let theirs = f(&torch_step?["step"], "torch_us");
        Some((
            ours / theirs,
            format!("step-processes default {ours:.2} µs over torch-step {theirs:.2} µs"),
        ))
    })();
    let mesh_over_torch = over_torch("mesh_and_first_all_reduces_ms");
    // The 8 B all_reduce replayed from a graph: one thread capturing every
    // GPU against a thread per GPU, the safe layer, out of place.
    let graph_docs = [docs.get("graph-single"), docs.get("graph-threads")];
    let graph_us = |doc: Option<&Value>| {
        results(doc?)
            .find(|r| {
                s(r, "layer") == "safe"
                    && s(r, "coll") == "all_reduce"
                    && r["bytes"] == 8
                    && r["in_place"] == false
            })
            .map(|r| f(r, "time_us"))
    };
    let graph_single = match graph_docs {
        [Some(_), Some(_)] => Some(match (graph_us(graph_docs[0]), graph_us(graph_docs[1])) {
            (Some(single), Some(threads)) => (
                single - threads,
                format!("graph-single {single:.2} µs minus graph-threads {threads:.2} µs"),
            ),
            _ => (f64::NAN, "no 8 B safe all_reduce in both graph jobs".into()),
        }),
        _ => None,
    };
    // The world like for like: a fresh process's first `World::init`
    // (`setup-processes-fresh-*`, timed from after its CUDA context) over
    // PyTorch's warm reps (each a fresh launch, context made first); else
    // our warm reps, which reuse a process that made a world before.
    let fresh: Vec<f64> = docs
        .iter()
        .filter(|(k, _)| k.starts_with("setup-processes-fresh-"))
        .flat_map(|(_, d)| d["setup"].as_array().into_iter().flatten())
        .filter(|r| s(r, "state") == "fresh")
        .map(|r| f(r, "world_ms"))
        .collect();
    let fresh_count = fresh.len();
    let fresh_world = upper_median(fresh.clone());
    // From nothing to a mesh whose axes have run once, like for like (not
    // a target): where the world's connection is counted (`World::init`
    // makes it unless lazy; PyTorch at its first collective) cannot move
    // this sum.
    let ready_over_torch = (|| {
        let ours = fresh_world?
            + warm_median(
                docs.get("setup-processes")?,
                "mesh_and_first_all_reduces_ms",
            )?
            .0;
        let torch = torch?;
        let theirs = warm_median(torch, "world_ms")?.0
            + warm_median(torch, "mesh_and_first_all_reduces_ms")?.0;
        Some((
            ours / theirs,
            format!(
                "fresh world + warm mesh and first calls, processes: {ours:.1} ms over PyTorch's {theirs:.1} ms"
            ),
        ))
    })();
    let world_over_torch = match (fresh_world, torch) {
        (Some(ours), Some(torch)) => warm_median(torch, "world_ms").map(|(theirs, _)| {
            (
                ours / theirs,
                format!(
                    "setup-processes-fresh {ours:.1} ms (median of {fresh_count} fresh processes) over setup-torch {theirs:.1} ms (warm median)"
                ),
            )
        }),
        _ => over_torch("world_ms"),
    };
    // Small messages: ours with symmetric buffers over raw NCCL's default
    // at 2 MiB bf16, and the wrong elements over every row.
    let small_doc = docs.get("small-threads");
    let small_row = |way: &str| {
        small_doc?["small"]
            .as_array()?
            .iter()
            .find(|r| s(r, "layer") == way && s(r, "dtype") == "bf16" && r["bytes"] == 2 << 20)
    };
    let small_over_nccl = small_doc.map(|_| match (small_row("symmetric"), small_row("raw")) {
        (Some(sym), Some(raw)) => {
            let (a, b) = (f(sym, "time_us"), f(raw, "time_us"));
            (
                a / b,
                format!("small-threads bf16 2 MiB: symmetric {a:.2} µs over raw {b:.2} µs"),
            )
        }
        _ => (f64::NAN, "no bf16 2 MiB rows".into()),
    });
    // Over PyTorch's better symmetric-memory all-reduce (one-shot or
    // two-shot), bf16, 8 B to 4 MiB: the largest ratio over the sizes, in
    // each mode of ours that ran (`None` where it did not), and the worse.
    let small_torch = docs.get("small-torch");
    let over_torch_in = |job: &str| -> Option<(f64, String)> {
        let torch = small_torch?;
        let rows = docs.get(job)?["small"].as_array()?;
        let theirs = torch["small"].as_array();
        let ratios: Vec<(f64, String)> = rows
            .iter()
            .filter(|r| {
                s(r, "layer") == "symmetric"
                    && s(r, "dtype") == "bf16"
                    && r["bytes"].as_u64().is_some_and(|b| b <= 4 << 20)
            })
            .map(|r| {
                let best = theirs
                    .into_iter()
                    .flatten()
                    .filter(|t| {
                        s(t, "dtype") == "bf16"
                            && t["bytes"] == r["bytes"]
                            && matches!(s(t, "layer"), "torch_one_shot" | "torch_two_shot")
                    })
                    .filter_map(|t| t["time_us"].as_f64())
                    .fold(f64::INFINITY, f64::min);
                let ours = f(r, "time_us");
                let ratio = if best.is_finite() {
                    ours / best
                } else {
                    f64::NAN
                };
                (
                    ratio,
                    format!(
                        "{job} bf16 {} B: symmetric {ours:.2} µs over PyTorch's best {best:.2} µs",
                        r["bytes"]
                    ),
                )
            })
            .collect();
        // A size PyTorch gave nothing for is a miss (NaN), else the worst.
        let missing = ratios.iter().find(|(r, _)| r.is_nan()).cloned();
        Some(
            missing
                .or_else(|| ratios.into_iter().max_by(|a, b| a.0.total_cmp(&b.0)))
                .unwrap_or((
                    f64::NAN,
                    format!("{job}: no bf16 rows of 8 B to 4 MiB on both sides"),
                )),
        )
    };
    let small_over_torch_modes = [
        ("threads", over_torch_in("small-threads")),
        ("processes", over_torch_in("small-processes")),
    ];
    let small_over_torch = small_torch.map(|_| {
        // A NaN (a miss) is the worst.
        worst(small_over_torch_modes.iter().filter_map(|(_, v)| v.clone()))
            .unwrap_or((f64::NAN, "no small-threads or small-processes rows".into()))
    });
    let small_wrong = small_doc.map(|_| {
        let total: f64 = [small_doc, docs.get("small-processes"), small_torch]
            .into_iter()
            .flatten()
            .flat_map(|d| d["small"].as_array().into_iter().flatten())
            .map(|r| r["wrong"].as_f64().unwrap_or(0.0))
            .sum();
        (
            total,
            "small-threads, small-processes and small-torch, every row".to_string(),
        )
    });
    // The median over the recover phase's reps of one figure of the
    // slowest survivor's, and how many reps gave it.
    // A process per GPU: one rep a launch (`recover-processes-0`, `-1`,
    // ...).
    let process_docs: Vec<&Value> = docs
        .iter()
        .filter(|(name, _)| name.starts_with(super::LOST_LAST))
        .map(|(_, d)| d)
        .collect();
    let recover_ran = docs.contains_key("recover-threads") || !process_docs.is_empty();
    let over_reps = |job: &str, value: &dyn Fn(&Value) -> Option<f64>| {
        let reps = docs.get(job).and_then(|d| d["recover"].as_array())?;
        let all: Vec<f64> = reps.iter().filter_map(value).collect();
        let n = all.len();
        upper_median(all).map(|median| (median, n))
    };
    // From a loss known to the first all-reduce done on the recovered
    // world (a rep without it counts, as a NaN).
    let first_done = |r: &Value| Some(f(r, "recover_and_first_all_reduce_ms"));
    let recover_threads = over_reps("recover-threads", &first_done)
        .map(|(ms, reps)| (ms, format!("recover-threads, median of {reps} reps")));
    // The launches' rows together.
    let process_reps: Vec<f64> = process_docs
        .iter()
        .flat_map(|d| d["recover"].as_array().into_iter().flatten())
        .filter_map(first_done)
        .collect();
    let launches = process_reps.len();
    let recover_processes = upper_median(process_reps).map(|ms| {
        (
            ms,
            format!("recover-processes, median of {launches} launches"),
        )
    });
    // The target's figure: the slower mode's.
    let recover = worst(
        [recover_threads.clone(), recover_processes.clone()]
            .into_iter()
            .flatten(),
    );
    // The same with recovery by shrink asked for (while it was opt-in),
    // and without it (since it is the default): not the target's key.
    let recover_by_shrink = over_reps("recover-threads-shrink", &first_done).map(|(ms, _)| ms);
    let recover_without_shrink =
        over_reps("recover-threads-give-up", &first_done).map(|(ms, _)| ms);
    // Giving the old world up (NCCL's aborts of its communicators, waited
    // for): the span, from the job that gives it up where it ran (since
    // recovery by shrink is the default), else from the default's (runs
    // from before, where it was part of `recover_ms`).
    let give_up_span = |r: &Value| r["spans"]["nccl.recover_give_up"].as_f64();
    let recover_give_up = over_reps("recover-threads-give-up", &give_up_span)
        .or_else(|| over_reps("recover-threads", &give_up_span))
        .map(|(ms, _)| ms);

    // Bandwidth at 128 MiB and above (a thread per GPU): the least of the
    // safe and dist layers' busbw over raw's, over every collective.
    let sweep = docs.get("sweep-threads");
    let busbw = sweep.map(|doc| {
        let rs: Vec<&Value> = results(doc).collect();
        let mut colls: Vec<&str> = rs.iter().map(|r| s(r, "coll")).collect();
        colls.dedup();
        least(
            colls
                .iter()
                .flat_map(|c| ["safe", "dist"].map(|l| large_busbw_ratio(&rs, c, l)))
                .flatten(),
        )
        .unwrap_or((f64::NAN, "no sizes of 128 MiB or more".into()))
    });

    let mut targets = vec![
        Target::ceiling(
            "setup_ms",
            measured(setup, !setups.is_empty()),
            60.0,
            "ms",
            "setup",
        ),
        Target::ceiling(
            "small_allreduce_over_nccl_2mib",
            small_over_nccl,
            0.6,
            "",
            "small",
        ),
        Target::ceiling(
            "small_allreduce_over_torch_symm_max",
            small_over_torch,
            1.0,
            "",
            "small with --python",
        ),
        Target::ceiling("small_wrong", small_wrong, 0.0, "", "small"),
        Target::ceiling(
            "recover_ms",
            measured(recover, recover_ran),
            150.0,
            "ms",
            "recover",
        ),
        Target::ceiling(
            "mesh_over_torch",
            measured(mesh_over_torch, torch.is_some()),
            0.5,
            "",
            "setup with --python",
        ),
        Target::ceiling(
            "world_over_torch",
            measured(world_over_torch, torch.is_some()),
            1.0,
            "",
            "setup with --python",
        ),
        Target::ceiling(
            "step_over_torch",
            measured(step_over_torch, torch_step.is_some()),
            0.33,
            "",
            "step with --python",
        ),
        Target::ceiling(
            "graph_single_minus_threads_us",
            measured(graph_single, graph_docs.iter().any(Option::is_some)),
            0.5,
            "µs",
            "graph",
        ),
        Target::ceiling(
            "default_minus_raw_small_us_max",
            measured(small, !latency.is_empty()),
            0.5,
            "µs",
            "latency",
        ),
        Target::ceiling(
            "default_step_over_raw",
            measured(step, !steps.is_empty()),
            1.02,
            "",
            "step",
        ),
        Target::ceiling(
            "watchdog_overhead_us",
            measured(watchdog, !latency.is_empty()),
            0.5,
            "µs",
            "latency",
        ),
        Target::ceiling(
            "await_minus_sync_small_us",
            measured(await_excess, !awaited.is_empty()),
            5.0,
            "µs",
            "async",
        ),
        Target::ceiling(
            "allocs_per_call_max",
            measured(allocs, any_results),
            0.0,
            "",
            "any",
        ),
    ];
    targets.push(Target {
        floor: true,
        ..Target::ceiling("busbw_large_over_raw_min", busbw, 0.99, "", "sweep")
    });
    let mut flat = serde_json::Map::new();
    for t in &targets {
        // serde_json writes a NaN as null: a figure that could not be had.
        flat.insert(t.key.into(), json!(t.value.as_ref().map(|(v, _)| *v)));
        flat.insert(
            format!("{}_at", t.key),
            json!(t.value.as_ref().map(|(_, at)| at.clone())),
        );
        flat.insert(format!("{}_target", t.key), json!(t.limit));
        // Whether the target is a floor (at least it) or, as for most, a
        // ceiling (at most it).
        flat.insert(format!("{}_floor", t.key), json!(t.floor));
        flat.insert(format!("{}_met", t.key), json!(t.met()));
    }
    // What the async phase reports beside its target (not targets).
    for key in [
        "await_small_us",
        "sync_small_us",
        "await_spin_minus_sync_small_us",
        "wait_minus_sync_small_us",
        "poll_minus_sync_small_us",
        "await_cold_small_us",
        "waker_cpu_share",
        "requests_per_s_64_in_flight",
    ] {
        if let Some((_, sum)) = awaited.first() {
            flat.insert(key.into(), sum[key].clone());
        }
    }
    if let Some((us, at)) = &step_raw_us {
        flat.insert("default_step_raw_us".into(), json!(us));
        flat.insert("default_step_raw_us_at".into(), json!(at));
    }
    if let Some((ratio, at)) = &step_medians {
        flat.insert("default_step_over_raw_medians".into(), json!(ratio));
        flat.insert("default_step_over_raw_medians_at".into(), json!(at));
    }
    if let Some((ms, _)) = &recover_threads {
        flat.insert("recover_ms_threads".into(), json!(ms));
    }
    if let Some((ms, _)) = &recover_processes {
        flat.insert("recover_ms_processes".into(), json!(ms));
    }
    if let Some(ms) = recover_by_shrink {
        flat.insert("recover_by_shrink_ms".into(), json!(ms));
    }
    if let Some(ms) = recover_without_shrink {
        flat.insert("recover_without_shrink_ms".into(), json!(ms));
    }
    if let Some(ms) = recover_give_up {
        flat.insert("recover_give_up_ms".into(), json!(ms));
    }
    if let Some((ratio, at)) = &ready_over_torch {
        flat.insert("ready_over_torch".into(), json!(ratio));
        flat.insert("ready_over_torch_at".into(), json!(at));
    }
    // The small phase's ratio over PyTorch in each mode (not targets).
    for (mode, v) in &small_over_torch_modes {
        flat.insert(
            format!("small_allreduce_over_torch_symm_max_{mode}"),
            json!(v.as_ref().map(|(r, _)| *r)),
        );
    }
    flat.insert("targets_met".into(), json!(targets.iter().all(Target::met)));
    (Value::Object(flat), targets)
}

/// A difference with a sign, two decimals where they tell hit from miss.
pub fn signed(v: f64, limit: f64) -> String {
    let short = format!("{v:+.2}");
    match short.parse::<f64>() {
        Ok(r) if at_most(r, limit) != at_most(v, limit) => format!("{v:+}"),
        _ => short,
    }
}

/// Shows a value so that rounding never makes a miss look like a hit
/// (`hit` tells one).
fn shown_by(v: f64, hit: impl Fn(f64) -> bool) -> String {
    let short = format!("{v:.3}");
    match short.parse::<f64>() {
        // The shortest text that reads back as exactly `v`.
        Ok(r) if hit(r) != hit(v) => format!("{v}"),
        _ => short,
    }
}

pub fn targets_section(
    md: &mut String,
    targets: &[Target],
    misses: &mut Vec<String>,
) -> Result<()> {
    writeln!(
        md,
        "## Targets
"
    )?;
    writeln!(
        md,
        "Each figure from this run (`summary` in `bench.json`; how each is computed: `docs/bench/README.md`).
"
    )?;
    writeln!(
        md,
        "| key | value | target | met | where (the worst case) |"
    )?;
    writeln!(md, "|---|---|---|---|---|")?;
    for t in targets {
        let (value, met, at) = match &t.value {
            None => (
                "not measured".to_string(),
                format!("not measured (phase {} not run)", t.phase),
                String::new(),
            ),
            Some((v, at)) if v.is_nan() => {
                misses.push(format!("{}: could not be computed ({at})", t.key));
                ("missing".to_string(), "**not met**".to_string(), at.clone())
            }
            Some((v, at)) => {
                let met = t.met();
                let beyond = if t.floor { "<" } else { ">" };
                if !met {
                    misses.push(format!("{} = {} {beyond} {}", t.key, t.shown(*v), t.limit));
                }
                (
                    format!("{} {}", t.shown(*v), t.unit),
                    if met { "met" } else { "**not met**" }.to_string(),
                    at.clone(),
                )
            }
        };
        writeln!(
            md,
            "| `{}` | {value} | {} {} {} | {met} | {at} |",
            t.key,
            if t.floor { "≥" } else { "≤" },
            t.limit,
            t.unit
        )?;
    }
    writeln!(md)?;
    Ok(())
}

#[cfg(test)]
mod tests;
