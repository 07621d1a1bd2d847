//! `cargo xtask bench`: the bench (`crates/nccl-bench`) in every launch mode, one
//! report.
//!
//! ```text
//! cargo xtask bench [--gpus N] [--quick] [--phases sweep,latency,graph,events,setup,step,async,recover,small]
//!                   [--out DIR] [--timeout SECS] [--python PATH]
//! # --timeout: the limit of the whole bench, every job together (default 900 s)
//! DIR/xtask bench --from-bundle DIR ...     # on a GPU host without cargo
//! cargo xtask bench --report DIR            # redo the report from DIR's JSON
//! ```
//!
//! Phases, each one run of the bench (`--json` into `--out`). In every
//! phase measured in rounds through several layers (sweep, latency,
//! graph) the layers take turns in every round, each round starting with
//! the next one (since session thirteen; before, raw always went first):
//!
//! - `sweep`: every collective, 8 B to 2 GiB (×4), out of place and in
//!   place, through raw, safe and dist, a thread per GPU, 15 rounds of at
//!   least 20 iterations and 20 ms each.
//! - `latency`: every collective from 8 B to 1 KiB (×2) with 1000
//!   iterations and 11 rounds (`--quick`: 300 in single mode), in each launch mode
//!   (single, threads, processes); in threads and processes mode also the
//!   `safe_wd` layer (safe with the watchdog observing the same
//!   communicator, toggled between layers, so interleaved with `safe`)
//!   and the `raw_probe` layer (raw plus the driver calls the typed path
//!   adds, to split the excess);
//!   and with nonblocking communicators (threads, 8–128 B, fewer
//!   iterations: each call costs over 100 µs there).
//! - `graph`: an 8 B all_reduce captured in CUDA graphs (single, threads).
//! - `events`: the 8 B all_reduce with cudarc's event tracking left on, to
//!   show what it costs.
//! - `setup`: communicator init, a 2×2 `DeviceMesh` and the first
//!   all_reduce on each axis (each mode, and threads with nonblocking
//!   communicators; first cold then warm: five warm reps in each blocking
//!   mode, two in the nonblocking and keeps-world jobs, and one rep of a
//!   fresh process in each `setup-processes-fresh-*` job). The span columns split world
//!   and mesh by the crates' `tracing` spans. With `--python PATH` (a
//!   Python with PyTorch), PyTorch's equivalents run on the same GPUs in
//!   the same run (`python/examples/torch_setup.py`, a process per GPU:
//!   `init_process_group` with `device_id`, `init_device_mesh`, the first
//!   all_reduce per axis; 6 reps, each its own `torch.distributed.run`
//!   launch, the first cold from process start, the warm ones timing
//!   `init_process_group` after making the CUDA context, as our warm
//!   reps), reported as mode `torch`; the summary's `mesh_over_torch` and
//!   `world_over_torch` divide by them.
//! - `step`: the training-like step over a 2-D `DeviceMesh` (the bench's
//!   `crates/nccl-bench/src/step/`), default options against raw nccl-sys, 500 steps per
//!   measurement, 11 interleaved rounds, threads and processes, with the
//!   `raw_mesh` side (raw calls on the mesh's own communicators) that
//!   splits the excess into NCCL's part and ours. With
//!   `--python PATH`, the same step in PyTorch on a `DeviceMesh` of the
//!   same shape (`python/examples/torch_step.py`, a process per GPU, same
//!   GPUs, same run): the summary's `step_over_torch`.
//! - `small`: the all_reduce of small messages, 8 B to 16 MiB by ×2, f32
//!   and bf16, a thread per GPU: raw NCCL, ours on plain buffers and ours
//!   on symmetric buffers (`SymmetricBuffer`), interleaved, checked (the
//!   summary's `small_allreduce_over_nccl_2mib`, `small_wrong`). With
//!   `--python PATH`, PyTorch's NCCL all_reduce and its symmetric-memory
//!   one-shot and two-shot all-reduce, same sizes, same GPUs, same run
//!   (`python/examples/torch_small.py`): `small_allreduce_over_torch_symm_max`.
//! - `recover`: a thread per GPU, the last rank lost on purpose (its
//!   thread panics), `World::recover` and the first all-reduce on the new
//!   world, timed from the loss known (3 reps, by shrink, the default);
//!   then the same giving the old world up (`recover-threads-give-up`,
//!   `recover_without_shrink_ms`); then a process per GPU, three
//!   launches, the last rank's process killing itself with SIGKILL
//!   (`recover-processes-N`; the launch must end with that rank killed
//!   and every other one passed). The summary's `recover_ms` is the
//!   slower mode's. Needs 2 GPUs.
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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::bench::summary::TARGET_MODES;
use crate::flags::{self, Flag, Trailing, switch, value};
use crate::gpu_test::{BENCH, BENCH_PROFILE, TORCH_SETUP, TORCH_SMALL, TORCH_STEP};
use crate::launch::{Ended, launch_ranks};
use crate::{Result, cargo, gpu_count, workspace_root};

