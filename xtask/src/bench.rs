//! `cargo xtask bench`: the bench (`crates/nccl-bench`) in every launch mode, one
//! report.
//!
//! ```text
//! cargo xtask bench [--gpus N] [--quick] [--phases sweep,latency,graph,events,setup,step]
//!                   [--out DIR] [--timeout SECS]
//! DIR/xtask bench --from-bundle DIR ...     # on a GPU host without cargo
//! cargo xtask bench --report DIR            # redo the report from DIR's JSON
//! ```
//!
//! Phases, each one run of the bench (`--json` into `--out`):
//!
//! - `sweep`: every collective, 8 B to 2 GiB (×4), out of place and in
//!   place, through raw, safe and dist, a thread per GPU, 3 rounds of at
//!   least 20 iterations and 20 ms each.
//! - `latency`: every collective from 8 B to 1 KiB (×2) with 1000
//!   iterations and 11 rounds (`--quick`: 300), in each launch mode
//!   (single, threads, processes); in threads and processes mode also the
//!   `safe_wd` layer (safe with the watchdog observing the same
//!   communicator, toggled between layers, so interleaved with `safe`);
//!   and with nonblocking communicators (threads, 8–128 B, fewer
//!   iterations: each call costs over 100 µs there).
//! - `graph`: an 8 B all_reduce captured in CUDA graphs (single, threads).
//! - `events`: the 8 B all_reduce with cudarc's event tracking left on, to
//!   show what it costs.
//! - `setup`: communicator init, a 2×2 `DeviceMesh` and the first
//!   all_reduce on each axis (each mode, and threads with nonblocking
//!   communicators; first cold then warm).
//! - `step`: the training-like step over a 2-D `DeviceMesh` (the bench's
//!   `crates/nccl-bench/src/step/`), default options against raw nccl-sys, 500 steps per
//!   measurement, 11 interleaved rounds, threads and processes.
//!
//! The raw and safe layers run on blocking communicators without a
//! watchdog (as in nccl-tests); the dist layer and the step's mesh on the
//! world as `World` makes it with default options (watchdog and liveness
//! on), unless a job says nonblocking.
//!
//! Then `report.md` (tables, a targets table and the older targets of the
//! performance issue, each as a ratio), `bench.json` (every result, and a
//! flat `summary` object: see [`summary`]) and `busbw.svg` (busbw against
//! size). Exits non-zero when a result is wrong or a target is missed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use plotters::prelude::*;
use serde_json::{Value, json};

use crate::gpu_test::BENCH;
use crate::launch::{Ended, launch_ranks};
use crate::{Result, cargo, release_dir, test::gpu_count, workspace_root};

const PHASES: &[&str] = &["sweep", "latency", "graph", "events", "setup", "step"];
const MODES: &[&str] = &["single", "threads", "processes"];

/// nccl-tests 2.19.6 on the 4×H200 host, busbw at 2 GiB (GB/s), from the
/// performance issue.
const NCCL_TESTS_2G: &[(&str, f64)] = &[
    ("all_reduce", 359.7),
    ("all_gather", 332.9),
    ("reduce_scatter", 336.3),
    ("broadcast", 362.3),
    ("reduce", 365.4),
    ("all_to_all", 348.2),
    ("send_recv", 362.9),
];

struct Options {
    gpus: Option<usize>,
    quick: bool,
    phases: Vec<String>,
    out: PathBuf,
    timeout: Duration,
    from_bundle: Option<PathBuf>,
    report_only: Option<PathBuf>,
}

fn parse(args: &[&str]) -> Result<Options> {
    let mut o = Options {
        gpus: None,
        quick: false,
        phases: PHASES.iter().map(|p| p.to_string()).collect(),
        out: workspace_root().join("target/bench"),
        timeout: Duration::from_secs(900),
        from_bundle: None,
        report_only: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .copied()
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        match *arg {
            "--gpus" => o.gpus = Some(value()?.parse().map_err(|_| "--gpus takes a number")?),
            "--quick" => o.quick = true,
            "--phases" => {
                let phases: Vec<String> = value()?.split(',').map(str::to_string).collect();
                if let Some(bad) = phases.iter().find(|p| !PHASES.contains(&p.as_str())) {
                    return Err(
                        format!("unknown phase {bad:?}; phases: {}", PHASES.join(", ")).into(),
                    );
                }
                o.phases = phases;
            }
            "--out" => o.out = PathBuf::from(value()?),
            "--timeout" => {
                o.timeout =
                    Duration::from_secs(value()?.parse().map_err(|_| "--timeout takes seconds")?)
            }
            "--from-bundle" => o.from_bundle = Some(PathBuf::from(value()?)),
            "--report" => o.report_only = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown bench argument {other:?}").into()),
        }
    }
    Ok(o)
}

/// One run of the bench.
struct Job {
    name: String,
    mode: &'static str,
    args: Vec<String>,
}

