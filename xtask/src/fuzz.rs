//! `cargo xtask fuzz`: every cargo-fuzz target in `fuzz/` for a fixed time,
//! then a table of executions per target.
//!
//! ```text
//! cargo xtask fuzz [--time SECS] [--targets rendezvous_frame,unique_id,...]
//! ```
//!
//! Builds the targets once (`cargo +nightly fuzz build`), then runs each
//! with `cargo +nightly fuzz run TARGET --fuzz-dir fuzz --
//! -max_total_time=SECS` (60 s unless `--time` says otherwise) from the
//! workspace root. libFuzzer's output goes to `target/fuzz/TARGET.log`;
//! its final `Done N runs in M second(s)` line (or, after a crash, the last
//! `#N ... exec/s: X` status line) gives the executions and the rate. The
//! markdown summary is printed and written to `target/fuzz/summary.md`.
//! A target that crashed (its input is kept under `fuzz/artifacts/TARGET/`)
//! fails the command, after every target has run.
//!
//! The fuzz project is not a member of the workspace: it needs the nightly
//! toolchain (`rustup toolchain install nightly`) and cargo-fuzz
//! (`cargo install cargo-fuzz`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

use crate::flags::{self, Flag, Trailing, value};
use crate::{Result, workspace_root};

/// Seconds per target unless `--time` is given.
const DEFAULT_SECS: u64 = 60;

struct Options {
    secs: u64,
    targets: Option<Vec<String>>,
}

/// The flags of `fuzz`.
const FLAGS: &[Flag] = &[value(&["--time"]), value(&["--targets"])];

fn parse(args: &[&str]) -> Result<Options> {
    let p = flags::parse("fuzz", FLAGS, Trailing::None, args)?;
    let secs = p
        .parsed::<u64>("--time", "a positive number of seconds")?
        .unwrap_or(DEFAULT_SECS);
    if secs == 0 {
        return Err("--time takes a positive number of seconds".into());
    }
    Ok(Options {
        secs,
        targets: p.list("--targets", None, "target")?,
    })
}

/// The fuzz project.
fn fuzz_dir() -> PathBuf {
    workspace_root().join("fuzz")
}

