//! `cargo xtask py`: the Python package `nccl_rs` (`crates/nccl-py`),
//! built and tested on a machine with only Rust, Python 3 and pip.
//!
//! 1. a virtual environment in `target/py-venv` (made once) with the
//!    pinned maturin ([`pins::MATURIN`]);
//! 2. maturin builds the abi3 wheel (one for every CPython from 3.8 on)
//!    into `target/wheels` and pip installs it into the environment;
//! 3. the Python tests (`python/tests`, unittest): rendezvous over
//!    loopback between Python and the Rust peer
//!    (`crates/nccl-dist/examples/rendezvous_peer.rs`, built first and
//!    named by `RENDEZVOUS_PEER`), both directions, and the bad input.
//!
//! `--release` builds an optimised wheel (the one to carry to a GPU
//! host); `--no-test` stops after the install.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::flags::{self, Flag, Trailing, switch};
use crate::{Result, cargo, fetch, pins, run, target_dir, workspace_root};

/// The flags of `py`.
const FLAGS: &[Flag] = &[switch(&["--release"]), switch(&["--no-test"])];

/// The variable that tells the Python tests where the Rust peer is.
pub const PEER_VAR: &str = "RENDEZVOUS_PEER";

pub fn run_py(args: &[&str]) -> Result<()> {
    let p = flags::parse("py", FLAGS, Trailing::None, args)?;
    let python = venv()?;
    let wheel = build_wheel(&python, p.has("--release"))?;
    install_wheel(&python, &wheel)?;
    if p.has("--no-test") {
        return Ok(());
    }
    test(&python)
}

/// `target/py-venv` with the pinned maturin; returns its interpreter.
pub fn venv() -> Result<PathBuf> {
    let dir = workspace_root().join("target").join("py-venv");
    let python = dir.join("bin").join("python");
    if !python.exists() {
        eprintln!("xtask: making the virtual environment {}", dir.display());
        run(Command::new(fetch::python()).args(["-m", "venv"]).arg(&dir))?;
    }
    let (name, version) = pins::MATURIN;
    let have = Command::new(dir.join("bin").join("maturin"))
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if have.as_deref() != Some(&format!("{name} {version}")) {
        eprintln!("xtask: installing {name}=={version} into {}", dir.display());
        run(Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(format!("{name}=={version}")))?;
    }
    Ok(python)
}

/// Builds the wheel into `target/wheels` with the environment's maturin;
/// returns its path.
pub fn build_wheel(python: &Path, release: bool) -> Result<PathBuf> {
    let out = workspace_root().join("target").join("wheels");
    // Only this build's wheel is left to find.
    if let Ok(entries) = std::fs::read_dir(&out) {
        for entry in entries.flatten() {
            if is_our_wheel(&entry.path()) {
                std::fs::remove_file(entry.path())?;
            }
        }
    }
    let maturin = python.with_file_name("maturin");
    let mut cmd = Command::new(maturin);
    cmd.current_dir(workspace_root())
        .args([
            "build",
            "--locked",
            "--manifest-path",
            "crates/nccl-py/Cargo.toml",
        ])
        .arg("--out")
        .arg(&out)
        .arg("--interpreter")
        .arg(python);
    if release {
        cmd.arg("--release");
    }
    eprintln!(
        "xtask: building the nccl_rs wheel ({})",
        if release { "release" } else { "debug" }
    );
    run(&mut cmd)?;
    find_wheel(&out).ok_or_else(|| {
        format!(
            "maturin reported success but no nccl_rs wheel is in {}",
            out.display()
        )
        .into()
    })
}

/// The nccl_rs wheel in `dir`, if there is one.
pub fn find_wheel(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| is_our_wheel(p))
}

/// Installs `wheel` into `python`'s environment, over any installed one
/// (an older build of the same version may be there).
pub fn install_wheel(python: &Path, wheel: &Path) -> Result<()> {
    eprintln!("xtask: installing {}", wheel.display());
    run(Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--no-deps", "--force-reinstall"])
        .arg(wheel))
}

fn is_our_wheel(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("nccl_rs-") && n.ends_with(".whl"))
}

/// The Rust peer, then the Python tests against it.
fn test(python: &Path) -> Result<()> {
    eprintln!("xtask: building the Rust peer (example rendezvous_peer)");
    run(cargo().args([
        "build",
        "--locked",
        "-p",
        "nccl-dist",
        "--example",
        "rendezvous_peer",
    ]))?;
    let peer = target_dir()
        .join("debug")
        .join("examples")
        .join("rendezvous_peer");
    let mut cmd = Command::new(python);
    cmd.current_dir(workspace_root())
        .args(["-m", "unittest", "discover", "-v", "-s", "python/tests"])
        .env(PEER_VAR, &peer);
    // `Server(unique_id=None)` and `new_unique_id()` load libnccl.
    if std::env::var_os("NCCL_LIBRARY").is_none() {
        let pin = pins::NCCL
            .iter()
            .find(|p| p.version == pins::NEWEST)
            .ok_or("pins::NEWEST is not one of pins::NCCL")?;
        cmd.env(
            "NCCL_LIBRARY",
            fetch::nccl(pin)?.join("lib").join("libnccl.so.2"),
        );
    }
    eprintln!("xtask: the Python tests (python/tests)");
    run(&mut cmd)
}