fn jobs(o: &Options) -> Vec<Job> {
    let mut jobs = Vec::new();
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let want = |p: &str| o.phases.iter().any(|q| q == p);
    if want("sweep") {
        let max = if o.quick { "128M" } else { "2G" };
        jobs.push(Job {
            name: "sweep-threads".into(),
            mode: "threads",
            args: s(&[
                "-b", "8", "-e", max, "-n", "20", "-w", "5", "--min-ms", "20", "--rounds", "3",
            ]),
        });
    }
    if want("latency") {
        // Rounds are many and short: the summary takes the largest
        // difference of medians over every size, so each median must be
        // steady (11 rounds: one round in five may be disturbed).
        let (iters, rounds) = if o.quick {
            ("300", "11")
        } else {
            ("1000", "11")
        };
        for mode in MODES {
            // The watchdog's cost is measured where the dist layer is:
            // with a thread or a process per GPU.
            let layers = if *mode == "single" {
                "raw,safe"
            } else {
                "raw,safe,dist,safe_wd"
            };
            jobs.push(Job {
                name: format!("latency-{mode}"),
                mode,
                args: s(&[
                    "-b", "8", "-e", "1K", "-f", "2", "-n", iters, "-w", "100", "--rounds", rounds,
                    "--layers", layers,
                ]),
            });
        }
        jobs.push(Job {
            name: "latency-threads-nonblocking".into(),
            mode: "threads",
            args: s(&[
                "-b",
                "8",
                "-e",
                "128",
                "-f",
                "2",
                "-n",
                "200",
                "-w",
                "20",
                "--rounds",
                "3",
                "--nonblocking",
            ]),
        });
    }
    if want("graph") {
        for mode in ["single", "threads"] {
            jobs.push(Job {
                name: format!("graph-{mode}"),
                mode,
                args: s(&[
                    "--graph",
                    "--ops",
                    "all_reduce",
                    "-b",
                    "8",
                    "-e",
                    "8",
                    "-n",
                    "100",
                    "-w",
                    "20",
                    "--graph-launches",
                    "20",
                    "--rounds",
                    "5",
                ]),
            });
        }
    }
    if want("events") {
        jobs.push(Job {
            name: "events-threads".into(),
            mode: "threads",
            args: s(&[
                "--cudarc-events",
                "--ops",
                "all_reduce",
                "-b",
                "8",
                "-e",
                "8",
                "-n",
                "1000",
                "-w",
                "100",
                "--rounds",
                "5",
            ]),
        });
    }
    if want("setup") {
        for mode in MODES {
            jobs.push(Job {
                name: format!("setup-{mode}"),
                mode,
                args: s(&["--setup", "--setup-reps", "3"]),
            });
        }
        jobs.push(Job {
            name: "setup-threads-nonblocking".into(),
            mode: "threads",
            args: s(&["--setup", "--setup-reps", "3", "--nonblocking"]),
        });
    }
    if want("step") {
        for mode in ["threads", "processes"] {
            jobs.push(Job {
                name: format!("step-{mode}"),
                mode,
                args: s(&["--step", "-n", "500", "-w", "50", "--rounds", "11"]),
            });
        }
    }
    jobs
}

fn bench_binary(o: &Options) -> Result<PathBuf> {
    if let Some(dir) = &o.from_bundle {
        let path = dir.join(BENCH);
        if !path.exists() {
            return Err(format!("{} is missing: rebuild the bundle", path.display()).into());
        }
        return Ok(path);
    }
    eprintln!("xtask: building the bench (release)");
    crate::run(cargo().args(["build", "--release", "-p", BENCH]))?;
    Ok(release_dir().join(BENCH))
}

pub fn run(args: &[&str]) -> Result<()> {
    let o = parse(args)?;
    if let Some(dir) = &o.report_only {
        return report(dir);
    }
    let gpus = gpu_count();
    if gpus == 0 {
        return Err("no GPU on this machine: the bench needs at least one (run it on a GPU host, e.g. from a bundle: `cargo xtask gpu-test --bundle DIR`, then `DIR/xtask bench --from-bundle DIR`)".into());
    }
    let n = o.gpus.unwrap_or(gpus);
    if n > gpus {
        return Err(format!("--gpus {n}: this machine has {gpus}").into());
    }
    let bin = bench_binary(&o)?;
    std::fs::create_dir_all(&o.out)?;
    let deadline = Instant::now() + o.timeout;
    let list = jobs(&o);
    let mut failed = Vec::new();
    for (i, job) in list.iter().enumerate() {
        let json = o.out.join(format!("{}.json", job.name));
        let _ = std::fs::remove_file(&json);
        let mut args = job.args.clone();
        args.extend(["--mode".into(), job.mode.into(), "--json".into()]);
        args.push(json.display().to_string());
        eprintln!(
            "xtask: bench [{}/{}] {} on {n} GPUs: bench {}",
            i + 1,
            list.len(),
            job.name,
            args.join(" ")
        );
        let left = deadline.saturating_duration_since(Instant::now());
        let ok = if job.mode == "processes" {
            matches!(launch_ranks(&bin, &args, n, left)?, Ended::Exited(s) if s.iter().all(|s| s.success()))
        } else {
            args.extend(["--gpus".into(), n.to_string()]);
            let log = o.out.join(format!("{}.log", job.name));
            run_logged(Command::new(&bin).args(&args), &log, left)?
        };
        if !ok {
            eprintln!("xtask: bench: {} failed", job.name);
            failed.push(job.name.clone());
        }
    }
    let verdict = report(&o.out);
    if !failed.is_empty() {
        return Err(format!("bench runs failed: {}", failed.join(", ")).into());
    }
    verdict
}

