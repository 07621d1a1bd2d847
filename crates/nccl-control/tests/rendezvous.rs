//! The rendezvous over loopback with real sockets (threads and processes),
//! and every bad case ending in a typed error on the side that sees it.

mod common;
use common::random_id;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nccl_control::Secret;
use nccl_control::nccl_sys::ncclUniqueId as UniqueId;
use nccl_control::rendezvous::{self, RendezvousError, encode_frame};

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

/// The id's bytes in hex (test ids are not secrets).
fn hex(id: &UniqueId) -> String {
    id.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
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
        // Child mode: join, print the id.
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
        println!("ID {}", hex(&got));
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
        assert!(text.contains(&format!("ID {}", hex(&id()))), "{text}");
    }
}

#[test]
fn a_wrong_secret_is_refused_on_both_sides_and_the_real_rank_still_gets_in() {
    let (l, addr) = listener();
    let good = secret("the right secret, long enough");
    let a = addr.clone();
    let intruder = std::thread::spawn(move || {
        let started = Instant::now();
        let r = rendezvous::join(
            a.as_str(),
            1,
            2,
            &secret("a wrong secret, long enough"),
            Duration::from_millis(1500),
        );
        (r, started.elapsed())
    });
    // Let the intruder be first in line.
    std::thread::sleep(Duration::from_millis(200));
    let (a, g) = (addr.clone(), good.clone());
    let real = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        rendezvous::join(a.as_str(), 1, 2, &g, Duration::from_secs(10))
    });
    let refused = rendezvous::serve(&l, 2, &good, &id(), Duration::from_secs(10)).expect("serve");
    // The intruder could not check rank 0's proof, so it never sent one
    // of its own: rank 0 saw it hang up after the challenge.
    assert!(!refused.is_empty(), "{refused:?}");
    let (err, took) = intruder.join().expect("thread");
    let err = err.expect_err("the intruder must not get the id");
    assert!(
        matches!(err, RendezvousError::Unauthenticated { .. }),
        "{err}"
    );
    assert!(took < Duration::from_millis(2500), "{took:?}");
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
    let dup = dup.join().unwrap().unwrap_err();
    assert!(
        matches!(&dup, RendezvousError::Rejected(why) if matches!(**why, RendezvousError::DuplicateRank { rank: 1 })),
        "{dup}"
    );
    let wrong_world = wrong_world.join().unwrap().unwrap_err();
    assert!(
        matches!(&wrong_world, RendezvousError::Rejected(why) if matches!(**why, RendezvousError::WorldSizeMismatch { expected: 3, got: 4 })),
        "{wrong_world}"
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
    // The silent peer holds its own handshake thread only.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
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
        answer.is_empty(),
        "a sender of garbage learns nothing, not even a reject: {answer:?}"
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

// ---- attacks (docs/security.md says what each one proves) -------------

/// One frame from `from`, or `None` at its end.
fn read_frame(from: &mut TcpStream) -> Option<Vec<u8>> {
    let mut frame = vec![0u8; 11];
    from.read_exact(&mut frame).ok()?;
    let len = u32::from_be_bytes([frame[7], frame[8], frame[9], frame[10]]) as usize;
    if len > rendezvous::MAX_PAYLOAD as usize {
        return None;
    }
    let mut payload = vec![0u8; len];
    from.read_exact(&mut payload).ok()?;
    frame.extend_from_slice(&payload);
    Some(frame)
}

/// Which way a frame goes through the proxy.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    ToServer,
    ToClient,
}

/// Everything a proxy saw, in order: (way, frame as it arrived).
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(Way, Vec<u8>)>>>;

