//! The rendezvous over loopback with real sockets (threads and processes),
//! and every bad case ending in a typed error on the side that sees it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nccl_dist::rendezvous::{self, RendezvousError, encode_frame};
use nccl_dist::{Secret, nccl_safe::UniqueId};

fn secret(text: &str) -> Secret {
    Secret::from_bytes(text.as_bytes().to_vec(), "test").expect("long enough")
}

fn id() -> UniqueId {
    let mut bytes = [0u8; 128];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(11);
    }
    UniqueId::from_bytes(bytes)
}

fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    (l, addr)
}

#[test]
fn eight_ranks_as_threads_all_receive_rank_zeros_id() {
    let (l, addr) = listener();
    let s = secret("a shared secret of the job");
    let joiners: Vec<_> = (1..8)
        .map(|rank| {
            let (addr, s) = (addr.clone(), s.clone());
            std::thread::spawn(move || {
                rendezvous::join(addr.as_str(), rank, 8, &s, Duration::from_secs(20))
            })
        })
        .collect();
    let refused = rendezvous::serve(&l, 8, &s, &id(), Duration::from_secs(20)).expect("serve");
    assert!(refused.is_empty(), "{refused:?}");
    for j in joiners {
        assert_eq!(j.join().expect("thread").expect("join"), id());
    }
}

#[test]
fn eight_ranks_as_processes_all_receive_rank_zeros_id() {
    if let Ok(spec) = std::env::var("NCCL_DIST_TEST_JOIN") {
        // Child mode: join, print the id's digest.
        let mut parts = spec.split(',');
        let (addr, rank) = (
            parts.next().unwrap_or_default().to_string(),
            parts.next().unwrap_or_default().parse().unwrap_or(0),
        );
        let got = rendezvous::join(
            addr.as_str(),
            rank,
            8,
            &Secret::from_env().expect("secret"),
            Duration::from_secs(20),
        )
        .expect("join");
        println!("DIGEST {:08x}", got.digest());
        return;
    }
    let (l, addr) = listener();
    let s = Secret::random().expect("random secret");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (1..8)
        .map(|rank| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "eight_ranks_as_processes_all_receive_rank_zeros_id",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env("NCCL_DIST_TEST_JOIN", format!("{addr},{rank}"))
                .env("NCCL_RS_SECRET", s.to_env_value())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let refused = rendezvous::serve(&l, 8, &s, &id(), Duration::from_secs(30)).expect("serve");
    assert!(refused.is_empty(), "{refused:?}");
    for child in children {
        let out = child.wait_with_output().expect("child");
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("DIGEST {:08x}", id().digest())),
            "{text}"
        );
    }
}

#[test]
fn a_wrong_secret_is_refused_on_both_sides_and_the_real_rank_still_gets_in() {
    let (l, addr) = listener();
    let good = secret("the right secret, long enough");
    let a = addr.clone();
    let intruder = std::thread::spawn(move || {
        rendezvous::join(
            a.as_str(),
            1,
            2,
            &secret("a wrong secret, long enough"),
            Duration::from_secs(10),
        )
    });
    // Let the intruder be first in line.
    std::thread::sleep(Duration::from_millis(200));
    let (a, g) = (addr.clone(), good.clone());
    let real = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        rendezvous::join(a.as_str(), 1, 2, &g, Duration::from_secs(10))
    });
    let refused = rendezvous::serve(&l, 2, &good, &id(), Duration::from_secs(10)).expect("serve");
    assert!(
        matches!(refused.as_slice(), [RendezvousError::BadSecret]),
        "{refused:?}"
    );
    let err = intruder
        .join()
        .expect("thread")
        .expect_err("the intruder must not get the id");
    assert!(matches!(err, RendezvousError::Rejected(_)), "{err}");
    assert_eq!(real.join().expect("thread").expect("real rank"), id());
}

#[test]
fn a_duplicate_rank_and_a_wrong_world_size_are_refused() {
    let (l, addr) = listener();
    let s = secret("shared secret for duplicates");
    let (a, s1) = (addr.clone(), s.clone());
    let first = std::thread::spawn(move || {
        rendezvous::join(a.as_str(), 1, 3, &s1, Duration::from_secs(10))
    });
    let (a, s2) = (addr.clone(), s.clone());
    let dup = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        rendezvous::join(a.as_str(), 1, 3, &s2, Duration::from_secs(10))
    });
    let (a, s3) = (addr.clone(), s.clone());
    let wrong_world = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        rendezvous::join(a.as_str(), 2, 4, &s3, Duration::from_secs(10))
    });
    let (a, s4) = (addr.clone(), s.clone());
    let second = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(900));
        rendezvous::join(a.as_str(), 2, 3, &s4, Duration::from_secs(10))
    });
    let refused = rendezvous::serve(&l, 3, &s, &id(), Duration::from_secs(10)).expect("serve");
    assert!(
        refused
            .iter()
            .any(|e| matches!(e, RendezvousError::DuplicateRank { rank: 1 })),
        "{refused:?}"
    );
    assert!(
        refused.iter().any(|e| matches!(
            e,
            RendezvousError::WorldSizeMismatch {
                expected: 3,
                got: 4
            }
        )),
        "{refused:?}"
    );
    assert_eq!(first.join().unwrap().unwrap(), id());
    assert_eq!(second.join().unwrap().unwrap(), id());
    assert!(
        matches!(dup.join().unwrap().unwrap_err(), RendezvousError::Rejected(m) if m.contains("joined twice"))
    );
    assert!(
        matches!(wrong_world.join().unwrap().unwrap_err(), RendezvousError::Rejected(m) if m.contains("world size"))
    );
}

