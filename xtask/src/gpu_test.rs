//! `cargo xtask gpu-test`: the GPU test matrix.
//!
//! Builds the GPU test binaries (release, stripped), lists their ignored
//! tests and runs each one for every world size and launch mode, one
//! process per cell with a deadline, then prints the matrix of test x world
//! size x mode with pass/fail and time.
//!
//! ```text
//! cargo xtask gpu-test [--worlds 1,2,4] [--modes single,threads,processes]
//!                      [--filter TEXT] [--targets nccl-safe-gpu,nccl-dist-gpu,...]
//!                      [--timeout SECS] [--out DIR]
//! cargo xtask gpu-test --bundle DIR          # pack binaries + xtask for a host without cargo
//! DIR/xtask gpu-test --from-bundle DIR ...   # run there
//! cargo xtask gpu-test --faults [--worlds 2,4] [--modes threads,processes]
//!                      [--filter TEXT] [--faults-report PATH]  # the fault-injection suite
//! ```
//!
//! `--python PATH` adds the cases with Python ranks (PyTorch and CuPy,
//! through the `nccl_rs` wheel) beside Rust ranks: see `gpu_py.rs`; they
//! need 2 GPUs and are reported as not run with fewer.
//!
//! `--faults` runs `nccl-dist`'s fault-injection cases instead of the
//! matrix, for world sizes 2 and 4 (those the host has) in `processes` and
//! `threads` modes: see `faults.rs`. `--faults-report PATH` also writes its
//! table to PATH (a directory gets `<device kind>.md`).
//!
//! Without `--worlds`, the sizes 1, 2, 4 and 8 that the host has are run; an
//! explicit world larger than the host's GPU count is an error, as is a
//! host with no GPU.
//!
//! Launch modes: `single` (one thread drives every GPU), `threads` (a
//! thread per rank) and `processes` (xtask starts a process per rank with
//! the torchrun variables, fresh ports and a fresh `NCCL_RS_SECRET`, as
//! `cargo xtask launch` does).
//!
//! `--nodes N [--launcher slurm|openmpi] [--share-gpus]` runs the
//! `processes` mode of nccl-dist's GPU tests (and, with `--faults`, the
//! fault suite) on `N` emulated hosts of this machine: see `hosts.rs`.
//! World sizes default to `N` (a rank per host); the matrix gains the
//! transports NCCL used, and a connection between hosts that did not go
//! through the network fails the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::flags::{self, Flag, Trailing, switch, value};
use crate::hosts::{Hosts, Launcher};
use crate::launch::{Ended, job, rank_env, wait_all};
use crate::{Result, cargo, gpu_count, release_dir, workspace_root};

/// The GPU test targets: (package, test target, name in the bundle, whether
/// the launch mode matters). A target without communicators runs once per
/// world size; its other mode columns read `n/a`.
const TARGETS: &[(&str, &str, &str, bool)] = &[
    ("nccl-safe", "gpu", "nccl-safe-gpu", true),
    ("nccl-safe", "abort", "nccl-safe-abort", false),
    ("nccl-safe", "completion", "nccl-safe-completion", false),
    ("nccl-dist", "gpu", "nccl-dist-gpu", true),
    ("nccl-dist", "topology", "nccl-dist-topology", false),
    ("nccl-dist", "bad_input", "nccl-dist-bad-input", false),
];

/// The fault-injection suite (`--faults`): package, test target, name in
/// the bundle.
const FAULTS: (&str, &str, &str) = ("nccl-dist", "faults", "nccl-dist-faults");

/// Examples packed into a bundle (`DIR/examples/NAME`), for
/// `DIR/xtask launch` and torchrun on the GPU host: (package, example).
pub const EXAMPLES: &[(&str, &str)] = &[
    ("nccl-safe", "all_reduce"),
    ("nccl-dist", "dp_allreduce"),
    ("nccl-dist", "mesh_2d"),
    ("nccl-dist", "handled_error"),
    ("nccl-dist", "async_server"),
    ("nccl-dist", "weight_sync"),
];

/// The bench binary (package `nccl-bench`), packed as `DIR/nccl-bench`
/// for `DIR/xtask bench --from-bundle DIR`.
pub const BENCH: &str = "nccl-bench";

/// The cargo profile the bench is built with (`Cargo.toml`: release with
/// fat LTO and one codegen unit).
pub const BENCH_PROFILE: &str = "release-lto";