/// Runs `cmd` with its output in `log`, killing it at the deadline; on
/// failure the log's last lines are shown.
fn run_logged(cmd: &mut Command, log: &Path, left: Duration) -> Result<bool> {
    let ok = run_with_deadline(
        cmd.stdout(std::fs::File::create(log)?)
            .stderr(std::fs::File::create(log.with_extension("err"))?),
        left,
    )?;
    if !ok {
        for path in [log.to_path_buf(), log.with_extension("err")] {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("xtask: --- last lines of {}", path.display());
            for line in &lines[lines.len().saturating_sub(25)..] {
                eprintln!("{line}");
            }
        }
    }
    Ok(ok)
}

/// Runs `cmd`, killing it at the deadline.
fn run_with_deadline(cmd: &mut Command, left: Duration) -> Result<bool> {
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + left;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status.success());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("xtask: bench: deadline passed, killed");
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn load(dir: &Path) -> Result<BTreeMap<String, Value>> {
    let mut docs = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if path.extension().is_some_and(|e| e == "json") && name != "bench" {
            let text = std::fs::read_to_string(&path)?;
            docs.insert(name, serde_json::from_str(&text)?);
        }
    }
    Ok(docs)
}

fn results(doc: &Value) -> impl Iterator<Item = &Value> {
    doc["results"].as_array().into_iter().flatten()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

fn s<'v>(v: &'v Value, k: &str) -> &'v str {
    v[k].as_str().unwrap_or("")
}

/// The same measurement through another layer.
fn same(a: &Value, b: &Value) -> bool {
    ["coll", "bytes", "in_place", "mode", "graph"]
        .iter()
        .all(|k| a[*k] == b[*k])
}

/// Writes report.md, bench.json and busbw.svg from the JSON in `dir`;
/// errors when a result is wrong or a target is missed.
fn report(dir: &Path) -> Result<()> {
    let docs = load(dir)?;
    if docs.is_empty() {
        return Err(format!("no bench JSON in {}", dir.display()).into());
    }
    let mut md = String::new();
    let mut misses: Vec<String> = Vec::new();
    let meta = docs
        .values()
        .next()
        .map(|d| d["meta"].clone())
        .unwrap_or_default();
    writeln!(md, "# Bench report\n")?;
    writeln!(
        md,
        "NCCL {}, {} ranks. Every figure below comes from this one run; ratios compare layers measured back to back.\n",
        s(&meta, "nccl"),
        meta["ranks"]
    )?;
    let step_wrong: u64 = docs
        .values()
        .map(|d| {
            ["wrong_default", "wrong_raw", "differ"]
                .iter()
                .filter_map(|k| d["step"][*k].as_u64())
                .sum::<u64>()
        })
        .sum();
    let wrong: u64 = docs
        .values()
        .flat_map(results)
        .filter_map(|r| r["wrong"].as_u64())
        .sum::<u64>()
        + step_wrong;
    writeln!(md, "Wrong elements over every check: **{wrong}**.\n")?;
    if wrong > 0 {
        misses.push(format!("{wrong} wrong elements"));
    }

    if let Some(doc) = docs.get("sweep-threads") {
        sweep_section(&mut md, doc, &mut misses)?;
        plot(doc, &dir.join("busbw.svg"))?;
        writeln!(
            md,
            "Plot: `busbw.svg` (busbw against size, out of place, per layer).\n"
        )?;
    }
    watchdog_fired(&mut md, dir, &mut misses)?;
    let (summary, targets) = summary(&docs);
    targets_section(&mut md, &targets, &mut misses)?;
    latency_section(&mut md, &docs, &mut misses)?;
    watchdog_section(&mut md, &docs)?;
    step_section(&mut md, &docs)?;
    graph_section(&mut md, &docs, &mut misses)?;
    allocation_section(&mut md, &docs, &mut misses)?;
    setup_section(&mut md, &docs, &mut misses)?;

    writeln!(md, "## Verdict\n")?;
    if misses.is_empty() {
        writeln!(md, "Every target met.")?;
    } else {
        for m in &misses {
            writeln!(md, "- MISSED: {m}")?;
        }
    }
    std::fs::write(dir.join("report.md"), &md)?;
    let mut all: BTreeMap<&str, &Value> = docs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    all.insert("summary", &summary);
    std::fs::write(
        dir.join("bench.json"),
        serde_json::to_string_pretty(&json!(all))?,
    )?;
    println!("{md}");
    eprintln!(
        "xtask: bench: wrote {}, bench.json and busbw.svg",
        dir.join("report.md").display()
    );
    if misses.is_empty() {
        Ok(())
    } else {
        Err(format!("bench: {} target(s) missed", misses.len()).into())
    }
}

