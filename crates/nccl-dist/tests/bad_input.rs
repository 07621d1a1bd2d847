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

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use nccl_dist::mesh::MeshShape;
use nccl_dist::nccl_safe::cudarc::driver::{CudaContext, CudaSlice, DevicePtr};
use nccl_dist::nccl_safe::{
    self, Comm, Config, Encryption, Error as SafeError, GroupGuard, Library, NcclMemory, PreMulSum,
    PresharedKey, ReduceOp, Registration, Role, Topology, UniqueId, Window, group,
};
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
        "Comm::rank size device stream timeout is_blocking compute_capability library capabilities fp8_reductions observer abort_handle",
        "accessor",
    ),
    ("AbortHandle::is_aborted downgrade", "accessor"),
    (
        "WeakAbortHandle::upgrade is_alive",
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
        "Span::device at_least holds blocks times rank aliasing segments",
        "crate-internal checks (pub inside a private module), driven by every collective row",
    ),
    ("nccl_safe::cudarc", "re-export"),
    ("DeviceMesh::shape coordinate position comm", "accessor"),
    ("SubMesh::shape coordinate", "accessor"),
    (
        "nccl_dist::device_order positions_on_host",
        "pure functions of a topology / order; every input is valid",
    ),
    ("MeshShape::size names", "accessor"),
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
        "World::comm into_comm rank size local_rank device launch watchdog",
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
    ("OpObserver::unfinished", "a query an observer answers"),
    (
        "Comm::borrowed_stream",
        "unsafe: the caller vouches that the raw stream is live on the communicator's context",
    ),
    (
        "capture",
        "its refusals (memory the graph does not own, a PreMulSum, a replaced buffer) need a GPU: a_captured_graph_owns_its_buffers_and_replays_bit_exact in tests/abort.rs",
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
        "WatchdogOptions::new timeout history poll_interval print_on_failure get_timeout options",
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
    // ---- nccl-safe, before any GPU is needed ----
    let id = UniqueId::from_bytes([7; 128]);
    case(
        "Comm::init_rank",
        "rank",
        Comm::init_rank(&id, 4, 4, 0, &Config::new()),
        |e| {
            matches!(
                e,
                SafeError::RankOutOfRange {
                    what: "rank",
                    rank: 4,
                    size: 4,
                    ..
                }
            )
        },
    );
    case(
        "Comm::init_rank",
        "rank (empty world)",
        Comm::init_rank(&id, 0, 0, 0, &Config::new()),
        |e| matches!(e, SafeError::RankOutOfRange { size: 0, .. }),
    );
    case(
        "Comm::init_all",
        "device (none)",
        Comm::init_all(&[], &Config::new()),
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::init_all",
        "device (twice)",
        Comm::init_all(&[0, 0], &Config::new()),
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::split_all",
        "length (colors vs comms)",
        Comm::split_all(&[], &[Some(0)], &[], None),
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::shrink_all",
        "length (nothing to shrink)",
        Comm::shrink_all(&[], &[0], false, None)
            .map(|v| v.len())
            .and_then(|n| {
                if n == 0 {
                    Err(SafeError::InvalidArgument {
                        op: "shrink_all",
                        reason: "no communicators: an empty answer",
                    })
                } else {
                    Ok(n)
                }
            }),
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "PresharedKey::new",
        "length",
        PresharedKey::new("short"),
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "PresharedKey::new",
        "format (NUL)",
        PresharedKey::new("0123456789abcdef\0"),
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Library::load_from",
        "format (not a library)",
        // A load error without a library yet, InvalidArgument once another
        // one is loaded: an error either way, never the other library.
        // SAFETY: the path names no file, so nothing is loaded and no
        // initialiser runs.
        unsafe { Library::load_from("/nonexistent/libnccl.so.2") }.map(|_| ()),
        |_| true,
    );
    let too_many_axes = Topology::from_links(
        vec![],
        vec![vec![]],
        nccl_safe::NvmlStatus::Missing("test".into()),
    );
    case(
        "Topology::from_links",
        "length (links vs gpus)",
        too_many_axes,
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    if has_library() {
        let lib = Library::get().expect("NCCL_LIBRARY names a libnccl");
        case(
            "Capabilities::require",
            "version",
            nccl_safe::Capabilities::decide(nccl_safe::nccl_sys::Version::new(2, 18, 3), |_| false)
                .require(nccl_safe::Feature::Grow),
            |e| matches!(e, SafeError::Unsupported { .. }),
        );
        if !lib.capabilities().has(nccl_safe::Feature::Encryption) {
            case(
                "nccl_safe::set_encryption",
                "version",
                nccl_safe::set_encryption(&Encryption::Plaintext),
                |e| matches!(e, SafeError::Unsupported { .. }),
            );
        }
        // UniqueId::new and every init refuse NCCL_COMM_ID: run in the cpu
        // tests of nccl-safe, in a child process (it needs the variable set).
        SEEN.lock()
            .unwrap()
            .insert(("UniqueId::new".into(), "environment (NCCL_COMM_ID)".into()));
        case(
            "Config::comm_name",
            "format (NUL), found at init",
            Comm::init_rank(&id, 0, 1, 0, &Config::new().comm_name("a\0b")),
            |e| {
                matches!(
                    e,
                    SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
                )
            },
        );
        case(
            "Config::net_name",
            "format (NUL), found at init",
            Comm::init_rank(&id, 0, 1, 0, &Config::new().net_name("a\0b")),
            |e| {
                matches!(
                    e,
                    SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
                )
            },
        );
        // An init inside a group is refused before NCCL sees it.
        let g = GroupGuard::start().expect("group");
        let inside = Comm::init_rank(&id, 0, 1, 0, &Config::new());
        let all_inside = Comm::init_all(&[0], &Config::new());
        let rank_scalable = Comm::init_rank_scalable(&[id], 0, 1, 0, &Config::new());
        g.end().expect("empty group");
        case(
            "Comm::init_rank",
            "group (init inside a group)",
            inside,
            |e| matches!(e, SafeError::InvalidArgument { .. }),
        );
        case(
            "Comm::init_all",
            "group (init inside a group)",
            all_inside,
            |e| matches!(e, SafeError::InvalidArgument { .. }),
        );
        case(
            "Comm::init_rank_scalable",
            "group (init inside a group)",
            rank_scalable,
            |e| {
                matches!(
                    e,
                    SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
                )
            },
        );
        case(
            "Comm::init_rank_scalable",
            "length (no ids)",
            Comm::init_rank_scalable(&[], 0, 1, 0, &Config::new()),
            |e| {
                matches!(
                    e,
                    SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
                )
            },
        );
        let g = GroupGuard::start().expect("group");
        let nested = GroupGuard::start();
        g.end().expect("empty group");
        case(
            "GroupGuard::start",
            "group (second outermost guard)",
            nested,
            |e| matches!(e, SafeError::InvalidArgument { .. }),
        );
        case(
            "nccl_safe::group",
            "group (inside another group)",
            {
                let g = GroupGuard::start().expect("group");
                let r = group(|_| Ok(()));
                g.end().expect("empty group");
                r
            },
            |e| matches!(e, SafeError::InvalidArgument { .. }),
        );
    }

    // ---- nccl-dist, no GPU needed ----
    case(
        "MeshShape::new",
        "length (product vs world)",
        MeshShape::new(&[("dp", 2), ("tp", 2)], 8),
        |e| matches!(e, MeshError::ShapeMismatch { .. }),
    );
    case(
        "MeshShape::new",
        "format (empty)",
        MeshShape::new(&[], 1),
        |e| matches!(e, MeshError::Empty),
    );
    case(
        "MeshShape::new",
        "length (zero axis)",
        MeshShape::new(&[("dp", 0)], 0),
        |e| matches!(e, MeshError::ZeroSize(_) | MeshError::ShapeMismatch { .. }),
    );
    case(
        "MeshShape::new",
        "format (duplicate axis)",
        MeshShape::new(&[("dp", 2), ("dp", 2)], 4),
        |e| matches!(e, MeshError::DuplicateAxis(_)),
    );
    case(
        "MeshShape::new",
        "length (product overflows)",
        MeshShape::new(&[("dp", usize::MAX / 2 + 2), ("tp", 2)], 2),
        |e| matches!(e, MeshError::Overflow { .. }),
    );
    let shape = MeshShape::new(&[("dp", 2), ("tp", 2)], 4).unwrap();
    case("MeshShape::axis_size", "name", shape.axis_size("pp"), |e| {
        matches!(e, MeshError::UnknownAxis(_))
    });
    case("MeshShape::coordinate", "rank", shape.coordinate(4), |e| {
        matches!(e, MeshError::RankOutOfRange { .. })
    });
    case(
        "MeshShape::split_for",
        "rank",
        shape.split_for(9, &["dp"]),
        |e| matches!(e, MeshError::RankOutOfRange { .. }),
    );
    case(
        "MeshShape::split_for",
        "name",
        shape.split_for(0, &["pp"]),
        |e| matches!(e, MeshError::UnknownAxis(_)),
    );
    case(
        "MeshShape::group_members",
        "rank",
        shape.group_members(9, &["dp"]),
        |e| matches!(e, MeshError::RankOutOfRange { .. }),
    );
    case(
        "MeshShape::group_members",
        "name",
        shape.group_members(0, &["x"]),
        |e| matches!(e, MeshError::UnknownAxis(_)),
    );
    case("MeshShape::slice", "name", shape.slice(&["x"]), |e| {
        matches!(e, MeshError::UnknownAxis(_))
    });
    case(
        "MeshShape::flatten",
        "format (not adjacent)",
        MeshShape::new(&[("a", 1), ("b", 1), ("c", 1)], 1)
            .unwrap()
            .flatten(&["a", "c"], "ac"),
        |e| matches!(e, MeshError::NotContiguous(_)),
    );
    case(
        "MeshShape::flatten",
        "name (unknown)",
        shape.flatten(&["pp"], "x"),
        |e| matches!(e, MeshError::UnknownAxis(_)),
    );

    case(
        "Launch::explicit",
        "rank",
        Launch::explicit(4, 4, 0, 1, "h", 1),
        |e| matches!(e, LaunchError::Inconsistent { .. }),
    );
    case(
        "Launch::explicit",
        "rank (local)",
        Launch::explicit(0, 4, 2, 2, "h", 1),
        |e| matches!(e, LaunchError::Inconsistent { .. }),
    );
    case(
        "Launch::from_lookup",
        "environment (none)",
        Launch::from_lookup(&|_: &str| None),
        |e| matches!(e, LaunchError::NoLauncher),
    );
    case(
        "Launch::from_lookup",
        "environment (not a number)",
        Launch::from_lookup(&|k: &str| match k {
            "RANK" => Some("zero".into()),
            "WORLD_SIZE" => Some("2".into()),
            _ => None,
        }),
        |e| matches!(e, LaunchError::Invalid { .. } | LaunchError::Missing { .. }),
    );
    case(
        "Launch::detect",
        "environment",
        {
            // The test process has no launcher variables unless run under one.
            if std::env::var_os("RANK").is_some()
                || std::env::var_os("SLURM_PROCID").is_some()
                || std::env::var_os("OMPI_COMM_WORLD_RANK").is_some()
            {
                Err(LaunchError::NoLauncher)
            } else {
                Launch::detect()
            }
        },
        |e| matches!(e, LaunchError::NoLauncher),
    );

    case(
        "Secret::from_bytes",
        "length",
        Secret::from_bytes(b"short".to_vec(), "test"),
        |e| matches!(e, SecretError::TooShort { .. }),
    );
    case(
        "Secret::from_lookup",
        "environment (missing)",
        Secret::from_lookup(&|_| None),
        |e| matches!(e, SecretError::Missing),
    );
    case(
        "Secret::from_env",
        "environment (missing)",
        {
            if std::env::var_os("NCCL_RS_SECRET").is_some()
                || std::env::var_os("NCCL_RS_SECRET_FILE").is_some()
            {
                Err(SecretError::Missing)
            } else {
                Secret::from_env()
            }
        },
        |e| matches!(e, SecretError::Missing),
    );
    case(
        "Secret::from_file",
        "path",
        Secret::from_file(std::path::Path::new("/nonexistent/secret")),
        |e| matches!(e, SecretError::File { .. }),
    );

    case(
        "rendezvous::decode_header",
        "length",
        rendezvous::decode_header(&[0; 5]),
        |e| matches!(e, RendezvousError::Malformed(_)),
    );
    case(
        "rendezvous::decode_header",
        "format (magic)",
        rendezvous::decode_header(&[0; 11]),
        |e| matches!(e, RendezvousError::Malformed(_)),
    );
    let mut big = rendezvous::encode_frame(1, &[]);
    big[7..11].copy_from_slice(&(1u32 << 20).to_be_bytes());
    case(
        "rendezvous::decode_header",
        "length (over the cap)",
        rendezvous::decode_header(&big[..11]),
        |e| matches!(e, RendezvousError::Malformed(_)),
    );
    let secret = Secret::from_bytes(vec![1u8; 32], "test").unwrap();
    case(
        "rendezvous::decode_file",
        "format",
        rendezvous::decode_file(b"not an id", &secret, std::time::SystemTime::now()),
        |e| matches!(e, RendezvousError::Malformed(_)),
    );
    case(
        "rendezvous::wait_file",
        "deadline",
        rendezvous::wait_file(
            std::path::Path::new("/nonexistent/dir/id"),
            &secret,
            Duration::from_millis(50),
        ),
        |e| matches!(e, RendezvousError::Timeout { .. } | RendezvousError::Io(_)),
    );
    case(
        "rendezvous::publish_file",
        "path",
        rendezvous::publish_file(std::path::Path::new("/nonexistent/dir/id"), &id, &secret),
        |e| matches!(e, RendezvousError::Io(_)),
    );
    case(
        "rendezvous::join",
        "deadline (nobody serves)",
        rendezvous::join(("127.0.0.1", 9), 1, 2, &secret, Duration::from_millis(200)),
        |e| matches!(e, RendezvousError::Timeout { .. } | RendezvousError::Io(_)),
    );
    case(
        "rendezvous::join",
        "rank",
        rendezvous::join(("127.0.0.1", 9), 2, 2, &secret, Duration::from_millis(50)),
        |e| matches!(e, RendezvousError::RankOutOfRange { .. }),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    case(
        "rendezvous::serve",
        "deadline (nobody joins)",
        rendezvous::serve(&listener, 2, &secret, &id, Duration::from_millis(200)),
        |e| matches!(e, RendezvousError::Timeout { .. }),
    );

    case(
        "rendezvous::serve_live",
        "deadline (nobody joins)",
        rendezvous::serve_live(
            &listener,
            2,
            &secret,
            &id,
            Duration::from_millis(200),
            &nccl_dist::liveness::LivenessOptions::new(),
        )
        .map(drop),
        |e| matches!(e, RendezvousError::Timeout { .. }),
    );
    case(
        "rendezvous::join_live",
        "rank",
        rendezvous::join_live(
            listener.local_addr().unwrap(),
            5,
            2,
            &secret,
            Duration::from_millis(200),
            &nccl_dist::liveness::LivenessOptions::new(),
        )
        .map(drop),
        |e| matches!(e, RendezvousError::RankOutOfRange { rank: 5, world: 2 }),
    );
    case(
        "LivenessOptions::from_lookup",
        "environment",
        nccl_dist::liveness::LivenessOptions::from_lookup(lookup(&[(
            "NCCL_RS_LIVENESS_TIMEOUT",
            "never",
        )])),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );

    case(
        "WatchdogOptions::from_lookup",
        "environment",
        WatchdogOptions::from_lookup(lookup(&[("NCCL_RS_WATCHDOG", "maybe")])),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "WatchdogOptions::from_lookup",
        "environment (timeout)",
        WatchdogOptions::from_lookup(lookup(&[("NCCL_RS_WATCHDOG_TIMEOUT", "-3")])),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "WatchdogOptions::from_env",
        "environment",
        WatchdogOptions::from_lookup(lookup(&[("NCCL_RS_FLIGHT_RECORDER", "0")])),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "nccl_dist::op_timeout_from_lookup",
        "environment",
        nccl_dist::op_timeout_from_lookup(lookup(&[("NCCL_RS_TIMEOUT", "soon")])),
        |e| {
            matches!(
                e,
                Error::InvalidArgument {
                    op: "NCCL_RS_TIMEOUT",
                    ..
                }
            )
        },
    );
    case(
        "WatchdogOptions::from_lookup",
        "environment (operation timeout)",
        WatchdogOptions::from_lookup(lookup(&[("NCCL_RS_TIMEOUT", "0")])),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "nccl_dist::encryption_from_lookup",
        "environment (psk without key)",
        nccl_dist::encryption_from_lookup(lookup(&[("NCCL_RS_ENCRYPTION", "psk")])),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::init_with",
        "rank (world from an inconsistent launch)",
        Launch::explicit(3, 2, 0, 1, "127.0.0.1", 1)
            .map_err(Error::from)
            .and_then(|l| World::init_with(l, &WorldOptions::new())),
        |e| matches!(e, Error::Launch(_)),
    );
    case(
        "World::init",
        "environment (no launcher)",
        {
            if std::env::var_os("RANK").is_some() {
                Err(Error::Launch(LaunchError::NoLauncher))
            } else {
                World::init()
            }
        },
        |e| matches!(e, Error::Launch(_) | Error::Secret(_)),
    );
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
    // ---- nccl-safe on a communicator of one rank on GPU 0 ----
    let comms = Comm::init_all(&[0], &Config::new()).expect("init_all");
    let c = &comms[0];
    let s = c.stream();
    let send = s.alloc_zeros::<f32>(16).unwrap();
    let mut short: CudaSlice<f32> = s.alloc_zeros::<f32>(8).unwrap();
    let mut out = s.alloc_zeros::<f32>(16).unwrap();
    let is_len = |e: &SafeError| matches!(e, SafeError::Length { .. });
    let is_rank = |e: &SafeError| matches!(e, SafeError::RankOutOfRange { .. });
    let is_alias = |e: &SafeError| matches!(e, SafeError::PartialAlias { .. });
    case(
        "OnStream::all_reduce",
        "length",
        c.all_reduce(&send, &mut short, ReduceOp::Sum),
        is_len,
    );
    case(
        "OnStream::reduce",
        "length",
        c.reduce(&send, Some(&mut short), ReduceOp::Sum, 0),
        is_len,
    );
    case(
        "OnStream::reduce",
        "root",
        c.reduce(&send, Some(&mut out), ReduceOp::Sum, 1),
        is_rank,
    );
    case(
        "OnStream::reduce_in_place",
        "root",
        c.reduce_in_place(&mut out, ReduceOp::Sum, 1),
        is_rank,
    );
    case(
        "OnStream::reduce_scatter",
        "length",
        c.reduce_scatter(&short, &mut s.alloc_zeros::<f32>(9).unwrap(), ReduceOp::Sum),
        |e| {
            matches!(
                e,
                SafeError::Length { .. } | SafeError::InvalidArgument { .. }
            )
        },
    );
    case(
        "OnStream::broadcast",
        "root",
        c.broadcast(Some(&send), &mut out, 1),
        is_rank,
    );
    case(
        "OnStream::broadcast",
        "length",
        c.broadcast(Some(&short), &mut out, 0),
        is_len,
    );
    case(
        "OnStream::broadcast_in_place",
        "root",
        c.broadcast_in_place(&mut out, 1),
        is_rank,
    );
    case(
        "OnStream::all_gather",
        "length",
        c.all_gather(&send, &mut short),
        is_len,
    );
    case(
        "OnStream::all_to_all",
        "length",
        c.all_to_all(&send, &mut short),
        is_len,
    );
    case(
        "OnStream::all_to_all_v",
        "length (counts per rank)",
        c.all_to_all_v(&send, &[1, 1], &[0, 1], &mut out, &[1], &[0]),
        |e| {
            matches!(
                e,
                SafeError::InvalidArgument { .. } | SafeError::Length { .. }
            )
        },
    );
    case(
        "OnStream::all_to_all_v",
        "length (segment outside)",
        c.all_to_all_v(&send, &[4], &[14], &mut out, &[4], &[0]),
        |e| {
            matches!(
                e,
                SafeError::Length { .. } | SafeError::InvalidArgument { .. }
            )
        },
    );
    case(
        "OnStream::gather",
        "root",
        c.gather(&send, Some(&mut out), 1),
        is_rank,
    );
    case(
        "OnStream::gather",
        "length",
        c.gather(&send, Some(&mut short), 0),
        is_len,
    );
    case(
        "OnStream::gather_in_place",
        "root",
        c.gather_in_place(&mut out, 1),
        is_rank,
    );
    case(
        "OnStream::scatter",
        "root",
        c.scatter(Some(&send), &mut out, 1),
        is_rank,
    );
    case(
        "OnStream::scatter",
        "length",
        c.scatter(Some(&short), &mut out, 0),
        is_len,
    );
    case(
        "OnStream::scatter_in_place",
        "root",
        c.scatter_in_place(&mut out, 1),
        is_rank,
    );
    case("OnStream::send", "peer", c.send(&send, 1), is_rank);
    case("OnStream::recv", "peer", c.recv(&mut out, 1), is_rank);
    case(
        "OnStream::all_reduce_in_place",
        "dtype (fp8 Avg on one rank)",
        {
            let mut f8 = s.alloc_zeros::<float8::F8E4M3>(4).unwrap();
            c.all_reduce_in_place(&mut f8, ReduceOp::Avg)
        },
        |e| matches!(e, SafeError::Unsupported { .. }),
    );
    // Aliasing: send is recv shifted by one element.
    {
        let (base, _sync) = send.device_ptr(s);
        let a = unsafe_view(base, 8, 0);
        let mut b = unsafe_view(base + 4, 8, 0);
        case(
            "OnStream::all_reduce",
            "aliasing",
            c.all_reduce(&a, &mut b, ReduceOp::Sum),
            is_alias,
        );
        // A length whose size in bytes overflows: refused before
        // ncclCommRegister sees the pointer.
        case(
            "Registration::new",
            "length (size in bytes overflows)",
            Registration::new(c, unsafe_view(base, usize::MAX / 2, 0)).map(|_| ()),
            |e| {
                matches!(
                    e,
                    SafeError::Overflow { .. } | SafeError::Unsupported { .. }
                )
            },
        );
    }
    // Device: a stream or buffer of another GPU.
    if n > 1 {
        let other = CudaContext::new(1).unwrap();
        let foreign = other.default_stream().alloc_zeros::<f32>(16).unwrap();
        case(
            "OnStream::all_reduce",
            "device (buffer)",
            c.all_reduce(&foreign, &mut out, ReduceOp::Sum),
            |e| {
                matches!(
                    e,
                    SafeError::WrongDevice {
                        role: Role::Send,
                        ..
                    }
                )
            },
        );
        let stream1 = other.new_stream().unwrap();
        let mut foreign_mut = other.default_stream().alloc_zeros::<f32>(16).unwrap();
        case(
            "OnStream::reduce_scatter_in_place",
            "device (buffer)",
            c.reduce_scatter_in_place(&mut foreign_mut, ReduceOp::Sum),
            |e| matches!(e, SafeError::WrongDevice { .. }),
        );
        case(
            "OnStream::all_gather_in_place",
            "device (buffer)",
            c.all_gather_in_place(&mut foreign_mut),
            |e| matches!(e, SafeError::WrongDevice { .. }),
        );
        case(
            "Comm::on",
            "device (stream)",
            c.on(&stream1).all_reduce_in_place(&mut out, ReduceOp::Sum),
            |e| {
                matches!(
                    e,
                    SafeError::WrongDevice {
                        role: Role::Stream,
                        ..
                    }
                )
            },
        );
        case(
            "Comm::synchronize",
            "device (stream)",
            c.synchronize(&stream1),
            |e| matches!(e, SafeError::WrongDevice { .. }),
        );
        case(
            "nccl_dist::synchronize",
            "device (stream)",
            nccl_dist::synchronize(c, &stream1),
            |e| matches!(e, Error::Nccl(SafeError::WrongDevice { .. })),
        );
        case(
            "nccl_safe::copy_peer_async",
            "length",
            nccl_safe::copy_peer_async(
                &send,
                s,
                &mut other.default_stream().alloc_zeros::<f32>(4).unwrap(),
                &other.default_stream(),
            ),
            |e| {
                matches!(
                    e,
                    SafeError::Length { .. } | SafeError::InvalidArgument { .. }
                )
            },
        );
        case(
            "nccl_safe::copy_peer",
            "length",
            nccl_safe::copy_peer(
                &send,
                s,
                &mut other.default_stream().alloc_zeros::<f32>(4).unwrap(),
                &other.default_stream(),
            ),
            |e| {
                matches!(
                    e,
                    SafeError::Length { .. } | SafeError::InvalidArgument { .. }
                )
            },
        );
    }
    // Group misuse and the closure form.
    let g = GroupGuard::start().unwrap();
    let direct = c.all_reduce_in_place(&mut out, ReduceOp::Sum);
    let abort_in_group = c.abort_handle().abort();
    let split_in_group = c.split(Some(0), 0, None);
    g.end().unwrap();
    case(
        "OnStream::all_reduce_in_place",
        "group (direct call inside a group)",
        direct,
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "AbortHandle::abort",
        "group (inside a group)",
        abort_in_group,
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::split",
        "group (inside a group)",
        split_in_group,
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "GroupGuard::end",
        "group (an error inside is returned by end)",
        {
            let g = GroupGuard::start().unwrap();
            let r = g.on(c).send(&send, 5);
            g.end().and(r)
        },
        is_rank,
    );
    case(
        "NestedGroup::end",
        "group (an error inside)",
        {
            let g = GroupGuard::start().unwrap();
            let inner = g.nest().unwrap();
            let r = inner.on(c).recv(&mut out, 5);
            let e = inner.end();
            g.end().and(e).and(r)
        },
        is_rank,
    );
    // Split, shrink, grow, PreMulSum, memory.
    case(
        "Comm::split_all",
        "length (keys)",
        Comm::split_all(&[c], &[Some(0)], &[], None),
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::shrink",
        "rank (excluded rank out of range)",
        c.shrink(&[3], false, None),
        |e| {
            matches!(
                e,
                SafeError::RankOutOfRange { .. } | SafeError::Unsupported { .. }
            )
        },
    );
    case(
        "Comm::shrink",
        "rank (nothing excluded)",
        c.shrink(&[], false, None),
        |e| {
            matches!(
                e,
                SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
            )
        },
    );
    case(
        "Comm::grow",
        "length (not larger)",
        c.grow(1, None, None),
        |e| {
            matches!(
                e,
                SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
            )
        },
    );
    case(
        "PreMulSum::device",
        "length (scalar buffer empty)",
        PreMulSum::device(c, &s.alloc_zeros::<f32>(0).unwrap()).map(|_| ()),
        |e| {
            matches!(
                e,
                SafeError::Length { .. } | SafeError::InvalidArgument { .. }
            )
        },
    );
    if n > 1 {
        let other = Comm::init_all(&[1], &Config::new()).unwrap();
        let p = PreMulSum::host(&other[0], 2.0f32).unwrap();
        case(
            "PreMulSum::host",
            "device (op of another communicator)",
            c.all_reduce_in_place(&mut out, &p),
            |e| matches!(e, SafeError::InvalidArgument { .. }),
        );
        let foreign = CudaContext::new(1)
            .unwrap()
            .default_stream()
            .alloc_zeros::<f32>(1)
            .unwrap();
        case(
            "PreMulSum::device",
            "device (scalar on another GPU)",
            PreMulSum::device(c, &foreign).map(|_| ()),
            |e| {
                matches!(
                    e,
                    SafeError::WrongDevice { .. } | SafeError::InvalidArgument { .. }
                )
            },
        );
        case(
            "Registration::new",
            "device (buffer on another GPU)",
            Registration::new(c, foreign.clone()).map(|_| ()),
            |e| matches!(e, SafeError::WrongDevice { .. }),
        );
        case(
            "Window::register",
            "device (buffer on another GPU)",
            Window::register(c, foreign.clone(), 0).map(|_| ()),
            |e| {
                matches!(
                    e,
                    SafeError::WrongDevice { .. } | SafeError::Unsupported { .. }
                )
            },
        );
        case(
            "Window::register_all",
            "length (buffers vs comms)",
            Window::register_all(&[c], Vec::<CudaSlice<f32>>::new(), 0).map(|_| ()),
            |e| {
                matches!(
                    e,
                    SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
                )
            },
        );
        let topo = Topology::probe(&[0, 1]).unwrap();
        case(
            "Topology::enable_peer_access",
            "device (unknown)",
            topo.enable_peer_access(0, 7),
            |e| {
                matches!(
                    e,
                    SafeError::InvalidArgument { .. }
                        | SafeError::RankOutOfRange { .. }
                        | SafeError::Cuda { .. }
                )
            },
        );
    }
    case(
        "Topology::probe",
        "device (does not exist)",
        Topology::probe(&[gpus + 3]),
        |e| {
            matches!(
                e,
                SafeError::Cuda { .. } | SafeError::InvalidArgument { .. }
            )
        },
    );
    case(
        "NcclMemory::alloc",
        "length (overflow)",
        NcclMemory::<f32>::alloc(c, usize::MAX / 2).map(|_| ()),
        |e| {
            matches!(
                e,
                SafeError::Overflow { .. }
                    | SafeError::InvalidArgument { .. }
                    | SafeError::Nccl { .. }
            )
        },
    );
    // Use after abort: every later call is Aborted, the handle too.
    let handle = c.abort_handle();
    handle.abort().unwrap();
    case(
        "Comm::status",
        "use after abort",
        c.status().map(|_| ()),
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    case(
        "AbortHandle::status",
        "use after abort",
        handle.status().map(|_| ()),
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    case(
        "OnStream::all_reduce_in_place",
        "use after abort",
        c.all_reduce_in_place(&mut out, ReduceOp::Sum),
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    case(
        "Comm::with_raw",
        "use after abort",
        // SAFETY: the closure does nothing; the call is refused (aborted).
        unsafe { c.with_raw(|_| ()) },
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    case(
        "Comm::split",
        "use after abort",
        c.split(Some(0), 0, None),
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    // Unsupported on a library without them (2.28 lacks grow), else
    // refused as aborted.
    let aborted_or_missing =
        |e: &SafeError| matches!(e, SafeError::Aborted { .. } | SafeError::Unsupported { .. });
    case(
        "Comm::grow_id",
        "use after abort / version",
        c.grow_id().map(|_| ()),
        aborted_or_missing,
    );
    case(
        "Comm::revoke",
        "use after abort / version",
        c.revoke(),
        aborted_or_missing,
    );
    if !c.capabilities().has(nccl_safe::Feature::Encryption) {
        case(
            "nccl_safe::set_encryption",
            "version",
            nccl_safe::set_encryption(&Encryption::Plaintext),
            |e| matches!(e, SafeError::Unsupported { .. }),
        );
    }
    drop(comms);
    // Use after finalize: the handle outlives its communicator.
    // (A communicator of its own: one made with others by init_all is
    // torn down with them, when the last goes.)
    let alone = Comm::init_rank(&UniqueId::new().unwrap(), 0, 1, 0, &Config::new()).unwrap();
    let handle = alone.abort_handle();
    alone.destroy().unwrap();
    case(
        "AbortHandle::status",
        "use after finalize",
        handle.status().map(|_| ()),
        |e| matches!(e, SafeError::Finalized { .. }),
    );
    // finalize/destroy/abort take self: a second call does not compile.
    SEEN.lock().unwrap().insert((
        "Comm::finalize".into(),
        "use after finalize (compile time)".into(),
    ));
    SEEN.lock().unwrap().insert((
        "Comm::destroy".into(),
        "use after finalize (compile time)".into(),
    ));
    SEEN.lock().unwrap().insert((
        "Comm::abort".into(),
        "use after abort (compile time)".into(),
    ));

    // ---- nccl-dist on worlds of n GPUs, one thread ----
    let worlds = World::local(n).expect("World::local");
    let w = &worlds[0];
    case(
        "World::local_with",
        "device (twice)",
        World::local_with(&[0, 0], &Config::new()),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::local",
        "device (more than exist)",
        World::local(gpus + 1),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::spawn_local_with",
        "device (does not exist)",
        World::spawn_local_with(&[gpus + 1], &Config::new(), |_| Ok(())),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::spawn_local",
        "device (more than exist)",
        World::spawn_local(gpus + 1, |_| Ok(())),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::nvlink_order",
        "device (more than exist)",
        World::nvlink_order(gpus + 1),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "DeviceMesh::new",
        "length (shape vs world)",
        DeviceMesh::new(w, &[("dp", n + 1)]),
        |e| matches!(e, Error::Mesh(MeshError::ShapeMismatch { .. })),
    );
    case(
        "DeviceMesh::new_with",
        "length (shape vs world)",
        DeviceMesh::new_with(w, &[("dp", n * 2)], nccl_dist::Placement::RankOrder),
        |e| matches!(e, Error::Mesh(_)),
    );
    case(
        "DeviceMesh::new_all",
        "rank (worlds out of order)",
        DeviceMesh::new_all(&worlds[..0], &[("dp", 1)], nccl_dist::Placement::RankOrder),
        |e| matches!(e, Error::Mesh(_) | Error::InvalidArgument { .. }),
    );
    let mut meshes =
        DeviceMesh::new_all(&worlds, &[("dp", n)], nccl_dist::Placement::RankOrder).expect("mesh");
    let m = &meshes[0];
    let mbuf = m.comm().stream().alloc_zeros::<f32>(16).unwrap();
    let mut mout = m.comm().stream().alloc_zeros::<f32>(16).unwrap();
    let unknown = |e: &Error| matches!(e, Error::Mesh(MeshError::UnknownAxis(_)));
    case(
        "DeviceMesh::axis",
        "name",
        m.axis("tp").map(|_| ()),
        unknown,
    );
    case("DeviceMesh::size", "name", m.size("tp"), unknown);
    case(
        "DeviceMesh::local_rank",
        "name",
        m.local_rank("tp"),
        unknown,
    );
    case("DeviceMesh::axes_of", "name", m.axes_of("tp"), unknown);
    case(
        "DeviceMesh::slice",
        "name",
        m.slice(&["tp"]).map(|_| ()),
        unknown,
    );
    case(
        "DeviceMesh::all_reduce",
        "name",
        m.all_reduce("tp", &mbuf, &mut mout, ReduceOp::Sum),
        unknown,
    );
    case(
        "DeviceMesh::all_reduce_in_place",
        "name",
        m.all_reduce_in_place("tp", &mut mout, ReduceOp::Sum),
        unknown,
    );
    case(
        "DeviceMesh::broadcast_in_place",
        "name",
        m.broadcast_in_place("tp", &mut mout, 0),
        unknown,
    );
    case(
        "DeviceMesh::all_gather",
        "name",
        m.all_gather("tp", &mbuf, &mut mout),
        unknown,
    );
    case(
        "DeviceMesh::reduce_scatter",
        "name",
        m.reduce_scatter("tp", &mbuf, &mut mout, ReduceOp::Sum),
        unknown,
    );
    case(
        "DeviceMesh::all_to_all",
        "name",
        m.all_to_all("tp", &mbuf, &mut mout),
        unknown,
    );
    case(
        "DeviceMesh::all_gather",
        "length (through the axis)",
        m.all_gather(
            "dp",
            &mbuf,
            &mut m.comm().stream().alloc_zeros::<f32>(1).unwrap(),
        ),
        |e| matches!(e, Error::Nccl(SafeError::Length { .. })),
    );
    let sub = m.slice(&["dp"]).unwrap();
    case("SubMesh::axis", "name", sub.axis("tp").map(|_| ()), unknown);
    case("SubMesh::size", "name", sub.size("tp"), unknown);
    case("SubMesh::local_rank", "name", sub.local_rank("tp"), unknown);
    case(
        "DeviceMesh::flatten",
        "name (taken)",
        meshes[0].flatten(&["dp"], "dp").map(|_| ()),
        |e| matches!(e, Error::Mesh(MeshError::DuplicateAxis(_))),
    );
    case(
        "DeviceMesh::flatten_all",
        "name (unknown)",
        DeviceMesh::flatten_all(&mut meshes, &["tp"], "x"),
        unknown,
    );
    drop(meshes);
    // Communicator: raw pointers that are not device memory of this GPU.
    let host = vec![0f32; 16];
    let dev_buf = w.comm().stream().alloc_zeros::<f32>(16).unwrap();
    let dev_ptr = {
        let (p, _sync) = dev_buf.device_ptr(w.comm().stream());
        p
    };
    let comm: &dyn Communicator = w.comm();
    let not_device = |e: &Error| {
        matches!(
            e,
            Error::Nccl(
                SafeError::InvalidArgument { .. }
                    | SafeError::WrongDevice { .. }
                    | SafeError::Cuda { .. }
            ) | Error::InvalidArgument { .. }
        )
    };
    // SAFETY: each call below is refused before any pointer is used.
    unsafe {
        case(
            "Communicator::all_reduce",
            "device (host pointer)",
            comm.all_reduce(
                host_ptr(&host),
                host_ptr(&host),
                16,
                DType::F32,
                ReduceOp::Sum,
                None,
            ),
            not_device,
        );
        case(
            "Communicator::broadcast",
            "device (host pointer)",
            comm.broadcast(host_ptr(&host), host_ptr(&host), 16, DType::F32, 0, None),
            not_device,
        );
        case(
            "Communicator::reduce",
            "device (host pointer)",
            comm.reduce(
                host_ptr(&host),
                host_ptr(&host),
                16,
                DType::F32,
                ReduceOp::Sum,
                0,
                None,
            ),
            not_device,
        );
        case(
            "Communicator::all_gather",
            "device (host pointer)",
            comm.all_gather(host_ptr(&host), host_ptr(&host), 4, DType::F32, None),
            not_device,
        );
        case(
            "Communicator::reduce_scatter",
            "device (host pointer)",
            comm.reduce_scatter(
                host_ptr(&host),
                host_ptr(&host),
                4,
                DType::F32,
                ReduceOp::Sum,
                None,
            ),
            not_device,
        );
        case(
            "Communicator::all_to_all",
            "device (host pointer)",
            comm.all_to_all(host_ptr(&host), host_ptr(&host), 4, DType::F32, None),
            not_device,
        );
        case(
            "Communicator::send",
            "peer",
            comm.send(dev_ptr, 4, DType::F32, n + 2, None),
            |e| {
                matches!(
                    e,
                    Error::Nccl(SafeError::RankOutOfRange { .. }) | Error::InvalidArgument { .. }
                )
            },
        );
        case(
            "Communicator::recv",
            "peer",
            comm.recv(dev_ptr, 4, DType::F32, n + 2, None),
            |e| {
                matches!(
                    e,
                    Error::Nccl(SafeError::RankOutOfRange { .. }) | Error::InvalidArgument { .. }
                )
            },
        );
        case(
            "Communicator::send_recv",
            "peer",
            comm.send_recv(dev_ptr, 4, n + 2, dev_ptr, 4, 0, DType::F32, None),
            |e| {
                matches!(
                    e,
                    Error::Nccl(SafeError::RankOutOfRange { .. }) | Error::InvalidArgument { .. }
                )
            },
        );
    }
    case(
        "HostCollectives::broadcast_host",
        "root",
        w.comm().broadcast_host(&mut [0f32; 4], n + 1),
        |e| matches!(e, Error::Nccl(SafeError::RankOutOfRange { .. })),
    );
    case(
        "HostCollectives::all_gather_host",
        "group (inside a group)",
        {
            let g = GroupGuard::start().unwrap();
            let r = w.comm().all_gather_host(&[1u8; 4][..]);
            g.end().unwrap();
            r
        },
        |e| matches!(e, Error::Nccl(SafeError::InvalidArgument { .. })),
    );
    case(
        "HostCollectives::all_reduce_host",
        "group (inside a group)",
        {
            let g = GroupGuard::start().unwrap();
            let r = w.comm().all_reduce_host(&mut [1f32; 4], ReduceOp::Sum);
            g.end().unwrap();
            r
        },
        |e| matches!(e, Error::Nccl(SafeError::InvalidArgument { .. })),
    );
    case(
        "Communicator::barrier",
        "group (inside a group)",
        {
            let g = GroupGuard::start().unwrap();
            let r = Communicator::barrier(w.comm());
            g.end().unwrap();
            r
        },
        |e| matches!(e, Error::Nccl(SafeError::InvalidArgument { .. })),
    );
    let _ = CommStream::new(w.comm()).unwrap();
    case(
        "HostCollectives::all_reduce_host",
        "use after abort",
        {
            w.comm().abort_handle().abort().unwrap();
            w.comm().all_reduce_host(&mut [1f32; 4], ReduceOp::Sum)
        },
        |e| matches!(e, Error::Nccl(SafeError::Aborted { .. })),
    );
    drop(worlds);
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
    let me = include_str!("bad_input.rs");
    let mut covered = BTreeSet::new();
    // Names in case rows: `case("Type::name", ...` / SEEN inserts.
    for part in me.split('"').skip(1).step_by(2) {
        if let Some((_, name)) = part.rsplit_once("::") {
            covered.insert(name.to_string());
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
    for krate in ["nccl-safe", "nccl-dist"] {
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
