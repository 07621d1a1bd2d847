//! The liveness channel over loopback with real processes: every rank is
//! this test binary re-executed in a child role (`child_process` below), so
//! a SIGKILL, a `std::process::exit` or a clean leave are the real thing.
//! No GPU and no NCCL are needed: the unique id is random bytes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nccl_control::liveness::{Liveness, LivenessOptions};
use nccl_control::nccl_sys::ncclUniqueId as UniqueId;
use nccl_control::rendezvous::{self, RendezvousError, encode_frame};
use nccl_control::{BadValue, LossCause, PeerLoss, Secret};

/// Selects the child role: `hub,<world>` or `member,<addr>,<rank>,<world>`.
const CHILD_ENV: &str = "NCCL_DIST_LIVENESS_CHILD";
/// The deadline the brief sets for every survivor to name the lost rank.
const WITHIN: Duration = Duration::from_secs(2);

fn id() -> UniqueId {
    let mut bytes = [0u8; nccl_control::nccl_sys::NCCL_UNIQUE_ID_BYTES];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(29).wrapping_add(7);
    }
    UniqueId::from_bytes(bytes)
}

/// A child rank: joins (or serves), prints what it learns, obeys stdin.
#[test]
fn child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<String> = spec.split(',').map(str::to_string).collect();
    let secret = Secret::from_env().expect("secret");
    let options = LivenessOptions::from_env().expect("options");
    let timeout = Duration::from_secs(10);
    let (rank, live) = match parts[0].as_str() {
        "hub" => {
            let world: usize = parts[1].parse().expect("world");
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            println!("ADDR {}", l.local_addr().expect("addr"));
            let (live, refused) =
                rendezvous::serve_live(&l, world, &secret, &id(), timeout, &options)
                    .expect("serve_live");
            assert!(refused.is_empty(), "{refused:?}");
            (0, live)
        }
        _ => {
            let rank: usize = parts[2].parse().expect("rank");
            let world: usize = parts[3].parse().expect("world");
            let (got, live) =
                rendezvous::join_live(parts[1].as_str(), rank, world, &secret, timeout, &options)
                    .expect("join_live");
            assert_eq!(got, id());
            (rank, live)
        }
    };
    assert_eq!(live.rank(), Some(rank));
    live.on_loss(Arc::new(|l: &PeerLoss| {
        println!("LOST {} {:?}", l.rank, l.cause);
    }));
    println!("READY");
    for line in std::io::stdin().lock().lines() {
        match line.unwrap_or_default().as_str() {
            "leave" => {
                live.leave();
                std::process::exit(0);
            }
            "exit" => std::process::exit(0),
            "panic" => live.report(PeerLoss {
                rank,
                cause: LossCause::Panicked {
                    message: "a test panic".into(),
                },
                seen_by: rank,
            }),
            _ => {}
        }
    }
    // Stdin closed: end normally, the drop is the goodbye.
    drop(live);
}

/// One line a child printed, and when the parent read it.
struct Event {
    rank: usize,
    line: String,
    at: Instant,
}

/// A job of child processes, rank 0 first.
struct Job {
    children: Vec<Option<(Child, ChildStdin)>>,
    events: Receiver<Event>,
    seen: Vec<Event>,
}

fn spawn_child(
    spec: String,
    rank: usize,
    secret: &Secret,
    env: &[(&str, &str)],
    tx: &Sender<Event>,
) -> (Child, ChildStdin) {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(CHILD_ENV, spec)
    .env("NCCL_RS_SECRET", secret.to_env_value())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // The test harness may print its own words in front.
            let Some(start) = ["ADDR ", "READY", "LOST "]
                .iter()
                .filter_map(|m| line.find(m))
                .min()
            else {
                continue;
            };
            let line = line[start..].to_string();
            let _ = tx.send(Event {
                rank,
                line,
                at: Instant::now(),
            });
        }
    });
    (child, stdin)
}