/// `x ≤ limit`; false when `x` is NaN (a missing figure), so a missing
/// figure is never a hit.
fn at_most(x: f64, limit: f64) -> bool {
    x <= limit
}

/// `x ≥ limit`; false when `x` is NaN.
fn at_least(x: f64, limit: f64) -> bool {
    x >= limit
}

/// The largest of `(value, where)` pairs; NaN wins, so a missing figure
/// shows instead of hiding behind a real one.
fn worst(items: impl Iterator<Item = (f64, String)>) -> Option<(f64, String)> {
    items.fold(None, |acc, (v, at)| match acc {
        Some((a, _)) if a.is_nan() => acc,
        Some((a, _)) if !v.is_nan() && v <= a => acc,
        _ => Some((v, at)),
    })
}

/// One figure of the targets table.
struct Target {
    key: &'static str,
    /// `None`: the phase that measures it did not run.
    value: Option<(f64, String)>,
    limit: f64,
    unit: &'static str,
    /// What produces it, for the "not measured" line.
    phase: &'static str,
}

impl Target {
    /// Met only when measured and at most the limit (NaN: not met).
    fn met(&self) -> bool {
        self.value
            .as_ref()
            .is_some_and(|(v, _)| at_most(*v, self.limit))
    }
}

/// The smallest size of each collective measured through `layer` in
/// `doc`, out of place: (coll, record).
fn smallest<'d>(doc: &'d Value, layer: &str) -> Vec<(&'d str, &'d Value)> {
    let mut out: Vec<(&str, &Value)> = Vec::new();
    for r in results(doc).filter(|r| r["in_place"] == false && s(r, "layer") == layer) {
        let c = s(r, "coll");
        match out.iter_mut().find(|(k, _)| *k == c) {
            Some(slot) if slot.1["bytes"].as_u64() > r["bytes"].as_u64() => slot.1 = r,
            Some(_) => {}
            None => out.push((c, r)),
        }
    }
    out
}

/// How much slower `a` is than `b` (µs per call), two layers measured at
/// the same point in interleaved rounds: the median over rounds of each
/// round's difference, so a stretch of seconds in which the whole machine
/// runs slow or fast moves both sides of a difference alike. Records
/// without per-round times (older runs) give the difference of medians.
fn paired_excess(a: &Value, b: &Value) -> f64 {
    let rounds = |r: &Value| -> Option<Vec<f64>> {
        r["rounds_us"]
            .as_array()?
            .iter()
            .map(Value::as_f64)
            .collect::<Option<Vec<f64>>>()
    };
    match (rounds(a), rounds(b)) {
        (Some(x), Some(y)) if x.len() == y.len() && !x.is_empty() => {
            let mut d: Vec<f64> = x.iter().zip(&y).map(|(p, q)| p - q).collect();
            d.sort_by(f64::total_cmp);
            let m = d.len() / 2;
            if d.len() % 2 == 1 {
                d[m]
            } else {
                (d[m - 1] + d[m]) / 2.0
            }
        }
        _ => f(a, "time_us") - f(b, "time_us"),
    }
}

/// The modes whose latency jobs count for the targets: a thread and a
/// process per GPU, blocking.
const TARGET_MODES: &[&str] = &["threads", "processes"];

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
///   processes) of median default step / median raw step.
/// - `allocs_per_call_max`: the most heap allocations per call, counted
///   on every thread of the process during the timed calls, in any
///   measurement of any phase, and per NCCL call of the default step.
fn summary(docs: &BTreeMap<String, Value>) -> (Value, Vec<Target>) {
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
        let rs: Vec<&Value> = results(doc).collect();
        rs.iter()
            .filter(|r| s(r, "layer") == "dist" && r["bytes"].as_u64().is_some_and(|b| b <= 1024))
            .map(|r| {
                let over = rs
                    .iter()
                    .find(|q| s(q, "layer") == "raw" && same(q, r))
                    .map_or(f64::NAN, |raw| paired_excess(r, raw));
                let place = if r["in_place"] == true {
                    "in place"
                } else {
                    "out of place"
                };
                (
                    over,
                    format!(
                        "{mode} {} {} {place}",
                        s(r, "coll"),
                        human(r["bytes"].as_u64().unwrap_or(0))
                    ),
                )
            })
            .collect::<Vec<_>>()
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

    let targets = vec![
        Target {
            key: "default_minus_raw_small_us_max",
            value: measured(small, !latency.is_empty()),
            limit: 0.5,
            unit: "µs",
            phase: "latency",
        },
        Target {
            key: "default_step_over_raw",
            value: measured(step, !steps.is_empty()),
            limit: 1.02,
            unit: "",
            phase: "step",
        },
        Target {
            key: "watchdog_overhead_us",
            value: measured(watchdog, !latency.is_empty()),
            limit: 0.5,
            unit: "µs",
            phase: "latency",
        },
        Target {
            key: "allocs_per_call_max",
            value: measured(allocs, any_results),
            limit: 0.0,
            unit: "",
            phase: "any",
        },
    ];
    let mut flat = serde_json::Map::new();
    for t in &targets {
        // serde_json writes a NaN as null: a figure that could not be had.
        flat.insert(t.key.into(), json!(t.value.as_ref().map(|(v, _)| *v)));
        flat.insert(
            format!("{}_at", t.key),
            json!(t.value.as_ref().map(|(_, at)| at.clone())),
        );
        flat.insert(format!("{}_target", t.key), json!(t.limit));
        flat.insert(format!("{}_met", t.key), json!(t.met()));
    }
    flat.insert("targets_met".into(), json!(targets.iter().all(Target::met)));
    (Value::Object(flat), targets)
}