/// A man in the middle in front of `upstream`: every connection to the
/// returned address is forwarded frame by frame, each frame first shown to
/// `tamper` (which may change it) and recorded as it arrived.
fn proxy(
    upstream: String,
    tamper: impl Fn(Way, usize, &mut Vec<u8>) + Send + Sync + 'static,
) -> (String, Seen) {
    let (l, addr) = listener();
    let seen: Seen = Default::default();
    let tamper = std::sync::Arc::new(tamper);
    let s = seen.clone();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(upstream.as_str()) else {
                return;
            };
            for (way, mut from, mut to) in [
                (
                    Way::ToServer,
                    client.try_clone().expect("clone the client socket"),
                    server.try_clone().expect("clone the server socket"),
                ),
                (Way::ToClient, server, client),
            ] {
                let (s, tamper) = (s.clone(), tamper.clone());
                std::thread::spawn(move || {
                    let mut n = 0;
                    while let Some(mut frame) = read_frame(&mut from) {
                        s.lock().expect("frames seen").push((way, frame.clone()));
                        tamper(way, n, &mut frame);
                        n += 1;
                        if to.write_all(&frame).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    (addr, seen)
}

#[test]
fn attack_slow_peers_do_not_delay_the_real_ranks() {
    let (l, addr) = listener();
    let s = secret("secret against slow peers!!");
    // Connections that say nothing, and some that stop mid-frame: before
    // the handshakes ran at once, each held rank 0 for up to 5 s.
    let mut idle = Vec::new();
    for i in 0..10 {
        let mut c = TcpStream::connect(addr.as_str()).expect("connect");
        if i % 2 == 0 {
            c.write_all(&encode_frame(1, &[0u8; 40])[..6])
                .expect("write");
        }
        idle.push(c);
    }
    let joiners: Vec<_> = (1..4)
        .map(|rank| {
            let (a, s) = (addr.clone(), s.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                rendezvous::join(a.as_str(), rank, 4, &s, Duration::from_secs(30))
            })
        })
        .collect();
    let started = Instant::now();
    rendezvous::serve(&l, 4, &s, &id(), Duration::from_secs(30)).expect("serve");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "served in {took:?}");
    for j in joiners {
        assert_eq!(j.join().unwrap().unwrap(), id());
    }
    drop(idle);
}

/// A listener that is not rank 0: it answers every hello with a reject
/// frame in the old style (text that tries to reach a terminal) or a
/// challenge it cannot prove, until `until`.
fn fake_rank_zero(l: &TcpListener, until: Instant) {
    l.set_nonblocking(true).expect("nonblocking listener");
    let mut n = 0;
    while Instant::now() < until {
        match l.accept() {
            Ok((mut c, _)) => {
                c.set_nonblocking(false).expect("blocking socket");
                c.set_read_timeout(Some(Duration::from_secs(1)))
                    .expect("read timeout");
                let _ = read_frame(&mut c);
                let frame = if n % 2 == 0 {
                    encode_frame(5, b"\x1b[31mEVIL: rank 0 says go away\n")
                } else {
                    encode_frame(2, &[7u8; 64])
                };
                let _ = c.write_all(&frame);
                n += 1;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

#[test]
fn attack_fake_server_cannot_end_a_join_or_reach_its_error() {
    // A stranger holds the port for a while, then the real rank 0 serves
    // on it: the join rides out the stranger and gets the real id.
    let (l, addr) = listener();
    let s = secret("secret against a fake server");
    let (a, s1) = (addr.clone(), s.clone());
    let joiner = std::thread::spawn(move || {
        let started = Instant::now();
        let r = rendezvous::join(a.as_str(), 1, 2, &s1, Duration::from_secs(20));
        (r, started.elapsed())
    });
    fake_rank_zero(&l, Instant::now() + Duration::from_millis(800));
    rendezvous::serve(&l, 2, &s, &id(), Duration::from_secs(20)).expect("serve");
    let (got, took) = joiner.join().unwrap();
    assert_eq!(got.expect("the join outlives the stranger"), id());
    assert!(took >= Duration::from_millis(700), "{took:?}");

    // Only a stranger: a typed error at the deadline, in our words.
    let (l, addr) = listener();
    let (a, s1) = (addr.clone(), s.clone());
    let joiner = std::thread::spawn(move || {
        let started = Instant::now();
        let r = rendezvous::join(a.as_str(), 1, 2, &s1, Duration::from_millis(1200));
        (r, started.elapsed())
    });
    fake_rank_zero(&l, Instant::now() + Duration::from_secs(3));
    let (got, took) = joiner.join().unwrap();
    let err = got.expect_err("a stranger has no id to give");
    assert!(
        matches!(err, RendezvousError::Unauthenticated { .. }),
        "{err}"
    );
    assert!(took < Duration::from_millis(2200), "{took:?}");
    let text = err.to_string();
    assert!(!text.contains("EVIL") && !text.contains('\x1b'), "{text}");
}

#[test]
fn attack_tampered_frames_are_refused_on_both_sides() {
    // The id frame (the server's second frame) with one bit flipped: the
    // joining rank never takes a wrong id.
    let (l, addr) = listener();
    let s = secret("secret against tampering!!");
    let (via, _) = proxy(addr.clone(), |way, n, frame| {
        if way == Way::ToClient && n == 1 && frame[6] == 4 {
            let last = frame.len() - 1;
            frame[last] ^= 1;
        }
    });
    let (v, s1) = (via.clone(), s.clone());
    let joiner =
        std::thread::spawn(move || rendezvous::join(v.as_str(), 1, 3, &s1, Duration::from_secs(3)));
    // Rank 2 comes late, so rank 0 is still serving when rank 1 retries.
    let (a, s2) = (addr.clone(), s.clone());
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        rendezvous::join(a.as_str(), 2, 3, &s2, Duration::from_secs(3))
    });
    let refused = rendezvous::serve(&l, 3, &s, &id(), Duration::from_secs(5)).expect("serve");
    assert!(
        refused
            .iter()
            .all(|e| matches!(e, RendezvousError::DuplicateRank { rank: 1 })),
        "{refused:?}"
    );
    let err = joiner
        .join()
        .unwrap()
        .expect_err("a tampered id must not be taken");
    // Rank 0 did send the id once, so the retry is told the rank is taken.
    assert!(
        matches!(&err, RendezvousError::Rejected(why) if matches!(**why, RendezvousError::DuplicateRank { rank: 1 })),
        "{err}"
    );
    assert_eq!(late.join().unwrap().unwrap(), id());

    // The joining rank's proof with one bit flipped: rank 0 refuses it.
    let (l, addr) = listener();
    let (via, _) = proxy(addr.clone(), |way, n, frame| {
        if way == Way::ToServer && n == 1 {
            let last = frame.len() - 1;
            frame[last] ^= 0x80;
        }
    });
    let (v, s1) = (via.clone(), s.clone());
    let joiner = std::thread::spawn(move || {
        rendezvous::join(v.as_str(), 1, 2, &s1, Duration::from_millis(800))
    });
    let err = rendezvous::serve(&l, 2, &s, &id(), Duration::from_millis(1500)).unwrap_err();
    assert!(matches!(err, RendezvousError::Timeout { .. }), "{err}");
    assert!(joiner.join().unwrap().is_err());
}

#[test]
fn attack_replayed_frames_open_nothing() {
    let s = secret("secret against replayed frames");
    // Record one real session through a proxy.
    let (l, addr) = listener();
    let (via, seen) = proxy(addr.clone(), |_, _, _| {});
    let (v, s1) = (via.clone(), s.clone());
    let joiner =
        std::thread::spawn(move || rendezvous::join(v.as_str(), 1, 3, &s1, Duration::from_secs(5)));
    let (l2, addr2) = listener();
    let s2 = s.clone();
    // Rank 0 of a second job with the same secret: it waits for ranks 1
    // and 2 while the recorded bytes are replayed to it.
    let second = std::thread::spawn(move || {
        rendezvous::serve(&l2, 2, &s2, &random_id(), Duration::from_millis(1500))
    });
    let (a, s3) = (addr.clone(), s.clone());
    let rank2 = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        rendezvous::join(a.as_str(), 2, 3, &s3, Duration::from_secs(5))
    });
    rendezvous::serve(&l, 3, &s, &id(), Duration::from_secs(5)).expect("serve");
    assert_eq!(joiner.join().unwrap().unwrap(), id());
    assert_eq!(rank2.join().unwrap().unwrap(), id());
    std::thread::sleep(Duration::from_millis(100));
    let frames = seen.lock().unwrap().clone();
    let to_server: Vec<Vec<u8>> = frames
        .iter()
        .filter(|(w, _)| *w == Way::ToServer)
        .map(|(_, f)| f.clone())
        .collect();
    let to_client: Vec<Vec<u8>> = frames
        .iter()
        .filter(|(w, _)| *w == Way::ToClient)
        .map(|(_, f)| f.clone())
        .collect();
    assert!(to_server.len() >= 2 && to_client.len() >= 2, "{frames:?}");

    // The joining rank's frames replayed to a rank 0 with the same secret:
    // its fresh challenge makes the old proof worthless.
    let mut c = TcpStream::connect(addr2.as_str()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    c.write_all(&to_server[0]).unwrap();
    let _challenge = read_frame(&mut c).expect("a challenge");
    c.write_all(&to_server[1]).unwrap();
    let answer = read_frame(&mut c).expect("an answer");
    assert_eq!(answer[6], 5, "a reject, not an id");
    let refused = second.join().unwrap().unwrap_err();
    assert!(
        matches!(refused, RendezvousError::Timeout { .. }),
        "{refused}"
    );

    // Rank 0's frames replayed to a joining rank by a stranger: its
    // fresh nonce makes the old challenge proof worthless.
    let (fake, fake_addr) = listener();
    let replay = std::thread::spawn(move || {
        let (mut c, _) = fake.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = read_frame(&mut c);
        let _ = c.write_all(&to_client[0]);
        let _ = read_frame(&mut c);
        let _ = c.write_all(&to_client[1]);
    });
    let err = rendezvous::join(fake_addr.as_str(), 1, 3, &s, Duration::from_millis(600))
        .expect_err("a replayed session gives no id");
    assert!(
        matches!(err, RendezvousError::Unauthenticated { .. }),
        "{err}"
    );
    replay.join().unwrap();
}

#[test]
fn attack_wrong_secret_gets_no_id_and_proves_nothing() {
    let (l, addr) = listener();
    let good = secret("the job's real secret, long");
    // A stranger that ignores rank 0's proof and sends a made-up one.
    let a = addr.clone();
    let stranger = std::thread::spawn(move || {
        let mut c = TcpStream::connect(a.as_str()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut hello = 1u32.to_be_bytes().to_vec();
        hello.extend_from_slice(&2u32.to_be_bytes());
        hello.extend_from_slice(&[3u8; 32]);
        c.write_all(&encode_frame(1, &hello)).unwrap();
        let challenge = read_frame(&mut c).expect("a challenge");
        c.write_all(&encode_frame(3, &[9u8; 32])).unwrap();
        let answer = read_frame(&mut c).expect("an answer");
        (challenge, answer)
    });
    let (a, g) = (addr.clone(), good.clone());
    let real = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        rendezvous::join(a.as_str(), 1, 2, &g, Duration::from_secs(5))
    });
    let refused = rendezvous::serve(&l, 2, &good, &id(), Duration::from_secs(5)).expect("serve");
    assert!(
        refused
            .iter()
            .any(|e| matches!(e, RendezvousError::BadSecret)),
        "{refused:?}"
    );
    let (_, answer) = stranger.join().unwrap();
    assert_eq!(answer[6], 5, "a reject");
    assert_eq!(answer.len(), 11 + 9 + 32, "numbers and a tag, no text");
    assert_eq!(real.join().unwrap().unwrap(), id());
}

#[test]
fn attack_eavesdropper_reads_no_id_bytes() {
    let (l, addr) = listener();
    let s = secret("secret against eavesdroppers");
    let the_id = random_id();
    let (via, seen) = proxy(addr.clone(), |_, _, _| {});
    let (v, s1) = (via.clone(), s.clone());
    let joiner =
        std::thread::spawn(move || rendezvous::join(v.as_str(), 1, 2, &s1, Duration::from_secs(5)));
    rendezvous::serve(&l, 2, &s, &the_id, Duration::from_secs(5)).expect("serve");
    assert_eq!(joiner.join().unwrap().unwrap(), the_id);
    std::thread::sleep(Duration::from_millis(100));
    let wire: Vec<u8> = seen
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(_, f)| f.clone())
        .collect();
    assert!(
        wire.len() > nccl_control::nccl_sys::NCCL_UNIQUE_ID_BYTES,
        "the session went through"
    );
    // No 8 consecutive bytes of the id cross the wire.
    for window in the_id.as_bytes().windows(8) {
        assert!(
            !wire.windows(8).any(|w| w == window),
            "id bytes in clear on the wire"
        );
    }
}
