//! The bad-input table: every public function of `nccl-safe` and
//! `nccl-dist`, driven with each class of invalid argument that applies to
//! it, asserting the typed error (and that no NCCL call was needed to find
//! it). Functions with nothing to refuse are listed in [`NOTHING_TO_REFUSE`]
//! with the reason, and [`the_table_names_every_public_function`] checks,
//! from the sources, that no public function is missing from the two.
//!
//! Classes: length, device, rank/root/peer, dtype, aliasing, use after
//! abort, use after finalize, group misuse (a direct call or an init inside
//! a group), double end, environment, format. Two are stopped by the type
//! system and need no runtime case: `finalize`, `destroy`, `abort` and
//! `GroupGuard::end` take `self`, so a second call or a use afterwards
//! does not compile.
//!
//! `table_without_a_gpu` runs on any machine (`cargo xtask test` points
//! `NCCL_LIBRARY` at a real libnccl); `table_on_gpus` is `#[ignore]`d and
//! run by `cargo xtask gpu-test` (one thread, up to 2 GPUs).

// Test code: the row helpers in the modules are not `#[test]` functions,
// which clippy's `allow-unwrap-in-tests` alone covers.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use nccl_dist::mesh::MeshShape;
use nccl_dist::nccl_safe::cudarc::driver::{CudaContext, CudaSlice, DevicePtr};
use nccl_dist::nccl_safe::{
    self, Comm, Config, Encryption, Error as SafeError, GroupGuard, Library, NcclMemory, PreMulSum,
    PresharedKey, ReduceOp, Registration, Role, UniqueId, Window, group,
};
use nccl_dist::placement::{NvmlStatus, Topology};
use nccl_dist::rendezvous::{self, RendezvousError};
use nccl_dist::{
    CommStream, Communicator, DType, DeviceMesh, Error, HostCollectives, Launch, LaunchError,
    MeshError, Secret, SecretError, WatchdogOptions, World, WorldOptions,
};

