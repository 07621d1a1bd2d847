//! The environment `cargo xtask gpu-test` sets for a GPU test binary:
//! the launch mode, the world size and (processes mode) the file through
//! which rank 0 hands out the unique id.
//!
//! | variable | meaning |
//! |---|---|
//! | `NCCL_SAFE_TEST_MODE` | `single` (default), `threads` or `processes` |
//! | `NCCL_SAFE_TEST_WORLD` | ranks (GPUs) to use; default: every visible GPU |
//! | `NCCL_SAFE_TEST_ID_FILE` | processes mode: where rank 0 writes the unique id |
//! | `RANK`, `WORLD_SIZE`, `LOCAL_RANK` | processes mode: this process's place (torchrun's names) |
//! | `NCCL_SAFE_TEST_TRACE` | `1`: the crates' tracing to stderr, unbuffered (`trace.rs`) |
//! | `NCCL_SAFE_TEST_NODES` | processes mode on emulated hosts (`gpu-test --nodes N`): the ranks are spread over N hosts, each with its own GPUs |

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nccl_safe::UniqueId;

/// How the ranks are driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One thread, every GPU, `Comm::init_all`, collectives in groups.
    Single,
    /// A thread per rank, `Comm::init_rank`.
    Threads,
    /// A process per rank (started by `cargo xtask gpu-test` with `RANK`
    /// and `LOCAL_RANK`); rank 0 hands out the unique id through the file
    /// `NCCL_SAFE_TEST_ID_FILE`. (nccl-dist's TCP rendezvous is not used
    /// here: nccl-safe cannot depend on the crate above it.)
    Processes,
}

/// The launch mode asked for (`NCCL_SAFE_TEST_MODE`).
pub fn mode() -> Mode {
    match std::env::var("NCCL_SAFE_TEST_MODE").as_deref() {
        Ok("threads") => Mode::Threads,
        Ok("processes") => Mode::Processes,
        _ => Mode::Single,
    }
}

/// A number from the environment (processes mode: `RANK` and the like).
pub fn env_number(var: &str) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("processes mode needs {var}"))
}

/// Rank 0 writes a fresh id (to a temporary name, then renamed, so no
/// reader sees half of it); the others poll for it for up to a minute.
pub fn exchange_id(rank: usize) -> UniqueId {
    let path = std::path::PathBuf::from(
        std::env::var_os("NCCL_SAFE_TEST_ID_FILE")
            .expect("processes mode needs NCCL_SAFE_TEST_ID_FILE"),
    );
    if rank == 0 {
        let id = UniqueId::new().expect("unique id");
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, id.as_bytes()).expect("write id");
        std::fs::rename(&tmp, &path).expect("publish id");
        return id;
    }
    let started = Instant::now();
    loop {
        if let Some(bytes) = std::fs::read(&path)
            .ok()
            .and_then(|b| <[u8; UniqueId::BYTES]>::try_from(b.as_slice()).ok())
        {
            return UniqueId::from_bytes(bytes);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no unique id from rank 0 in {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// World size: `NCCL_SAFE_TEST_WORLD`, else every visible GPU. On
/// emulated hosts (`NCCL_SAFE_TEST_NODES`) each host sees only its own
/// GPUs, which must hold its share of the ranks.
pub fn world() -> usize {
    trace_if_asked();
    let visible = nccl_safe::cudarc::driver::CudaContext::device_count().unwrap_or(0) as usize;
    let hosts = std::env::var("NCCL_SAFE_TEST_NODES")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let wanted = std::env::var("NCCL_SAFE_TEST_WORLD")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(visible);
    assert!(wanted >= 1, "no GPU visible");
    assert!(
        wanted.div_ceil(hosts) <= visible,
        "asked for {wanted} GPUs over {hosts} host(s), {visible} visible per host"
    );
    wanted
}

/// Bytes that differ from run to run (no GPU, no NCCL: the id is only
/// carried), so a test cannot pass by luck on a constant.
pub fn random_id() -> UniqueId {
    let mut x = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
        | 1;
    let mut bytes = [0u8; UniqueId::BYTES];
    for b in &mut bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    UniqueId::from_bytes(bytes)
}

/// Turns the stderr trace on (`trace.rs`).
pub const TRACE_ENV: &str = "NCCL_SAFE_TEST_TRACE";

/// Installs the stderr trace when [`TRACE_ENV`] is `1` (once).
pub fn trace_if_asked() {
    if std::env::var(TRACE_ENV).as_deref() == Ok("1") {
        crate::trace::install();
    }
}
