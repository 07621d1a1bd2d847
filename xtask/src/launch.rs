//! `cargo xtask launch -n N`: a process per rank on this machine, with the
//! torchrun variables, free ports and a fresh shared secret, so a program
//! calling `World::init()` runs here as it would under torchrun.
//!
//! ```text
//! cargo xtask launch -n 4 --example dp_allreduce [-- ARGS]   # builds it (release)
//! cargo xtask launch -n 4 --bin nccl-bench [-- ARGS]         # a workspace binary
//! cargo xtask launch -n 4 path/to/program [ARGS]
//! ```
//!
//! Each rank's output lines are prefixed with `[rank r]`. When a rank
//! fails, the others get a grace period to fail or finish, then are
//! killed; `--timeout SECS` bounds the whole run.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::flags::{self, Flag, Trailing, value};
use crate::{Result, cargo, release_dir};

/// How long the other ranks may still run after one has failed.
const GRACE: Duration = Duration::from_secs(10);

/// A free TCP port on the loopback interface (free when asked).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// 32 random bytes as hex, from the kernel.
fn random_secret() -> Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The environment of rank `rank` of `n`, all on this machine.
pub fn rank_env(rank: usize, n: usize, ports: (u16, u16), secret: &str) -> Vec<(String, String)> {
    [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", n.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("LOCAL_WORLD_SIZE", n.to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_string()),
        ("MASTER_PORT", ports.0.to_string()),
        ("NCCL_RS_PORT", ports.1.to_string()),
        ("NCCL_RS_SECRET", secret.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Fresh ports and secret for one job.
pub fn job() -> Result<((u16, u16), String)> {
    let a = free_port()?;
    let mut b = free_port()?;
    while b == a {
        b = free_port()?;
    }
    Ok(((a, b), random_secret()?))
}

/// How a set of rank processes ended.
pub enum Ended {
    /// Every rank exited; their statuses in rank order.
    Exited(Vec<ExitStatus>),
    /// The deadline passed; the ranks still running were killed.
    TimedOut,
}

/// Waits for every child until `deadline`; once one fails, the rest get
/// [`GRACE`] and are then killed.
pub fn wait_all(children: &mut [Child], deadline: Instant) -> Result<Ended> {
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.len()];
    let mut failed_at: Option<Instant> = None;
    loop {
        for (child, status) in children.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = child.try_wait()?;
                if status.is_some_and(|s| !s.success()) && failed_at.is_none() {
                    failed_at = Some(Instant::now());
                }
            }
        }
        if statuses.iter().all(Option::is_some) {
            return Ok(Ended::Exited(statuses.into_iter().flatten().collect()));
        }
        let grace_over = failed_at.is_some_and(|t| t.elapsed() > GRACE);
        if Instant::now() > deadline || grace_over {
            for (child, status) in children.iter_mut().zip(&statuses) {
                if status.is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            if grace_over {
                // The killed ranks count as failed.
                return Ok(Ended::Exited(
                    statuses
                        .into_iter()
                        .map(|s| s.unwrap_or_else(killed_status))
                        .collect(),
                ));
            }
            return Ok(Ended::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(unix)]
fn killed_status() -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    ExitStatus::from_raw(9)
}

/// Copies a child's output to ours, each line prefixed.
fn forward(stream: impl Read + Send + 'static, prefix: String, to_stderr: bool) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(|l| l.ok()) {
            if to_stderr {
                eprintln!("{prefix}{line}");
            } else {
                println!("{prefix}{line}");
            }
        }
    });
}

fn build_example(name: &str) -> Result<PathBuf> {
    eprintln!("xtask: building example {name} (release)");
    crate::run(cargo().args(["build", "--release", "-p", "nccl-dist", "--example", name]))?;
    Ok(release_dir().join("examples").join(name))
}

/// Builds a workspace binary (`--bin nccl-bench`) in release mode.
fn build_bin(name: &str) -> Result<PathBuf> {
    eprintln!("xtask: building {name} (release)");
    crate::run(cargo().args(["build", "--release", "--bin", name]))?;
    Ok(release_dir().join(name))
}