/// PyTorch's side of the bench's set-up phase (`bench --python`), in
/// `python/examples` and a bundle's `python`.
pub const TORCH_SETUP: &str = "torch_setup.py";

/// PyTorch's side of the bench's step phase (`bench --python`).
pub const TORCH_STEP: &str = "torch_step.py";

/// PyTorch's side of the bench's small phase (`bench --python`).
pub const TORCH_SMALL: &str = "torch_small.py";

/// Launch modes the harnesses understand (`NCCL_SAFE_TEST_MODE`).
const MODES: &[&str] = &["single", "threads", "processes"];

struct Options {
    worlds: Option<Vec<usize>>,
    modes: Vec<String>,
    filter: Option<String>,
    targets: Option<Vec<String>>,
    timeout: Duration,
    out: PathBuf,
    bundle: Option<PathBuf>,
    from_bundle: Option<PathBuf>,
    faults: bool,
    faults_report: Option<PathBuf>,
    python: Option<PathBuf>,
    hosts: Option<Hosts>,
}

/// The flags of `gpu-test`.
const FLAGS: &[Flag] = &[
    value(&["--worlds"]),
    value(&["--modes"]),
    value(&["--filter"]),
    value(&["--targets"]),
    value(&["--timeout"]),
    value(&["--out"]),
    value(&["--bundle"]),
    value(&["--from-bundle"]),
    switch(&["--faults"]),
    value(&["--faults-report"]),
    value(&["--python"]),
    value(&["--nodes"]),
    value(&["--launcher"]),
    switch(&["--share-gpus"]),
];

