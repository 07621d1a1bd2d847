//! The mixed-language cases of `cargo xtask gpu-test` (`--python PATH`):
//! Python ranks and Rust ranks in one communicator, on every GPU of the
//! host (at least 2; with fewer they are reported as not run).
//!
//! | case | ranks |
//! |---|---|
//! | `weight_sync` | PyTorch rank 0 (`python/examples/weight_sync.py`) broadcasts a model's bf16 parameters to Rust ranks (`weight_sync join`), checksums all_reduced: bit-exact |
//! | `weight_sync_rust` | the same broadcast between Rust ranks only (`weight_sync serve`), for the bandwidth beside it |
//! | `cupy_allreduce` | CuPy rank 0 (`python/examples/cupy_allreduce.py`) and Rust ranks in one all_reduce |
//!
//! PATH is a Python with PyTorch and CuPy; the `nccl_rs` wheel is pip
//! installed into it when it is missing (from `target/wheels`, or a
//! bundle's `wheels/`). The Rust ranks load the libnccl of that Python's
//! `nvidia-nccl` wheel (`NCCL_LIBRARY`), the one CuPy and PyTorch use.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;
use crate::launch::{Ended, job, rank_env, wait_all};

/// Where the pieces are: the Rust example, the Python scripts, the wheels.
pub struct Pieces {
    pub weight_sync: PathBuf,
    pub scripts: PathBuf,
    pub wheels: PathBuf,
}

/// Runs the cases; returns the report's markdown and whether all passed.
pub fn run(python: &Path, pieces: &Pieces, gpus: usize, limit: Duration) -> Result<(String, bool)> {
    let mut text = String::from("## Python and Rust ranks\n\n");
    if gpus < 2 {
        text.push_str(&format!("not run: {gpus} GPU(s); these cases need 2\n"));
        return Ok((text, true));
    }
    prepare(python, &pieces.wheels)?;
    let nccl = Command::new(python)
        .args(["-c", "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))"])
        .output()?;
    let library = String::from_utf8_lossy(&nccl.stdout).trim().to_string();
    if !nccl.status.success() || library.is_empty() {
        // Without it the Rust ranks could load another libnccl than CuPy.
        return Err(format!(
            "{} has no nvidia.nccl wheel: the Rust ranks must load the libnccl CuPy loads",
            python.display()
        )
        .into());
    }
    let script = |name: &str| pieces.scripts.join(name).to_string_lossy().into_owned();
    let ws = pieces.weight_sync.to_string_lossy().into_owned();
    let world = gpus.to_string();
    let cases: [(&str, Vec<String>, &[&str]); 3] = [
        (
            "weight_sync",
            vec![
                python.to_string_lossy().into_owned(),
                script("weight_sync.py"),
                "--world".into(),
                world.clone(),
                "--port".into(),
            ],
            &[],
        ),
        (
            "weight_sync_rust",
            vec![ws.clone(), "serve".into(), world.clone()],
            &[],
        ),
        (
            "cupy_allreduce",
            vec![
                python.to_string_lossy().into_owned(),
                script("cupy_allreduce.py"),
                "--world".into(),
                world.clone(),
                "--port".into(),
            ],
            &["--all-reduce"],
        ),
    ];
    text.push_str(&format!("{gpus} GPUs; Rust ranks load {library}\n\n| case | result | rank 0 | rank 1 |\n|---|---|---|---|\n"));
    let mut all_passed = true;
    let logs = crate::target_dir().join("gpu-test").join("python-logs");
    std::fs::create_dir_all(&logs)?;
    for (name, rank0, extra) in cases {
        let ((port, _), secret) = job()?;
        let mut children = Vec::new();
        for rank in 0..gpus {
            let mut cmd = if rank == 0 {
                let mut c = Command::new(&rank0[0]);
                c.args(&rank0[1..]).arg(port.to_string());
                c
            } else {
                let mut c = Command::new(&ws);
                c.args([
                    "join",
                    &format!("127.0.0.1:{port}"),
                    &rank.to_string(),
                    &world,
                ])
                .args(extra);
                c
            };
            // Output into a file, not a pipe: a pipe nobody reads until
            // the end would stop a rank that writes more than it holds.
            let log = logs.join(format!("{name}-{rank}.log"));
            let file = std::fs::File::create(&log)?;
            cmd.envs(rank_env(rank, gpus, (port, port), &secret))
                .env("NCCL_LIBRARY", &library)
                .stdout(Stdio::from(file.try_clone()?))
                .stderr(Stdio::from(file));
            children.push(cmd.spawn()?);
        }
        let started = Instant::now();
        let ended = wait_all(&mut children, started + limit)?;
        for mut child in children {
            // Reaped (wait_all has ended or killed every one).
            let _ = child.wait();
        }
        let mut outputs = Vec::new();
        for rank in 0..gpus {
            let log = logs.join(format!("{name}-{rank}.log"));
            outputs.push(std::fs::read_to_string(&log).unwrap_or_default());
        }
        let passed = matches!(&ended, Ended::Exited(s) if s.iter().all(|s| s.success()));
        all_passed &= passed;
        let line = |i: usize| {
            outputs
                .get(i)
                .and_then(|o| {
                    o.lines()
                        .find(|l| l.contains("GB/s") || l.contains("wrong"))
                })
                .unwrap_or("")
                .to_string()
        };
        let verdict = if passed {
            format!("pass ({:.1} s)", started.elapsed().as_secs_f64())
        } else {
            "FAIL".into()
        };
        text.push_str(&format!(
            "| {name} | {verdict} | {} | {} |\n",
            line(0),
            line(1)
        ));
        if !passed {
            for (rank, o) in outputs.iter().enumerate() {
                eprintln!("xtask: {name}, rank {rank}:\n{o}");
            }
        }
    }
    Ok((text, all_passed))
}

/// Checks that `python` has PyTorch and CuPy, and installs the `nccl_rs`
/// wheel from `wheels` when it lacks it.
fn prepare(python: &Path, wheels: &Path) -> Result<()> {
    let has = |module: &str| {
        Command::new(python)
            .args(["-c", &format!("import {module}")])
            .status()
            .is_ok_and(|s| s.success())
    };
    for module in ["torch", "cupy"] {
        if !has(module) {
            return Err(format!(
                "{} cannot import {module}: the Python cases need PyTorch and CuPy",
                python.display()
            )
            .into());
        }
    }
    let wheel = crate::py::find_wheel(wheels).ok_or_else(|| {
        format!(
            "no nccl_rs wheel in {} (`cargo xtask py --release`)",
            wheels.display()
        )
    })?;
    crate::py::install_wheel(python, &wheel)?;
    Ok(())
}
