//! `cargo xtask miri`: the library crates' unit tests under Miri, which
//! checks every step of their unsafe code (and of what it calls) against
//! Rust's aliasing and validity rules.
//!
//! ```text
//! cargo xtask miri [--crates nccl-safe,nccl-dist,...]
//! ```
//!
//! Runs `cargo +nightly miri test -p CRATE --lib` for each crate of
//! [`RUNS`], with `MIRIFLAGS=-Zmiri-disable-isolation` unless `MIRIFLAGS`
//! is set (the tests read clocks and the environment). Miri interprets the
//! program and cannot call into libnccl, the CUDA driver or the network:
//! the tests that do are skipped by name, each with its reason, and what
//! the skipped tests cover is left to `cargo xtask test` and the GPU
//! matrix. Miri stops a test binary at the first undefined behaviour it
//! finds, so a finding ends that crate's run; the others still run. Each
//! crate's output goes to `target/miri/CRATE.log`, the summary to
//! `target/miri/summary.md`; any failure fails the command, after every
//! crate has run.
//!
//! Needs the nightly toolchain with its `miri` and `rust-src` components
//! (`rustup +nightly component add miri rust-src`).

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use crate::flags::{self, Flag, Trailing, value};
use crate::fuzz::nightly_cargo;
use crate::{Result, workspace_root};

/// A crate's unit tests under Miri, and the tests it cannot run.
pub struct Run {
    pub krate: &'static str,
    /// Test name filters (`--skip`, a substring) and why Miri cannot run
    /// them.
    pub skip: &'static [(&'static str, &'static str)],
}

/// Why a test is skipped: it loads libnccl (`dlopen`), which Miri cannot.
const LOADS_NCCL: &str = "loads libnccl (dlopen), a foreign library Miri cannot run";
/// Why a test is skipped: it opens sockets.
const SOCKETS: &str = "opens TCP sockets, which Miri does not support";

/// Every crate with unsafe code or threads and unit tests that need no
/// GPU, in the order they run.
pub const RUNS: &[Run] = &[
    Run {
        krate: "nccl-safe",
        skip: &[
            (
                "completion::thread::tests::a_panicking_entry_does_not_stop_the_others",
                "its waker thread registers an `atexit` hook, a foreign function Miri cannot call",
            ),
            (
                "unique_id::tests::files_hold_raw_bytes_or_hex_text",
                "opens a FIFO with O_NONBLOCK, a flag Miri does not support",
            ),
        ],
    },
    Run {
        krate: "nccl-dist",
        skip: &[
            (
                "mesh::tests::splits_partition_the_mesh_for_shapes_up_to_4d",
                "safe index arithmetic over every split of four shapes: more than ten minutes interpreted",
            ),
            (
                "world::resolved::tests::the_control_communicator_takes_one_channel_and_its_children_the_default",
                LOADS_NCCL,
            ),
        ],
    },
    Run {
        krate: "nccl-control",
        skip: &[
            (
                "liveness::engine",
                "the liveness engine's tests run it over socket pairs and poll(2), which Miri does not support",
            ),
            ("rendezvous::serve", SOCKETS),
            (
                "wire::tests::random_bytes_never_panic_and_never_open",
                "2 000 frames of random bytes through the AEAD: far too long interpreted (the rendezvous_frame fuzz target covers it)",
            ),
        ],
    },
    Run {
        krate: "nccl-sys",
        skip: &[],
    },
];

struct Options {
    crates: Option<Vec<String>>,
}

/// The flags of `miri`.
const FLAGS: &[Flag] = &[value(&["--crates"])];

fn parse(args: &[&str]) -> Result<Options> {
    let p = flags::parse("miri", FLAGS, Trailing::None, args)?;
    Ok(Options {
        crates: p.list("--crates", None, "crate")?,
    })
}

