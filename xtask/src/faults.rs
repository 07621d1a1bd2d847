//! `cargo xtask gpu-test --faults`: the fault-injection suite.
//!
//! Each case of `nccl-dist`'s `faults` test binary (`tests/faults/`) runs
//! for every world size asked (default: 2 and 4 GPUs, those the host has)
//! in each mode it supports:
//!
//! - `processes`: a process per GPU with the torchrun variables, fresh
//!   ports and a fresh secret;
//! - `threads`: one process driving every GPU with a thread each
//!   (`World::spawn_local_with_options`), for the cases that kill no
//!   process.
//!
//! The victim (the rank that misbehaves) is chosen per case ([`CASES`]):
//! rank 0 for some, the last rank for others. The harness waits for the
//! ranks that must finish, then kills what is left (a stopped victim, or a
//! hung rank, which fails the case), checks how the victim ended (SIGKILL,
//! stopped, a panic reported by `spawn_local_with_options`) and reads what
//! each rank recorded (`<case>.<rank>`) into a table: per-rank verdict,
//! outcome, time to error (and after the victim's death), deadline, kernel
//! check, recovery. The table goes to `faults/faults.md` under `--out`,
//! and to `--faults-report PATH` when given (a directory gets
//! `<device kind>.md`, for `docs/faults/`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::Result;
use crate::hosts::Hosts;

mod cases;
use crate::launch::{job, rank_env};
use cases::{CASES, Case, End, SHARED_LOSS_BOUND_MS};

/// How a case is started.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// A process per GPU.
    Processes,
    /// One process, a thread per GPU.
    Threads,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Processes => "processes",
            Mode::Threads => "threads",
        }
    }
}

/// What `gpu-test` passes on.
pub struct Options<'a> {
    /// World sizes to run (each at least 2, at most the host's GPUs);
    /// `None`: 2 and 4, those the host has.
    pub worlds: Option<&'a [usize]>,
    /// Modes to run (each case runs in those it supports).
    pub modes: Vec<Mode>,
    /// Keeps cases whose name contains one of its comma-separated parts.
    pub filter: Option<&'a str>,
    /// The limit of one case (a case may ask for more).
    pub limit: Duration,
    /// Logs, results and `faults/faults.md` go under it.
    pub out: &'a Path,
    /// Where the table also goes: a file, or a directory that gets
    /// `<device kind>.md`.
    pub report: Option<&'a Path>,
    /// Emulated hosts (`--nodes`): each rank process on one (processes
    /// mode only).
    pub hosts: Option<Hosts>,
}

/// One run of a case.
struct CaseResult {
    name: String,
    mode: Mode,
    n: usize,
    victim: Option<usize>,
    passed: bool,
    took: Duration,
    /// What each rank recorded.
    ranks: Vec<BTreeMap<String, String>>,
    /// Each rank's verdict, for the table.
    verdicts: Vec<String>,
    /// How the victim ended, in words.
    victim_end: String,
    /// With a thread per GPU, GPU memory in use after the job returned
    /// over before it (the job's `held`).
    held: Option<String>,
    problems: Vec<String>,
}

