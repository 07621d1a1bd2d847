//! The rows that need no GPU: arguments refused before NCCL or a device
//! is needed (nccl-safe), and nccl-dist's meshes, rendezvous frames,
//! secrets and launch variables.

use super::*;

/// nccl-safe, before any GPU is needed; `id` is a unique id no NCCL made.
pub fn safe_rows(id: UniqueId) {
    id_rows(id);
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
    let too_many_axes =
        Topology::from_links(vec![], vec![vec![]], NvmlStatus::Missing("test".into()));
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
}

/// A unique id from outside: bytes, hex text, a file.
fn id_rows(id: UniqueId) {
    use nccl_safe::UniqueIdError as E;
    case(
        "UniqueId::from_slice",
        "length",
        UniqueId::from_slice(&[0; 127]),
        |e| {
            matches!(
                e,
                SafeError::BadUniqueId(E::Length {
                    expected: 128,
                    found: 127
                })
            )
        },
    );
    let hex = id.to_hex();
    case(
        "UniqueId::from_hex",
        "length",
        UniqueId::from_hex(&hex[..254]),
        |e| matches!(e, SafeError::BadUniqueId(E::HexLength { found: 254, .. })),
    );
    case(
        "UniqueId::from_hex",
        "format (not a hex digit)",
        UniqueId::from_hex(&hex.replacen('7', "x", 1)),
        |e| matches!(e, SafeError::BadUniqueId(E::NotHex { found: 'x', .. })),
    );
    let dir = std::env::temp_dir().join(format!("bad-input-id-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    case(
        "UniqueId::read_file",
        "format (missing file)",
        UniqueId::read_file(dir.join("none")),
        |e| matches!(e, SafeError::BadUniqueId(E::Io { .. })),
    );
    let path = dir.join("short");
    std::fs::write(&path, [0xffu8; 100]).unwrap();
    case(
        "UniqueId::read_file",
        "length (wrong size)",
        UniqueId::read_file(&path),
        |e| matches!(e, SafeError::BadUniqueId(E::FileContents { size: 100, .. })),
    );
    std::fs::write(&path, vec![b'0'; 4097]).unwrap();
    case(
        "UniqueId::read_file",
        "length (over 4 KiB)",
        UniqueId::read_file(&path),
        |e| matches!(e, SafeError::BadUniqueId(E::FileTooLarge { .. })),
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// nccl-dist, no GPU needed.
pub fn dist_rows(id: UniqueId) {
    case(
        "World::from_unique_id",
        "rank",
        World::from_unique_id(&id, 2, 2, &WorldOptions::new()),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::from_unique_id",
        "rank (empty world)",
        World::from_unique_id(&id, 0, 0, &WorldOptions::new()),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "MeshShape::new",
        "length (product vs world)",
        MeshShape::new(&[("dp", 2), ("tp", 2)], 8),
        |e| matches!(e, MeshError::ShapeMismatch { .. }),
    );
    let square = MeshShape::new(&[("dp", 2), ("tp", 2)], 4).expect("a 2x2 shape");
    case(
        "MeshShape::without_replicas",
        "name (no such axis)",
        square.without_replicas("pp", &[0]),
        |e| matches!(e, MeshError::UnknownAxis(_)),
    );
    case(
        "MeshShape::without_replicas",
        "rank (outside the mesh)",
        square.without_replicas("dp", &[4]),
        |e| matches!(e, MeshError::RankOutOfRange { .. }),
    );
    case(
        "MeshShape::without_replicas",
        "state (every replica lost a rank)",
        square.without_replicas("dp", &[0, 2]),
        |e| matches!(e, MeshError::NoReplicaLeft(_)),
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
        rendezvous::publish_file(
            std::path::Path::new("/nonexistent/dir/id"),
            &id.raw(),
            &secret,
        ),
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
        rendezvous::serve(&listener, 2, &secret, &id.raw(), Duration::from_millis(200)),
        |e| matches!(e, RendezvousError::Timeout { .. }),
    );

    case(
        "rendezvous::serve_live",
        "deadline (nobody joins)",
        rendezvous::serve_live(
            &listener,
            2,
            &secret,
            &id.raw(),
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
        |e| e.var == "NCCL_RS_LIVENESS_TIMEOUT",
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
        "WatchdogOptions::from_lookup",
        "environment (poll interval)",
        WatchdogOptions::from_lookup(lookup(&[("NCCL_RS_WATCHDOG_POLL_MS", "0.01")])),
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
