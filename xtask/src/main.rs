//! Project automation: `cargo xtask <command>`.
//!
//! ```text
//! cargo xtask test             fetch pinned libnccl wheels into target/, run every test
//! cargo xtask bindgen          regenerate crates/nccl-sys/tests/reference/*.rs
//! cargo xtask bindgen --check  fail if regenerating would change a file
//! cargo xtask fetch            only fetch the pinned wheels (and libclang)
//! cargo xtask fetch --newest   only the newest pinned NCCL (the README's quick start)
//! cargo xtask ci               fmt --check, clippy -D warnings, docs, test, py, bindgen --check,
//!                              package the published crates, check the minimum Rust
//! cargo xtask py               the Python package's wheel and its tests (see py.rs)
//! cargo xtask package          cargo package of the published crates (see publish.rs)
//! cargo xtask msrv             cargo check with the declared rust-version (see publish.rs)
//! cargo xtask gpu-test         the GPU test matrix (see gpu_test.rs)
//! cargo xtask launch -n N ...  a process per rank, like torchrun (see launch.rs)
//! cargo xtask fuzz             every cargo-fuzz target for 60 s (see fuzz.rs)
//! cargo xtask miri             the library crates' unit tests under Miri (see miri.rs)
//! cargo xtask bench            the benchmark in every launch mode, report and plot (see bench.rs)
//! ```
//!
//! Every subcommand reads its flags through `nccl-flags` (one declarative
//! table each) and answers `--help` from [`COMMANDS`].

mod bench;
mod bindgen;
#[cfg(test)]
mod examples;
mod faults;
mod fetch;
use nccl_flags as flags;
mod fuzz;
mod gpu_py;
mod gpu_test;
mod hosts;
mod launch;
mod miri;
mod pins;
mod publish;
mod py;
mod test;
#[cfg(test)]
mod tidy;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// xtask's error type: every failure ends the command with its message.
pub type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// Every subcommand with its help: the one list `cargo xtask --help` and
/// `cargo xtask <command> --help` print from.
const COMMANDS: &[(&str, &str)] = &[
    (
        "test",
        "test              fetch the pinned NCCL wheels into target/nccl and run all tests",
    ),
    (
        "bindgen",
        "bindgen [--check] regenerate the reference bindings (--check: fail if stale)",
    ),
    (
        "fetch",
        "fetch [--newest]  fetch the pinned NCCL wheels and libclang only
                    (--newest: only the newest NCCL, and print the NCCL_LIBRARY that finds it)",
    ),
    (
        "kernels",
        "kernels [--check] build nccl-safe's one-shot kernel to PTX with the pinned NVRTC
                    (--check: fail if the committed PTX differs)",
    ),
    (
        "ci",
        "ci                what CI runs (`.ci/run` calls it): fmt, clippy, docs, test, py, bindgen --check,
                    cargo package of the published crates, cargo check with the declared rust-version",
    ),
    (
        "py",
        "py [--release] [--no-test]
                    the Python package nccl_rs: a venv in target/py-venv with the pinned maturin,
                    the abi3 wheel into target/wheels, installed, then the Python tests
                    (python/tests) against the Rust peer; --release: an optimised wheel",
    ),
    (
        "package",
        "package           the checks of the published crates' metadata and file lists, then
                    cargo package of them (each built from its packaged form)",
    ),
    (
        "msrv",
        "msrv              cargo check of the workspace with its declared rust-version (rustup installs it)",
    ),
    (
        "gpu-test",
        "gpu-test [--worlds 1,2,4] [--modes single,threads,processes] [--filter TEXT] [--timeout SECS] [--out DIR]
           [--python PATH]
                    run the GPU test matrix (fails without the GPUs asked for); --python: then the
                    cases with PyTorch/CuPy ranks beside Rust ranks (2+ GPUs; PATH has torch and cupy)
  gpu-test --bundle DIR        pack the GPU tests, examples and xtask for a host without cargo
  gpu-test --from-bundle DIR   run a bundle's tests (on the GPU host)
  gpu-test --faults [--filter TEXT] [--worlds 2,4] [--modes processes,threads] [--faults-report PATH]
                    the fault-injection suite with default options (victim per case);
                    PATH a directory gets <device kind>.md
  gpu-test --nodes N [--launcher slurm|openmpi] [--share-gpus] [--faults] ...
                    a process per rank on N emulated hosts (own NCCL_HOSTID, GPUs and launcher
                    variables each): nccl-dist's GPU tests (or the fault suite) over NCCL's
                    network transport; --share-gpus lets hosts share GPUs (2 hosts on 1 GPU)",
    ),
    (
        "launch",
        "launch -n N [--timeout SECS] (--example NAME | --bin NAME | PROGRAM) [--] [ARGS]
                    run N processes on this machine with the torchrun variables
                    and a fresh NCCL_RS_SECRET (World::init() picks them up)",
    ),
    (
        "fuzz",
        "fuzz [--time SECS] [--targets a,b]
                    run each cargo-fuzz target in fuzz/ for SECS (default 60) s and
                    print a table of executions (needs nightly and cargo-fuzz)",
    ),
    (
        "miri",
        "miri [--crates a,b]
                    the library crates' unit tests under Miri (undefined behaviour in unsafe
                    code); tests that need libnccl, CUDA or sockets are skipped by name
                    (needs nightly with its miri component)",
    ),
    (
        "bench",
        "bench [--gpus N] [--quick] [--phases sweep,latency,graph,events,setup,step,async,recover,small]
           [--out DIR] [--python PATH] [--timeout SECS]
                    the bench (crates/nccl-bench) in every launch mode: report.md, bench.json and
                    busbw.svg in DIR (default target/bench); fails without a GPU; --timeout bounds
                    every job together (default 900 s), and a job that would start after it is
                    not run
  bench --from-bundle DIR ...  the same with a bundle's bench (on the GPU host)
  bench --report DIR           redo the report from DIR's JSON",
    ),
];