impl Job {
    /// Starts `world` ranks and waits until each says READY.
    fn start(world: usize, env: &[(&str, &str)]) -> Job {
        let secret = Secret::random().expect("secret");
        let (tx, events) = channel();
        let mut job = Job {
            children: Vec::new(),
            events,
            seen: Vec::new(),
        };
        job.children.push(Some(spawn_child(
            format!("hub,{world}"),
            0,
            &secret,
            env,
            &tx,
        )));
        let addr = job
            .wait(
                |e| e.rank == 0 && e.line.starts_with("ADDR "),
                Duration::from_secs(10),
            )
            .expect("rank 0's address")
            .trim_start_matches("ADDR ")
            .to_string();
        for rank in 1..world {
            job.children.push(Some(spawn_child(
                format!("member,{addr},{rank},{world}"),
                rank,
                &secret,
                env,
                &tx,
            )));
        }
        for rank in 0..world {
            job.wait(
                |e| e.rank == rank && e.line == "READY",
                Duration::from_secs(10),
            )
            .unwrap_or_else(|| panic!("rank {rank} not ready: {:?}", job.lines()));
        }
        job
    }

    /// The first line (already seen or still to come) matching `pred`.
    fn wait(&mut self, pred: impl Fn(&Event) -> bool, within: Duration) -> Option<String> {
        self.wait_at(pred, within).map(|(line, _)| line)
    }