/// Fails with how to install it when `cargo +nightly miri` is missing.
fn check_tools() -> Result<()> {
    let ran = nightly_cargo()
        .args(["miri", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ran {
        return Ok(());
    }
    Err(
        "`cargo +nightly miri` does not run: install the nightly toolchain and its Miri \
         with `rustup toolchain install nightly --component miri,rust-src` (or \
         `rustup +nightly component add miri rust-src` where nightly is there)"
            .into(),
    )
}

/// What one crate's run came to.
#[derive(Debug, Default, PartialEq)]
pub struct Report {
    pub krate: String,
    pub secs: u64,
    pub passed: Option<u64>,
    pub failed: Option<u64>,
    /// Tests the skip filters left out (libtest's `filtered out`).
    pub skipped: Option<u64>,
    /// `None`: every test that ran passed.
    pub failure: Option<String>,
    /// What Miri said about it, a few lines.
    pub message: Vec<String>,
}

/// Passed, failed and filtered out (skipped) from libtest's `test result:
/// ok. 44 passed; 0 failed; 0 ignored; 0 measured; 23 filtered out; ...`
/// line.
pub fn parse_result(line: &str) -> Option<(u64, u64, u64)> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let count = |what: &str| -> Option<u64> {
        let (before, _) = rest.split_once(&format!(" {what}"))?;
        before
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    Some((
        count("passed")?,
        count("failed")?,
        count("filtered out").unwrap_or(0),
    ))
}

/// Reads a finished run's output into a [`Report`].
pub fn summarize(run: &Run, output: &str, success: bool, secs: u64) -> Report {
    let mut r = Report {
        krate: run.krate.to_string(),
        secs,
        ..Report::default()
    };
    let lines: Vec<&str> = output.lines().collect();
    for line in &lines {
        if let Some((passed, failed, filtered)) = parse_result(line) {
            r.passed = Some(r.passed.unwrap_or(0) + passed);
            r.failed = Some(r.failed.unwrap_or(0) + failed);
            r.skipped = Some(r.skipped.unwrap_or(0) + filtered);
        }
    }
    // Miri's own finding: the error line, where it points, and the test
    // that was running.
    // The error follows the running test's `test NAME ... ` on its line.
    if let Some(at) = lines.iter().position(|l| {
        l.contains("error: Undefined Behavior")
            || l.contains("error: unsupported operation")
            || l.contains("error: the main thread terminated without waiting")
    }) {
        let test = lines[..=at].iter().rev().find_map(|l| {
            l.strip_prefix("test ")
                .and_then(|t| t.split(" ... ").next())
        });
        if let Some(test) = test {
            r.message.push(format!("in test {test}"));
        }
        let first = lines[at]
            .find("error: ")
            .map_or(lines[at], |i| &lines[at][i..]);
        r.message.push(shorten(first));
        r.message.extend(
            lines[at + 1..]
                .iter()
                .take(5)
                .map(|l| shorten(l.trim_end()))
                .filter(|l| !l.trim().is_empty()),
        );
        r.failure = Some(if lines[at].contains("Undefined Behavior") {
            "UNDEFINED BEHAVIOUR".to_string()
        } else {
            "stopped by Miri".to_string()
        });
    } else if !success || r.failed.is_some_and(|f| f > 0) {
        r.failure = Some("failed".to_string());
        r.message.extend(
            lines
                .iter()
                .filter(|l| l.contains("panicked at") || l.starts_with("error"))
                .take(6)
                .map(|l| shorten(l)),
        );
    }
    r
}

/// One line of at most 300 characters.
fn shorten(line: &str) -> String {
    match line.char_indices().nth(300) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_string(),
    }
}

/// Runs one crate's tests, its output to `log`.
fn miri_one(run: &Run, log: &Path) -> Result<Report> {
    let mut cmd = nightly_cargo();
    cmd.args(["miri", "test", "-p", run.krate, "--lib", "--"]);
    for (name, _) in run.skip {
        cmd.args(["--skip", name]);
    }
    if std::env::var_os("MIRIFLAGS").is_none() {
        cmd.env("MIRIFLAGS", "-Zmiri-disable-isolation");
    }
    eprintln!("xtask: miri: {} ...", run.krate);
    let started = Instant::now();
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| {
        format!(
            "cannot start cargo +nightly miri test -p {}: {e}",
            run.krate
        )
    })?;
    let secs = started.elapsed().as_secs();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    std::fs::write(log, &text).map_err(|e| format!("cannot write {}: {e}", log.display()))?;
    let r = summarize(run, &text, out.status.success(), secs);
    eprintln!(
        "xtask: miri: {}: {} in {secs} s",
        run.krate,
        r.failure.as_deref().unwrap_or("ok")
    );
    Ok(r)
}

