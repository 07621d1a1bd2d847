//! The examples a newcomer runs, run as a test (`cargo xtask test`): on a
//! machine without a GPU, each example that needs one must exit with a
//! non-zero status and its one-paragraph message, never a panic; the one
//! that needs only libnccl (`nccl_info`) must work.
//!
//! The test builds every example of the workspace (`cargo build
//! --examples`, nothing to do after `cargo test --all-targets`) and runs
//! the binaries cargo reports. On a host with GPUs the GPU examples are
//! left to the GPU matrix and the bundle (`cargo xtask gpu-test`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::{cargo, gpu_count};

/// What an example needs to do its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Needs {
    /// libnccl only (found through `NCCL_LIBRARY` here).
    Nccl,
    /// An NVIDIA GPU and its driver.
    Gpu,
    /// Arguments: a peer that another test drives (`cargo xtask py`).
    /// Started plainly it prints its usage as an error and exits with 2.
    Args,
}

/// Every example, in the order a newcomer runs them: package, name, need.
const EXAMPLES: &[(&str, &str, Needs)] = &[
    ("nccl-sys", "nccl_info", Needs::Nccl),
    ("nccl-safe", "all_reduce", Needs::Gpu),
    ("nccl-dist", "dp_allreduce", Needs::Gpu),
    ("nccl-dist", "mesh_2d", Needs::Gpu),
    ("nccl-dist", "handled_error", Needs::Gpu),
    ("nccl-dist", "async_server", Needs::Gpu),
    ("nccl-dist", "topology", Needs::Gpu),
    ("nccl-dist", "rendezvous_peer", Needs::Args),
    ("nccl-dist", "weight_sync", Needs::Gpu),
];

/// Launcher variables that would make an example join a job instead of
/// running alone.
const LAUNCHER_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
];

/// Builds every example of the workspace; their executables by name.
fn build_examples() -> BTreeMap<String, PathBuf> {
    let out = cargo()
        .args(["build", "--workspace", "--examples", "--locked"])
        .args(["--message-format", "json-render-diagnostics"])
        .output()
        .expect("cargo starts");
    assert!(
        out.status.success(),
        "cargo build --examples failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut built = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let is_example = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "example"));
        if let (true, Some(name), Some(exe)) = (
            is_example,
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) {
            built.insert(name.to_string(), PathBuf::from(exe));
        }
    }
    built
}

fn run(exe: &Path) -> Output {
    let mut cmd = Command::new(exe);
    for var in LAUNCHER_VARS {
        cmd.env_remove(var);
    }
    cmd.output().expect("the example starts")
}

#[test]
fn every_example_runs_or_says_what_it_needs() {
    let built = build_examples();
    let listed: Vec<&str> = EXAMPLES.iter().map(|e| e.1).collect();
    for name in built.keys() {
        assert!(
            listed.contains(&name.as_str()),
            "example {name} is not in examples.rs's EXAMPLES: say what it needs"
        );
    }
    let gpus = gpu_count();
    for (package, name, needs) in EXAMPLES {
        let exe = built
            .get(*name)
            .unwrap_or_else(|| panic!("{package} has no example {name}"));
        match needs {
            Needs::Nccl if std::env::var_os("NCCL_LIBRARY").is_none() => {
                eprintln!("skipped {name}: NCCL_LIBRARY is not set (`cargo xtask test` sets it)");
            }
            Needs::Nccl => {
                let out = run(exe);
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success() && stdout.contains("proved: "),
                    "{name} failed ({}):\n{stdout}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Needs::Args => {
                let out = run(exe);
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.code() == Some(2) && stdout.starts_with("error other: usage:"),
                    "{name} without arguments must print its usage and exit with 2 ({}):\n{stdout}",
                    out.status
                );
            }
            Needs::Gpu if gpus > 0 => {
                eprintln!("skipped {name}: {gpus} GPU(s) here; the GPU matrix runs it");
            }
            Needs::Gpu => {
                let out = run(exe);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert_eq!(
                    out.status.code(),
                    Some(1),
                    "{name} without a GPU must exit with status 1: {stderr}"
                );
                assert!(!stderr.contains("panicked"), "{name} panicked: {stderr}");
                let message = stderr.trim();
                assert!(
                    message.starts_with(&format!("{name} needs an NVIDIA GPU"))
                        && message.contains("docs/troubleshooting.md")
                        && !message.contains("\n\n"),
                    "{name}'s message is not the one paragraph: {stderr}"
                );
            }
        }
    }
}