fn parse(args: &[&str]) -> Result<Options> {
    let p = flags::parse("gpu-test", FLAGS, Trailing::None, args)?;
    let worlds = p
        .list("--worlds", None, "world size")?
        .map(|list| {
            list.iter()
                .map(|w| {
                    w.parse::<usize>()
                        .map_err(|_| format!("bad world size {w:?}"))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let target_names: Vec<&str> = TARGETS.iter().map(|t| t.2).collect();
    let launcher = p.value("--launcher");
    let hosts = match p.parsed::<usize>("--nodes", "hosts")? {
        Some(nodes) => Some(Hosts {
            nodes,
            launcher: Launcher::parse(launcher.unwrap_or("slurm"))?,
            share_gpus: p.has("--share-gpus"),
        }),
        None if launcher.is_some() || p.has("--share-gpus") => {
            return Err("--launcher and --share-gpus go with --nodes N".into());
        }
        None => None,
    };
    let modes = p.list("--modes", Some(MODES), "mode")?;
    if hosts.is_some()
        && modes
            .as_ref()
            .is_some_and(|m| m.iter().any(|m| m != "processes"))
    {
        return Err("--nodes runs a process per rank: only --modes processes goes with it".into());
    }
    let default_modes: &[&str] = if hosts.is_some() {
        &["processes"]
    } else {
        MODES
    };
    Ok(Options {
        worlds,
        modes: modes.unwrap_or_else(|| default_modes.iter().map(|m| m.to_string()).collect()),
        filter: p.value("--filter").map(str::to_string),
        targets: p.list("--targets", Some(&target_names), "target")?,
        timeout: Duration::from_secs(p.parsed("--timeout", "seconds")?.unwrap_or(300)),
        out: p
            .value("--out")
            .map_or_else(|| workspace_root().join("target/gpu-test"), PathBuf::from),
        bundle: p.value("--bundle").map(PathBuf::from),
        from_bundle: p.value("--from-bundle").map(PathBuf::from),
        faults: p.has("--faults"),
        faults_report: p.value("--faults-report").map(PathBuf::from),
        python: p.value("--python").map(PathBuf::from),
        hosts,
    })
}

pub fn run(args: &[&str]) -> Result<()> {
    let o = parse(args)?;
    if let Some(dir) = &o.bundle {
        return bundle(dir);
    }
    if o.faults {
        let binary = match &o.from_bundle {
            Some(dir) => dir.join("tests").join(FAULTS.2),
            None => build_tests(&[(FAULTS.0, FAULTS.1)])?.remove(0),
        };
        if !binary.exists() {
            return Err(format!("test binary {} is missing", binary.display()).into());
        }
        // `single` has no meaning here: one thread cannot lose a peer.
        let modes = [crate::faults::Mode::Processes, crate::faults::Mode::Threads]
            .into_iter()
            .filter(|m| o.modes.iter().any(|asked| asked == m.name()))
            .collect();
        let options = crate::faults::Options {
            worlds: o.worlds.as_deref(),
            modes,
            filter: o.filter.as_deref(),
            limit: o.timeout.min(Duration::from_secs(180)),
            out: &o.out,
            report: o.faults_report.as_deref(),
            hosts: o.hosts,
        };
        return crate::faults::run(&binary, gpu_count(), &options);
    }
    let binaries = match &o.from_bundle {
        Some(dir) => TARGETS
            .iter()
            .map(|(_, _, name, _)| dir.join("tests").join(name))
            .collect(),
        None => build_tests(&matrix_targets())?,
    };
    for b in &binaries {
        if !b.exists() {
            return Err(format!("test binary {} is missing", b.display()).into());
        }
    }
    matrix(&o, &binaries)?;
    match &o.python {
        Some(python) => python_cases(&o, python),
        None => Ok(()),
    }
}

/// The cases with Python ranks (`gpu_py.rs`), after the matrix.
fn python_cases(o: &Options, python: &Path) -> Result<()> {
    let pieces = match &o.from_bundle {
        Some(dir) => crate::gpu_py::Pieces {
            weight_sync: dir.join("examples").join("weight_sync"),
            scripts: dir.join("python"),
            wheels: dir.join("wheels"),
        },
        None => {
            crate::run(cargo().args([
                "build",
                "--release",
                "-p",
                "nccl-dist",
                "--example",
                "weight_sync",
            ]))?;
            crate::gpu_py::Pieces {
                weight_sync: release_dir().join("examples").join("weight_sync"),
                scripts: workspace_root().join("python").join("examples"),
                wheels: workspace_root().join("target").join("wheels"),
            }
        }
    };
    let (text, passed) = crate::gpu_py::run(python, &pieces, gpu_count(), o.timeout)?;
    std::fs::create_dir_all(&o.out)?;
    std::fs::write(o.out.join("python.md"), &text)?;
    println!("{text}");
    if passed {
        Ok(())
    } else {
        Err("a case with Python ranks failed (see above)".into())
    }
}

fn matrix_targets() -> Vec<(&'static str, &'static str)> {
    TARGETS.iter().map(|(p, t, _, _)| (*p, *t)).collect()
}

/// Builds test binaries in release mode, stripped; returns their paths.
fn build_tests(targets: &[(&str, &str)]) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for (package, target) in targets {
        eprintln!("xtask: building {package} --test {target} (release)");
        let out = cargo()
            .args([
                "test",
                "--release",
                "-p",
                package,
                "--test",
                target,
                "--no-run",
                "--message-format=json",
            ])
            .env("CARGO_PROFILE_RELEASE_STRIP", "true")
            .stderr(Stdio::inherit())
            .output()?;
        if !out.status.success() {
            return Err(format!("building {package} --test {target} failed").into());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let exe = text
            .lines()
            .filter(|l| {
                l.contains("\"compiler-artifact\"")
                    && l.contains(&format!("\"name\":\"{target}\""))
                    && l.contains(&format!("/{package}#"))
            })
            .find_map(|l| json_string(l, "executable"))
            .ok_or_else(|| format!("cargo did not report the {target} test executable"))?;
        paths.push(PathBuf::from(exe));
    }
    Ok(paths)
}

/// The string value of `"key":"..."` in one line of cargo's JSON.
fn json_string(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let rest = &line[start..];
    let end = rest.find('"')?;
    Some(rest[..end].replace("\\\\", "\\"))
}

/// Packs the test binaries and a release build of xtask into `dir`.
fn bundle(dir: &Path) -> Result<()> {
    let mut targets = matrix_targets();
    targets.push((FAULTS.0, FAULTS.1));
    let binaries = build_tests(&targets)?;
    std::fs::create_dir_all(dir.join("tests"))?;
    let names = TARGETS.iter().map(|t| t.2).chain([FAULTS.2]);
    for (path, name) in binaries.iter().zip(names) {
        std::fs::copy(path, dir.join("tests").join(name))?;
    }
    eprintln!("xtask: building the examples (release) for the bundle");
    let mut build = cargo();
    build.args(["build", "--release", "--examples"]);
    let packages: std::collections::BTreeSet<&str> = EXAMPLES.iter().map(|e| e.0).collect();
    for package in packages {
        build.args(["-p", package]);
    }
    crate::run(build.env("CARGO_PROFILE_RELEASE_STRIP", "true"))?;
    std::fs::create_dir_all(dir.join("examples"))?;
    for (_, name) in EXAMPLES {
        std::fs::copy(
            release_dir().join("examples").join(name),
            dir.join("examples").join(name),
        )?;
    }
    eprintln!("xtask: the nccl_rs wheel (release) and the Python examples for the bundle");
    let python = crate::py::venv()?;
    let wheel = crate::py::build_wheel(&python, true)?;
    std::fs::create_dir_all(dir.join("wheels"))?;
    std::fs::copy(
        &wheel,
        dir.join("wheels")
            .join(wheel.file_name().unwrap_or_default()),
    )?;
    std::fs::create_dir_all(dir.join("python"))?;
    for script in [
        "weight_sync.py",
        "cupy_allreduce.py",
        TORCH_SETUP,
        TORCH_STEP,
        TORCH_SMALL,
    ] {
        std::fs::copy(
            workspace_root().join("python/examples").join(script),
            dir.join("python").join(script),
        )?;
    }
    eprintln!("xtask: building the bench ({BENCH_PROFILE}) for the bundle");
    // Stripped by the profile itself: `CARGO_PROFILE_RELEASE_LTO_STRIP`
    // would read as release's `lto` key.
    crate::run(cargo().args(["build", "--profile", BENCH_PROFILE, "-p", BENCH]))?;
    std::fs::copy(
        crate::target_dir().join(BENCH_PROFILE).join(BENCH),
        dir.join(BENCH),
    )?;
    eprintln!("xtask: building xtask (release) for the bundle");
    crate::run(
        cargo()
            .args(["build", "--release", "-p", "xtask"])
            .env("CARGO_PROFILE_RELEASE_STRIP", "true"),
    )?;
    std::fs::copy(release_dir().join("xtask"), dir.join("xtask"))?;
    std::fs::write(
        dir.join("README.txt"),
        "Prebuilt GPU tests. Run on a host with NVIDIA GPUs and libnccl:\n  ./xtask gpu-test --from-bundle .\n",
    )?;
    eprintln!(
        "xtask: bundle ready in {} (run `{}/xtask gpu-test --from-bundle {}`)",
        dir.display(),
        dir.display(),
        dir.display()
    );
    Ok(())
}

#[derive(Clone)]
enum Outcome {
    NotApplicable,
    Pass(Duration),
    Fail(Duration),
    Timeout(Duration),
}

impl Outcome {
    fn cell(&self) -> String {
        match self {
            Outcome::NotApplicable => "n/a".to_string(),
            Outcome::Pass(d) => format!("pass {:.1}s", d.as_secs_f64()),
            Outcome::Fail(d) => format!("FAIL {:.1}s", d.as_secs_f64()),
            Outcome::Timeout(d) => format!("TIMEOUT {:.0}s", d.as_secs_f64()),
        }
    }
    fn passed(&self) -> bool {
        matches!(self, Outcome::Pass(_) | Outcome::NotApplicable)
    }
}

/// Runs one test in its own process (a process per rank in `processes`
/// mode), killing it at the deadline; the output goes to `log`.
fn run_one(
    binary: &Path,
    test: &str,
    world: usize,
    mode: &str,
    hosts: Option<&Hosts>,
    timeout: Duration,
    log: &Path,
) -> Result<Outcome> {
    let file = std::fs::File::create(log)?;
    let started = Instant::now();
    let ranks = if mode == "processes" { world } else { 1 };
    let (mut ports, secret) = job()?;
    if hosts.is_some() {
        ports = crate::hosts::ports()?;
        // NCCL's logs of an earlier run of this cell must not count.
        crate::hosts::remove_logs(&nccl_log(log))?;
    }
    let id_file = log.with_extension("id");
    let _ = std::fs::remove_file(&id_file);
    let mut children = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let mut cmd = Command::new(binary);
        cmd.args([
            "--ignored",
            "--exact",
            test,
            "--test-threads",
            "1",
            "--nocapture",
        ])
        .env("NCCL_SAFE_TEST_WORLD", world.to_string())
        .env("NCCL_SAFE_TEST_MODE", mode)
        .stdout(file.try_clone()?)
        .stderr(file.try_clone()?);
        match hosts {
            Some(h) => {
                h.apply(
                    &mut cmd,
                    rank,
                    world,
                    gpu_count(),
                    ports,
                    &secret,
                    &nccl_log(log),
                )?;
                cmd.env("NCCL_SAFE_TEST_NODES", h.nodes.to_string());
            }
            None if mode == "processes" => {
                cmd.envs(rank_env(rank, world, ports, &secret));
            }
            None => {}
        }
        if mode == "processes" {
            cmd.env("NCCL_SAFE_TEST_ID_FILE", &id_file);
        }
        children.push(cmd.spawn()?);
    }
    let ended = wait_all(&mut children, started + timeout)?;
    let _ = std::fs::remove_file(&id_file);
    let took = started.elapsed();
    Ok(match ended {
        Ended::Exited(statuses) if statuses.iter().all(|s| s.success()) => Outcome::Pass(took),
        Ended::Exited(_) => Outcome::Fail(took),
        Ended::TimedOut => Outcome::Timeout(took),
    })
}

/// Where NCCL's set-up log of the processes behind `log` goes (per
/// process: NCCL puts the pid for `%p`).
fn nccl_log(log: &Path) -> PathBuf {
    log.with_extension("nccl.%p")
}

/// The transports of the run behind `log` ([`nccl_log`]), in words, and
/// whether a connection between emulated hosts avoided the network.
fn transports_of(log: &Path, hosts: &Hosts, world: usize) -> (String, bool) {
    let dir = log.parent().unwrap_or(Path::new("."));
    let stem = log
        .with_extension("nccl.")
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let seen = crate::hosts::transports(dir, &stem);
    let local = crate::hosts::local_transports(&seen);
    let one_per_host = world == hosts.nodes;
    let summary = crate::hosts::summary(&seen);
    if one_per_host && !local.is_empty() {
        (
            format!("{summary} (between hosts without the network: {local:?})"),
            false,
        )
    } else {
        (summary, true)
    }
}

fn matrix(o: &Options, binaries: &[PathBuf]) -> Result<()> {
    let gpus = gpu_count();
    if gpus == 0 {
        return Err("gpu-test needs NVIDIA GPUs, and `nvidia-smi -L` lists none".into());
    }
    let worlds = match (&o.worlds, &o.hosts) {
        (Some(worlds), Some(h)) => {
            for &w in worlds {
                h.per_host(w, gpus)?;
            }
            worlds.clone()
        }
        (None, Some(h)) => {
            h.per_host(h.nodes, gpus)?;
            vec![h.nodes]
        }
        (Some(worlds), None) => {
            if let Some(w) = worlds.iter().find(|w| **w > gpus || **w == 0) {
                return Err(
                    format!("asked for world size {w}, but this host has {gpus} GPU(s)").into(),
                );
            }
            worlds.clone()
        }
        (None, None) => [1, 2, 4, 8].into_iter().filter(|w| *w <= gpus).collect(),
    };
    std::fs::create_dir_all(&o.out)?;
    let mut rows: Vec<(String, Vec<Outcome>)> = Vec::new();
    let mut columns = Vec::new();
    for w in &worlds {
        for m in &o.modes {
            columns.push(match &o.hosts {
                Some(h) => format!("{w} ranks, {}", h.describe(*w, gpus)),
                None => format!("{w} GPU{} {m}", if *w == 1 { "" } else { "s" }),
            });
        }
    }
    let mut tests = Vec::new();
    for (binary, (package, _, name, per_mode)) in binaries.iter().zip(TARGETS) {
        // Emulated hosts are for nccl-dist's launch, rendezvous and
        // placement: its tests that run a process per rank.
        if o.hosts.is_some() && !(*package == "nccl-dist" && *per_mode) {
            continue;
        }
        if o.targets
            .as_ref()
            .is_some_and(|t| !t.iter().any(|n| n == name))
        {
            continue;
        }
        for test in crate::list_tests(binary)? {
            // `--filter a,b` keeps tests whose name contains any of them.
            if o.filter
                .as_ref()
                .is_none_or(|f| f.split(',').any(|part| test.contains(part)))
            {
                tests.push((binary.clone(), test, *per_mode));
            }
        }
    }
    if tests.is_empty() {
        return Err("no GPU tests matched".into());
    }
    let total = tests.len() * columns.len();
    let mut done = 0;
    let mut transports: Vec<(String, String)> = Vec::new();
    let started = Instant::now();
    for (binary, test, per_mode) in &tests {
        let mut cells = Vec::new();
        for w in &worlds {
            for (k, m) in o.modes.iter().enumerate() {
                done += 1;
                if !per_mode && k > 0 {
                    cells.push(Outcome::NotApplicable);
                    continue;
                }
                let log = o.out.join(format!("{test}.w{w}.{m}.log"));
                // A mode-free target runs once, in one process.
                let mode = if *per_mode { m.as_str() } else { "single" };
                let mut outcome =
                    run_one(binary, test, *w, mode, o.hosts.as_ref(), o.timeout, &log)?;
                if let Some(h) = &o.hosts {
                    let (words, ok) = transports_of(&log, h, *w);
                    eprintln!("xtask:     NCCL transports: {words}");
                    if !ok && let Outcome::Pass(took) = outcome {
                        outcome = Outcome::Fail(took);
                    }
                    transports.push((format!("{test} ({w} ranks)"), words));
                }
                eprintln!(
                    "xtask: [{done}/{total}] {test} world {w} {m}: {} ({:.0}s elapsed)",
                    outcome.cell(),
                    started.elapsed().as_secs_f64()
                );
                if !outcome.passed() {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(15).collect();
                    for line in tail.into_iter().rev() {
                        eprintln!("    | {line}");
                    }
                }
                cells.push(outcome);
            }
        }
        rows.push((test.clone(), cells));
        // Keep the file current, so a run cut short still leaves its rows.
        let table = render(&columns, &rows, gpus) + &render_transports(&transports);
        std::fs::write(o.out.join("matrix.md"), table)?;
    }
    let table = render(&columns, &rows, gpus) + &render_transports(&transports);
    println!("{table}");
    std::fs::write(o.out.join("matrix.md"), &table)?;
    let failed = rows
        .iter()
        .flat_map(|(_, c)| c)
        .filter(|c| !c.passed())
        .count();
    if failed == 0 {
        Ok(())
    } else {
        Err(format!(
            "{failed} of {total} GPU test runs failed (logs in {})",
            o.out.display()
        )
        .into())
    }
}

/// The transports NCCL reported per run on emulated hosts (empty
/// without `--nodes`).
fn render_transports(rows: &[(String, String)]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = "\nNCCL transports (from its set-up log, one line per connection)\n\n\
                   | test | transports |\n|---|---|\n"
        .to_string();
    for (test, words) in rows {
        out.push_str(&format!("| {test} | {words} |\n"));
    }
    out
}

fn render(columns: &[String], rows: &[(String, Vec<Outcome>)], gpus: usize) -> String {
    let name_width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(4).max(4);
    let width = columns.iter().map(String::len).max().unwrap_or(10).max(12);
    let mut out = format!("GPU test matrix ({gpus} GPU(s) on this host)\n\n");
    out.push_str(&format!("| {:name_width$} |", "test"));
    for c in columns {
        out.push_str(&format!(" {c:width$} |"));
    }
    out.push('\n');
    out.push_str(&format!("|{}|", "-".repeat(name_width + 2)));
    for _ in columns {
        out.push_str(&format!("{}|", "-".repeat(width + 2)));
    }
    out.push('\n');
    for (name, cells) in rows {
        out.push_str(&format!("| {name:name_width$} |"));
        for cell in cells {
            out.push_str(&format!(" {:width$} |", cell.cell()));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_worlds_modes_and_rejects_unknown_modes() {
        let o = parse(&["--worlds", "1,4", "--modes", "threads", "--timeout", "9"]).unwrap();
        assert_eq!(o.worlds, Some(vec![1, 4]));
        assert_eq!(o.modes, vec!["threads".to_string()]);
        assert_eq!(o.timeout, Duration::from_secs(9));
        assert!(parse(&["--modes", "processes"]).is_ok());
        assert!(parse(&["--modes", "mpi"]).is_err());
        assert!(parse(&["--worlds", "two"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }

    #[test]
    fn reads_the_executable_from_cargo_json() {
        let line = r#"{"reason":"compiler-artifact","target":{"name":"gpu"},"executable":"/t/release/deps/gpu-abc"}"#;
        assert_eq!(
            json_string(line, "executable").as_deref(),
            Some("/t/release/deps/gpu-abc")
        );
    }

    #[test]
    fn renders_a_markdown_matrix() {
        let rows = vec![(
            "t".to_string(),
            vec![
                Outcome::Pass(Duration::from_millis(1500)),
                Outcome::Fail(Duration::ZERO),
            ],
        )];
        let text = render(&["1 GPU single".into(), "2 GPUs single".into()], &rows, 2);
        assert!(text.contains("| pass 1.5s"), "{text}");
        assert!(text.contains("FAIL 0.0s"), "{text}");
    }
}
