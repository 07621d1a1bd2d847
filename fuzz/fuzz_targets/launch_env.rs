//! Launch, watchdog and secret configuration from arbitrary environments.
//!
//! Input: entries separated by a NUL byte (real environment values hold
//! none). An entry's first byte picks the variable (low 6 bits, modulo the
//! list below) and how the rest of the entry becomes its value (high 2
//! bits): `00` the raw bytes (not necessarily UTF-8); `10` the decimal of
//! the next byte (so valid small numbers are easy to reach); `01` and `11`
//! an `f64` from the next 8 bytes, printed with `{}` or `{:e}` (fractional
//! seconds). A later entry for the same variable wins.
//!
//! Properties checked:
//! - `Launch::from_lookup` never panics, is deterministic, and an `Ok`
//!   launch is consistent: `world_size >= 1`, `rank < world_size`,
//!   `local_rank < local_world_size <= world_size`, a non-empty address
//!   (`MASTER_ADDR`, else Slurm's first host), a non-zero port, the
//!   launcher whose variables are set, and the numbers its variables hold;
//! - `launch::first_host` never panics and returns one host name;
//! - `WatchdogOptions::from_lookup` never panics; `Ok(Some(_))` only when
//!   turned on, with a timeout above zero; `Ok(None)` when turned off;
//! - `Secret::from_lookup` / `Secret::from_bytes` never panic, accept
//!   exactly the secrets of at least 16 bytes, keep the bytes and never
//!   show them in `Debug`.

#![no_main]

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use nccl_dist::launch::first_host;
use nccl_dist::secret::{MIN_SECRET_BYTES, SECRET_ENV, SECRET_FILE_ENV};
use nccl_dist::watchdog::{FLIGHT_RECORDER_ENV, WATCHDOG_ENV, WATCHDOG_TIMEOUT_ENV};
use nccl_dist::{Launch, LaunchError, Launcher, Secret, SecretError, WatchdogOptions};

/// Every variable `Launch`, `WatchdogOptions` and `Secret` read.
const VARS: &[&str] = &[
    // torchrun
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    // Slurm
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
    // Open MPI
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    // watchdog
    WATCHDOG_ENV,
    WATCHDOG_TIMEOUT_ENV,
    FLIGHT_RECORDER_ENV,
    // secret
    SECRET_ENV,
    SECRET_FILE_ENV,
];

type Env = HashMap<&'static str, OsString>;

fn parse_env(data: &[u8]) -> Env {
    let mut env = Env::new();
    for entry in data.split(|b| *b == 0) {
        let Some((&sel, rest)) = entry.split_first() else {
            continue;
        };
        let var = VARS[usize::from(sel & 0x3f) % VARS.len()];
        let float = || {
            let mut bits = [0u8; 8];
            let n = rest.len().min(8);
            bits[..n].copy_from_slice(&rest[..n]);
            f64::from_le_bytes(bits)
        };
        let value = match sel >> 6 {
            0b00 => OsString::from_vec(rest.to_vec()),
            0b10 => OsString::from(rest.first().copied().unwrap_or(0).to_string()),
            0b01 => OsString::from(float().to_string()),
            _ => OsString::from(format!("{:e}", float())),
        };
        env.insert(var, value);
    }
    env
}

/// The value `Launch` sees: trimmed lossy UTF-8, absent when empty.
fn seen(env: &Env, var: &str) -> Option<String> {
    env.get(var)
        .map(|v| v.to_string_lossy().trim().to_string())
        .filter(|v| !v.is_empty())
}

fn number(env: &Env, var: &str) -> usize {
    seen(env, var)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("launch accepted {var}={:?}", env.get(var)))
}

fn check_launch(env: &Env) {
    let lookup = |k: &str| env.get(k).cloned();
    let result = Launch::from_lookup(&lookup);
    assert_eq!(result, Launch::from_lookup(&lookup), "not deterministic");
    let torchrun = seen(env, "RANK").is_some() && seen(env, "WORLD_SIZE").is_some();
    let slurm = seen(env, "SLURM_PROCID").is_some();
    let mpi = seen(env, "OMPI_COMM_WORLD_RANK").is_some();
    let l = match result {
        Ok(l) => l,
        Err(LaunchError::NoLauncher) => {
            assert!(!torchrun && !slurm && !mpi, "launcher variables ignored");
            return;
        }
        Err(e) => {
            // Errors render without panicking.
            let _ = e.to_string();
            return;
        }
    };
    assert!(l.world_size >= 1, "{l:?}");
    assert!(l.rank < l.world_size, "{l:?}");
    assert!(l.local_rank < l.local_world_size, "{l:?}");
    assert!(l.local_world_size <= l.world_size, "{l:?}");
    assert!(!l.master_addr.is_empty(), "{l:?}");
    assert!(l.master_port > 0, "{l:?}");
    let (rank, world, local, local_world) = match l.launcher {
        Launcher::Torchrun => {
            assert!(torchrun);
            ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        }
        Launcher::Slurm => {
            assert!(!torchrun && slurm);
            if seen(env, "MASTER_PORT").is_none() {
                let job = number(env, "SLURM_JOB_ID");
                assert_eq!(usize::from(l.master_port), 20_000 + job % 10_000);
            }
            let local_world = if seen(env, "SLURM_NTASKS_PER_NODE").is_some() {
                "SLURM_NTASKS_PER_NODE"
            } else {
                // `4(x2),3`: the first count.
                let v = seen(env, "SLURM_TASKS_PER_NODE").expect("tasks per node");
                let first = v.split(',').next().unwrap_or_default();
                let count = first.split('(').next().unwrap_or_default();
                assert_eq!(count.parse::<usize>().ok(), Some(l.local_world_size));
                ""
            };
            ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_world)
        }
        Launcher::OpenMpi => {
            assert!(!torchrun && !slurm && mpi);
            (
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            )
        }
        other => panic!("an environment launch reported launcher {other:?}"),
    };
    assert_eq!(number(env, rank), l.rank);
    assert_eq!(number(env, world), l.world_size);
    assert_eq!(number(env, local), l.local_rank);
    if !local_world.is_empty() {
        assert_eq!(number(env, local_world), l.local_world_size);
    }
    match seen(env, "MASTER_ADDR") {
        Some(addr) => assert_eq!(l.master_addr, addr),
        None => {
            // Only Slurm has an address without MASTER_ADDR: the first host
            // of the step's node list, else the job's.
            assert_eq!(l.launcher, Launcher::Slurm);
            let nodes = seen(env, "SLURM_STEP_NODELIST")
                .or_else(|| seen(env, "SLURM_JOB_NODELIST"))
                .expect("a node list");
            assert_eq!(first_host(&nodes).as_deref(), Some(l.master_addr.as_str()));
        }
    }
    if let Some(port) = seen(env, "MASTER_PORT") {
        assert_eq!(port.parse::<u16>().ok(), Some(l.master_port));
    }
}