fn read_fields(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(unix)]
fn signal_of(status: &ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

const SIGKILL: i32 = 9;

/// Starts the case's processes (`test` as listed): one per rank, or one
/// for every rank.
#[allow(clippy::too_many_arguments)]
fn start(
    binary: &Path,
    case: &Case,
    test: &str,
    n: usize,
    mode: Mode,
    hosts: Option<&Hosts>,
    results: &Path,
    log: &std::fs::File,
) -> Result<Vec<Child>> {
    let victim = case
        .victim
        .rank(n)
        .map_or("none".to_string(), |v| v.to_string());
    let command = || -> Result<Command> {
        let mut cmd = Command::new(binary);
        cmd.args([
            "--ignored",
            "--exact",
            test,
            "--test-threads",
            "1",
            "--nocapture",
        ])
        .env("NCCL_RS_FAULT_OUT", results)
        .env("NCCL_RS_FAULT_VICTIM", &victim)
        .env("NCCL_RS_FAULT_MODE", mode.name())
        .envs(case.env.iter().copied())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?);
        Ok(cmd)
    };
    match mode {
        Mode::Threads => {
            let mut cmd = command()?;
            cmd.env("NCCL_RS_FAULT_WORLD", n.to_string());
            Ok(vec![cmd.spawn()?])
        }
        Mode::Processes => {
            let (mut ports, secret) = job()?;
            if hosts.is_some() {
                ports = crate::hosts::ports()?;
            }
            let (port2, _) = job()?;
            let nccl_log = results.join(format!("{}.nccl.%p", case.name));
            (0..n)
                .map(|rank| {
                    let mut cmd = command()?;
                    match hosts {
                        Some(h) => {
                            let gpus = crate::gpu_count();
                            h.apply(&mut cmd, rank, n, gpus, ports, &secret, &nccl_log)?;
                            if n > gpus {
                                // Kernels of hosts sharing a GPU take turns,
                                // and an abort waits for them.
                                cmd.env("NCCL_RS_FAULT_LOSS_BOUND_MS", SHARED_LOSS_BOUND_MS);
                            }
                        }
                        None => {
                            cmd.envs(rank_env(rank, n, ports, &secret));
                        }
                    }
                    cmd.env("NCCL_RS_FAULT_PORT2", port2.0.to_string());
                    Ok(cmd.spawn()?)
                })
                .collect()
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    binary: &Path,
    case: &Case,
    test: &str,
    n: usize,
    mode: Mode,
    hosts: Option<&Hosts>,
    limit: Duration,
    dir: &Path,
) -> Result<CaseResult> {
    let results = dir.join("results").join(format!("w{n}-{}", mode.name()));
    std::fs::create_dir_all(&results)?;
    for entry in std::fs::read_dir(&results)? {
        let path = entry?.path();
        let stale = path
            .file_name()
            .and_then(|f| f.to_str())
            .is_some_and(|f| f.starts_with(&format!("{}.", case.name)));
        if stale {
            std::fs::remove_file(path)?;
        }
    }
    let log = std::fs::File::create(dir.join(format!("{}.w{n}.{}.log", case.name, mode.name())))?;
    let victim = case.victim.rank(n);
    // In processes mode, the victim of a kill or stop case does not have
    // to end by itself; every other process does.
    let waits_for =
        |i: usize| mode == Mode::Threads || Some(i) != victim || case.end == End::Passes;
    let started = Instant::now();
    let mut children = start(binary, case, test, n, mode, hosts, &results, &log)?;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.len()];
    let deadline = started + limit;
    loop {
        for (child, status) in children.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = child.try_wait()?;
            }
        }
        let done = statuses
            .iter()
            .enumerate()
            .all(|(i, s)| s.is_some() || !waits_for(i));
        if done || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    // A victim that kills itself may end a moment after the survivors were
    // seen done (its exit not yet collected): give it a little time before
    // judging it.
    if let Some(v) = victim
        && mode == Mode::Processes
        && case.end == End::KillsItself
    {
        let grace = Instant::now() + Duration::from_secs(5);
        while statuses[v].is_none() && Instant::now() < grace {
            statuses[v] = children[v].try_wait()?;
            if statuses[v].is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let mut problems = Vec::new();
    // How each process ended before the harness touched it.
    let ended_alone = statuses.clone();
    for (i, (child, status)) in children.iter_mut().zip(statuses.iter_mut()).enumerate() {
        if status.is_none() {
            let _ = child.kill();
            *status = Some(child.wait()?);
            if waits_for(i) {
                problems.push(format!("process {i} hung (killed after {limit:?})"));
            }
        }
    }
    let ranks: Vec<BTreeMap<String, String>> = (0..n)
        .map(|r| read_fields(&results.join(format!("{}.{r}", case.name))))
        .collect();
    let death = |r: usize| {
        std::fs::read_to_string(results.join(format!("{}.{r}.death", case.name)))
            .ok()
            .map(|t| {
                t.split_once(' ')
                    .map_or(String::new(), |(_, how)| how.trim().to_string())
            })
    };
    let mut verdicts = Vec::with_capacity(n);
    let mut victim_end = "-".to_string();
    for (r, fields) in ranks.iter().enumerate() {
        let reported = fields.get("pass").map(String::as_str) == Some("yes");
        let failure = || {
            fields
                .get("failed")
                .map_or(String::new(), |f| format!(": {f}"))
        };
        let verdict = match (Some(r) == victim, case.end, mode) {
            (true, End::KillsItself, Mode::Processes) => {
                let alone = ended_alone[r];
                if alone.is_some_and(|s| signal_of(&s) == Some(SIGKILL)) {
                    victim_end = death(r).unwrap_or_else(|| "SIGKILL".into());
                    "SIGKILL".to_string()
                } else {
                    problems.push(format!("the victim did not die of SIGKILL: {alone:?}"));
                    victim_end = format!("unexpected: {alone:?}");
                    "FAIL".to_string()
                }
            }
            (true, End::Stops, Mode::Processes) => match ended_alone[r] {
                None => {
                    victim_end = "stopped (SIGSTOP), killed by the harness".into();
                    "stopped".to_string()
                }
                Some(s) => {
                    problems.push(format!("the stopped victim exited by itself: {s}"));
                    victim_end = format!("unexpected: {s}");
                    "FAIL".to_string()
                }
            },
            (true, End::Panics, Mode::Threads) => match death(r) {
                Some(how) => {
                    victim_end = how;
                    "panicked".to_string()
                }
                None => {
                    problems.push(format!("rank {r} was to panic and did not record it"));
                    "FAIL".to_string()
                }
            },
            _ if reported => "pass".to_string(),
            _ => {
                problems.push(format!("rank {r} did not report a pass{}", failure()));
                "FAIL".to_string()
            }
        };
        verdicts.push(verdict);
    }
    if case.end == End::Passes {
        victim_end = if victim.is_some() {
            "took part".into()
        } else {
            "none (every rank alike)".into()
        };
    }
    // Every process the harness waited for must have exited 0; in threads
    // mode, the job's own verdict (spawn's result) must be a pass too.
    for (i, status) in ended_alone.iter().enumerate() {
        if waits_for(i) && status.is_some_and(|s| !s.success()) {
            problems.push(format!("process {i} failed ({})", status.expect("checked")));
        }
    }
    let mut held = None;
    if mode == Mode::Threads {
        let job = read_fields(&results.join(format!("{}.job", case.name)));
        held = job.get("held").cloned();
        if job.get("pass").map(String::as_str) != Some("yes") {
            problems.push(format!(
                "the job did not pass (spawn: {}){}",
                job.get("spawn").map_or("-", String::as_str),
                job.get("failed")
                    .map_or(String::new(), |f| format!(": {f}"))
            ));
        }
        if case.end == End::Panics {
            victim_end = format!(
                "{victim_end}; spawn returned {}",
                job.get("spawn").map_or("-", String::as_str)
            );
        }
    }
    Ok(CaseResult {
        name: case.name.to_string(),
        mode,
        n,
        victim,
        passed: problems.is_empty(),
        took,
        ranks,
        verdicts,
        victim_end,
        held,
        problems,
    })
}

/// The distinct values of `key` over the ranks that have it.
fn values(r: &CaseResult, key: &str) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for fields in &r.ranks {
        if let Some(v) = fields.get(key)
            && !seen.contains(&v.as_str())
        {
            seen.push(v);
        }
    }
    if seen.is_empty() {
        "-".to_string()
    } else {
        seen.join("; ")
    }
}

/// The largest number under `key` over the ranks.
fn max_of(r: &CaseResult, key: &str) -> Option<u64> {
    r.ranks
        .iter()
        .filter_map(|f| f.get(key)?.parse::<u64>().ok())
        .max()
}

fn or_dash(v: Option<u64>) -> String {
    v.map_or("-".to_string(), |v| v.to_string())
}

/// Table cells must not break the row.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn render(results: &[CaseResult], device: &str) -> String {
    let mut out = format!(
        "# Fault-injection suite: {device}\n\n\
         `cargo xtask gpu-test --faults`. Every world has the default options \
         (blocking communicators, watchdog, liveness) with the operation timeout \
         as the only setting. A lost peer must be named (`PeerLost`) within 2000 ms \
         of its death; \"after death\" is the slowest survivor's. Times in ms.\n\n\
         | GPUs | case | mode | victim | ranks | verdict | outcome | time to error | after death | deadline | kernel | recovery and details | case time |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in results {
        let mut details = Vec::new();
        for key in [
            "culprit",
            "death_bound_ms",
            "recovered",
            "rejoined",
            "rebuilt_ms",
            "released",
            "mesh",
            "drop_ms",
            "victim_drop_ms",
            "abort_call_ms",
            "wake_after_abort_ms",
            "group_end",
            "cycle1",
            "cycle10",
            "cycle50",
            "total_s",
        ] {
            let v = values(r, key);
            if v != "-" {
                details.push(format!("{key}: {}", cell(&v)));
            }
        }
        if let Some(held) = &r.held {
            details.push(format!("held after the job: {}", cell(held)));
        }
        let time = max_of(r, "error_after_ms")
            .or_else(|| max_of(r, "drop_ms"))
            .or_else(|| max_of(r, "abort_call_ms"))
            .or_else(|| max_of(r, "ended_after_ms"));
        let victim = match r.victim {
            Some(v) => format!("rank {v}: {}", r.victim_end),
            None => r.victim_end.clone(),
        };
        let ranks: Vec<String> = r
            .verdicts
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{i} {v}"))
            .collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1}s |\n",
            r.n,
            r.name,
            r.mode.name(),
            cell(&victim),
            ranks.join(", "),
            if r.passed { "pass" } else { "FAIL" },
            cell(&values(r, "outcome")),
            or_dash(time),
            or_dash(max_of(r, "since_death_ms")),
            or_dash(max_of(r, "deadline_ms")),
            values(r, "kernel"),
            details.join("<br>"),
            r.took.as_secs_f64()
        ));
    }
    for r in results.iter().filter(|r| !r.passed) {
        out.push_str(&format!(
            "\n{} ({} GPUs, {}): {}\n",
            r.name,
            r.n,
            r.mode.name(),
            r.problems.join("; ")
        ));
    }
    out
}