const PHASES: &[&str] = &[
    "sweep", "latency", "graph", "events", "setup", "step", "async", "recover", "small",
];
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
    /// A Python with PyTorch: its side of the set-up phase runs too.
    python: Option<PathBuf>,
}

/// The flags of `bench`.
const FLAGS: &[Flag] = &[
    value(&["--gpus"]),
    switch(&["--quick"]),
    value(&["--phases"]),
    value(&["--out"]),
    value(&["--timeout"]),
    value(&["--from-bundle"]),
    value(&["--report"]),
    value(&["--python"]),
];

fn parse(args: &[&str]) -> Result<Options> {
    let p = flags::parse("bench", FLAGS, Trailing::None, args)?;
    Ok(Options {
        gpus: p.parsed("--gpus", "a number")?,
        quick: p.has("--quick"),
        phases: p
            .list("--phases", Some(PHASES), "phase")?
            .unwrap_or_else(|| PHASES.iter().map(|p| p.to_string()).collect()),
        out: p
            .value("--out")
            .map_or_else(|| workspace_root().join("target/bench"), PathBuf::from),
        timeout: Duration::from_secs(p.parsed("--timeout", "seconds")?.unwrap_or(900)),
        from_bundle: p.value("--from-bundle").map(PathBuf::from),
        report_only: p.value("--report").map(PathBuf::from),
        python: p.value("--python").map(PathBuf::from),
    })
}

/// One run of the bench.
struct Job {
    name: String,
    mode: &'static str,
    args: Vec<String>,
}

