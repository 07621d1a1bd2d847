//! What nccl-safe does on a machine without a GPU, against the real libnccl
//! that `cargo xtask test` points `NCCL_LIBRARY` at.

use nccl_safe::{
    Comm, Config, Error, Feature, GroupGuard, Library, UniqueId, group, take_dropped_group_error,
};

fn library() -> Option<&'static Library> {
    if std::env::var_os("NCCL_LIBRARY").is_none() {
        eprintln!("skipped: NCCL_LIBRARY is not set (`cargo xtask test` sets it)");
        return None;
    }
    Some(Library::get().expect("NCCL_LIBRARY names a loadable libnccl"))
}

fn has_gpu() -> bool {
    std::path::Path::new("/dev/nvidia0").exists()
}

#[test]
fn unique_ids_need_no_gpu_and_never_print_their_bytes() {
    if library().is_none() {
        return;
    }
    let a = UniqueId::new().expect("ncclGetUniqueId");
    let b = UniqueId::new().expect("ncclGetUniqueId");
    assert_ne!(a, b);
    assert_eq!(UniqueId::from_bytes(*a.as_bytes()), a);
    let text = format!("{a:?}");
    assert!(text.starts_with("UniqueId(digest "), "{text}");
    assert!(text.len() < 32, "{text}");
}

#[test]
fn capabilities_follow_the_loaded_library() {
    let Some(lib) = library() else { return };
    let caps = lib.capabilities();
    assert_eq!(caps.version(), lib.version());
    for feature in Feature::ALL {
        let expected =
            lib.version() >= feature.since() && feature.symbols().iter().all(|s| lib.raw().has(*s));
        assert_eq!(caps.has(*feature), expected, "{feature}");
    }
    if lib.version() >= nccl_sys::Version::new(2, 32, 0) {
        assert_eq!(
            caps.features().len(),
            Feature::ALL.len(),
            "2.32 has every feature"
        );
    }
}

#[test]
fn init_without_a_gpu_is_an_error_value_not_a_panic() {
    if library().is_none() || has_gpu() {
        return;
    }
    let id = UniqueId::new().expect("id");
    let err = Comm::init_rank(&id, 0, 1, 0, &Config::new()).expect_err("no GPU here");
    assert!(
        matches!(
            err,
            Error::Unsupported { what: "CUDA", .. } | Error::Cuda { .. }
        ),
        "{err}"
    );
    let err = Comm::init_all(&[0, 1], &Config::new()).expect_err("no GPU here");
    assert!(
        matches!(err, Error::Unsupported { .. } | Error::Cuda { .. }),
        "{err}"
    );
}

#[test]
fn bad_init_arguments_are_refused_before_nccl_sees_them() {
    if library().is_none() {
        return;
    }
    let id = UniqueId::from_bytes([0; 128]);
    let err = Comm::init_rank(&id, 2, 2, 0, &Config::new()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::RankOutOfRange {
                rank: 2,
                size: 2,
                ..
            }
        ),
        "{err}"
    );
    let err = Comm::init_rank(&id, 0, 0, 0, &Config::new()).unwrap_err();
    assert!(matches!(err, Error::RankOutOfRange { .. }), "{err}");
    let err = Comm::init_all(&[], &Config::new()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = Comm::init_all(&[0, 0], &Config::new()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                reason: "a device is listed twice",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn groups_nest_and_a_dropped_guard_still_ends_its_group() {
    if library().is_none() {
        return;
    }
    let outer = GroupGuard::start().expect("ncclGroupStart");
    // A second outermost group on the same thread is refused: an inner
    // group's buffers must stay borrowed until the outer one launches.
    let err = GroupGuard::start().expect_err("nested start");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let inner = outer.nest().expect("nested ncclGroupStart");
    inner.end().expect("inner end");
    outer.end().expect("outer end");
    {
        let _guard = GroupGuard::start().expect("start");
        // Dropped without end(): the group is still closed.
    }
    assert!(take_dropped_group_error().is_none());
    // The closure form ends the group when the body fails, and the body's
    // error is what comes back.
    let err = group(|_| -> nccl_safe::Result<()> {
        Err(Error::InvalidArgument {
            op: "test",
            reason: "body failed",
        })
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                reason: "body failed",
                ..
            }
        ),
        "{err}"
    );
    // And a fresh group still works afterwards: no group was left open.
    group(|_| Ok(())).expect("a new group");
}

#[test]
fn encryption_is_set_or_refused_never_silently_plaintext() {
    let Some(lib) = library() else { return };
    let key = nccl_safe::PresharedKey::new("a-job-wide-key-of-32-bytes-00000").expect("key");
    let result = nccl_safe::set_encryption(&nccl_safe::Encryption::Psk(key));
    if lib.capabilities().has(Feature::Encryption) {
        // A TLS-enabled build accepts it; one without TLS answers with its
        // NCCL error, which must reach the caller.
        match &result {
            Ok(()) => {}
            Err(Error::Nccl { op, .. }) => assert_eq!(*op, "ncclSetEncryption"),
            Err(other) => panic!("unexpected {other:?}"),
        }
        eprintln!(
            "ncclSetEncryption with a PSK on NCCL {}: {result:?}",
            lib.version()
        );
        nccl_safe::set_encryption(&nccl_safe::Encryption::Plaintext).expect("back to plaintext");
    } else {
        assert!(
            matches!(result, Err(Error::Unsupported { .. })),
            "{result:?}"
        );
    }
}

#[test]
fn nccl_comm_id_is_refused_unless_allowed() {
    if library().is_none() {
        return;
    }
    // Run in a child process instead, so no other test sees the variable.
    let exe = std::env::current_exe().expect("test binary");
    if std::env::var_os("NCCL_SAFE_COMM_ID_CHILD").is_some() {
        let refused = UniqueId::new();
        assert!(
            matches!(refused, Err(Error::InvalidArgument { .. })),
            "{refused:?}"
        );
        let refused = Comm::init_rank(&UniqueId::from_bytes([0; 128]), 0, 1, 0, &Config::new());
        assert!(
            matches!(refused, Err(Error::InvalidArgument { .. })),
            "{refused:?}"
        );
        return;
    }
    let status = std::process::Command::new(exe)
        .args([
            "--exact",
            "nccl_comm_id_is_refused_unless_allowed",
            "--test-threads",
            "1",
        ])
        .env("NCCL_SAFE_COMM_ID_CHILD", "1")
        .env("NCCL_COMM_ID", "127.0.0.1:29999")
        .status()
        .expect("child");
    assert!(status.success(), "the child saw NCCL_COMM_ID accepted");
}
