//! The loader and the no-GPU parts of NCCL, against real libraries.
//!
//! `cargo xtask test` fetches the pinned wheels into `target/nccl/<version>`
//! and points `NCCL_SYS_PINNED` there. No GPU is needed: these calls either
//! work without one (`ncclGetVersion`, `ncclGetErrorString`,
//! `ncclGetUniqueId`, `ncclGetLastError`) or must fail cleanly without one
//! (`ncclCommInitRank`).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use nccl_sys::*;

const PINNED: [(u32, u32, u32); 4] = [(2, 18, 3), (2, 24, 3), (2, 28, 9), (2, 32, 3)];

fn pinned_root() -> PathBuf {
    std::env::var_os("NCCL_SYS_PINNED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/nccl"))
}

fn pinned_library(version: &str) -> PathBuf {
    let path = pinned_root().join(version).join("lib/libnccl.so.2");
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask test` (or `cargo xtask fetch`), which fetches the \
         pinned NCCL wheels",
        path.display()
    );
    path
}

fn open(version: &str) -> Nccl {
    let path = pinned_library(version);
    // SAFETY: a pinned NCCL release that xtask fetched from PyPI.
    match unsafe { Nccl::open(&path) } {
        Ok(nccl) => nccl,
        Err(e) => panic!("loading {}: {e}", path.display()),
    }
}

fn newest() -> Nccl {
    open("2.32.3")
}

#[test]
fn each_pinned_library_reports_its_own_version() {
    for (major, minor, patch) in PINNED {
        let nccl = open(&format!("{major}.{minor}.{patch}"));
        assert_eq!(nccl.version(), Version::new(major, minor, patch));
        assert_eq!(nccl.source(), Source::Explicit);
        assert!(
            nccl.path().ends_with("lib/libnccl.so.2"),
            "{}",
            nccl.path().display()
        );
    }
}

#[test]
fn each_pinned_library_exports_exactly_the_symbols_its_version_should_have() {
    for (major, minor, patch) in PINNED {
        let nccl = open(&format!("{major}.{minor}.{patch}"));
        let code = nccl.version().code();
        let expected: Vec<Symbol> = Symbol::ALL
            .iter()
            .copied()
            .filter(|s| s.since() <= code)
            .collect();
        assert_eq!(nccl.available(), expected, "NCCL {}", nccl.version());
        let missing: Vec<Symbol> = Symbol::ALL
            .iter()
            .copied()
            .filter(|s| s.since() > code)
            .collect();
        assert_eq!(nccl.missing(), missing, "NCCL {}", nccl.version());
    }
}

#[test]
fn nccl_2_18_reports_2_19_and_later_functions_as_unavailable() {
    let nccl = open("2.18.3");
    for symbol in [
        Symbol::ncclCommRegister,
        Symbol::ncclMemAlloc,
        Symbol::ncclCommShrink,
    ] {
        assert!(!nccl.has(symbol), "{symbol:?}");
    }
    let err = nccl
        .ncclCommShrink()
        .expect_err("2.18.3 has no ncclCommShrink");
    assert_eq!(
        err,
        SymbolError {
            symbol: Symbol::ncclCommShrink,
            library: Version::new(2, 18, 3)
        }
    );
    assert_eq!(
        err.to_string(),
        "ncclCommShrink is not available in the loaded NCCL 2.18.3 (it was added in NCCL 2.27)"
    );
    let err = nccl
        .ncclCommRegister()
        .expect_err("2.18.3 has no ncclCommRegister");
    assert_eq!(err.symbol, Symbol::ncclCommRegister);
    // And what 2.18 does have still resolves.
    assert!(nccl.ncclCommSplit().is_ok());
}

#[test]
fn error_string_names_every_result_code() {
    let nccl = newest();
    let expected_words = [
        (ncclResult_t::ncclSuccess, "no error"),
        (ncclResult_t::ncclUnhandledCudaError, "CUDA"),
        (ncclResult_t::ncclSystemError, "system"),
        (ncclResult_t::ncclInternalError, "internal"),
        (ncclResult_t::ncclInvalidArgument, "invalid argument"),
        (ncclResult_t::ncclInvalidUsage, "invalid usage"),
        (ncclResult_t::ncclRemoteError, "remote"),
        (ncclResult_t::ncclInProgress, "in progress"),
        (ncclResult_t::ncclTimeout, "timeout"),
    ];
    assert_eq!(expected_words.len(), ncclResult_t::VARIANTS.len());
    for (result, word) in expected_words {
        let text = nccl
            .error_string(result)
            .unwrap_or_else(|| panic!("{result:?}: no string"));
        assert!(
            text.to_lowercase().contains(&word.to_lowercase()),
            "{result:?}: {text:?} does not mention {word:?}"
        );
    }
    // A code no release has used yet still gets a string, not a crash.
    let unknown = nccl
        .error_string(ncclResult_t(1000))
        .expect("a string for an unknown code");
    assert!(!unknown.is_empty());
}

#[test]
fn get_unique_id_fills_128_bytes_and_each_call_differs() {
    let nccl = newest();
    let get = nccl.ncclGetUniqueId().expect("ncclGetUniqueId");
    let mut a = ncclUniqueId::zeroed();
    let mut b = ncclUniqueId::zeroed();
    // SAFETY: each call writes one ncclUniqueId through a valid pointer.
    let (ra, rb) = unsafe { (get(&mut a), get(&mut b)) };
    assert_eq!(
        (ra, rb),
        (ncclResult_t::ncclSuccess, ncclResult_t::ncclSuccess)
    );
    assert_ne!(a, ncclUniqueId::zeroed());
    assert_ne!(a, b, "two ids must differ");
    assert_eq!(ncclUniqueId::from_bytes(*a.as_bytes()), a);
    assert_eq!(
        format!("{a:?}"),
        "ncclUniqueId { .. }",
        "Debug must not print the id"
    );
}

#[test]
fn get_last_error_without_a_communicator_returns_a_string() {
    let nccl = newest();
    let last = nccl.ncclGetLastError().expect("ncclGetLastError");
    // SAFETY: a null communicator asks for the thread's last error; NCCL
    // returns a pointer to a nul-terminated string it owns.
    let text = unsafe { last(std::ptr::null_mut()) };
    assert!(!text.is_null());
    // SAFETY: non-null and nul-terminated, per the call above.
    let text = unsafe { std::ffi::CStr::from_ptr(text) };
    assert!(text.to_str().is_ok());
}

/// Runs `f` on its own thread and fails the test if it does not return
/// within `limit`: a hang must show up as a failure, not a stuck CI job.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => value,
        Err(_) => panic!("no answer within {limit:?}"),
    }
}

#[test]
fn comm_init_rank_without_a_gpu_fails_cleanly() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        eprintln!("skipped: this machine has a GPU, so init would not fail");
        return;
    }
    let (result, comm, last_error) = within(Duration::from_secs(120), || {
        let nccl = newest();
        let mut id = ncclUniqueId::zeroed();
        // SAFETY: writes one ncclUniqueId.
        let r = unsafe { nccl.ncclGetUniqueId().expect("ncclGetUniqueId")(&mut id) };
        assert_eq!(r, ncclResult_t::ncclSuccess);
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer, one rank of one, the id just made.
        let result =
            unsafe { nccl.ncclCommInitRank().expect("ncclCommInitRank")(&mut comm, 1, id, 0) };
        let last = nccl.ncclGetLastError().expect("ncclGetLastError");
        // SAFETY: null asks for the thread's last error; the text is copied at once.
        let text = unsafe { std::ffi::CStr::from_ptr(last(std::ptr::null_mut())) };
        (result, comm as usize, text.to_string_lossy().into_owned())
    });
    assert_ne!(
        result,
        ncclResult_t::ncclSuccess,
        "init cannot succeed without a GPU"
    );
    assert!(
        result.name().is_some(),
        "a known error code, got {result:?}"
    );
    assert_eq!(comm, 0, "no communicator is handed out on failure");
    eprintln!("ncclCommInitRank without a GPU: {result:?} ({last_error})");
}

// ---- the loader's bad inputs ---------------------------------------------------

#[test]
fn a_missing_explicit_file_is_rejected_as_missing() {
    let path = pinned_root().join("no-such-dir/libnccl.so.2");
    // SAFETY: nothing is loaded: the file does not exist.
    let err = unsafe { Nccl::load_from(&SearchPaths::only(&path)) }.expect_err("missing file");
    let LoadError::Rejected(attempt) = &err else {
        panic!("expected Rejected, got {err:?}")
    };
    assert_eq!(attempt.source, Source::NcclLibrary);
    assert_eq!(attempt.target, path);
    assert!(matches!(attempt.failure, AttemptFailure::Missing));
    assert!(err.to_string().contains("no such file"), "{err}");
    assert!(err.to_string().contains("NCCL_LIBRARY"), "{err}");
}

/// The path of the C library this test links, per `dladdr`.
fn libc_path() -> PathBuf {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `dladdr` reads the address as a number and fills `info`.
    let found = unsafe { libc::dladdr(libc::malloc as *const libc::c_void, info.as_mut_ptr()) };
    assert_ne!(found, 0);
    // SAFETY: filled by a successful `dladdr`; the name is copied at once.
    let name = unsafe { std::ffi::CStr::from_ptr(info.assume_init().dli_fname) };
    PathBuf::from(name.to_str().expect("utf-8 path"))
}

#[test]
fn a_shared_object_that_is_not_nccl_is_rejected() {
    let libc = libc_path();
    // SAFETY: the C library is already loaded in this process; opening it
    // again runs no new initialisers.
    let err = unsafe { Nccl::open(&libc) }.expect_err("libc is not NCCL");
    let LoadError::Rejected(attempt) = &err else {
        panic!("expected Rejected, got {err:?}")
    };
    assert!(matches!(attempt.failure, AttemptFailure::NotNccl), "{err}");
    assert!(err.to_string().contains("not an NCCL library"), "{err}");
}

#[test]
fn a_file_that_is_not_a_shared_object_is_rejected_with_the_loaders_reason() {
    let path = std::env::temp_dir().join(format!("nccl-sys-not-elf-{}.so", std::process::id()));
    std::fs::write(&path, b"this is text, not ELF").unwrap();
    // SAFETY: dlopen refuses a non-ELF file before running anything.
    let err = unsafe { Nccl::open(&path) }.expect_err("text is not a library");
    std::fs::remove_file(&path).unwrap();
    let LoadError::Rejected(attempt) = &err else {
        panic!("expected Rejected, got {err:?}")
    };
    assert!(matches!(attempt.failure, AttemptFailure::Open(_)), "{err}");
    assert!(err.to_string().contains("could not be loaded"), "{err}");
}

#[test]
fn a_library_older_than_2_18_is_rejected_with_its_version() {
    let path = pinned_library("2.17.1");
    // SAFETY: a genuine NCCL 2.17.1 from PyPI.
    let err = unsafe { Nccl::open(&path) }.expect_err("2.17.1 is too old");
    let LoadError::Rejected(attempt) = &err else {
        panic!("expected Rejected, got {err:?}")
    };
    assert!(
        matches!(attempt.failure, AttemptFailure::TooOld(v) if v == Version::new(2, 17, 1)),
        "{err}"
    );
    assert!(
        err.to_string().contains("NCCL 2.17.1, older than 2.18.0"),
        "{err}"
    );
}

#[test]
fn a_failed_search_lists_every_place_tried_and_why() {
    let home = pinned_root().join("no-such-home");
    let prefix = std::env::temp_dir().join(format!("nccl-sys-prefix-{}", std::process::id()));
    let site = prefix.join("lib/python3.11/site-packages");
    std::fs::create_dir_all(&site).unwrap();
    let paths = SearchPaths {
        nccl_library: None,
        nccl_home: Some(home.clone()),
        system_loader: false,
        python_prefixes: vec![(Source::Virtualenv, prefix.clone())],
    };
    // SAFETY: none of these paths exist, so nothing is loaded.
    let err = unsafe { Nccl::load_from(&paths) }.expect_err("nothing to find");
    std::fs::remove_dir_all(&prefix).unwrap();
    let LoadError::NotFound { attempts } = &err else {
        panic!("expected NotFound, got {err:?}")
    };
    let tried: Vec<_> = attempts
        .iter()
        .map(|a| (a.source, a.target.clone()))
        .collect();
    assert_eq!(
        tried,
        vec![
            (Source::NcclHome, home.join("lib/libnccl.so.2")),
            (Source::NcclHome, home.join("lib/libnccl.so")),
            (
                Source::Virtualenv,
                site.join("nvidia/nccl/lib/libnccl.so.2")
            ),
        ]
    );
    assert!(
        attempts
            .iter()
            .all(|a| matches!(a.failure, AttemptFailure::Missing))
    );
    let text = err.to_string();
    assert!(text.contains("tried 3 places"), "{text}");
    assert!(text.contains("NCCL_HOME"), "{text}");
    assert!(text.contains("VIRTUAL_ENV"), "{text}");
}

#[test]
fn the_search_skips_bad_candidates_and_loads_the_first_good_one() {
    // A prefix laid out like a pip install, holding the newest pinned lib.
    let prefix = std::env::temp_dir().join(format!("nccl-sys-venv-{}", std::process::id()));
    let lib_dir = prefix.join("lib/python3.12/site-packages/nvidia/nccl/lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::os::unix::fs::symlink(pinned_library("2.32.3"), lib_dir.join("libnccl.so.2")).unwrap();
    let paths = SearchPaths {
        nccl_library: None,
        nccl_home: Some(pinned_root().join("no-such-home")),
        system_loader: false,
        python_prefixes: vec![(Source::Virtualenv, prefix.clone())],
    };
    // SAFETY: the only loadable candidate is the pinned NCCL 2.32.3.
    let nccl = unsafe { Nccl::load_from(&paths) }.expect("found in the virtualenv");
    assert_eq!(nccl.source(), Source::Virtualenv);
    assert_eq!(nccl.version(), Version::new(2, 32, 3));
    std::fs::remove_dir_all(&prefix).unwrap();
}

#[test]
fn load_honours_nccl_library_from_the_environment() {
    let Some(var) = std::env::var_os("NCCL_LIBRARY") else {
        eprintln!("skipped: NCCL_LIBRARY is not set (`cargo xtask test` sets it)");
        return;
    };
    // SAFETY: xtask points NCCL_LIBRARY at a pinned NCCL.
    let nccl = unsafe { Nccl::load() }.expect("NCCL_LIBRARY is loadable");
    assert_eq!(nccl.source(), Source::NcclLibrary);
    assert_eq!(
        std::fs::canonicalize(nccl.path()).unwrap(),
        std::fs::canonicalize(PathBuf::from(var)).unwrap()
    );
}