/// The help of every command.
fn usage() -> String {
    let mut text = String::from("usage: cargo xtask <command> [--help]\n\ncommands:\n");
    for (_, help) in COMMANDS {
        text.push_str("  ");
        text.push_str(help);
        text.push('\n');
    }
    text
}

/// The help of `command`, when `args` (what follows it) asks for it: a
/// `--help` or `-h` before any `--`; for `launch`, only as its first
/// argument (the rest may be the started program's).
fn help_for(command: &str, args: &[&str]) -> Option<String> {
    let asked = if command == "launch" {
        // What follows the program is the program's: only a first
        // argument asks `launch` itself.
        matches!(args.first(), Some(&("--help" | "-h")))
    } else {
        args.iter()
            .take_while(|a| **a != "--")
            .any(|a| matches!(*a, "--help" | "-h"))
    };
    if !asked {
        return None;
    }
    let (_, help) = COMMANDS.iter().find(|(name, _)| *name == command)?;
    Some(format!("usage: cargo xtask {help}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    if let [command, rest @ ..] = args.as_slice()
        && let Some(help) = help_for(command, rest)
    {
        // A closed pipe (`| head`) is not an error worth a panic.
        let _ = writeln!(std::io::stdout(), "{help}");
        return ExitCode::SUCCESS;
    }
    let outcome = match args.as_slice() {
        ["test"] => test::run_tests(),
        ["bindgen"] => bindgen::run(false),
        ["bindgen", "--check"] => bindgen::run(true),
        ["fetch"] => fetch::all_nccl().and_then(|()| fetch::libclang().map(drop)),
        ["fetch", "--newest"] => fetch::newest(),
        ["kernels"] => kernels(false),
        ["kernels", "--check"] => kernels(true),
        ["ci"] => ci(),
        ["package"] => publish::package(),
        ["py", rest @ ..] => py::run_py(rest),
        ["msrv"] => publish::msrv(),
        ["gpu-test", rest @ ..] => gpu_test::run(rest),
        ["launch", rest @ ..] => launch::run(rest),
        ["fuzz", rest @ ..] => fuzz::run(rest),
        ["miri", rest @ ..] => miri::run(rest),
        ["bench", rest @ ..] => bench::run(rest),
        ["help" | "--help" | "-h"] | [] => {
            let _ = writeln!(std::io::stdout(), "{}", usage());
            Ok(())
        }
        _ => Err(format!("unknown arguments {args:?}\n\n{}", usage()).into()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Where cargo builds: `CARGO_TARGET_DIR` (as cargo reads it) or the
/// workspace's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map_or_else(
            || workspace_root().join("target"),
            |d| workspace_root().join(d),
        )
}

/// Where cargo puts release builds: [`target_dir`], then `release/`.
pub fn release_dir() -> PathBuf {
    target_dir().join("release")
}

/// Runs a command, echoing it; a non-zero exit is an error.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!(
        "xtask: $ {}",
        display(cmd).lines().next().unwrap_or_default()
    );
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {}: {e}", display(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed with {status}", display(cmd)).into())
    }
}