fn check_first_host(list: &str) {
    let Some(host) = first_host(list) else {
        return;
    };
    assert!(
        !host.contains([',', '[', ']']),
        "first_host({list:?}) = {host:?}: not one host"
    );
    let list = list.trim();
    if !list.contains([',', '[', ']']) {
        assert_eq!(host, list);
    }
}

fn check_watchdog(env: &Env) {
    let lookup = |k: &str| env.get(k).map(|v| v.to_string_lossy().into_owned());
    let result = WatchdogOptions::from_lookup(lookup);
    let switch = lookup(WATCHDOG_ENV);
    let switch = switch.as_deref().map(str::trim);
    match result {
        Ok(Some(options)) => {
            assert!(
                options.get_timeout() > Duration::ZERO,
                "watchdog on with a zero timeout ({WATCHDOG_TIMEOUT_ENV}={:?})",
                lookup(WATCHDOG_TIMEOUT_ENV)
            );
            // On by default: only an explicit "off" switches it off.
            assert!(!matches!(switch, Some("0" | "off" | "false" | "no")));
            if lookup(WATCHDOG_TIMEOUT_ENV).is_none() && lookup("NCCL_RS_TIMEOUT").is_none() {
                assert_eq!(options.get_timeout(), WatchdogOptions::new().get_timeout());
            }
        }
        Ok(None) => {
            assert!(
                matches!(switch, Some("0" | "off" | "false" | "no")),
                "watchdog off with {switch:?}"
            );
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// A file of this process for `NCCL_RS_SECRET_FILE` (the fuzzer picks its
/// contents, never the path).
fn secret_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("nccl-fuzz-secret-{}", std::process::id()))
    })
}

fn check_secret_bytes(bytes: &[u8]) {
    match Secret::from_bytes(bytes.to_vec(), "fuzz") {
        Ok(secret) => {
            assert!(bytes.len() >= MIN_SECRET_BYTES);
            assert_eq!(secret.bytes(), bytes);
            check_secret_debug(&secret);
        }
        Err(SecretError::TooShort { len, .. }) => {
            assert!(bytes.len() < MIN_SECRET_BYTES);
            assert_eq!(len, bytes.len());
        }
        Err(e) => panic!("from_bytes: unexpected error {e:?}"),
    }
}

fn check_secret_debug(secret: &Secret) {
    let text = format!("{secret:?}");
    assert_eq!(text, format!("Secret({} bytes)", secret.bytes().len()));
}

fn check_secret(env: &Env) {
    let from_env = env.get(SECRET_ENV).filter(|v| !v.is_empty());
    let file = env.get(SECRET_FILE_ENV).filter(|v| !v.is_empty());
    let path = secret_path();
    if let (None, Some(contents)) = (from_env, file) {
        std::fs::write(path, contents.as_bytes()).expect("writing the secret file");
    }
    let lookup = |k: &str| match k {
        SECRET_ENV => env.get(SECRET_ENV).cloned(),
        SECRET_FILE_ENV => env
            .get(SECRET_FILE_ENV)
            .filter(|v| !v.is_empty())
            .map(|_| path.clone().into_os_string()),
        _ => None,
    };
    let result = Secret::from_lookup(&lookup);
    // What the secret must be: the variable's bytes, else the file's bytes
    // without trailing line ends.
    let expected: Option<Vec<u8>> = match (from_env, file) {
        (Some(v), _) => Some(v.as_encoded_bytes().to_vec()),
        (None, Some(contents)) => {
            let mut bytes = contents.as_bytes().to_vec();
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            Some(bytes)
        }
        (None, None) => None,
    };
    if from_env.is_none() && file.is_some() {
        let _ = std::fs::remove_file(path);
    }
    match (result, expected) {
        (Ok(secret), Some(bytes)) => {
            assert_eq!(secret.bytes(), bytes.as_slice());
            assert!(bytes.len() >= MIN_SECRET_BYTES);
            check_secret_debug(&secret);
        }
        (Err(SecretError::TooShort { len, .. }), Some(bytes)) => {
            assert_eq!(len, bytes.len());
            assert!(len < MIN_SECRET_BYTES);
        }
        (Err(SecretError::Missing), None) => {}
        (result, expected) => {
            panic!("Secret::from_lookup = {result:?}, expected the bytes {expected:?}")
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let env = parse_env(data);
    check_launch(&env);
    for var in ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"] {
        if let Some(v) = env.get(var) {
            check_first_host(&v.to_string_lossy());
        }
    }
    check_watchdog(&env);
    check_secret(&env);
    check_secret_bytes(data);
});
