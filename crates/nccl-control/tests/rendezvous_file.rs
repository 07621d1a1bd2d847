//! The file rendezvous against an attacker who can write to the shared
//! directory, and the secret against lossy environments. CPU only: real
//! files, links and FIFOs in a fresh directory per test.
//!
//! Every `attack_*` test asserts a typed error (or the join completing
//! with the real id) and that it came back within its deadline; the ones
//! that could hang on a regression run the wait on a thread and fail when
//! it does not return in time.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use nccl_control::nccl_sys::ncclUniqueId as UniqueId;
use nccl_control::rendezvous::{self, RendezvousError};
use nccl_control::{Secret, SecretError};
use sha2::Sha256;

/// Slack on top of a deadline for the thread to be scheduled and return.
const SLACK: Duration = Duration::from_secs(1);
/// Short deadline for waits that are expected to fail.
const SHORT: Duration = Duration::from_millis(300);
/// `MAX_FILE_AGE` and `MAX_FILE_BYTES` as the module documents them.
const MAX_AGE_SECS: u64 = 600;
const MAX_FILE_BYTES: u64 = 4096;

/// A directory of its own for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "nccl-dist-rvfile-{}-{test}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn secret(text: &[u8]) -> Secret {
    Secret::from_bytes(text.to_vec(), "test").expect("long enough")
}

fn job_secret() -> Secret {
    secret(b"the secret of this job, 32 bytes")
}

fn id(seed: u8) -> UniqueId {
    let mut bytes = [0u8; nccl_control::nccl_sys::NCCL_UNIQUE_ID_BYTES];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    UniqueId::from_bytes(bytes)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// A version 2 rendezvous file written from the module's documentation
/// alone (not with the crate's code), keyed by `key`, dated `written`.
fn craft(id: &UniqueId, key: &[u8], written: u64) -> Vec<u8> {
    let nonce = [0x5a_u8; 32];
    let mut out = b"NCRVFILE".to_vec();
    out.extend_from_slice(&2u16.to_be_bytes());
    out.extend_from_slice(&written.to_be_bytes());
    out.extend_from_slice(&nonce);
    let stream_key = hmac(key, &[b"nccl-rs file v2 stream key"]);
    for (i, chunk) in id.as_bytes().chunks(32).enumerate() {
        let block = hmac(&stream_key, &[&nonce, &[i as u8]]);
        out.extend(chunk.iter().zip(block).map(|(a, b)| a ^ b));
    }
    let tag = hmac(key, &[b"nccl-rs file v2", &out]);
    out.extend_from_slice(&tag);
    out
}

fn write_private(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .expect("writing a test file");
    f.write_all(bytes).expect("writing a test file");
}

/// `wait_file(path, secret, timeout)` on a thread; its result and how long
/// it took, or a panic when it has not returned by `timeout + SLACK` (a
/// wait that blocks fails the test instead of hanging it).
fn wait_on_thread(
    path: &Path,
    secret: &Secret,
    timeout: Duration,
) -> (Result<UniqueId, RendezvousError>, Duration) {
    let (tx, rx) = mpsc::channel();
    let (path, secret) = (path.to_path_buf(), secret.clone());
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(rendezvous::wait_file(&path, &secret, timeout));
    });
    match rx.recv_timeout(timeout + SLACK) {
        Ok(result) => (result, started.elapsed()),
        Err(_) => panic!("wait_file did not return within {timeout:?} + {SLACK:?}"),
    }
}