/// The world sizes to run: those asked (each at least 2 and at most the
/// host's GPUs), else 2 and 4 where the host has them. On emulated hosts:
/// those asked, else one rank per host, each checked by [`Hosts::per_host`].
fn world_sizes(asked: Option<&[usize]>, gpus: usize, hosts: Option<&Hosts>) -> Result<Vec<usize>> {
    if let Some(h) = hosts {
        let sizes = asked.map_or_else(|| vec![h.nodes], <[usize]>::to_vec);
        for &n in &sizes {
            h.per_host(n, gpus)?;
        }
        return Ok(sizes);
    }
    if gpus < 2 {
        return Err(format!("the fault suite needs at least 2 GPUs; this host has {gpus}").into());
    }
    match asked {
        Some(sizes) => {
            if let Some(bad) = sizes.iter().find(|&&n| n < 2 || n > gpus) {
                return Err(format!(
                    "the fault suite asked for {bad} GPUs; it needs at least 2 and this host has {gpus}"
                )
                .into());
            }
            Ok(sizes.to_vec())
        }
        None => Ok([2, 4].into_iter().filter(|&n| n <= gpus).collect()),
    }
}

/// The first GPU's name from `nvidia-smi -L` ("GPU 0: NVIDIA H200 (UUID:
/// ...)").
fn gpu_name() -> Option<String> {
    let out = Command::new("nvidia-smi").arg("-L").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("GPU "))?;
    let name = line.split_once(": ")?.1;
    Some(name.split(" (UUID").next()?.trim().to_string())
}

