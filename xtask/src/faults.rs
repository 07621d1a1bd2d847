//! `cargo xtask gpu-test --faults`: the fault-injection suite.
//!
//! Each case of `nccl-dist`'s `faults` test binary runs as a job of a
//! process per GPU (up to 4), the last rank being the victim. The harness
//! waits for the survivors, then kills what is left (a stopped victim, or a
//! hung rank, which fails the case), checks how the victim ended, and reads
//! what each rank recorded (`NCCL_RS_FAULT_OUT/<case>.<rank>`) into a table:
//! outcome, time to error, deadline, and the recovery steps.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::Result;
use crate::launch::{job, rank_env};

/// How the victim of a case must end.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Victim {
    /// It kills itself with SIGKILL.
    KillsItself,
    /// It stops itself; the harness kills it after the survivors finish.
    Stops,
    /// It takes part and must pass like the others.
    Passes,
}

fn victim_of(case: &str) -> Victim {
    if case.starts_with("a_") {
        Victim::KillsItself
    } else if case.starts_with("b_") {
        Victim::Stops
    } else {
        Victim::Passes
    }
}

/// One case's result.
struct CaseResult {
    name: String,
    passed: bool,
    took: Duration,
    ranks: Vec<BTreeMap<String, String>>,
    victim: String,
    problems: Vec<String>,
}

#[cfg(unix)]
fn signal_of(status: &ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

fn read_fields(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run_case(
    binary: &Path,
    case: &str,
    n: usize,
    limit: Duration,
    dir: &Path,
) -> Result<CaseResult> {
    let results = dir.join("results");
    std::fs::create_dir_all(&results)?;
    for rank in 0..n {
        let _ = std::fs::remove_file(results.join(format!("{case}.{rank}")));
    }
    let log = std::fs::File::create(dir.join(format!("{case}.log")))?;
    let (ports, secret) = job()?;
    let (port2, _) = job()?;
    let victim = n - 1;
    let started = Instant::now();
    let mut children: Vec<Child> = Vec::with_capacity(n);
    for rank in 0..n {
        children.push(
            Command::new(binary)
                .args([
                    "--ignored",
                    "--exact",
                    case,
                    "--test-threads",
                    "1",
                    "--nocapture",
                ])
                .envs(rank_env(rank, n, ports, &secret))
                .env("NCCL_RS_FAULT_OUT", &results)
                .env("NCCL_RS_FAULT_VICTIM", victim.to_string())
                .env("NCCL_RS_FAULT_PORT2", port2.0.to_string())
                .stdout(log.try_clone()?)
                .stderr(log.try_clone()?)
                .spawn()?,
        );
    }
    let expect = victim_of(case);
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; n];
    let deadline = started + limit;
    loop {
        for (child, status) in children.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = child.try_wait()?;
            }
        }
        let survivors_done = statuses
            .iter()
            .enumerate()
            .all(|(r, s)| s.is_some() || (r == victim && expect != Victim::Passes));
        if survivors_done || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    let mut problems = Vec::new();
    // The victim's own end, before the harness touches it.
    let victim_before = statuses[victim];
    for (rank, (child, status)) in children.iter_mut().zip(statuses.iter_mut()).enumerate() {
        if status.is_none() {
            let _ = child.kill();
            *status = Some(child.wait()?);
            if rank != victim || expect == Victim::Passes {
                problems.push(format!("rank {rank} hung (killed after {limit:?})"));
            }
        }
    }
    for (rank, status) in statuses.iter().enumerate() {
        let ok = status.is_some_and(|s| s.success());
        if (rank != victim || expect == Victim::Passes) && !ok {
            problems.push(format!("rank {rank} failed ({status:?})"));
        }
    }
    let victim_text = match (expect, victim_before) {
        (Victim::KillsItself, Some(s)) if signal_of(&s) == Some(libc_sigkill()) => {
            "killed itself (SIGKILL)".to_string()
        }
        (Victim::KillsItself, other) => {
            problems.push(format!("the victim did not die of SIGKILL: {other:?}"));
            format!("unexpected: {other:?}")
        }
        (Victim::Stops, None) => "stopped, killed by the harness".to_string(),
        (Victim::Stops, Some(s)) => {
            problems.push(format!("the stopped victim exited by itself: {s}"));
            format!("unexpected: {s}")
        }
        (Victim::Passes, _) => "took part".to_string(),
    };
    let ranks: Vec<BTreeMap<String, String>> = (0..n)
        .map(|r| read_fields(&results.join(format!("{case}.{r}"))))
        .collect();
    for (rank, fields) in ranks.iter().enumerate() {
        let reports = rank != victim || expect == Victim::Passes;
        if reports && fields.get("pass").map(String::as_str) != Some("yes") {
            problems.push(format!(
                "rank {rank} did not report a pass{}",
                fields
                    .get("failed")
                    .map(|f| format!(": {f}"))
                    .unwrap_or_default()
            ));
        }
    }
    Ok(CaseResult {
        name: case.to_string(),
        passed: problems.is_empty(),
        took,
        ranks,
        victim: victim_text,
        problems,
    })
}