    fn wait_at(
        &mut self,
        pred: impl Fn(&Event) -> bool,
        within: Duration,
    ) -> Option<(String, Instant)> {
        if let Some(e) = self.seen.iter().find(|e| pred(e)) {
            return Some((e.line.clone(), e.at));
        }
        let until = Instant::now() + within;
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            let e = self.events.recv_timeout(left).ok()?;
            let hit = pred(&e).then(|| (e.line.clone(), e.at));
            self.seen.push(e);
            if hit.is_some() {
                return hit;
            }
        }
    }

    /// Everything printed so far (after draining what is pending).
    fn lines(&mut self) -> Vec<(usize, String)> {
        while let Ok(e) = self.events.try_recv() {
            self.seen.push(e);
        }
        self.seen.iter().map(|e| (e.rank, e.line.clone())).collect()
    }

    fn kill(&mut self, rank: usize) -> Instant {
        // Stdin stays open until the child is dead: its end would be a
        // clean goodbye racing the kill.
        let (mut child, stdin) = self.children[rank].take().expect("alive");
        let at = Instant::now();
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        drop(stdin);
        at
    }

    fn say(&mut self, rank: usize, what: &str) {
        let (_, stdin) = self.children[rank].as_mut().expect("alive");
        writeln!(stdin, "{what}").expect("stdin");
    }

    fn wait_exit(&mut self, rank: usize) -> std::process::ExitStatus {
        let (mut child, stdin) = self.children[rank].take().expect("alive");
        let status = child.wait().expect("wait");
        drop(stdin);
        status
    }

    /// Every rank in `survivors` names `lost` within [`WITHIN`] of `since`.
    fn all_name(&mut self, survivors: &[usize], lost: usize, since: Instant) -> Vec<Duration> {
        let prefix = format!("LOST {lost} ");
        survivors
            .iter()
            .map(|&r| {
                let (line, at) = self
                    .wait_at(
                        |e| e.rank == r && e.line.starts_with(&prefix),
                        Duration::from_secs(5),
                    )
                    .unwrap_or_else(|| {
                        panic!("rank {r} never named rank {lost}: {:?}", self.lines())
                    });
                let took = at.saturating_duration_since(since);
                eprintln!("rank {r}: {line} after {took:?}");
                assert!(took < WITHIN, "rank {r} took {took:?} to name rank {lost}");
                took
            })
            .collect()
    }

    fn losses(&mut self) -> Vec<(usize, String)> {
        self.lines()
            .into_iter()
            .filter(|(_, l)| l.starts_with("LOST"))
            .collect()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for (mut child, stdin) in self.children.drain(..).flatten() {
            drop(stdin);
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn peer_lost_sigkilled_member_is_named_by_every_survivor_within_2s() {
    let mut job = Job::start(4, &[]);
    let at = job.kill(2);
    job.all_name(&[0, 1, 3], 2, at);
    for (_, line) in job.losses() {
        assert_eq!(line, "LOST 2 ConnectionClosed");
    }
}

#[test]
fn peer_lost_sigkilled_rank_0_is_named_by_every_member_within_2s() {
    let mut job = Job::start(3, &[]);
    let at = job.kill(0);
    job.all_name(&[1, 2], 0, at);
    assert_eq!(job.losses().len(), 2, "{:?}", job.lines());
}

#[test]
fn peer_lost_after_rank_0_dies_the_lowest_live_rank_takes_over_and_later_losses_are_seen() {
    let mut job = Job::start(4, &[]);
    let at = job.kill(0);
    job.all_name(&[1, 2, 3], 0, at);
    // Give the members a moment to attach to rank 1, the new hub.
    std::thread::sleep(Duration::from_millis(200));
    let at = job.kill(3);
    job.all_name(&[1, 2], 3, at);
    // And once more: rank 1 dies, rank 2 is alone but still told.
    let at = job.kill(1);
    job.all_name(&[2], 1, at);
    let lines = job.losses();
    assert_eq!(lines.len(), 3 + 2 + 1, "{lines:?}");
}

#[test]
fn peer_lost_a_rank_that_left_cleanly_is_neither_lost_nor_taken_for_the_next_hub() {
    let mut job = Job::start(4, &[]);
    job.say(1, "leave");
    assert!(job.wait_exit(1).success());
    std::thread::sleep(Duration::from_millis(100));
    let at = job.kill(0);
    job.all_name(&[2, 3], 0, at);
    std::thread::sleep(Duration::from_millis(200));
    // Rank 2 took over (rank 1 is gone, not lost); rank 3 is attached.
    let at = job.kill(3);
    job.all_name(&[2], 3, at);
    assert!(
        job.losses().iter().all(|(_, l)| !l.starts_with("LOST 1 ")),
        "{:?}",
        job.lines()
    );
}

#[test]
fn peer_lost_when_the_next_hub_is_unreachable_it_is_named_and_the_one_after_takes_over() {
    let mut job = Job::start(4, &[]);
    // Rank 1 is stopped: its kernel still accepts connections, but it
    // never answers the takeover handshake.
    let pid = job.children[1].as_ref().expect("alive").0.id() as libc::pid_t;
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let at = job.kill(0);
    job.all_name(&[2, 3], 0, at);
    job.all_name(&[2, 3], 1, at);
    assert!(
        job.losses()
            .iter()
            .any(|(_, l)| l.starts_with("LOST 1 Exited") && l.contains("take over")),
        "{:?}",
        job.lines()
    );
    std::thread::sleep(Duration::from_millis(200));
    // Rank 2 took over; rank 3 is attached to it.
    let at = job.kill(3);
    job.all_name(&[2], 3, at);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
}

#[test]
fn peer_lost_a_silent_member_is_named_after_the_silence_limit() {
    let env = [
        ("NCCL_RS_HEARTBEAT_MS", "50"),
        ("NCCL_RS_LIVENESS_TIMEOUT", "0.5"),
    ];
    let mut job = Job::start(3, &env);
    let pid = job.children[1].as_ref().expect("alive").0.id() as libc::pid_t;
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let at = Instant::now();
    let took = job.all_name(&[0, 2], 1, at);
    // Not before the silence limit: a live peer is never taken for silent.
    assert!(
        took.iter().all(|t| *t >= Duration::from_millis(400)),
        "{took:?}"
    );
    let lines = job.losses();
    assert!(
        lines.iter().all(|(_, l)| l.starts_with("LOST 1 Silent")),
        "{lines:?}"
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
}

#[test]
fn a_clean_leave_is_not_a_loss_and_later_losses_are_still_seen() {
    let mut job = Job::start(4, &[]);
    job.say(3, "leave");
    assert!(job.wait_exit(3).success());
    std::thread::sleep(Duration::from_millis(500));
    assert!(job.losses().is_empty(), "{:?}", job.lines());
    let at = job.kill(1);
    job.all_name(&[0, 2], 1, at);
    assert!(
        job.losses().iter().all(|(_, l)| l.starts_with("LOST 1 ")),
        "{:?}",
        job.lines()
    );
}

#[test]
fn peer_lost_exit_without_leave_is_a_loss() {
    let mut job = Job::start(3, &[]);
    let at = Instant::now();
    job.say(1, "exit");
    job.all_name(&[0, 2], 1, at);
    assert!(job.wait_exit(1).success());
    assert!(
        job.losses()
            .iter()
            .all(|(_, l)| l == "LOST 1 ConnectionClosed")
    );
}

#[test]
fn peer_lost_a_member_report_reaches_every_rank() {
    let mut job = Job::start(3, &[]);
    let at = Instant::now();
    job.say(2, "panic");
    job.all_name(&[0, 1, 2], 2, at);
    assert!(
        job.losses()
            .iter()
            .all(|(_, l)| l.starts_with("LOST 2 Panicked")),
        "{:?}",
        job.lines()
    );
}

#[test]
fn ranks_end_cleanly_when_stdin_closes_and_nobody_is_lost() {
    let mut job = Job::start(3, &[]);
    // Members first, then rank 0: every drop is a goodbye.
    for rank in [1, 2, 0] {
        let (mut child, stdin) = job.children[rank].take().expect("alive");
        drop(stdin);
        assert!(child.wait().expect("wait").success());
    }
    assert!(job.losses().is_empty(), "{:?}", job.lines());
}

fn secret(text: &str) -> Secret {
    Secret::from_bytes(text.as_bytes().to_vec(), "test").expect("long enough")
}

fn fast() -> LivenessOptions {
    LivenessOptions::new()
        .heartbeat(Duration::from_millis(50))
        .silence_limit(Duration::from_secs(5))
}

#[test]
fn a_stranger_with_the_wrong_secret_cannot_join_or_fake_a_loss() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let good = secret("the job's secret, long enough");
    let hub = std::thread::spawn({
        let good = good.clone();
        move || rendezvous::serve_live(&l, 2, &good, &id(), Duration::from_secs(10), &fast())
    });
    // A stranger claims rank 1 with the wrong secret: it cannot check the
    // hub's proof, gets nothing and gives up at its deadline.
    let err = rendezvous::join_live(
        addr,
        1,
        2,
        &secret("a stranger's secret, long enough"),
        Duration::from_millis(800),
        &fast(),
    )
    .expect_err("a stranger must not join");
    assert!(
        matches!(err, RendezvousError::Unauthenticated { .. }),
        "{err}"
    );
    // A stranger who skips the handshake and sends liveness frames
    // (a report of rank 1's loss, a goodbye) is refused as garbage.
    for kind in [20u8, 21] {
        let mut s = TcpStream::connect(addr).expect("connect");
        let mut body = vec![0u8; 8];
        body.extend_from_slice(&1u32.to_be_bytes());
        body.extend_from_slice(&0u32.to_be_bytes());
        body.push(0);
        body.extend_from_slice(&[0u8; 32]);
        s.write_all(&encode_frame(kind, &body)).expect("write");
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    let (id1, member) =
        rendezvous::join_live(addr, 1, 2, &good, Duration::from_secs(5), &fast()).expect("join");
    assert_eq!(id1, id());
    let (live, refused) = hub.join().expect("thread").expect("serve_live");
    // The stranger's attempts (each hung up after the hub's challenge) and
    // the two frames sent without a handshake.
    assert!(refused.len() >= 3, "{refused:?}");
    assert!(
        refused
            .iter()
            .all(|e| matches!(e, RendezvousError::Malformed(_))),
        "{refused:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(live.losses(), Vec::new());
    assert_eq!(member.losses(), Vec::new());
    member.leave();
    live.leave();
    assert_eq!(live.losses(), Vec::new());
}

/// Forwards bytes between a member and rank 0, and can inject bytes
/// towards rank 0, as someone in the middle could.
fn man_in_the_middle(
    to: std::net::SocketAddr,
) -> (std::net::SocketAddr, Arc<Mutex<Option<TcpStream>>>) {
    let front = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = front.local_addr().expect("addr");
    let upstream = Arc::new(Mutex::new(None));
    let up = Arc::clone(&upstream);
    std::thread::spawn(move || {
        let Ok((client, _)) = front.accept() else {
            return;
        };
        let Ok(server) = TcpStream::connect(to) else {
            return;
        };
        *up.lock().expect("lock") = server.try_clone().ok();
        let (mut c1, mut s1) = (
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
        );
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut c1, &mut s1);
        });
        let (mut s2, mut c2) = (server, client);
        let _ = std::io::copy(&mut s2, &mut c2);
    });
    (addr, upstream)
}

#[test]
fn peer_lost_an_injected_frame_on_an_authenticated_connection_closes_it_with_the_reason() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let hub_addr = l.local_addr().expect("addr");
    let s = secret("the job's secret for the middle");
    let hub = std::thread::spawn({
        let s = s.clone();
        move || rendezvous::serve_live(&l, 3, &s, &id(), Duration::from_secs(10), &fast())
    });
    let (via, upstream) = man_in_the_middle(hub_addr);
    let (_, one) = rendezvous::join_live(via, 1, 3, &s, Duration::from_secs(5), &fast())
        .expect("rank 1 through the middle");
    let (_, two) =
        rendezvous::join_live(hub_addr, 2, 3, &s, Duration::from_secs(5), &fast()).expect("rank 2");
    let (live, refused) = hub.join().expect("thread").expect("serve_live");
    assert!(refused.is_empty(), "{refused:?}");
    // A forged goodbye from "rank 1" (no valid MAC).
    let forged = encode_frame(21, &[0u8; 40]);
    let at = Instant::now();
    upstream
        .lock()
        .expect("lock")
        .as_mut()
        .expect("connected")
        .write_all(&forged)
        .expect("inject");
    let until = at + WITHIN;
    while two.first_loss().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let loss = two.first_loss().expect("rank 2 learns of rank 1");
    assert_eq!(loss.rank, 1);
    assert_eq!(loss.seen_by, 0);
    match &loss.cause {
        LossCause::Exited { reason } => assert!(reason.contains("failed the check"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(live.first_loss(), Some(loss));
    // Rank 1 itself is told it was dropped (or sees rank 0 close on it):
    // either way it does not carry on as if nothing happened.
    let until = Instant::now() + WITHIN;
    while one.first_loss().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(one.first_loss().is_some());
}

#[test]
fn in_process_a_report_reaches_every_hook() {
    let live = Liveness::in_process(3);
    assert_eq!(live.rank(), None);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..3)
        .map(|rank| {
            let (live, seen) = (live.clone(), Arc::clone(&seen));
            std::thread::spawn(move || {
                live.on_loss(Arc::new(move |l: &PeerLoss| {
                    seen.lock().expect("lock").push((rank, l.rank));
                }));
                if rank == 1 {
                    live.report(PeerLoss {
                        rank: 1,
                        cause: LossCause::Panicked {
                            message: "boom".into(),
                        },
                        seen_by: 1,
                    });
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let mut seen = seen.lock().expect("lock").clone();
    seen.sort();
    assert_eq!(seen, vec![(0, 1), (1, 1), (2, 1)]);
    // Leaving in one process does not end the others' channel.
    live.leave();
    live.report(PeerLoss {
        rank: 2,
        cause: LossCause::ConnectionClosed,
        seen_by: 0,
    });
    assert_eq!(live.losses().len(), 2);
}

#[test]
fn options_parse_and_reject() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let o = LivenessOptions::from_lookup(env(&[
        ("NCCL_RS_LIVENESS", "1"),
        ("NCCL_RS_HEARTBEAT_MS", "100"),
        ("NCCL_RS_LIVENESS_TIMEOUT", "3"),
    ]))
    .expect("valid");
    assert!(o.is_enabled());
    assert_eq!(o.heartbeat_interval(), Duration::from_millis(100));
    assert_eq!(o.silence(), Duration::from_secs(3));
    assert!(
        !LivenessOptions::from_lookup(env(&[("NCCL_RS_LIVENESS", "0")]))
            .expect("valid")
            .is_enabled()
    );
    for (pairs, var) in [
        (&[("NCCL_RS_LIVENESS", "on")][..], "NCCL_RS_LIVENESS"),
        (&[("NCCL_RS_HEARTBEAT_MS", "fast")], "NCCL_RS_HEARTBEAT_MS"),
        (
            &[("NCCL_RS_LIVENESS_TIMEOUT", "-3")],
            "NCCL_RS_LIVENESS_TIMEOUT",
        ),
    ] {
        match LivenessOptions::from_lookup(env(pairs)) {
            Err(BadValue { var: named, .. }) => assert_eq!(named, var),
            other => panic!("{pairs:?}: {other:?}"),
        }
    }
}

#[test]
fn liveness_off_on_rank_0_fails_a_live_member_with_a_typed_error() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let s = secret("secret for mismatched settings");
    let hub = std::thread::spawn({
        let s = s.clone();
        move || {
            rendezvous::serve_live(
                &l,
                2,
                &s,
                &id(),
                Duration::from_secs(5),
                &LivenessOptions::new().enabled(false),
            )
        }
    });
    let err = rendezvous::join_live(addr, 1, 2, &s, Duration::from_secs(5), &fast())
        .expect_err("rank 0 does not keep the connection");
    assert!(
        matches!(
            err,
            RendezvousError::Liveness(nccl_control::liveness::LivenessError::NotAttached {
                rank: 1,
                ..
            })
        ),
        "{err}"
    );
    let (live, refused) = hub.join().expect("thread").expect("serve");
    assert!(refused.is_empty());
    assert_eq!(live.rank(), Some(0));
}

#[test]
fn threads_a_member_report_reaches_every_hook_and_goodbyes_are_quiet() {
    fn shareable<T: Clone + Send + Sync + std::fmt::Debug + 'static>(_: &T) {}
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let s = secret("secret for ranks as threads");
    let hub = std::thread::spawn({
        let s = s.clone();
        move || rendezvous::serve_live(&l, 3, &s, &id(), Duration::from_secs(10), &fast())
    });
    let members: Vec<Liveness> = (1..3)
        .map(|rank| {
            let (got, live) =
                rendezvous::join_live(addr, rank, 3, &s, Duration::from_secs(10), &fast())
                    .expect("join_live");
            assert_eq!(got, id());
            assert_eq!(live.rank(), Some(rank));
            live
        })
        .collect();
    let (root, refused) = hub.join().expect("thread").expect("serve_live");
    assert!(refused.is_empty(), "{refused:?}");
    shareable(&root);
    let seen = Arc::new(Mutex::new(Vec::new()));
    for live in members.iter().chain([&root]) {
        let (seen, me) = (Arc::clone(&seen), live.rank());
        live.on_loss(Arc::new(move |l: &PeerLoss| {
            seen.lock().expect("lock").push((me, l.rank, l.seen_by));
        }));
    }
    let at = Instant::now();
    members[1].report(PeerLoss {
        rank: 2,
        cause: LossCause::Exited {
            reason: "its work failed".into(),
        },
        seen_by: 2,
    });
    while seen.lock().expect("lock").len() < 3 && at.elapsed() < WITHIN {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut got = seen.lock().expect("lock").clone();
    got.sort();
    assert_eq!(
        got,
        vec![(Some(0), 2, 2), (Some(1), 2, 2), (Some(2), 2, 2)],
        "after {:?}",
        at.elapsed()
    );
    // Everyone ends cleanly: no further losses anywhere.
    let [one, two]: [Liveness; 2] = members.try_into().expect("two members");
    drop(two);
    one.leave();
    root.leave();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(root.losses().len(), 1);
    assert_eq!(one.losses().len(), 1);
}