/// Functions with no argument that could be invalid, or whose every input
/// is valid, with the reason. Names as `Type::function`.
const NOTHING_TO_REFUSE: &[(&str, &str)] = &[
    // Accessors of values that exist once the object does.
    (
        "Comm::rank size device stream timeout is_blocking compute_capability library capabilities fp8_reductions observer abort_handle is_parked parks_on_peer_loss",
        "accessor",
    ),
    ("AbortHandle::is_aborted downgrade", "accessor"),
    (
        "WeakAbortHandle::upgrade is_alive keep",
        "None / false once the communicator is gone, not an error",
    ),
    (
        "Comm::force_send_recv_collectives set_observer",
        "every value is valid",
    ),
    (
        "Capabilities::symbols since name version has features",
        "accessor / query",
    ),
    (
        "Feature::decide",
        "a pure function of the version and symbols",
    ),
    ("Library::raw version capabilities", "accessor"),
    ("nccl_safe::require_cuda_driver", "query"),
    ("nccl_safe::require_gpus", "query (no input)"),
    (
        "RawBuffer::from_raw_parts",
        "unsafe: its caller answers for the memory; the collectives check the rest",
    ),
    (
        "Config::new timeout get_timeout is_blocking",
        "every value is valid (the NCCL fields are checked at init: see Config rows)",
    ),
    ("Error::nccl_code", "accessor"),
    ("UniqueId::digest", "accessor"),
    (
        "UniqueId::to_hex",
        "every id has a hex form (the parsers refuse: from_hex rows)",
    ),
    ("ReduceOp::raw", "every op maps"),
    ("PreMulSum::raw", "accessor"),
    ("NcclMemory::device_ptr", "accessor"),
    ("Registration::into_inner", "consumes the registration"),
    (
        "Window::deregister_all raw",
        "consumes the windows / accessor",
    ),
    ("Access::none", "constructor without input"),
    ("Link::abbreviation", "accessor"),
    (
        "Topology::gpus link nvml has_nvlink islands ring_order render",
        "queries of a probed topology; link() answers None for unknown pairs",
    ),
    (
        "GroupGuard::on on_stream nest",
        "borrow the guard; misuse is a compile error or is refused at the collective (group rows)",
    ),
    ("NestedGroup::on", "as GroupGuard::on"),
    ("nccl_safe::take_dropped_group_error", "query"),
    (
        "Comm::completion all_reduce_owned all_reduce_in_place_owned",
        "completion only delays dropping what it is given; the owned forms run all_reduce's checks (its rows) and resolve to their error",
    ),
    ("Completion::wait", "blocks as .await would"),
    (
        "Completion::spin_for",
        "every window is valid (zero: no spin; a huge one: spins until the work ends, or the communicator's timeout resolves the future)",
    ),
    (
        "Span::device at_least holds blocks times rank aliasing segments",
        "crate-internal checks (pub inside a private module), driven by every collective row",
    ),
    ("nccl_safe::cudarc", "re-export"),
    (
        "nccl_safe::segments::mark take",
        "a diagnostic (hidden; counts only with --features segments): timing marks, no input to refuse",
    ),
    ("DeviceMesh::shape coordinate position comm", "accessor"),
    (
        "DeviceMesh::from_world",
        "the shape check of DeviceMesh::new, before any NCCL call, with the world given back (FromWorldError): a_mesh_that_keeps_its_world_uses_the_worlds_communicator_bit_exact in tests/gpu.rs (it consumes a world, which the bad-input table's worlds are not)",
    ),
    (
        "DeviceMesh::world into_world FromWorldError::into_world",
        "accessors of the world a mesh keeps (None for a mesh made from a borrowed world) or an error gives back",
    ),
    ("SubMesh::shape coordinate", "accessor"),
    (
        "nccl_dist::device_order positions_on_host",
        "pure functions of a topology / order; every input is valid",
    ),
    ("MeshShape::size names axes", "accessor"),
    (
        "MeshShape::rank_of",
        "None for a coordinate outside the mesh, not an error",
    ),
    (
        "DeviceMesh::world_rank_of",
        "None for a coordinate outside the mesh, not an error",
    ),
    (
        "CommStream::stream record new wait_for",
        "accessor / records an event / a cross-device wait is valid CUDA",
    ),
    (
        "GroupGuard::simulate",
        "consumes the guard; NCCL's own errors come back typed",
    ),
    ("CommEvent::block is_done", "accessor / orders a stream"),
    (
        "World::comm into_comm rank size local_rank device launch watchdog lost_ranks",
        "accessor",
    ),
    (
        "WorldOptions::new secret timeout config method device port watchdog encryption",
        "builders; checked when init uses them (World rows)",
    ),
    (
        "nccl_dist::default_config nonblocking_config",
        "constructor",
    ),
    (
        "WorldOptions::op_timeout no_watchdog liveness",
        "builders; every value is valid (a zero timeout fails the first wait, typed)",
    ),
    (
        "World::explain abort_signal liveness spawn_local_with_options",
        "maps an error / accessor / as spawn_local (its rows)",
    ),
    ("Error::lost_rank", "accessor"),
    (
        "Watched::track_stream",
        "refuses a stream of another device (WrongDevice) before anything is kept; not driven here (needs a watched communicator on a GPU)",
    ),
    (
        "Watchdog::peer_lost",
        "every loss is valid input; it fails the watched communicators",
    ),
    (
        "AbortHandle::request_abort abort_with try_status cause",
        "as abort and status: every cause is valid; misuse in a group is refused (abort rows)",
    ),
    (
        "AbortSignal::new trigger is_triggered cause",
        "every cause is valid; triggering twice keeps the first",
    ),
    (
        "AbortSignal::wait_settled wait_quiet",
        "every deadline is valid (a past one answers at once)",
    ),
    (
        "AbortSignal::end_parking",
        "nothing to refuse: ending parking twice, or with nothing parked, does nothing more",
    ),
    (
        "Config::park_on_peer_loss parks_on_peer_loss",
        "every value is valid (parking happens only where a shrink can follow) / accessors",
    ),
    ("AbortCause::lost_rank", "accessor"),
    (
        "Liveness::in_process world losses first_loss is_lost on_loss leave",
        "constructor / accessors / every hook is valid / idempotent goodbye",
    ),
    (
        "Liveness::report",
        "every loss is valid; a rank outside the world is ignored (logged)",
    ),
    (
        "LivenessOptions::new heartbeat silence_limit enabled is_enabled heartbeat_interval silence",
        "builders (values clamped to a floor) / accessors; the environment is checked (from_lookup rows)",
    ),
    (
        "Config::abort_signal get_abort_signal",
        "every signal is valid",
    ),
    (
        "Config::for_symmetric_kernels get_min_ctas get_max_ctas",
        "a builder bounded by the configuration's own maxCTAs / accessors; NCCL checks the values at init",
    ),
    ("OpObserver::unfinished", "a query an observer answers"),
    (
        "OpObserver::before checks_before",
        "hooks an observer implements; a refusal is the observer's own error",
    ),
    (
        "OpObserver::gate gates gate_label",
        "hooks an observer implements (the connection gate); a refusal is the observer's own error, ranks out of range are ignored by the watchdog's",
    ),
    (
        "ExitHold::new",
        "every limit is valid (the exit waits at most a minute)",
    ),
    (
        "Liveness::address_of hold_exit_with set_tail_source exchanger",
        "a rank outside the roster reads None; the holder and the tail source are the caller's closures",
    ),
    (
        "Exchanger::await_loss exchange check",
        "the watchdog's means over the channel: every wait is bounded by the duration given, and a channel that is gone answers at once",
    ),
    (
        "wait::until at_most",
        "waits on the caller's condition variable and lock: every wait ends by the deadline or limit given",
    ),
    (
        "gate_members seconds",
        "parsers: a key that is no gate's is None; a value that is no number of seconds is a BadValue naming its variable",
    ),
    (
        "drop_together",
        "takes owned communicators: any number, each dropped as on its own (an empty list waits for nothing)",
    ),
    (
        "Comm::borrowed_stream",
        "unsafe: the caller vouches that the raw stream is live on the communicator's context",
    ),
    (
        "capture",
        "its refusals (memory the graph does not own, a PreMulSum, a replaced buffer) need a GPU: a_captured_graph_owns_its_buffers_and_replays_bit_exact in tests/abort.rs",
    ),
    (
        "SymmetricBuffer::new new_all",
        "length 0 and an open group are refused before any NCCL call (a GPU is needed to reach them: symmetric_buffers_reduce_bit_exact_and_drop_on_every_rank checks the length); lengths that differ across ranks are refused by the ranks' meeting where the communicator's observer gates calls, before NCCL; elsewhere by the ranks' agreement after registration (InvalidArgument on every rank, the buffers dropped collectively)",
    ),
    (
        "SymmetricBuffer::copy_from copy_to",
        "a buffer of another length or on another device is refused before any copy (InvalidArgument)",
    ),
    (
        "DeviceBuffer::one_shot (hidden)",
        "no input: a view only SymmetricBuffer gives (its type cannot be made elsewhere), and a call checks that it reads exactly that buffer before the kernel runs",
    ),
    (
        "SymmetricBuffer::uses_one_shot set_one_shot one_shot_max_bytes CAPTURED_NCCL_MAX_BYTES",
        "no input to refuse: a flag and a size limit; a call the one-shot kernel cannot take (another type, a reduction other than a sum, a group, an unaligned output, more than the limit) goes to NCCL",
    ),
    (
        "SymmetricBuffer::drop_all comm",
        "takes owned buffers (any number: each leaked when the ranks cannot meet) / accessor",
    ),
    (
        "capture_group",
        "its refusals before the capture begins (no communicator, a buffer set too many, a communicator twice, a stream on another GPU or already capturing, a group open) are unit-tested in capture/grouped.rs; a call on a communicator outside the capture and a replaced buffer need GPUs: one_thread_captures_one_graph_over_its_gpus_and_replays_bit_exact in tests/gpu",
    ),
    (
        "CapturedGraph::buffers into_buffers",
        "accessors of what the graph owns; into_buffers waits with the communicators' deadline",
    ),
    (
        "Captured::open Opened::push",
        "the trait's own plumbing (an unsafe trait: implementors vouch for what they push)",
    ),
    (
        "allow_capture",
        "unsafe scope around a closure: every input is valid, the contract (buffers and communicator outlive the graph's launches) is the caller's",
    ),
    (
        "ObservedStream::as_raw",
        "accessor; only nccl-safe makes an ObservedStream",
    ),
    (
        "Secret::random bytes to_env_value",
        "constructor / accessor",
    ),
    (
        "Launch::first_host",
        "pure string function; every input gives a host",
    ),
    (
        "rendezvous::encode_frame",
        "every kind and payload encode (the reader enforces the cap)",
    ),
    (
        "WatchdogOptions::new timeout history poll_interval print_on_failure get_timeout options check_calls",
        "builders clamp to their minimum",
    ),
    (
        "Watchdog::start watch options",
        "every communicator can be watched",
    ),
    (
        "Watched::of label failure history render_history next_seq wait_idle",
        "queries; of() answers None for an unwatched comm",
    ),
    ("Failure::render_history", "accessor"),
    ("OpRecord::call", "accessor"),
    (
        "CheckFailure::of divergence silent_ranks",
        "accessors; of() answers None for any other error",
    ),
    (
        "WorldOptions::check_calls lazy_connect recover_by_shrink",
        "a switch: both values are valid",
    ),
    (
        "Comm::same_communicator",
        "a comparison: any two communicators have an answer",
    ),
    (
        "nccl_dist::analyze",
        "pure: any set of flight-recorder tails has an answer (None when they agree)",
    ),
    (
        "nccl_dist::explain",
        "maps an error; every error is valid input",
    ),
    ("Communicator::rank size device nccl of", "accessor"),
    ("DType::size of", "accessor / type mapping"),
    (
        "OpObserver::issued as_any into_any",
        "implemented by the user, called by the library",
    ),
    (
        "DeviceBuffer::len is_empty read write",
        "implemented by buffer types; the collectives check what they report (length, device and aliasing rows)",
    ),
    (
        "Reduction::raw_for scalar_access scales",
        "called by the collectives; raw_for refuses the op of another communicator (PreMulSum::host row)",
    ),
    (
        "UniqueId::as_bytes",
        "accessor (from_bytes takes any 128 bytes)",
    ),
    (
        "Library::get",
        "a bad NCCL_LIBRARY is a typed load error: nccl-sys's loader tests (crates/nccl-sys/tests/library.rs)",
    ),
];