/// `shown` with a sign, two decimals where they tell hit from miss.
fn signed(v: f64, limit: f64) -> String {
    let short = format!("{v:+.2}");
    match short.parse::<f64>() {
        Ok(r) if at_most(r, limit) != at_most(v, limit) => format!("{v:+}"),
        _ => short,
    }
}

/// Shows a value so that rounding never makes a miss look like a hit.
fn shown(v: f64, limit: f64) -> String {
    let short = format!("{v:.3}");
    match short.parse::<f64>() {
        // The shortest text that reads back as exactly `v`.
        Ok(r) if at_most(r, limit) != at_most(v, limit) => format!("{v}"),
        _ => short,
    }
}

fn targets_section(md: &mut String, targets: &[Target], misses: &mut Vec<String>) -> Result<()> {
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
                if !met {
                    misses.push(format!("{} = {} > {}", t.key, shown(*v, t.limit), t.limit));
                }
                (
                    format!("{} {}", shown(*v, t.limit), t.unit),
                    if met { "met" } else { "**not met**" }.to_string(),
                    at.clone(),
                )
            }
        };
        writeln!(
            md,
            "| `{}` | {value} | ≤ {} {} | {met} | {at} |",
            t.key, t.limit, t.unit
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// Jobs whose stderr (`JOB.err`, the jobs run by this process rather than
/// the launcher) holds the watchdog's report: an operation timed out, or
/// a communicator was aborted with operations the watchdog still counted
/// as unfinished. Each is a miss, whatever the job's exit status.
fn watchdog_fired(md: &mut String, dir: &Path, misses: &mut Vec<String>) -> Result<()> {
    let mut fired = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "err") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.starts_with("nccl-dist watchdog:")) {
            let job = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            fired.push((job, line.to_string()));
        }
    }
    if fired.is_empty() {
        return Ok(());
    }
    fired.sort();
    writeln!(
        md,
        "## The watchdog fired
"
    )?;
    writeln!(
        md,
        "Its first line in each job's stderr (the flight recorder follows it in `JOB.err`):
"
    )?;
    for (job, line) in &fired {
        writeln!(md, "- `{job}`: {line}")?;
        misses.push(format!("the watchdog fired in {job} (see {job}.err)"));
    }
    writeln!(md)?;
    Ok(())
}