/// The device kind as a file name: "NVIDIA H200" on 2 GPUs is
/// `nvidia-h200-x2`.
fn device_kind(name: &str, gpus: usize) -> String {
    let mut slug = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    format!("{}-x{gpus}", slug.trim_end_matches('-'))
}

/// Where `--faults-report PATH` puts the table: into a directory as
/// `<device kind>.md`, else at PATH.
fn report_path(path: &Path, kind: &str) -> PathBuf {
    let is_dir = path.is_dir() || path.as_os_str().to_string_lossy().ends_with('/');
    if is_dir {
        path.join(format!("{kind}.md"))
    } else {
        path.to_path_buf()
    }
}

/// A listed test's function name (libtest lists `module::name`).
fn short(test: &str) -> &str {
    test.rsplit("::").next().unwrap_or(test)
}

/// The cases of `listed` (the binary's tests) to run, each with its name
/// as listed (what `--exact` needs), checked against [`CASES`].
fn select(listed: &[String], filter: Option<&str>) -> Result<Vec<(&'static Case, String)>> {
    let unknown: Vec<&str> = listed
        .iter()
        .map(String::as_str)
        .filter(|l| !CASES.iter().any(|c| c.name == short(l)))
        .collect();
    let missing: Vec<&str> = CASES
        .iter()
        .map(|c| c.name)
        .filter(|c| !listed.iter().any(|l| short(l) == *c))
        .collect();
    if !unknown.is_empty() || !missing.is_empty() {
        return Err(format!(
            "the fault binary and xtask's case table differ: not in the table {unknown:?}, \
             not in the binary {missing:?} (see xtask/src/faults.rs)"
        )
        .into());
    }
    Ok(CASES
        .iter()
        .filter(|c| filter.is_none_or(|f| f.split(',').any(|p| c.name.contains(p))))
        .filter_map(|c| {
            let test = listed.iter().find(|l| short(l) == c.name)?;
            Some((c, test.clone()))
        })
        .collect())
}