/// Every (function, class) a case exercised, for the coverage report.
static SEEN: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());

/// One row: `func` given an invalid argument of `class` answers an error
/// that `want` accepts.
fn case<T: std::fmt::Debug, E: std::fmt::Debug>(
    func: &str,
    class: &str,
    got: Result<T, E>,
    want: impl Fn(&E) -> bool,
) {
    match &got {
        Err(e) if want(e) => {}
        other => panic!("{func} with bad {class}: got {other:?}"),
    }
    SEEN.lock()
        .unwrap()
        .insert((func.to_string(), class.to_string()));
}

fn lookup(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

fn has_library() -> bool {
    std::env::var_os("NCCL_LIBRARY").is_some()
}

#[test]
fn table_without_a_gpu() {
    let id = UniqueId::from_bytes([7; 128]);
    without_gpu::safe_rows(id);
    without_gpu::dist_rows(id);
}

/// A host buffer's address is not device memory.
fn host_ptr(v: &[f32]) -> u64 {
    v.as_ptr() as u64
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn table_on_gpus() {
    if std::env::var("NCCL_SAFE_TEST_MODE").is_ok_and(|m| m != "single") {
        // One thread drives the table; the other modes add nothing.
        return;
    }
    let gpus = CudaContext::device_count().expect("CUDA") as usize;
    let n = gpus.min(2);
    safe_on_gpu::rows(n, gpus);
    dist_on_gpus::rows(n, gpus);
    let seen = SEEN.lock().unwrap();
    eprintln!(
        "bad-input table on {n} GPU(s): {} (function, class) rows passed",
        seen.len()
    );
}

/// A view over raw device memory, for the aliasing rows.
fn unsafe_view(ptr: u64, len: usize, device: usize) -> nccl_safe::RawBuffer<f32> {
    // SAFETY: only used with pointers into a live allocation of f32 on
    // `device`, in calls refused before any use (partial overlap, overflow).
    unsafe { nccl_safe::RawBuffer::from_raw_parts(ptr, len, device) }
}

/// The public functions of a crate's sources: `pub fn` items and the
/// methods of its public traits, by name.
fn public_functions(src: &std::path::Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    // Module directories too (`src/liveness/*.rs`).
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    for path in files {
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut in_pub_trait = 0usize;
        let mut depth = 0usize;
        for line in text.lines() {
            let t = line.trim_start();
            if t.starts_with("#[cfg(test)]") {
                break;
            }
            if t.starts_with("pub trait ") || t.starts_with("pub unsafe trait ") {
                in_pub_trait = depth + 1;
            }
            let fn_name = t
                .strip_prefix("pub fn ")
                .or_else(|| t.strip_prefix("pub unsafe fn "))
                .or_else(|| t.strip_prefix("pub const fn "))
                .or_else(|| {
                    (in_pub_trait > 0 && depth == in_pub_trait)
                        .then(|| {
                            t.strip_prefix("fn ")
                                .or_else(|| t.strip_prefix("unsafe fn "))
                        })
                        .flatten()
                });
            if let Some(rest) = fn_name {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    names.insert(name);
                }
            }
            depth += line.matches('{').count();
            depth = depth.saturating_sub(line.matches('}').count());
            if in_pub_trait > 0 && depth < in_pub_trait {
                in_pub_trait = 0;
            }
        }
    }
    names
}

#[test]
fn the_table_names_every_public_function() {
    let mut covered = BTreeSet::new();
    // Names in case rows: `case("Type::name", ...` / SEEN inserts.
    for me in SOURCES {
        for part in me.split('"').skip(1).step_by(2) {
            if let Some((_, name)) = part.rsplit_once("::") {
                covered.insert(name.to_string());
            }
        }
    }
    for (names, _) in NOTHING_TO_REFUSE {
        let mut words = names.split_whitespace();
        if let Some(first) = words.next() {
            covered.insert(
                first
                    .rsplit_once("::")
                    .map_or(first, |(_, n)| n)
                    .to_string(),
            );
        }
        covered.extend(words.map(str::to_string));
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut missing = Vec::new();
    for krate in ["nccl-safe", "nccl-control", "nccl-dist"] {
        for name in public_functions(&root.join(krate).join("src")) {
            if !covered.contains(&name) {
                missing.push(format!("{krate}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "public functions missing from the bad-input table: {missing:?}"
    );
}

/// The files of this test, whose case rows name the functions covered.
const SOURCES: [&str; 4] = [
    include_str!("main.rs"),
    include_str!("without_gpu.rs"),
    include_str!("safe_on_gpu.rs"),
    include_str!("dist_on_gpus.rs"),
];

mod dist_on_gpus;
mod safe_on_gpu;
mod without_gpu;