fn display(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// GPUs `nvidia-smi -L` lists; 0 when it is missing or fails.
pub fn gpu_count() -> usize {
    match Command::new("nvidia-smi").arg("-L").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("GPU "))
            .count(),
        _ => 0,
    }
}

/// The ignored tests a libtest binary lists.
pub fn list_tests(binary: &Path) -> Result<Vec<String>> {
    let out = Command::new(binary)
        .args(["--list", "--ignored"])
        .output()?;
    if !out.status.success() {
        return Err(format!("{} --list failed", binary.display()).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect())
}

/// `cargo` as invoked us, so the same toolchain runs the sub-steps.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// Builds `crates/nccl-safe/kernels/one_shot.cu` to PTX with the pinned
/// NVRTC (`xtask/py/nvrtc_ptx.py`), once per target: `one_shot.ptx` for
/// compute_80 and `one_shot_90.ptx` for compute_90 (Hopper's launch
/// dependency wait), and each again with `ONE_SHOT_RELEASE` defined
/// (`_rel`: the flags in the PTX memory model's form); `check`: only
/// compares with the committed PTX.
fn kernels(check: bool) -> Result<()> {
    let lib = fetch::nvrtc()?;
    let root = workspace_root();
    let dir = root.join("crates/nccl-safe/kernels");
    for (file, arch, define) in [
        ("one_shot.ptx", "compute_80", None),
        ("one_shot_90.ptx", "compute_90", None),
        ("one_shot_rel.ptx", "compute_80", Some("-DONE_SHOT_RELEASE")),
        (
            "one_shot_90_rel.ptx",
            "compute_90",
            Some("-DONE_SHOT_RELEASE"),
        ),
    ] {
        let committed = dir.join(file);
        let out = if check {
            root.join("target/nvrtc").join(file)
        } else {
            committed.clone()
        };
        run(Command::new(fetch::python())
            .arg(root.join("xtask/py/nvrtc_ptx.py"))
            .arg(&lib)
            .arg(dir.join("one_shot.cu"))
            .arg(&out)
            .arg(arch)
            .args(define))?;
        if check && std::fs::read(&out)? != std::fs::read(&committed)? {
            return Err(format!(
                "crates/nccl-safe/kernels/{file} is stale: run `cargo xtask kernels`"
            )
            .into());
        }
        eprintln!("xtask: kernels: {} is current", committed.display());
    }
    Ok(())
}

/// The checks CI runs, in order: the one list (`.ci/run` calls this).
fn ci() -> Result<()> {
    let step = |name: &str| eprintln!("\n==> {name}");
    step("cargo fmt --check");
    run(cargo().args(["fmt", "--all", "--check"]))?;
    step("cargo clippy -D warnings");
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]))?;
    step("cargo doc (warnings denied)");
    run(cargo()
        .args(["doc", "--workspace", "--no-deps", "--locked"])
        .env("RUSTDOCFLAGS", "-D warnings"))?;
    step("cargo xtask test");
    test::run_tests()?;
    step("cargo xtask py: the Python package's wheel and its tests");
    py::run_py(&[])?;
    step("cargo xtask bindgen --check");
    bindgen::run(true)?;
    step("cargo xtask kernels --check: the committed PTX is built from its source");
    kernels(true)?;
    step("cargo package: the published crates build from their packaged form");
    publish::package()?;
    step("minimum Rust version: cargo check with the declared rust-version");
    publish::msrv()?;
    step("all checks passed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_answers_help_but_never_for_a_launched_program() {
        for (name, _) in COMMANDS {
            let help = help_for(name, &["--help"]).expect("help");
            assert!(
                help.starts_with(&format!("usage: cargo xtask {name}")),
                "{help}"
            );
        }
        assert!(help_for("bench", &["--quick", "-h"]).is_some());
        assert!(help_for("gpu-test", &["--worlds", "2", "--", "-h"]).is_none());
        // The launched program's arguments are its own.
        assert!(help_for("launch", &["-n", "2", "prog", "-h"]).is_none());
        assert!(help_for("launch", &["-n", "2", "prog", "--", "--help"]).is_none());
        assert!(help_for("nonsense", &["--help"]).is_none());
        assert!(usage().contains("gpu-test --bundle DIR"));
    }
}