#[test]
fn garbage_bytes_and_a_silent_peer_are_refused_without_stopping_the_listener() {
    let (l, addr) = listener();
    let s = secret("secret against garbage bytes");
    let a = addr.clone();
    let garbage = std::thread::spawn(move || {
        let mut c = TcpStream::connect(a.as_str()).expect("connect");
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer);
        answer
    });
    let a = addr.clone();
    let silent = std::thread::spawn(move || {
        let c = TcpStream::connect(a.as_str()).expect("connect");
        std::thread::sleep(Duration::from_secs(7));
        drop(c);
    });
    let a = addr.clone();
    let oversize = std::thread::spawn(move || {
        let mut c = TcpStream::connect(a.as_str()).expect("connect");
        let mut frame = encode_frame(1, &[]);
        frame[7..11].copy_from_slice(&u32::MAX.to_be_bytes());
        c.write_all(&frame).expect("write");
    });
    let (a, s2) = (addr.clone(), s.clone());
    let real = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        rendezvous::join(a.as_str(), 1, 2, &s2, Duration::from_secs(20))
    });
    let started = Instant::now();
    let refused = rendezvous::serve(&l, 2, &s, &id(), Duration::from_secs(20)).expect("serve");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(
        refused
            .iter()
            .any(|e| matches!(e, RendezvousError::Malformed("bad magic"))),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|e| matches!(e, RendezvousError::Malformed("payload over the size cap"))),
        "{refused:?}"
    );
    assert_eq!(real.join().unwrap().unwrap(), id());
    let answer = garbage.join().unwrap();
    assert!(
        answer.starts_with(b"NCRV"),
        "the garbage sender gets a reject frame"
    );
    oversize.join().unwrap();
    silent.join().unwrap();
    // The silent peer either timed out or was still queued when the real
    // rank finished: either way the listener did not wait on it forever.
}

#[test]
fn both_sides_time_out_within_their_deadlines() {
    let (l, addr) = listener();
    let s = secret("secret for a lonely listener");
    let started = Instant::now();
    let err = rendezvous::serve(&l, 3, &s, &id(), Duration::from_millis(400)).unwrap_err();
    assert!(matches!(err, RendezvousError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(l);
    // Nobody listens at `addr` any more.
    let started = Instant::now();
    let err = rendezvous::join(addr.as_str(), 1, 2, &s, Duration::from_millis(500)).unwrap_err();
    assert!(matches!(err, RendezvousError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    // A listener that accepts and then says nothing.
    let (mute, addr) = listener();
    let started = Instant::now();
    let err = rendezvous::join(addr.as_str(), 1, 2, &s, Duration::from_millis(500)).unwrap_err();
    assert!(matches!(err, RendezvousError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(mute);
}

#[test]
fn the_file_rendezvous_is_atomic_private_and_checked() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("nccl-dist-rv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("id");
    let p = path.clone();
    let reader = std::thread::spawn(move || rendezvous::wait_file(&p, Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(100));
    rendezvous::publish_file(&path, &id()).expect("publish");
    assert_eq!(reader.join().unwrap().unwrap(), id());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(matches!(
        rendezvous::decode_file(b"short"),
        Err(RendezvousError::Malformed(_))
    ));
    let err = rendezvous::wait_file(&dir.join("never"), Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, RendezvousError::Timeout { .. }));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn frame_headers_are_checked_without_panicking() {
    use rendezvous::decode_header;
    assert!(decode_header(&encode_frame(1, &[1, 2, 3])[..11]).is_ok());
    assert!(matches!(
        decode_header(b"NCRV"),
        Err(RendezvousError::Malformed(_))
    ));
    let mut bad_version = encode_frame(1, &[]);
    bad_version[4..6].copy_from_slice(&9u16.to_be_bytes());
    assert!(matches!(
        decode_header(&bad_version[..11]),
        Err(RendezvousError::Version { got: 9 })
    ));
    // Every 11-byte prefix of noise decodes to an error or a capped length.
    let mut x = 0x12345678u32;
    for _ in 0..10_000 {
        let mut h = [0u8; 11];
        for b in &mut h {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
        if let Ok((_, len)) = decode_header(&h) {
            assert!(len <= rendezvous::MAX_PAYLOAD);
        }
    }
}