/// The targets of the fuzz project: `fuzz/fuzz_targets/*.rs`, sorted.
fn all_targets(dir: &Path) -> Result<Vec<String>> {
    let src = dir.join("fuzz_targets");
    let entries =
        std::fs::read_dir(&src).map_err(|e| format!("cannot list {}: {e}", src.display()))?;
    let mut names = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs")
            && let Some(stem) = path.file_stem()
        {
            names.push(stem.to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// `cargo +nightly`, through the rustup proxy on the PATH (not `$CARGO`,
/// which is the toolchain running xtask), from the workspace root (also
/// `miri.rs`'s).
pub(crate) fn nightly_cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg("+nightly")
        .current_dir(workspace_root())
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC");
    cmd
}

/// Fails with how to install them when nightly or cargo-fuzz is missing.
fn check_tools() -> Result<()> {
    let ok = |cmd: &mut Command| {
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok(nightly_cargo().arg("--version")) {
        return Err(
            "`cargo +nightly` does not run: cargo-fuzz needs the nightly toolchain; \
             install it with `rustup toolchain install nightly` (and rustup itself from \
             https://rustup.rs if `cargo +TOOLCHAIN` is not understood)"
                .into(),
        );
    }
    if !ok(nightly_cargo().args(["fuzz", "--version"])) {
        return Err(
            "`cargo +nightly fuzz` does not run: install cargo-fuzz with `cargo install cargo-fuzz`"
                .into(),
        );
    }
    Ok(())
}

/// Executions and seconds from libFuzzer's last line,
/// `Done 883775 runs in 16 second(s)`.
pub fn parse_done(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim().strip_prefix("Done ")?;
    let (runs, rest) = rest.split_once(" runs in ")?;
    let secs = rest.strip_suffix(" second(s)")?;
    Some((runs.trim().parse().ok()?, secs.trim().parse().ok()?))
}

/// Executions and exec/s from a libFuzzer status line,
/// `#883775\tDONE   cov: 151 ft: 244 corp: 17/285b lim: 4096 exec/s: 55235 rss: 494Mb`.
pub fn parse_status(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim().strip_prefix('#')?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let runs = rest[..end].parse().ok()?;
    let (_, after) = rest.split_once("exec/s: ")?;
    let rate = after.split_whitespace().next()?.parse().ok()?;
    Some((runs, rate))
}

/// What one target's run came to.
#[derive(Debug, Default, PartialEq)]
struct Report {
    target: String,
    /// libFuzzer's seconds (`Done` line), else the wall-clock time.
    secs: u64,
    runs: Option<u64>,
    rate: Option<u64>,
    /// `None`: ran to the end without a finding.
    failure: Option<String>,
    /// The crashing input, as libFuzzer saved it.
    artifact: Option<String>,
    /// The panic or sanitizer message, a few lines.
    message: Vec<String>,
}

impl Report {
    fn result(&self) -> String {
        match &self.failure {
            None => "ok".to_string(),
            Some(why) => why.clone(),
        }
    }
}

/// Reads a finished run's output into a [`Report`].
fn summarize(target: &str, lines: &[String], status: Option<ExitStatus>, wall: u64) -> Report {
    let mut r = Report {
        target: target.to_string(),
        secs: wall,
        ..Report::default()
    };
    let mut done = None;
    let mut status_line = None;
    let mut panicked = false;
    let mut sanitizer = None;
    let mut i = 0;
    while i < lines.len() {
        let line = &lines[i];
        if let Some(d) = parse_done(line) {
            done = Some(d);
        } else if let Some(s) = parse_status(line) {
            status_line = Some(s);
        } else if line.contains("panicked at ") && !panicked {
            panicked = true;
            r.message.push(shorten(line.trim()));
            // The message follows, up to the backtrace.
            for next in lines[i + 1..].iter().take(4) {
                if next.starts_with("stack backtrace") || next.starts_with("note: ") {
                    break;
                }
                r.message.push(shorten(next.trim()));
            }
        } else if let Some((_, what)) = line.split_once("ERROR: ") {
            sanitizer.get_or_insert_with(|| what.trim().to_string());
        } else if let Some((_, path)) = line.split_once("Test unit written to ") {
            r.artifact = Some(path.trim().to_string());
        }
        i += 1;
    }
    if let Some((runs, secs)) = done {
        r.runs = Some(runs);
        r.secs = secs;
        r.rate = Some(runs / secs.max(1));
    } else if let Some((runs, rate)) = status_line {
        r.runs = Some(runs);
        r.rate = Some(rate);
    }
    let success = status.is_some_and(|s| s.success());
    r.failure = if panicked {
        Some("CRASH (panic)".to_string())
    } else if let Some(what) = sanitizer {
        Some(format!("CRASH ({what})"))
    } else if r.artifact.is_some() {
        Some("CRASH".to_string())
    } else if !success {
        Some(match status {
            Some(s) => format!("failed ({s})"),
            None => "failed (could not run)".to_string(),
        })
    } else {
        None
    };
    r
}

/// One line of at most 300 characters.
fn shorten(line: &str) -> String {
    match line.char_indices().nth(300) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_string(),
    }
}

/// Runs one target for `secs`, its output to `log`.
fn fuzz_one(target: &str, secs: u64, log: &Path) -> Result<Report> {
    let (reader, writer) = std::io::pipe()?;
    let mut cmd = nightly_cargo();
    cmd.args(["fuzz", "run", target, "--fuzz-dir", "fuzz", "--"])
        .arg(format!("-max_total_time={secs}"))
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start cargo +nightly fuzz run {target}: {e}"))?;
    // The command holds the pipe's write ends: drop them, or the reader
    // never sees the end.
    drop(cmd);
    let mut file =
        std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let mut lines = Vec::new();
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        file.write_all(&buf)?;
        lines.push(
            String::from_utf8_lossy(&buf)
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        );
    }
    let status = child.wait()?;
    Ok(summarize(
        target,
        &lines,
        Some(status),
        started.elapsed().as_secs(),
    ))
}

/// The markdown table, and what each crash left.
fn render(reports: &[Report], secs: u64) -> String {
    let mut out = format!("Fuzzing, {secs} s per target\n\n");
    out.push_str("| target | seconds | executions | exec/s | result |\n");
    out.push_str("|---|---:|---:|---:|---|\n");
    let num = |v: Option<u64>| v.map_or_else(|| "?".to_string(), |n| n.to_string());
    for r in reports {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.target,
            r.secs,
            num(r.runs),
            num(r.rate),
            r.result()
        ));
    }
    for r in reports.iter().filter(|r| r.failure.is_some()) {
        out.push_str(&format!("\n### {}: {}\n\n", r.target, r.result()));
        if let Some(a) = &r.artifact {
            out.push_str(&format!(
                "input: `{a}`\nreproduce: `cargo +nightly fuzz run {} --fuzz-dir fuzz {a}`\n",
                r.target
            ));
        }
        if !r.message.is_empty() {
            out.push_str("\n```text\n");
            for line in &r.message {
                out.push_str(line);
                out.push('\n');
            }
            out.push_str("```\n");
        }
        out.push_str(&format!("log: `target/fuzz/{}.log`\n", r.target));
    }
    out
}