/// The watchdog's cost: the safe layer with and without the watchdog's
/// observer on the same communicator, at each collective's smallest size.
fn watchdog_section(md: &mut String, docs: &BTreeMap<String, Value>) -> Result<()> {
    let mut rows = Vec::new();
    for mode in TARGET_MODES {
        let Some(doc) = docs.get(&format!("latency-{mode}")) else {
            continue;
        };
        for (coll, on) in smallest(doc, "safe_wd") {
            let off_rec = results(doc).find(|q| s(q, "layer") == "safe" && same(q, on));
            let off = off_rec.map_or(f64::NAN, |q| f(q, "time_us"));
            let over = off_rec.map_or(f64::NAN, |q| paired_excess(on, q));
            let t = f(on, "time_us");
            rows.push(format!(
                "| {mode} | {coll} | {} | {off:.2} | {t:.2} | {over:+.3} |",
                human(on["bytes"].as_u64().unwrap_or(0)),
            ));
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(
        md,
        "## Watchdog overhead
"
    )?;
    writeln!(
        md,
        "µs per call (median of rounds, slowest rank), out of place, at each collective's smallest size: the safe layer on one communicator, its watchdog observer removed (off) or set (on) between measurements, interleaved in every round. on − off is the median over rounds of each round's difference; `watchdog_overhead_us` is the largest.
"
    )?;
    writeln!(md, "| mode | collective | size | off | on | on − off |")?;
    writeln!(md, "|---|---|---|---|---|---|")?;
    for r in rows {
        writeln!(md, "{r}")?;
    }
    writeln!(md)?;
    Ok(())
}

/// The training-like step: default options against raw, per mode.
fn step_section(md: &mut String, docs: &BTreeMap<String, Value>) -> Result<()> {
    let heading = "## Training step (2-D DeviceMesh)

The step of `docs/bench/README.md` (broadcast, all_reduce, all_to_all, reduce_scatter + all_gather, a send/recv ring, a PreMulSum average and a loss all_reduce over the dp and tp axes, bf16 and f32, 8 B to 1 MiB): µs per step, median of interleaved rounds, slowest rank; checked bit for bit against the expected values and between the sides after the timing.

| mode | mesh | default (µs) | raw (µs) | default / raw | allocs per step (default) | wrong (default / raw) | differ |
|---|---|---|---|---|---|---|---|
";
    let found = phase(md, docs, "step-", heading);
    for &(mode, doc) in &found {
        let st = &doc["step"];
        let mesh = &doc["meta"]["mesh"];
        writeln!(
            md,
            "| {mode} | {}×{} | {:.2} | {:.2} | {:.4} | {:.3} | {} / {} | {} |",
            mesh["dp"],
            mesh["tp"],
            f(st, "default_us"),
            f(st, "raw_us"),
            f(st, "default_over_raw"),
            f(st, "allocs_per_step_default"),
            st["wrong_default"],
            st["wrong_raw"],
            st["differ"],
        )?;
    }
    if !found.is_empty() {
        writeln!(md)?;
    }
    Ok(())
}

/// busbw per layer at the largest size, and the least safe/raw and
/// dist/raw ratio at 128 MiB and above.
fn sweep_section(md: &mut String, doc: &Value, misses: &mut Vec<String>) -> Result<()> {
    writeln!(md, "## Bandwidth (a thread per GPU)\n")?;
    writeln!(
        md,
        "busbw in GB/s at the largest size, out of place; the ratios are the least over every size ≥ 128 MiB and both placements (target ≥ 0.99).\n"
    )?;
    writeln!(
        md,
        "| collective | size | raw | safe | dist | nccl-tests 2.19.6 (2 GiB, from the issue) | safe/raw min | dist/raw min |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|")?;
    let rs: Vec<&Value> = results(doc).collect();
    for (coll, reference) in NCCL_TESTS_2G {
        let of = |layer: &str| -> Vec<&Value> {
            rs.iter()
                .copied()
                .filter(|r| s(r, "coll") == *coll && s(r, "layer") == layer)
                .collect()
        };
        let raw = of("raw");
        let Some(largest) = raw
            .iter()
            .filter(|r| r["in_place"] == false)
            .max_by_key(|r| r["bytes"].as_u64())
        else {
            continue;
        };
        let bw = |layer: &str| {
            of(layer)
                .iter()
                .find(|r| same(r, largest))
                .map_or("-".to_string(), |r| format!("{:.1}", f(r, "busbw_gbs")))
        };
        let ratio = |layer: &str| -> Option<f64> {
            of(layer)
                .iter()
                .filter(|r| r["bytes"].as_u64().unwrap_or(0) >= 128 << 20)
                .filter_map(|r| {
                    raw.iter()
                        .find(|q| same(q, r))
                        .map(|q| f(r, "busbw_gbs") / f(q, "busbw_gbs"))
                })
                .min_by(f64::total_cmp)
        };
        let mut cells = Vec::new();
        for layer in ["safe", "dist"] {
            match ratio(layer) {
                Some(x) => {
                    // Written so that a missing (NaN) ratio is a miss.
                    if !at_least(x, 0.99) {
                        misses.push(format!("{coll}: {layer}/raw busbw {x:.4} < 0.99"));
                    }
                    cells.push(format!("{x:.4}"));
                }
                None => cells.push("-".into()),
            }
        }
        writeln!(
            md,
            "| {coll} | {} | {} | {} | {} | {reference} | {} | {} |",
            human(largest["bytes"].as_u64().unwrap_or(0)),
            bw("raw"),
            bw("safe"),
            bw("dist"),
            cells[0],
            cells[1]
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// Time per call at the smallest size of each collective, per mode; the
/// target is at most 0.5 µs above raw.
fn latency_section(
    md: &mut String,
    docs: &BTreeMap<String, Value>,
    misses: &mut Vec<String>,
) -> Result<()> {
    let heading = "## Small messages\n\nµs per call (median of rounds, slowest rank), out of place, at each collective's smallest size; raw and safe on a blocking communicator without watchdog, dist on the world made with default options (watchdog on); target: safe and dist at most 0.5 µs above raw. Each difference is the median over rounds of the round's difference (the layers take turns in every round), so it is not always the difference of the medians shown. The last column is the largest dist − raw over every size up to 1 KiB and both placements (what `default_minus_raw_small_us_max` takes).\n\n";
    for (mode, doc) in phase(md, docs, "latency-", heading) {
        writeln!(md, "### {mode}\n")?;
        writeln!(
            md,
            "| collective | size | raw | safe | dist | safe − raw | dist − raw | dist − raw, most ≤ 1 KiB |"
        )?;
        writeln!(md, "|---|---|---|---|---|---|---|---|")?;
        let every: Vec<&Value> = results(doc).collect();
        let rs: Vec<&Value> = results(doc).filter(|r| r["in_place"] == false).collect();
        let mut colls: Vec<&str> = rs.iter().map(|r| s(r, "coll")).collect();
        colls.dedup();
        for coll in colls {
            let Some(smallest) = rs
                .iter()
                .filter(|r| s(r, "coll") == coll && s(r, "layer") == "raw")
                .min_by_key(|r| r["bytes"].as_u64())
            else {
                continue;
            };
            let rec = |layer: &str| {
                rs.iter()
                    .find(|r| s(r, "layer") == layer && same(r, smallest))
                    .copied()
            };
            let t = |layer: &str| rec(layer).map(|r| f(r, "time_us"));
            let raw = f(smallest, "time_us");
            let cell = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
            let mut deltas = Vec::new();
            for layer in ["safe", "dist"] {
                match rec(layer) {
                    Some(r) => {
                        let d = paired_excess(r, smallest);
                        if !at_most(d, 0.5) {
                            misses.push(format!(
                                "{mode} {coll} {}: {layer} {} µs over raw",
                                human(smallest["bytes"].as_u64().unwrap_or(0)),
                                signed(d, 0.5)
                            ));
                        }
                        deltas.push(signed(d, 0.5));
                    }
                    None => deltas.push("-".into()),
                }
            }
            let most = worst(
                every
                    .iter()
                    .filter(|r| {
                        s(r, "coll") == coll
                            && s(r, "layer") == "dist"
                            && r["bytes"].as_u64().is_some_and(|b| b <= 1024)
                    })
                    .map(|r| {
                        let over = every
                            .iter()
                            .find(|q| s(q, "layer") == "raw" && same(q, r))
                            .map_or(f64::NAN, |q| paired_excess(r, q));
                        let place = if r["in_place"] == true {
                            " in place"
                        } else {
                            ""
                        };
                        (
                            over,
                            format!("{}{place}", human(r["bytes"].as_u64().unwrap_or(0))),
                        )
                    }),
            )
            .map_or("-".to_string(), |(d, at)| {
                format!("{} ({at})", signed(d, 0.5))
            });
            writeln!(
                md,
                "| {coll} | {} | {raw:.2} | {} | {} | {} | {} | {most} |",
                human(smallest["bytes"].as_u64().unwrap_or(0)),
                cell(t("safe")),
                cell(t("dist")),
                deltas[0],
                deltas[1]
            )?;
        }
        writeln!(md)?;
    }
    if let Some(doc) = docs.get("events-threads") {
        writeln!(
            md,
            "### cudarc event tracking on (threads, 8 B all_reduce)\n"
        )?;
        writeln!(
            md,
            "With cudarc's default event tracking every buffer use adds a `cuStreamWaitEvent` and a `cuEventRecord`; the bench turns it off for its single-stream buffers. For comparison:\n"
        )?;
        writeln!(md, "| layer | µs per call |")?;
        writeln!(md, "|---|---|")?;
        for r in results(doc).filter(|r| r["in_place"] == false) {
            writeln!(md, "| {} | {:.2} |", s(r, "layer"), f(r, "time_us"))?;
        }
        writeln!(md)?;
    }
    Ok(())
}

fn graph_section(
    md: &mut String,
    docs: &BTreeMap<String, Value>,
    misses: &mut Vec<String>,
) -> Result<()> {
    let heading = "## CUDA graphs (8 B all_reduce)\n\nµs per all_reduce replayed from a graph of 100 captured calls; target ≤ 9 µs on 4 GPUs.\n\n| mode | layer | placement | µs per call |\n|---|---|---|---|\n";
    let found = phase(md, docs, "graph-", heading);
    for &(mode, doc) in &found {
        for r in results(doc) {
            let t = f(r, "time_us");
            let place = if r["in_place"] == true {
                "in place"
            } else {
                "out of place"
            };
            writeln!(md, "| {mode} | {} | {place} | {t:.2} |", s(r, "layer"))?;
            if r["ranks"].as_u64() == Some(4) && !at_most(t, 9.0) {
                misses.push(format!(
                    "graph {mode} {} {place}: {t:.2} µs > 9",
                    s(r, "layer")
                ));
            }
        }
    }
    if !found.is_empty() {
        writeln!(md)?;
    }
    Ok(())
}

fn allocation_section(
    md: &mut String,
    docs: &BTreeMap<String, Value>,
    misses: &mut Vec<String>,
) -> Result<()> {
    let mut worst: BTreeMap<String, (f64, String, f64)> = BTreeMap::new();
    for (name, doc) in docs {
        for r in results(doc) {
            let key = format!(
                "{} ({})",
                s(r, "layer"),
                name.split('-').next().unwrap_or("")
            );
            let a = f(r, "allocs_per_call");
            let own = f(r, "allocs_per_call_thread");
            let e = worst.entry(key).or_insert((0.0, String::new(), 0.0));
            // A missing count (NaN) wins, so it shows.
            if a.is_nan() || a > e.0 || e.1.is_empty() {
                *e = (
                    if a.is_nan() { a } else { a.max(e.0) },
                    format!("{} {} {}", name, s(r, "coll"), r["bytes"]),
                    e.2,
                );
            }
            if !at_most(own, e.2) {
                e.2 = own;
            }
        }
    }
    if worst.is_empty() {
        return Ok(());
    }
    writeln!(md, "## Heap allocations per call\n")?;
    writeln!(
        md,
        "The most seen in any measurement: allocations by every thread of the process (the watchdog's and liveness threads included) during the timed calls, per call the process issued, counted by the bench's global allocator; in brackets the issuing thread's own. Target: 0 (`allocs_per_call_max`); a miss for safe is also listed below.\n"
    )?;
    writeln!(
        md,
        "| layer (phase) | most allocations per call (thread's own) | where |"
    )?;
    writeln!(md, "|---|---|---|")?;
    for (key, (a, at, own)) in &worst {
        writeln!(md, "| {key} | {a:.3} ({own:.3}) | {at} |")?;
        if key.starts_with("safe") && !at_most(*a, 0.0) {
            misses.push(format!("{key}: {a:.3} allocations per call"));
        }
    }
    writeln!(md)?;
    Ok(())
}

fn setup_section(
    md: &mut String,
    docs: &BTreeMap<String, Value>,
    misses: &mut Vec<String>,
) -> Result<()> {
    let heading = "## Set-up\n\nms, slowest rank. world = communicator init (from process start in the first processes rep); mesh = `DeviceMesh::new` dp×tp; target: mesh + first all_reduce on each axis ≤ 200 ms on 4 GPUs (warm reps).\n\n| mode | rep | state | world | mesh | first dp | first tp | mesh + firsts |\n|---|---|---|---|---|---|---|---|\n";
    let found = phase(md, docs, "setup-", heading);
    for &(mode, doc) in &found {
        let ranks = doc["meta"]["ranks"].as_u64();
        for r in doc["setup"].as_array().into_iter().flatten() {
            let total = f(r, "mesh_and_first_all_reduces_ms");
            writeln!(
                md,
                "| {mode} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {total:.1} |",
                r["rep"],
                s(r, "state"),
                f(r, "world_ms"),
                f(r, "mesh_ms"),
                f(r, "first_all_reduce_dp_ms"),
                f(r, "first_all_reduce_tp_ms"),
            )?;
            if ranks == Some(4) && s(r, "state") == "warm" && !at_most(total, 200.0) {
                misses.push(format!(
                    "setup {mode} rep {}: {total:.1} ms > 200",
                    r["rep"]
                ));
            }
        }
    }
    if !found.is_empty() {
        writeln!(md)?;
    }
    Ok(())
}

/// The results of one phase (files `PREFIX-MODE.json`) with their modes,
/// after writing the section's `heading` when there are any.
fn phase<'d>(
    md: &mut String,
    docs: &'d BTreeMap<String, Value>,
    prefix: &str,
    heading: &str,
) -> Vec<(&'d str, &'d Value)> {
    let found: Vec<(&str, &Value)> = docs
        .iter()
        .filter_map(|(name, doc)| name.strip_prefix(prefix).map(|mode| (mode, doc)))
        .collect();
    if !found.is_empty() {
        md.push_str(heading);
    }
    found
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// busbw against size (log-log), one panel per collective, one line per
/// layer, out of place.
fn plot(doc: &Value, path: &Path) -> Result<()> {
    let rs: Vec<&Value> = results(doc).filter(|r| r["in_place"] == false).collect();
    let colls: Vec<&str> = NCCL_TESTS_2G
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| rs.iter().any(|r| s(r, "coll") == *c))
        .collect();
    if colls.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (1500, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 4));
    let max_bytes = rs
        .iter()
        .filter_map(|r| r["bytes"].as_u64())
        .max()
        .unwrap_or(8) as f64;
    let max_bw = rs.iter().map(|r| f(r, "busbw_gbs")).fold(1.0, f64::max) * 1.1;
    for (coll, area) in colls.iter().zip(panels.iter()) {
        let mut chart = ChartBuilder::on(area)
            .caption(*coll, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(
                (8f64..max_bytes).log_scale(),
                (0.001f64..max_bw).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("bytes")
            .y_desc("busbw GB/s")
            .x_label_formatter(&|x| human(*x as u64))
            .y_label_formatter(&|y| format!("{y:.3}"))
            .draw()?;
        for (layer, color) in [("raw", &BLACK), ("safe", &BLUE), ("dist", &RED)] {
            let mut points: Vec<(f64, f64)> = rs
                .iter()
                .filter(|r| s(r, "coll") == *coll && s(r, "layer") == layer)
                .map(|r| (f(r, "bytes"), f(r, "busbw_gbs")))
                .filter(|(_, y)| *y > 0.0)
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(points.clone(), color))?
                .label(layer)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 2, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excess_is_paired_by_round_and_falls_back_to_medians() {
        // Round 2 ran on a slow machine for both layers: pairing removes it.
        let a = json!({"time_us": 6.0, "rounds_us": [4.3, 6.3, 4.2]});
        let b = json!({"time_us": 6.0, "rounds_us": [4.0, 6.0, 4.0]});
        let d = paired_excess(&a, &b);
        assert!((d - 0.3).abs() < 1e-9, "{d}");
        let even = json!({"time_us": 5.0, "rounds_us": [5.0, 5.4]});
        let base = json!({"time_us": 5.0, "rounds_us": [5.0, 5.0]});
        assert!((paired_excess(&even, &base) - 0.2).abs() < 1e-9);
        // Older records, or rounds that do not line up: medians.
        let old = json!({"time_us": 5.5});
        assert!((paired_excess(&old, &b) + 0.5).abs() < 1e-9);
        let short = json!({"time_us": 7.0, "rounds_us": [7.0]});
        assert!((paired_excess(&short, &b) - 1.0).abs() < 1e-9);
    }
}