/// The flags of `launch`; what follows them is the program and its
/// arguments (or, with `--example`/`--bin`, the arguments).
const FLAGS: &[Flag] = &[
    value(&["-n", "--nproc"]),
    value(&["--timeout"]),
    value(&["--example"]),
    value(&["--bin"]),
];

pub fn run(args: &[&str]) -> Result<()> {
    let p = flags::parse("launch", FLAGS, Trailing::Rest, args)?;
    let n = p
        .parsed::<usize>("-n", "a positive number of ranks")?
        .filter(|n| *n > 0)
        .ok_or("launch needs -n RANKS (a positive number)")?;
    let timeout = Duration::from_secs(p.parsed("--timeout", "seconds")?.unwrap_or(600));
    let mut rest: Vec<String> = p.rest.iter().map(|s| s.to_string()).collect();
    let program = match (p.value("--example"), p.value("--bin")) {
        (Some(name), _) => build_example(name)?,
        (None, Some(name)) => build_bin(name)?,
        (None, None) if !rest.is_empty() => PathBuf::from(rest.remove(0)),
        (None, None) => return Err("launch needs a program, --example NAME or --bin NAME".into()),
    };
    // A `--` between the program and its arguments is not theirs.
    if rest.first().is_some_and(|a| a == "--") {
        rest.remove(0);
    }
    match launch_ranks(&program, &rest, n, timeout)? {
        Ended::Exited(statuses) if statuses.iter().all(ExitStatus::success) => Ok(()),
        Ended::Exited(statuses) => {
            let failed: Vec<String> = statuses
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.success())
                .map(|(r, s)| format!("rank {r} ({s})"))
                .collect();
            Err(format!("{} failed", failed.join(", ")).into())
        }
        Ended::TimedOut => Err(format!("ranks still running after {timeout:?}: killed").into()),
    }
}

/// Starts `n` ranks of `program` and waits for them.
pub fn launch_ranks(program: &Path, args: &[String], n: usize, timeout: Duration) -> Result<Ended> {
    let (ports, secret) = job()?;
    eprintln!(
        "xtask: launching {n} ranks of {} (rendezvous on 127.0.0.1:{})",
        program.display(),
        ports.1
    );
    let deadline = Instant::now() + timeout;
    let mut children = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(rank_env(rank, n, ports, &secret))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        if let Some(out) = child.stdout.take() {
            forward(out, format!("[rank {rank}] "), false);
        }
        if let Some(err) = child.stderr.take() {
            forward(err, format!("[rank {rank}] "), true);
        }
        children.push(child);
    }
    wait_all(&mut children, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_gets_the_torchrun_variables_and_one_secret() {
        let (ports, secret) = job().expect("job");
        assert_ne!(ports.0, ports.1);
        assert_eq!(secret.len(), 64);
        let env = rank_env(2, 4, ports, &secret);
        let get = |k: &str| env.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        assert_eq!(get("RANK").as_deref(), Some("2"));
        assert_eq!(get("WORLD_SIZE").as_deref(), Some("4"));
        assert_eq!(get("LOCAL_RANK").as_deref(), Some("2"));
        assert_eq!(get("NCCL_RS_SECRET"), Some(secret));
    }

    #[test]
    fn a_failing_rank_ends_the_job_after_the_grace_period() {
        let mut children = vec![
            Command::new("sh")
                .args(["-c", "exit 3"])
                .spawn()
                .expect("sh"),
            Command::new("sh")
                .args(["-c", "exit 0"])
                .spawn()
                .expect("sh"),
        ];
        let deadline = Instant::now() + Duration::from_secs(30);
        match wait_all(&mut children, deadline).expect("wait") {
            Ended::Exited(s) => {
                assert!(!s[0].success());
                assert!(s[1].success());
            }
            Ended::TimedOut => panic!("should have exited"),
        }
        let mut sleeper = vec![Command::new("sleep").arg("30").spawn().expect("sleep")];
        let started = Instant::now();
        let ended =
            wait_all(&mut sleeper, Instant::now() + Duration::from_millis(200)).expect("wait");
        assert!(matches!(ended, Ended::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