pub fn run(args: &[&str]) -> Result<()> {
    let o = parse(args)?;
    let dir = fuzz_dir();
    let known = all_targets(&dir)?;
    let targets = match o.targets {
        Some(names) => {
            if let Some(bad) = names.iter().find(|n| !known.contains(n)) {
                return Err(
                    format!("unknown fuzz target {bad:?}; targets: {}", known.join(", ")).into(),
                );
            }
            names
        }
        None => known,
    };
    if targets.is_empty() {
        return Err(format!("no fuzz targets in {}/fuzz_targets", dir.display()).into());
    }
    check_tools()?;
    let out = workspace_root().join("target/fuzz");
    std::fs::create_dir_all(&out)?;
    // Build once, so each target's time is spent fuzzing.
    crate::run(nightly_cargo().args(["fuzz", "build", "--fuzz-dir", "fuzz"]))?;
    let mut reports = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        eprintln!(
            "xtask: [{}/{}] fuzzing {target} for {} s",
            i + 1,
            targets.len(),
            o.secs
        );
        let log = out.join(format!("{target}.log"));
        let r = fuzz_one(target, o.secs, &log)?;
        eprintln!(
            "xtask: [{}/{}] {target}: {} executions in {} s ({} exec/s): {}",
            i + 1,
            targets.len(),
            r.runs.map_or_else(|| "?".into(), |n| n.to_string()),
            r.secs,
            r.rate.map_or_else(|| "?".into(), |n| n.to_string()),
            r.result()
        );
        reports.push(r);
    }
    let table = render(&reports, o.secs);
    println!("\n{table}");
    let summary = out.join("summary.md");
    std::fs::write(&summary, &table)
        .map_err(|e| format!("cannot write {}: {e}", summary.display()))?;
    eprintln!("xtask: summary written to {}", summary.display());
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| r.failure.is_some())
        .map(|r| r.target.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "fuzz target(s) {} failed: see the summary above and fuzz/artifacts/",
            failed.join(", ")
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_done_line() {
        assert_eq!(
            parse_done("Done 883775 runs in 16 second(s)"),
            Some((883775, 16))
        );
        assert_eq!(parse_done("Done 0 runs in 0 second(s)\n"), Some((0, 0)));
        assert_eq!(parse_done("Done many runs in 16 second(s)"), None);
        assert_eq!(parse_done("Done 5 runs in 16 seconds"), None);
        assert_eq!(parse_done("#883775\tDONE   cov: 151"), None);
    }

    #[test]
    fn parses_status_lines() {
        assert_eq!(
            parse_status(
                "#883775\tDONE   cov: 151 ft: 244 corp: 17/285b lim: 4096 exec/s: 55235 rss: 494Mb"
            ),
            Some((883775, 55235))
        );
        assert_eq!(
            parse_status("#4096\tpulse  cov: 174 ft: 486 exec/s: 2048 rss: 84Mb"),
            Some((4096, 2048))
        );
        assert_eq!(parse_status("INFO: Seed: 2589972073"), None);
        assert_eq!(parse_status("#146\tINITED cov: 174 ft: 485"), None);
    }

    #[test]
    fn summarizes_clean_and_crashed_runs() {
        use std::os::unix::process::ExitStatusExt;
        let lines = |s: &str| s.lines().map(str::to_string).collect::<Vec<_>>();
        let success = ExitStatus::from_raw(0);
        let r = summarize(
            "t",
            &lines(
                "#8192\tpulse  cov: 1 exec/s: 4096 rss: 1Mb\n\
                 #100000\tDONE   cov: 1 exec/s: 9000 rss: 1Mb\n\
                 Done 100000 runs in 11 second(s)",
            ),
            Some(success),
            12,
        );
        assert_eq!((r.runs, r.rate, r.secs), (Some(100000), Some(9090), 11));
        assert_eq!(r.result(), "ok");

        let r = summarize(
            "t",
            &lines(
                "#8192\tpulse  cov: 1 exec/s: 4096 rss: 1Mb\n\
                 thread '<unnamed>' (1) panicked at fuzz_targets/t.rs:3:5:\n\
                 boom\n\
                 stack backtrace:\n\
                 ==1== ERROR: libFuzzer: deadly signal\n\
                 artifact_prefix='a/'; Test unit written to a/crash-12ab\n\
                 Error: Fuzz target exited with exit status: 77",
            ),
            None,
            3,
        );
        assert_eq!((r.runs, r.rate, r.secs), (Some(8192), Some(4096), 3));
        assert_eq!(r.result(), "CRASH (panic)");
        assert_eq!(r.artifact.as_deref(), Some("a/crash-12ab"));
        assert_eq!(r.message[1], "boom");
        let table = render(&[r], 3);
        assert!(
            table.contains("| t | 3 | 8192 | 4096 | CRASH (panic) |"),
            "{table}"
        );
        assert!(table.contains("a/crash-12ab"), "{table}");
    }

    #[test]
    fn parses_time_and_targets() {
        let o = parse(&["--time", "20", "--targets", "a, b"]).expect("parse");
        assert_eq!(o.secs, 20);
        assert_eq!(o.targets, Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(parse(&[]).expect("parse").secs, DEFAULT_SECS);
        assert!(parse(&["--time", "0"]).is_err());
        assert!(parse(&["--time"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }
}