/// The markdown table, the skipped tests with their reasons, and what each
/// failure said.
pub fn render(runs: &[&Run], reports: &[Report]) -> String {
    let mut out = String::from(
        "Miri, the library crates' unit tests (skipped: left out by the filters below)\n\n",
    );
    out.push_str("| crate | seconds | passed | failed | skipped | result |\n");
    out.push_str("|---|---:|---:|---:|---:|---|\n");
    let num = |v: Option<u64>| v.map_or_else(|| "?".to_string(), |n| n.to_string());
    for r in reports {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.krate,
            r.secs,
            num(r.passed),
            num(r.failed),
            num(r.skipped),
            r.failure.as_deref().unwrap_or("ok"),
        ));
    }
    for r in reports.iter().filter(|r| r.failure.is_some()) {
        out.push_str(&format!(
            "\n### {}: {}\n\n```text\n",
            r.krate,
            r.failure.as_deref().unwrap_or("")
        ));
        for line in &r.message {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&format!("```\nlog: `target/miri/{}.log`\n", r.krate));
    }
    let skipped: Vec<_> = runs
        .iter()
        .flat_map(|run| run.skip.iter().map(move |s| (run.krate, s)))
        .collect();
    if !skipped.is_empty() {
        out.push_str("\nSkipped (Miri cannot run them):\n\n");
        for (krate, (name, why)) in skipped {
            out.push_str(&format!("- {krate} `{name}`: {why}\n"));
        }
    }
    out
}

pub fn run(args: &[&str]) -> Result<()> {
    let o = parse(args)?;
    let runs: Vec<&Run> = match &o.crates {
        Some(names) => {
            let known: Vec<&str> = RUNS.iter().map(|r| r.krate).collect();
            if let Some(bad) = names.iter().find(|n| !known.contains(&n.as_str())) {
                return Err(format!("unknown crate {bad:?}; crates: {}", known.join(", ")).into());
            }
            RUNS.iter()
                .filter(|r| names.iter().any(|n| n == r.krate))
                .collect()
        }
        None => RUNS.iter().collect(),
    };
    check_tools()?;
    let out = workspace_root().join("target/miri");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let mut reports = Vec::new();
    for run in &runs {
        reports.push(miri_one(run, &out.join(format!("{}.log", run.krate)))?);
    }
    let summary = render(&runs, &reports);
    let path = out.join("summary.md");
    std::fs::write(&path, &summary).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    print!("{summary}");
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| r.failure.is_some())
        .map(|r| r.krate.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "miri: {} failed (see {})",
            failed.join(", "),
            path.display()
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_result_line_gives_passed_and_failed() {
        assert_eq!(
            parse_result(
                "test result: ok. 44 passed; 0 failed; 0 ignored; 0 measured; 23 filtered out; finished in 12.63s"
            ),
            Some((44, 0, 23))
        );
        assert_eq!(
            parse_result("test result: FAILED. 3 passed; 2 failed; 0 ignored"),
            Some((3, 2, 0))
        );
        assert_eq!(parse_result("test foo ... ok"), None);
    }

    #[test]
    fn undefined_behaviour_names_the_test_and_fails() {
        let run = Run {
            krate: "nccl-safe",
            skip: &[("a", "why")],
        };
        let output = "\
running 2 tests
test config::tests::one ... ok
test config::tests::set_fields_reach_the_struct ... error: Undefined Behavior: attempting a read access using <1> at alloc2[0x0], but that tag does not exist in the borrow stack for this location
   --> c_str.rs:767:22
error: aborting due to 1 previous error
";
        let r = summarize(&run, output, false, 7);
        assert_eq!(r.failure.as_deref(), Some("UNDEFINED BEHAVIOUR"));
        assert_eq!(
            r.message[0],
            "in test config::tests::set_fields_reach_the_struct"
        );
        let table = render(&[&run], &[r]);
        assert!(
            table.contains("| nccl-safe | 7 | ? | ? | ? | UNDEFINED BEHAVIOUR |"),
            "{table}"
        );
        assert!(table.contains("- nccl-safe `a`: why"), "{table}");
    }

    #[test]
    fn a_clean_run_is_ok_with_its_counts() {
        let run = Run {
            krate: "nccl-dist",
            skip: &[],
        };
        let output = "test a ... ok\n\ntest result: ok. 49 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 80.1s\n";
        let r = summarize(&run, output, true, 90);
        assert_eq!(r.failure, None);
        assert_eq!(
            (r.passed, r.failed, r.skipped),
            (Some(49), Some(0), Some(0))
        );
    }

    #[test]
    fn every_crate_is_a_workspace_member_once() {
        let root = workspace_root();
        let mut seen = Vec::new();
        for run in RUNS {
            assert!(
                root.join("crates")
                    .join(run.krate)
                    .join("Cargo.toml")
                    .exists(),
                "{} is not a crate of the workspace",
                run.krate
            );
            assert!(!seen.contains(&run.krate), "{} twice", run.krate);
            seen.push(run.krate);
            for (name, why) in run.skip {
                assert!(!name.is_empty() && !why.is_empty());
            }
        }
    }
}