/// The reason a `Malformed` refusal carries, or a panic naming what came.
fn malformed_reason(result: Result<UniqueId, RendezvousError>) -> &'static str {
    match result {
        Err(RendezvousError::Malformed(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_documented_format_written_independently_is_accepted() {
    let dir = Scratch::new("documented");
    let path = dir.path("id");
    write_private(&path, &craft(&id(1), job_secret().bytes(), now_secs()));
    let (got, took) = wait_on_thread(&path, &job_secret(), Duration::from_secs(5));
    assert_eq!(got.expect("an authentic, fresh file"), id(1));
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[test]
fn attack_planted_file() {
    let dir = Scratch::new("planted");
    let path = dir.path("id");
    // Valid format and fresh, but keyed by someone without the secret.
    let attacker = secret(b"an attacker's guess at the secret");
    write_private(&path, &craft(&id(66), attacker.bytes(), now_secs()));
    let (got, took) = wait_on_thread(&path, &job_secret(), SHORT);
    assert!(matches!(got, Err(RendezvousError::BadSecret)), "{got:?}");
    // It waited for a real file until its deadline, and no longer.
    assert!(took >= SHORT && took < SHORT + SLACK, "took {took:?}");
    // Garbage of the right magic is not the format.
    write_private(&path, b"NCRVFILE and then anything");
    let (got, _) = wait_on_thread(&path, &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("rendezvous file"));
}

#[test]
fn attack_planted_file_then_rank_zeros_file_is_accepted_before_the_deadline() {
    let dir = Scratch::new("replaced");
    let path = dir.path("id");
    let attacker = secret(b"an attacker's guess at the secret");
    write_private(&path, &craft(&id(66), attacker.bytes(), now_secs()));
    let timeout = Duration::from_secs(10);
    let (tx, rx) = mpsc::channel();
    let (p, s) = (path.clone(), job_secret());
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(rendezvous::wait_file(&p, &s, timeout));
    });
    std::thread::sleep(Duration::from_millis(200));
    rendezvous::publish_file(&path, &id(1), &job_secret()).expect("publish");
    let got = rx.recv_timeout(timeout + SLACK).expect("the wait returned");
    assert_eq!(got.expect("the real file"), id(1));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn attack_symlinked_file() {
    let dir = Scratch::new("symlink");
    let real = dir.path("real");
    rendezvous::publish_file(&real, &id(1), &job_secret()).expect("publish");
    let path = dir.path("id");
    std::os::unix::fs::symlink(&real, &path).expect("symlink");
    // Even to an authentic file: a link is not read.
    let (got, took) = wait_on_thread(&path, &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("symbolic link"));
    assert!(took < SHORT + SLACK, "took {took:?}");

    // To an endless device: refused without reading it (a read would
    // fill memory, and never end before the deadline).
    let zero = dir.path("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    let (got, took) = wait_on_thread(&zero, &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("symbolic link"));
    assert!(took < SHORT + SLACK, "took {took:?}");
}

#[test]
fn attack_fifo() {
    let dir = Scratch::new("fifo");
    let path = dir.path("id");
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("no NUL in the path");
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call;
    // mkfifo only reads it.
    let rc = unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
    // Opening a FIFO for reading blocks until a writer comes: the wait
    // must refuse it instead.
    let (got, took) = wait_on_thread(&path, &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("not a regular file"));
    assert!(took < SHORT + SLACK, "took {took:?}");
}

#[test]
fn attack_directory_or_device_at_the_path() {
    let dir = Scratch::new("nonregular");
    let sub = dir.path("id");
    std::fs::create_dir(&sub).expect("directory");
    let (got, _) = wait_on_thread(&sub, &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("not a regular file"));
    // A device named directly (no link): never opened.
    let (got, took) = wait_on_thread(Path::new("/dev/zero"), &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("not a regular file"));
    assert!(took < SHORT + SLACK, "took {took:?}");
}

#[test]
fn attack_oversized_file() {
    let dir = Scratch::new("oversized");
    let path = dir.path("id");
    // One byte over the cap, starting like a real file.
    let mut big = craft(&id(1), job_secret().bytes(), now_secs());
    big.resize(MAX_FILE_BYTES as usize + 1, 0);
    write_private(&path, &big);
    let (got, took) = wait_on_thread(&path, &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("size cap"));
    assert!(took < SHORT + SLACK, "took {took:?}");
    // A sparse file of 1 GiB: refused by its size, never read.
    let huge = dir.path("huge");
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(1 << 30))
        .expect("sparse file");
    let (got, took) = wait_on_thread(&huge, &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("size cap"));
    assert!(took < SHORT + SLACK, "took {took:?}");
}

#[test]
fn attack_stale_file() {
    let dir = Scratch::new("stale");
    let path = dir.path("id");
    // Authentic (the job's own secret), but from an earlier job.
    let old = now_secs() - MAX_AGE_SECS - 60;
    write_private(&path, &craft(&id(1), job_secret().bytes(), old));
    let (got, took) = wait_on_thread(&path, &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("stale"));
    assert!(took < SHORT + SLACK, "took {took:?}");
    // Dated an hour ahead: refused as well.
    write_private(
        &path,
        &craft(&id(1), job_secret().bytes(), now_secs() + 3600),
    );
    let (got, _) = wait_on_thread(&path, &job_secret(), SHORT);
    assert!(malformed_reason(got).contains("future"));
}

#[test]
fn attack_precreated_temp_name_does_not_stop_publishing() {
    let dir = Scratch::new("tmpname");
    let path = dir.path("id");
    // The temporary name the publisher once used, claimed in advance (a
    // link to a file the attacker wants overwritten).
    let victim = dir.path("victim");
    std::fs::write(&victim, b"keep me").expect("victim");
    let claimed = dir.path(&format!(".id.{}.tmp", std::process::id()));
    std::os::unix::fs::symlink(&victim, &claimed).expect("symlink");
    rendezvous::publish_file(&path, &id(1), &job_secret()).expect("publish");
    assert_eq!(std::fs::read(&victim).expect("victim"), b"keep me");
    let (got, _) = wait_on_thread(&path, &job_secret(), Duration::from_secs(5));
    assert_eq!(got.expect("published"), id(1));
}

#[test]
fn publishing_replaces_a_link_at_the_path_instead_of_writing_through_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = Scratch::new("replace-link");
    let victim = dir.path("victim");
    std::fs::write(&victim, b"keep me").expect("victim");
    let path = dir.path("id");
    std::os::unix::fs::symlink(&victim, &path).expect("symlink");
    rendezvous::publish_file(&path, &id(1), &job_secret()).expect("publish");
    assert_eq!(std::fs::read(&victim).expect("victim"), b"keep me");
    let meta = std::fs::symlink_metadata(&path).expect("published");
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Only the published file and the victim are left: no temporary file.
    let mut names: Vec<_> = std::fs::read_dir(&dir.0)
        .expect("listing")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, [OsString::from("id"), OsString::from("victim")]);
}

#[test]
fn attack_short_secret() {
    let lookup = |value: OsString| move |k: &str| (k == "NCCL_RS_SECRET").then(|| value.clone());
    // Six bytes that are not UTF-8: a lossy conversion made them 18.
    match Secret::from_lookup(&lookup(OsString::from_vec(vec![0xff; 6]))) {
        Err(SecretError::TooShort { source_name, len }) => {
            assert_eq!(len, 6);
            assert_eq!(source_name, "NCCL_RS_SECRET");
        }
        other => panic!("expected TooShort, got {other:?}"),
    }
    match Secret::from_lookup(&lookup(OsString::from("fifteen bytes!!"))) {
        Err(SecretError::TooShort { len, .. }) => assert_eq!(len, 15),
        other => panic!("expected TooShort, got {other:?}"),
    }
}

#[test]
fn attack_non_utf8_secret() {
    let lookup = |value: Vec<u8>| {
        move |k: &str| (k == "NCCL_RS_SECRET").then(|| OsString::from_vec(value.clone()))
    };
    let mut ours = b"sixteen bytes at least".to_vec();
    let mut theirs = ours.clone();
    ours.extend_from_slice(&[0xff, 0xfe]);
    theirs.extend_from_slice(&[0x80, 0x81]);
    let s_ours = Secret::from_lookup(&lookup(ours.clone())).expect("long enough");
    let s_theirs = Secret::from_lookup(&lookup(theirs)).expect("long enough");
    assert_eq!(s_ours.bytes(), ours.as_slice());
    assert_ne!(s_ours, s_theirs);
    // End to end: a file published with one is refused by the other.
    let dir = Scratch::new("non-utf8");
    let path = dir.path("id");
    rendezvous::publish_file(&path, &id(1), &s_theirs).expect("publish");
    let (got, took) = wait_on_thread(&path, &s_ours, SHORT);
    assert!(matches!(got, Err(RendezvousError::BadSecret)), "{got:?}");
    assert!(took < SHORT + SLACK, "took {took:?}");
}

#[test]
fn a_path_where_nothing_appears_times_out_at_its_deadline() {
    let dir = Scratch::new("nothing");
    let (got, took) = wait_on_thread(&dir.path("never"), &job_secret(), SHORT);
    assert!(
        matches!(got, Err(RendezvousError::Timeout { .. })),
        "{got:?}"
    );
    assert!(took >= SHORT && took < SHORT + SLACK, "took {took:?}");
}

#[test]
fn publish_and_wait_round_trip_on_eight_threads() {
    let dir = Scratch::new("threads");
    let path = dir.path("id");
    let waiters: Vec<_> = (1..8)
        .map(|_| {
            let (p, s) = (path.clone(), job_secret());
            std::thread::spawn(move || rendezvous::wait_file(&p, &s, Duration::from_secs(20)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    rendezvous::publish_file(&path, &id(9), &job_secret()).expect("publish");
    for w in waiters {
        assert_eq!(w.join().expect("thread").expect("wait"), id(9));
    }
    // A timeout too large for a deadline waits without one.
    let got = rendezvous::wait_file(&path, &job_secret(), Duration::MAX).expect("wait");
    assert_eq!(got, id(9));
}

/// Child mode of the process test: wait for the file named by
/// `NCCL_DIST_TEST_FILE_WAIT` with the environment's secret, print the id.
const CHILD_ENV: &str = "NCCL_DIST_TEST_FILE_WAIT";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn publish_and_wait_round_trip_across_processes_with_a_non_utf8_secret() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        let secret = Secret::from_env().expect("the secret from the environment");
        let got = rendezvous::wait_file(Path::new(&path), &secret, Duration::from_secs(20))
            .expect("wait");
        // A line of its own: the harness prints the test name before it.
        println!("\nID {}", hex(got.as_bytes()));
        return;
    }
    let dir = Scratch::new("processes");
    let path = dir.path("id");
    // Not UTF-8: it reaches the children byte for byte or not at all.
    let s = secret(b"\xff\xfe a job secret \x80\x81 not utf-8");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "publish_and_wait_round_trip_across_processes_with_a_non_utf8_secret",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(CHILD_ENV, &path)
                .env("NCCL_RS_SECRET", s.to_env_value())
                .env_remove("NCCL_RS_SECRET_FILE")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    rendezvous::publish_file(&path, &id(3), &s).expect("publish");
    let want = format!("ID {}", hex(id(3).as_bytes()));
    for child in children {
        let out = child.wait_with_output().expect("child");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {text}");
        assert!(text.contains(&want), "child printed: {text}");
    }
}