const fn libc_sigkill() -> i32 {
    9
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
fn max_of(r: &CaseResult, key: &str) -> String {
    r.ranks
        .iter()
        .filter_map(|f| f.get(key)?.parse::<u64>().ok())
        .max()
        .map_or("-".to_string(), |v| v.to_string())
}

fn render(results: &[CaseResult], n: usize) -> String {
    let mut out = format!(
        "Fault-injection suite: {n} GPUs, a process per rank, victim = rank {}\n\n\
         | case | verdict | victim | outcome on the other ranks | time to error (max ms) | deadline (ms) | after | case time |\n\
         |---|---|---|---|---|---|---|---|\n",
        n - 1
    );
    for r in results {
        let mut after = Vec::new();
        for key in [
            "kernel",
            "recovered",
            "rebuilt_ms",
            "drop_ms",
            "abort_call_ms",
            "wake_after_abort_ms",
            "victim_drop_ms",
            "cycle1",
            "cycle10",
            "cycle50",
            "total_s",
        ] {
            let v = values(r, key);
            if v != "-" {
                after.push(format!("{key}: {v}"));
            }
        }
        let time = match max_of(r, "error_after_ms").as_str() {
            "-" => max_of(r, "drop_ms"),
            t => t.to_string(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1}s |\n",
            r.name,
            if r.passed { "pass" } else { "FAIL" },
            r.victim,
            values(r, "outcome"),
            time,
            max_of(r, "deadline_ms"),
            after.join("<br>"),
            r.took.as_secs_f64()
        ));
    }
    for r in results.iter().filter(|r| !r.passed) {
        out.push_str(&format!("\n{}: {}\n", r.name, r.problems.join("; ")));
    }
    out
}

/// Runs every case of `binary` matching `filter` on `gpus` GPUs (at most
/// 4 are used); writes `faults.md` and the logs under `out`.
pub fn run(
    binary: &Path,
    gpus: usize,
    filter: Option<&str>,
    limit: Duration,
    out: &Path,
) -> Result<()> {
    if gpus < 2 {
        return Err(format!("the fault suite needs at least 2 GPUs; this host has {gpus}").into());
    }
    let n = gpus.min(4);
    let dir = out.join("faults");
    std::fs::create_dir_all(&dir)?;
    let cases: Vec<String> = crate::gpu_test::list_tests(binary)?
        .into_iter()
        .filter(|c| filter.is_none_or(|f| f.split(',').any(|p| c.contains(p))))
        .collect();
    if cases.is_empty() {
        return Err("no fault cases matched".into());
    }
    let started = Instant::now();
    let mut results = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        eprintln!(
            "xtask: [{}/{}] fault case {case} on {n} GPUs ...",
            i + 1,
            cases.len()
        );
        let r = run_case(binary, case, n, limit, &dir)?;
        eprintln!(
            "xtask: [{}/{}] {case}: {} in {:.1}s ({:.0}s elapsed){}",
            i + 1,
            cases.len(),
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
        std::fs::write(dir.join("faults.md"), render(&results, n))?;
    }
    let table = render(&results, n);
    println!("{table}");
    let failed = results.iter().filter(|r| !r.passed).count();
    if failed == 0 {
        Ok(())
    } else {
        Err(format!(
            "{failed} of {} fault cases failed (logs in {})",
            results.len(),
            dir.display()
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victims_follow_the_case_letter() {
        assert_eq!(victim_of("a_sigkill_mid_all_reduce"), Victim::KillsItself);
        assert_eq!(victim_of("b_sigstop_then_rebuild"), Victim::Stops);
        assert_eq!(victim_of("c1_mismatched_count"), Victim::Passes);
    }

    #[test]
    fn the_table_lists_outcomes_and_the_slowest_error() {
        let mut a = BTreeMap::new();
        a.insert("outcome".to_string(), "Timeout".to_string());
        a.insert("error_after_ms".to_string(), "5001".to_string());
        a.insert("deadline_ms".to_string(), "7000".to_string());
        let mut b = a.clone();
        b.insert("error_after_ms".to_string(), "5100".to_string());
        let r = CaseResult {
            name: "c1_mismatched_count".into(),
            passed: true,
            took: Duration::from_secs(9),
            ranks: vec![a, b],
            victim: "took part".into(),
            problems: vec![],
        };
        let table = render(&[r], 2);
        assert!(
            table.contains("| c1_mismatched_count | pass | took part | Timeout | 5100 | 7000 |"),
            "{table}"
        );
    }
}