fn jobs(o: &Options) -> Vec<Job> {
    let mut jobs = Vec::new();
    // A job's arguments, written as on a command line.
    let w = |text: &str| {
        text.split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let want = |p: &str| o.phases.iter().any(|q| q == p);
    if want("sweep") {
        let max = if o.quick { "128M" } else { "2G" };
        jobs.push(Job {
            name: "sweep-threads".into(),
            mode: "threads",
            // 15 rounds: at 128 MiB an all-to-all moves by 3 % from round
            // to round, and the summary takes the least of 24 ratios
            // (quick: 12 points, safe and dist; 72 to 2 GiB); with 7, one
            // run's paired median fell to 0.988 on per-round ratios of
            // 0.971 to 1.032 (session eighteen, 2 H100s).
            args: w(&format!("-b 8 -e {max} -n 20 -w 5 --min-ms 20 --rounds 15")),
        });
    }
    if want("latency") {
        // Rounds are many and short: the summary takes the largest
        // difference of medians over every size, so each median must be
        // steady (11 rounds: one round in five may be disturbed). 1 000
        // calls a window in the modes the targets take, also when quick:
        // 300 (3 ms) let one scheduler hiccup move a window's mean by half
        // a microsecond.
        let rounds = "11";
        for mode in MODES {
            let iters = if o.quick && !TARGET_MODES.contains(mode) {
                "300"
            } else {
                "1000"
            };
            // The watchdog's cost is measured where the dist layer is:
            // with a thread or a process per GPU.
            // `raw_probe` splits the safe layer's excess into the driver
            // calls it adds and its own code (the report's "Where the
            // per-call excess goes").
            let layers = if *mode == "single" {
                "raw,safe"
            } else {
                "raw,safe,dist,safe_wd,raw_probe"
            };
            jobs.push(Job {
                name: format!("latency-{mode}"),
                mode,
                args: w(&format!(
                    "-b 8 -e 1K -f 2 -n {iters} -w 100 --rounds {rounds} --layers {layers}"
                )),
            });
        }
        jobs.push(Job {
            name: "latency-threads-nonblocking".into(),
            mode: "threads",
            args: w("-b 8 -e 128 -f 2 -n 200 -w 20 --rounds 3 --nonblocking"),
        });
    }
    if want("graph") {
        for mode in ["single", "threads"] {
            jobs.push(Job {
                name: format!("graph-{mode}"),
                mode,
                args: w("--graph --ops all_reduce -b 8 -e 8 -n 100 -w 20 --graph-launches 20 --rounds 5"),
            });
        }
    }
    if want("setup") {
        // Five warm reps a mode (the first rep is cold): NCCL's init of a
        // one-rank communicator varies by tens of ms from rep to rep, and
        // the upper median of two warm reps was their maximum.
        for mode in MODES {
            jobs.push(Job {
                name: format!("setup-{mode}"),
                mode,
                args: w("--setup --setup-reps 6"),
            });
        }
        jobs.push(Job {
            name: "setup-threads-nonblocking".into(),
            mode: "threads",
            args: w("--setup --setup-reps 3 --nonblocking"),
        });
        // The mesh that keeps its world (`DeviceMesh::from_world`), beside
        // `DeviceMesh::new`; not in `setup_ms`, which is `new`'s.
        jobs.push(Job {
            name: "setup-processes-keeps-world".into(),
            mode: "processes",
            args: w("--setup --setup-reps 3 --mesh-keeps-world"),
        });
        // A fresh process's first world, three launches: like for like
        // with PyTorch's set-up side (`world_over_torch`).
        for i in 0..3 {
            jobs.push(Job {
                name: format!("setup-processes-fresh-{i}"),
                mode: "processes",
                args: w("--setup --setup-reps 1 --fresh-process"),
            });
        }
    }
    if want("step") {
        for mode in ["threads", "processes"] {
            jobs.push(Job {
                name: format!("step-{mode}"),
                mode,
                args: w("--step --step-raw-mesh -n 500 -w 50 --rounds 11"),
            });
        }
    }
    // The phases of one job each: (phase, mode, arguments); the job is
    // `PHASE-MODE`.
    let singles: [(&str, &'static str, &str); 4] = [
        (
            "events",
            "threads",
            "--cudarc-events --ops all_reduce -b 8 -e 8 -n 1000 -w 100 --rounds 5",
        ),
        (
            "small",
            "threads",
            "--small -b 8 -e 16M -n 200 -w 20 --rounds 5",
        ),
        // The default, by shrink, asked for by name: the environment must
        // not change what `recover_ms` measures.
        (
            "recover",
            "threads",
            "--recover --recover-by-shrink --setup-reps 3",
        ),
        ("async", "single", "--async -n 2000 -w 200"),
    ];
    for (phase, mode, args) in singles {
        if want(phase) {
            jobs.push(Job {
                name: format!("{phase}-{mode}"),
                mode,
                args: w(args),
            });
        }
    }
    // The recover phase again, giving the old world up instead of
    // shrinking it (`recover_without_shrink_ms`; `recover_ms` is the
    // default's, by shrink).
    if want("recover") {
        jobs.push(Job {
            name: "recover-threads-give-up".into(),
            mode: "threads",
            args: w("--recover --recover-give-up --setup-reps 3"),
        });
        // A process per GPU: the last rank's process kills itself, so a
        // launch is one rep (three, as the threads' reps).
        for i in 0..3 {
            jobs.push(Job {
                name: format!("{LOST_LAST}{i}"),
                mode: "processes",
                args: w("--recover --recover-by-shrink --setup-reps 1"),
            });
        }
    }
    // The small phase again with a process per GPU, as PyTorch's side runs
    // (its rows beside the threads'; the summary keys stay the threads').
    if want("small") {
        jobs.push(Job {
            name: "small-processes".into(),
            mode: "processes",
            args: w("--small -b 8 -e 16M -n 200 -w 20 --rounds 5"),
        });
    }
    jobs
}

/// The jobs whose last rank kills its process on purpose (the recover
/// phase with a process per GPU), `PREFIX` + the launch's number.
const LOST_LAST: &str = "recover-processes-";

/// Whether a launch of `job` ended as it should: every rank exited with
/// success, except in a [`LOST_LAST`] job, whose last rank must have been
/// killed by a signal (SIGKILL, its own) and the others succeeded.
fn launch_ok(job: &str, statuses: &[std::process::ExitStatus]) -> bool {
    use std::os::unix::process::ExitStatusExt;
    match statuses.split_last() {
        Some((last, others)) if job.starts_with(LOST_LAST) => {
            last.signal() == Some(9) && others.iter().all(std::process::ExitStatus::success)
        }
        _ => statuses.iter().all(std::process::ExitStatus::success),
    }
}

fn bench_binary(o: &Options) -> Result<PathBuf> {
    if let Some(dir) = &o.from_bundle {
        let path = dir.join(BENCH);
        if !path.exists() {
            return Err(format!("{} is missing: rebuild the bundle", path.display()).into());
        }
        return Ok(path);
    }
    eprintln!("xtask: building the bench ({BENCH_PROFILE})");
    crate::run(cargo().args(["build", "--profile", BENCH_PROFILE, "-p", BENCH]))?;
    Ok(crate::target_dir().join(BENCH_PROFILE).join(BENCH))
}

pub fn run(args: &[&str]) -> Result<()> {
    let o = parse(args)?;
    if let Some(dir) = &o.report_only {
        return report::report(dir);
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
        if left.is_zero() {
            eprintln!(
                "xtask: bench: {} not run: the bench's --timeout ({} s, every job together) ran out",
                job.name,
                o.timeout.as_secs()
            );
            failed.push(job.name.clone());
            continue;
        }
        let ok = if job.mode == "processes" {
            match launch_ranks(&bin, &args, n, left)? {
                Ended::Exited(s) => launch_ok(&job.name, &s),
                Ended::TimedOut => false,
            }
        } else {
            args.extend(["--gpus".into(), n.to_string()]);
            let log = o.out.join(format!("{}.log", job.name));
            run_logged(Command::new(&bin).args(&args), &log, left, false)?
        };
        if !ok {
            eprintln!("xtask: bench: {} failed", job.name);
            failed.push(job.name.clone());
        }
    }
    if let Some(python) = &o.python {
        let sides = [
            TorchSide {
                phase: "setup",
                script: TORCH_SETUP,
                name: "setup-torch",
                args: &[],
                // A launch per rep: with PyTorch 2.11 on 2 H200s both
                // ranks died (SIGSEGV) in a second rep that initialised
                // again after `destroy_process_group` in the same process.
                // Six, as our set-up phase: five warm reps for the median
                // (with two, the upper median was the slower of them).
                reps: Some(6),
            },
            TorchSide {
                phase: "step",
                script: TORCH_STEP,
                name: "torch-step",
                args: &["--iters", "500", "--warmup", "50", "--rounds", "11"],
                reps: None,
            },
            TorchSide {
                phase: "small",
                script: TORCH_SMALL,
                name: "small-torch",
                args: &["--iters", "200", "--warmup", "20", "--rounds", "5"],
                reps: None,
            },
        ];
        for side in &sides {
            if o.phases.iter().any(|p| p == side.phase)
                && !torch_side(&o, python, n, deadline, side)?
            {
                failed.push(side.name.into());
            }
        }
    }
    let verdict = report::report(&o.out);
    if !failed.is_empty() {
        return Err(format!("bench runs failed: {}", failed.join(", ")).into());
    }
    verdict
}

/// PyTorch's side of a phase: a script in `python/examples` (a bundle's
/// `python`) run under `torch.distributed.run`, a process per GPU.
struct TorchSide {
    /// The phase it stands beside.
    phase: &'static str,
    script: &'static str,
    /// Its results: `NAME.json` (and `NAME.log`, `NAME.err`) in `--out`.
    name: &'static str,
    /// The script's arguments, after `--json NAME.json`.
    args: &'static [&'static str],
    /// `Some(n)`: `n` launches, each one rep (`--rep I`, 0 cold), each
    /// adding its row to `NAME.json`; `None`: one launch.
    reps: Option<usize>,
}

/// Runs `side` on `n` GPUs, writing `NAME.json` beside the bench's own
/// results, each launch with what is left of the deadline; every
/// launch's output goes to the same `NAME.log` and `NAME.err`, one after
/// the other. False when any launch fails (the launches after it do not
/// run).
fn torch_side(
    o: &Options,
    python: &Path,
    n: usize,
    deadline: Instant,
    side: &TorchSide,
) -> Result<bool> {
    let name = side.name;
    let script = match &o.from_bundle {
        Some(dir) => dir.join("python").join(side.script),
        None => workspace_root().join("python/examples").join(side.script),
    };
    let json = o.out.join(format!("{name}.json"));
    let log = o.out.join(format!("{name}.log"));
    for path in [&json, &log, &log.with_extension("err")] {
        let _ = std::fs::remove_file(path);
    }
    let launches: Vec<Option<usize>> = match side.reps {
        Some(reps) => (0..reps).map(Some).collect(),
        None => vec![None],
    };
    for rep in launches {
        let mut cmd = Command::new(python);
        // No NVLink multicast on either side: NCCL's NVLS and PyTorch's
        // symmetric memory (which would call cuMulticastCreate) stay off.
        cmd.env("NCCL_NVLS_ENABLE", "0")
            .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1");
        cmd.args(["-m", "torch.distributed.run", "--standalone"])
            .arg(format!("--nproc-per-node={n}"))
            .arg(&script)
            .arg("--json")
            .arg(&json)
            .args(side.args);
        let what = match rep {
            Some(rep) => {
                cmd.arg("--rep").arg(rep.to_string());
                format!(" rep {rep} ({})", if rep == 0 { "cold" } else { "warm" })
            }
            None => String::new(),
        };
        eprintln!(
            "xtask: bench: PyTorch's {name}{what} on {n} GPUs ({})",
            python.display()
        );
        if rep.is_some() {
            // Where each launch's output starts in the shared logs.
            for path in [log.clone(), log.with_extension("err")] {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                writeln!(file, "--- xtask: {name}{what}")?;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !run_logged(&mut cmd, &log, left, true)? {
            eprintln!("xtask: bench: PyTorch's {name}{what} failed");
            return Ok(false);
        }
    }
    Ok(true)
}

/// Runs `cmd` with its stdout in `log` and its stderr beside it
/// (`.err`), added to what they hold when `append`, killing it at the
/// deadline; on failure the logs' last lines are shown.
fn run_logged(cmd: &mut Command, log: &Path, left: Duration, append: bool) -> Result<bool> {
    let open = |path: &Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
    };
    let ok = run_with_deadline(
        cmd.stdout(open(log)?)
            .stderr(open(&log.with_extension("err"))?),
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
            eprintln!("xtask: bench: the bench's --timeout (every job together) ran out: killed");
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

mod excess;
mod json;
mod report;
mod summary;

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use super::*;

    #[test]
    fn only_a_recover_launch_may_lose_its_last_rank() {
        let ok = ExitStatus::from_raw(0);
        let failed = ExitStatus::from_raw(3 << 8);
        let killed = ExitStatus::from_raw(9);
        let job = format!("{LOST_LAST}0");
        assert!(launch_ok(&job, &[ok, killed]));
        assert!(launch_ok("setup-processes", &[ok, ok]));
        // Anywhere else a killed rank fails the job.
        assert!(!launch_ok("setup-processes", &[ok, killed]));
        // The recover launch: only the last may go, by a signal.
        assert!(!launch_ok(&job, &[killed, ok]));
        assert!(!launch_ok(&job, &[ok, ok]));
        assert!(!launch_ok(&job, &[ok, failed]));
        assert!(!launch_ok(&job, &[failed, killed]));
    }
}