/// Runs the suite from `binary` on this host's `gpus` GPUs.
pub fn run(binary: &Path, gpus: usize, o: &Options) -> Result<()> {
    let sizes = world_sizes(o.worlds, gpus, o.hosts.as_ref())?;
    let cases = select(&crate::list_tests(binary)?, o.filter)?;
    let mut runs: Vec<(usize, &Case, &str, Mode)> = Vec::new();
    for &n in &sizes {
        for (case, test) in &cases {
            // Emulated hosts are processes: a thread cannot be a host.
            let modes = case
                .modes
                .iter()
                .filter(|m| o.modes.contains(m))
                .filter(|m| o.hosts.is_none() || **m == Mode::Processes);
            if n < case.min_world {
                eprintln!(
                    "xtask: {} skipped in a world of {n} (it needs {})",
                    case.name, case.min_world
                );
                continue;
            }
            for &mode in modes {
                runs.push((n, case, test, mode));
            }
        }
    }
    if runs.is_empty() {
        return Err("no fault cases matched (filter and modes)".into());
    }
    let name = gpu_name().unwrap_or_else(|| "unknown GPU".into());
    let kind = match &o.hosts {
        // Its own report: the emulated hosts do not replace the real run.
        Some(h) => format!("{}-{}hosts", device_kind(&name, gpus), h.nodes),
        None => device_kind(&name, gpus),
    };
    let device = match &o.hosts {
        Some(h) => format!(
            "{gpus} x {name} ({kind}), ranks on {}",
            h.describe(sizes[0], gpus)
        ),
        None => format!("{gpus} x {name} ({kind})"),
    };
    let dir = o.out.join("faults");
    std::fs::create_dir_all(&dir)?;
    let report = o.report.map(|p| report_path(p, &kind));
    let write = |results: &[CaseResult]| -> Result<()> {
        let table = render(results, &device);
        std::fs::write(dir.join("faults.md"), &table)?;
        if let Some(path) = &report {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, &table)?;
        }
        Ok(())
    };
    let started = Instant::now();
    let mut results = Vec::new();
    for (i, (n, case, test, mode)) in runs.iter().enumerate() {
        let tag = format!(
            "[{}/{}] {} ({n} GPUs, {})",
            i + 1,
            runs.len(),
            case.name,
            mode.name()
        );
        eprintln!("xtask: {tag} ...");
        let limit = case.limit.unwrap_or(o.limit);
        let r = run_case(binary, case, test, *n, *mode, o.hosts.as_ref(), limit, &dir)?;
        eprintln!(
            "xtask: {tag}: {} in {:.1}s ({:.0}s elapsed){}",
            if r.passed { "pass" } else { "FAIL" },
            r.took.as_secs_f64(),
            started.elapsed().as_secs_f64(),
            if r.passed {
                String::new()
            } else {
                format!(": {}", r.problems.join("; "))
            }
        );
        results.push(r);
        // Kept current, so a run cut short still leaves its rows.
        write(&results)?;
    }
    println!("{}", render(&results, &device));
    if let Some(path) = &report {
        eprintln!("xtask: fault table written to {}", path.display());
    }
    let failed = results.iter().filter(|r| !r.passed).count();
    if failed == 0 {
        Ok(())
    } else {
        Err(format!(
            "{failed} of {} fault case runs failed (logs in {})",
            results.len(),
            dir.display()
        )
        .into())
    }
}

#[cfg(test)]
mod tests;
