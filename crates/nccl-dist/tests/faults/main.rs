//! The fault-injection suite: each test is one case, run by
//! `cargo xtask gpu-test --faults` in one of two modes:
//!
//! - `processes`: a process per GPU, each one rank, with the torchrun
//!   variables (`World::init_with`);
//! - `threads`: one process, a thread per GPU
//!   (`World::spawn_local_with_options`), for the cases that kill no
//!   process.
//!
//! Every world is made with the default options and one setting, the
//! operation timeout ([`OP_TIMEOUT`]): blocking communicators, the watchdog
//! and the liveness channel are what a user gets without asking. The
//! harness sets
//!
//! - `NCCL_RS_FAULT_OUT`: a directory where each rank writes what it saw
//!   (`<case>.<rank>`, `key=value` lines) for the harness's table, and a
//!   rank that kills itself the time of its death (`<case>.<rank>.death`,
//!   milliseconds since the epoch: every rank runs on this host's clock);
//! - `NCCL_RS_FAULT_VICTIM`: the rank that misbehaves (chosen per case:
//!   rank 0 for some, the last rank for others), or `none`;
//! - `NCCL_RS_FAULT_MODE`: `processes` (the default) or `threads`;
//! - `NCCL_RS_FAULT_WORLD`: the number of GPUs, in `threads` mode;
//! - `NCCL_RS_FAULT_PORT2`: a rendezvous port for the survivors' new world
//!   (`processes` mode).
//!
//! A case passes when its rank saw the outcome the case expects: an error
//! within its bound (a lost peer named within [`LOSS_BOUND`] of its death),
//! a plain CUDA kernel still running on the GPU, a working communicator
//! after recovery. A killed victim never reports; the harness checks how it
//! ended.
//!
//! Ignored by default: they need GPUs and the harness.

mod checked;
mod hardware;
mod loss;
mod rejoin;
mod silent;
mod stuck;

use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nccl_dist::nccl_safe::{self, ReduceOp};
use nccl_dist::{Error, FailureKind, Launch, LossCause, World, WorldOptions};

pub(crate) use hardware::kernel_runs;

pub(crate) type TestResult<T = ()> = Result<T, Box<dyn StdError + Send + Sync>>;

/// The operation timeout of every world of the suite (the watchdog's and
/// the communicators' own: creation, waits, drop). Long enough for a
/// communicator's creation on 4 GPUs with every process starting at once.
pub(crate) const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// How soon after a peer's death every survivor must hold an error naming
/// it.
pub(crate) const LOSS_BOUND: Duration = Duration::from_secs(2);

/// How long the survivors' fresh world ([`Rank::survivors_world`]) waits at
/// its rendezvous for every survivor: they all arrive within a second or
/// two when the case goes well.
const SURVIVORS_RENDEZVOUS: Duration = Duration::from_secs(30);

/// The suite's world options: the defaults, with the operation timeout
/// above and nothing else.
pub(crate) fn options() -> WorldOptions {
    WorldOptions::new().op_timeout(OP_TIMEOUT)
}

/// How the harness started this case.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// A process per GPU.
    Processes,
    /// One process, a thread per GPU.
    Threads,
}

pub(crate) fn env(name: &str) -> TestResult<String> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: run this through `cargo xtask gpu-test --faults`").into()
    })
}

fn mode() -> TestResult<Mode> {
    match std::env::var("NCCL_RS_FAULT_MODE").as_deref() {
        Err(_) | Ok("processes") => Ok(Mode::Processes),
        Ok("threads") => Ok(Mode::Threads),
        Ok(other) => Err(format!("NCCL_RS_FAULT_MODE={other:?}: processes or threads").into()),
    }
}

/// What every rank of the job shares: where to write, and who the victim
/// is.
struct Job {
    out: PathBuf,
    victim: Option<usize>,
}

impl Job {
    fn from_env() -> TestResult<Job> {
        let victim = match env("NCCL_RS_FAULT_VICTIM")?.as_str() {
            "none" => None,
            v => Some(v.parse()?),
        };
        Ok(Job {
            out: PathBuf::from(env("NCCL_RS_FAULT_OUT")?),
            victim,
        })
    }
}

/// One rank of a case, and what it has recorded.
pub(crate) struct Rank {
    pub(crate) case: &'static str,
    pub(crate) mode: Mode,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// This rank's GPU: its local rank (processes; on emulated hosts each
    /// host numbers its own GPUs from 0), or its rank (threads).
    pub(crate) device: usize,
    victim: Option<usize>,
    out: PathBuf,
    lines: Vec<String>,
}

/// Milliseconds since the Unix epoch: the clock every rank on this host
/// shares, so a survivor can tell how long after a peer's death its error
/// came.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn death_file(out: &Path, case: &str, rank: usize) -> PathBuf {
    out.join(format!("{case}.{rank}.death"))
}

/// Writes the time of this rank's death, for the survivors and the harness.
fn record_death(out: &Path, case: &str, rank: usize, how: &str) {
    let _ = std::fs::write(death_file(out, case, rank), format!("{} {how}\n", now_ms()));
}

/// Records the time of death, then kills this whole process with SIGKILL
/// (from any of its threads).
pub(crate) fn die(out: &Path, case: &str, rank: usize, how: &str) -> ! {
    record_death(out, case, rank, how);
    // SAFETY: kill(2) on this process's own id; it touches no memory.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    // SIGKILL cannot be caught; this only keeps the type `!` honest.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

impl Rank {
    fn new(
        case: &'static str,
        mode: Mode,
        (rank, size, device): (usize, usize, usize),
        job: &Job,
    ) -> Rank {
        Rank {
            case,
            mode,
            rank,
            size,
            device,
            victim: job.victim,
            out: job.out.clone(),
            lines: Vec::new(),
        }
    }

    /// The rank of this process, from the launcher's variables (torchrun,
    /// or Slurm's and Open MPI's on emulated hosts).
    fn from_env(case: &'static str) -> TestResult<Rank> {
        let job = Job::from_env()?;
        let l = Launch::detect()?;
        Ok(Rank::new(
            case,
            Mode::Processes,
            (l.rank, l.world_size, l.local_rank),
            &job,
        ))
    }

    /// The victim; an error for a case run without one.
    pub(crate) fn victim(&self) -> TestResult<usize> {
        self.victim
            .ok_or_else(|| format!("{} needs a victim (NCCL_RS_FAULT_VICTIM)", self.case).into())
    }

    pub(crate) fn is_victim(&self) -> bool {
        self.victim == Some(self.rank)
    }

    pub(crate) fn out(&self) -> &Path {
        &self.out
    }

    /// Records `key=value` for the harness (written at once, so a later
    /// hang or kill still leaves what was seen).
    pub(crate) fn note(&mut self, key: &str, value: impl std::fmt::Display) -> TestResult {
        let value = value.to_string().replace('\n', " | ");
        // Also in the log, next to NCCL's and the watchdog's output.
        println!("[{} rank {}] {key}={value}", self.case, self.rank);
        self.lines.push(format!("{key}={value}"));
        let path = self.out.join(format!("{}.{}", self.case, self.rank));
        std::fs::write(path, self.lines.join("\n") + "\n")?;
        Ok(())
    }

    /// Says this rank has its outcome, then waits (at most `within`) until
    /// every rank of the case has said so: a rank that is done early stays
    /// in the job (its world alive) while the others still need it. Ranks
    /// that do not come in time are noted, not an error: this rank's own
    /// outcome stands.
    pub(crate) fn settled_with_peers(&mut self, within: Duration) -> TestResult {
        let file = |rank: usize| self.out.join(format!("{}.{rank}.settled", self.case));
        std::fs::write(file(self.rank), format!("{}\n", now_ms()))?;
        let until = Instant::now() + within;
        loop {
            let missing: Vec<usize> = (0..self.size).filter(|r| !file(*r).exists()).collect();
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= until {
                return self.note("peers_not_settled", format!("{missing:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Records the time of this rank's death (for a victim that ends
    /// itself some other way than [`die`]).
    pub(crate) fn record_death(&self, how: &str) {
        record_death(&self.out, self.case, self.rank, how);
    }

    /// When the victim recorded its death (milliseconds since the epoch).
    fn victim_died_at(&self) -> TestResult<u64> {
        let path = death_file(&self.out, self.case, self.victim()?);
        // The victim writes the file before it dies, and the error comes
        // after the death; the short retry covers a slow file system.
        for _ in 0..20 {
            if let Ok(text) = std::fs::read_to_string(&path)
                && let Some(ms) = text.split_whitespace().next()
            {
                return Ok(ms.parse()?);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!("the victim recorded no death ({})", path.display()).into())
    }

    /// This process's world, from the launch environment.
    pub(crate) fn world(&self) -> TestResult<World> {
        Ok(World::init_with(Launch::detect()?, &options())?)
    }

    /// A new world among every rank but the victim, on the second port.
    pub(crate) fn survivors_world(&self) -> TestResult<World> {
        if self.mode != Mode::Processes {
            return Err("the survivors' world is for a process per GPU".into());
        }
        let port: u16 = env("NCCL_RS_FAULT_PORT2")?.parse()?;
        let victim = self.victim()?;
        let rank = if self.rank > victim {
            self.rank - 1
        } else {
            self.rank
        };
        let launch = Launch::explicit(rank, self.size - 1, rank, self.size - 1, "127.0.0.1", port)?;
        // A survivor that failed its own check exits instead of joining:
        // the others' rendezvous ends within SURVIVORS_RENDEZVOUS, so the
        // case reports that failure rather than hanging into the
        // harness's limit.
        let options = options().device(self.device).timeout(SURVIVORS_RENDEZVOUS);
        Ok(World::init_with(launch, &options)?)
    }
}

/// An error of an operation on the world's own communicator, as the
/// watchdog accounts for it ([`nccl_dist::watchdog::explain`]: a fresh
/// NCCL error or timeout is handed to it), then as the world does (a
/// lost peer named by the abort).
pub(crate) fn explained(world: &World, e: nccl_safe::Error) -> Error {
    match nccl_dist::watchdog::explain(world.comm(), e) {
        Error::Nccl(inner) => world.explain(inner),
        other => other,
    }
}

/// One all-reduce of `n` elements, `rank + 1` each, checked bit-exact.
/// Every rank running it also makes NCCL set up its connections for this
/// size while everyone is there: a blocking enqueue that still had to set
/// them up would wait inside NCCL for the peers, and a case that then
/// lets a peer misbehave would test that instead of its own fault.
pub(crate) fn checked_all_reduce(world: &World, n: usize) -> TestResult {
    let comm = world.comm();
    let stream = comm.stream();
    let mut buf = stream.clone_htod(&vec![(comm.rank() + 1) as f32; n])?;
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        .map_err(|e| explained(world, e))?;
    nccl_dist::synchronize(comm, stream)?;
    let got = stream.clone_dtoh(&buf)?;
    let want = (comm.size() * (comm.size() + 1) / 2) as f32;
    let wrong = got.iter().filter(|v| **v != want).count();
    if wrong > 0 {
        return Err(format!("{wrong} of {n} elements wrong (want {want})").into());
    }
    Ok(())
}

/// Enqueues `ops` in-place all-reduces of `buf`, stopping at the first
/// that fails, and returns that failure (the waits come later).
pub(crate) fn enqueue_all_reduces(
    comm: &nccl_safe::Comm,
    buf: &mut nccl_safe::cudarc::driver::CudaSlice<f32>,
    ops: usize,
) -> nccl_safe::Result<()> {
    for _ in 0..ops {
        comm.all_reduce_in_place(buf, ReduceOp::Sum)?;
    }
    Ok(())
}

/// A CUDA allocation failure as this crate's error.
pub(crate) fn cuda(source: nccl_safe::cudarc::driver::DriverError) -> Error {
    Error::Nccl(nccl_safe::Error::Cuda {
        op: "alloc",
        source,
    })
}

/// What kind of error `e` is, for the table.
pub(crate) fn kind(e: &Error) -> String {
    match e {
        Error::PeerLost(p) => {
            let how = match &p.loss.cause {
                LossCause::ConnectionClosed => "connection closed",
                LossCause::Silent { .. } => "silent",
                LossCause::Panicked { .. } => "panicked",
                LossCause::Exited { .. } => "exited",
                _ => "other",
            };
            format!(
                "PeerLost(rank {}, {how}) at {} #{}",
                p.rank, p.failure.op, p.failure.seq
            )
        }
        Error::Watchdog(f) => {
            let what = match &f.kind {
                FailureKind::Timeout { .. } => "timeout".to_string(),
                FailureKind::AsyncError(e) => format!("async error {e}"),
                FailureKind::Aborted => "aborted".to_string(),
                FailureKind::PeerLost(l) => format!("peer {} lost", l.rank),
                FailureKind::Diverged { .. } => "timeout, ranks diverged".to_string(),
                FailureKind::Mismatch { .. } => "NCCL error, ranks diverged".to_string(),
                _ => "other".to_string(),
            };
            format!("Watchdog: {what} of {} #{}", f.op, f.seq)
        }
        Error::RankPanicked { rank, .. } => format!("RankPanicked(rank {rank})"),
        Error::Nccl(nccl_safe::Error::Timeout { op, .. }) => format!("Timeout({op})"),
        Error::Nccl(nccl_safe::Error::Aborted { op, cause }) => format!("Aborted({op}: {cause})"),
        Error::Nccl(nccl_safe::Error::Nccl { code, op, .. }) => format!("Nccl({op}: {code:?})"),
        other => format!("{other}"),
    }
}

/// Records the error of a wait that should fail and how long it took;
/// fails when it did not fail, or later than `limit` after `since`.
pub(crate) fn expect_error(
    r: &mut Rank,
    waited: Result<(), Error>,
    since: Instant,
    limit: Duration,
) -> TestResult<Error> {
    let after = since.elapsed();
    r.note("error_after_ms", after.as_millis())?;
    r.note("deadline_ms", limit.as_millis())?;
    match waited {
        Ok(()) => {
            r.note("outcome", "completed (no error)")?;
            Err("the wait that should fail succeeded".into())
        }
        Err(e) => {
            r.note("outcome", kind(&e))?;
            r.note("error", &e)?;
            if after > limit {
                return Err(format!("error after {after:?}, beyond {limit:?}").into());
            }
            Ok(e)
        }
    }
}

/// A survivor's wait after the victim died: it must fail with
/// `Error::PeerLost` naming the victim, within [`LOSS_BOUND`] of the
/// death (and within `OP_TIMEOUT` of `since` in any case).
pub(crate) fn expect_peer_lost(
    r: &mut Rank,
    waited: Result<(), Error>,
    since: Instant,
) -> TestResult {
    let at = now_ms();
    let e = expect_error(r, waited, since, OP_TIMEOUT)?;
    let victim = r.victim()?;
    let since_death = at.saturating_sub(r.victim_died_at()?);
    r.note("since_death_ms", since_death)?;
    let bound = loss_bound()?;
    r.note("death_bound_ms", bound.as_millis())?;
    if e.lost_rank() != Some(victim) {
        return Err(format!("the error does not name the lost rank {victim}: {e}").into());
    }
    if since_death > bound.as_millis() as u64 {
        return Err(format!(
            "the error came {since_death} ms after rank {victim} died, beyond {bound:?}"
        )
        .into());
    }
    Ok(())
}

/// [`LOSS_BOUND`], or the longer bound xtask gives ranks that share one
/// GPU between emulated hosts (`NCCL_RS_FAULT_LOSS_BOUND_MS`): their
/// kernels take turns on it, and aborting a communicator waits for them.
/// The table shows the bound each case ran under.
fn loss_bound() -> TestResult<Duration> {
    match std::env::var("NCCL_RS_FAULT_LOSS_BOUND_MS") {
        Ok(ms) => Ok(Duration::from_millis(ms.parse()?)),
        Err(_) => Ok(LOSS_BOUND),
    }
}

/// The survivors' epilogue (process mode): a kernel on the GPU, then a new
/// world among them with a checked all-reduce.
pub(crate) fn recover(r: &mut Rank) -> TestResult {
    kernel_runs(r.device)?;
    r.note("kernel", "ok")?;
    let started = Instant::now();
    let world = r.survivors_world()?;
    checked_all_reduce(&world, 1 << 20)?;
    r.note("rebuilt_ms", started.elapsed().as_millis())?;
    r.note("recovered", format!("ok ({} ranks)", world.size()))?;
    Ok(())
}

/// Records how the rank's body ended; the error text on failure.
fn finish(r: &mut Rank, result: TestResult) -> Result<(), String> {
    match result {
        Ok(()) => {
            let _ = r.note("pass", "yes");
            Ok(())
        }
        Err(e) => {
            let _ = r.note("failed", &e);
            Err(format!("rank {}: {e}", r.rank))
        }
    }
}

/// A case that runs in both modes: the body gets this rank's world.
pub(crate) fn run(case: &'static str, body: impl Fn(&mut Rank, World) -> TestResult + Sync) {
    run_with(case, options(), body)
}

/// As [`run`], with worlds that leave their connections to their first
/// collective ([`WorldOptions::lazy_connect`]): for the cases about that
/// first collective.
pub(crate) fn run_lazy(case: &'static str, body: impl Fn(&mut Rank, World) -> TestResult + Sync) {
    run_with(case, options().lazy_connect(), body)
}

fn run_with(
    case: &'static str,
    options: WorldOptions,
    body: impl Fn(&mut Rank, World) -> TestResult + Sync,
) {
    match mode().expect("fault-suite environment") {
        Mode::Processes => run_process(case, |r| {
            let world = World::init_with(Launch::detect()?, &options)?;
            body(r, world)
        }),
        Mode::Threads => run_threads_with(case, false, &options, body),
    }
}

/// A case for a process per GPU only (it kills or stops a process, or
/// makes its own worlds).
pub(crate) fn run_process(case: &'static str, body: impl FnOnce(&mut Rank) -> TestResult) {
    nccl_testkit::trace_if_asked();
    let mode = mode().expect("fault-suite environment");
    assert_eq!(
        mode,
        Mode::Processes,
        "{case} runs as a process per GPU only"
    );
    let mut r = Rank::from_env(case).expect("fault-suite environment");
    let result = body(&mut r);
    if let Err(e) = finish(&mut r, result) {
        panic!("{e}");
    }
}

/// A case for a thread per GPU: `World::spawn_local_with_options` over
/// GPUs `0..NCCL_RS_FAULT_WORLD`, each thread one rank. With
/// `victim_panics`, the victim's body panics on purpose and the job must
/// end in `Error::RankPanicked` naming it; otherwise every rank returns.
/// Either way every other rank must pass.
pub(crate) fn run_threads(
    case: &'static str,
    victim_panics: bool,
    body: impl Fn(&mut Rank, World) -> TestResult + Sync,
) {
    run_threads_with(case, victim_panics, &options(), body)
}

fn run_threads_with(
    case: &'static str,
    victim_panics: bool,
    options: &WorldOptions,
    body: impl Fn(&mut Rank, World) -> TestResult + Sync,
) {
    nccl_testkit::trace_if_asked();
    let job = Job::from_env().expect("fault-suite environment");
    let size: usize = env("NCCL_RS_FAULT_WORLD")
        .and_then(|n| Ok(n.parse()?))
        .expect("NCCL_RS_FAULT_WORLD");
    let devices: Vec<usize> = (0..size).collect();
    // Each rank's verdict, kept apart from what spawn returns: a panic
    // makes it return the panic alone.
    let verdicts: Mutex<Vec<Option<Result<(), String>>>> = Mutex::new(vec![None; size]);
    // What the team leaves on its GPUs once `spawn_local` returned (its
    // worlds' old communicators are torn down by then, the last of them
    // by the team's yard).
    let usage = hardware::Usage::on(&devices).ok();
    let before = usage.as_ref().map(hardware::Usage::mib);
    let result = World::spawn_local_with_options(&devices, options, |world| {
        let place = (world.rank(), world.size(), world.device());
        let mut r = Rank::new(case, Mode::Threads, place, &job);
        let rank = r.rank;
        let result = body(&mut r, world);
        let verdict = finish(&mut r, result);
        verdicts.lock().unwrap_or_else(|p| p.into_inner())[rank] = Some(verdict);
        Ok(())
    });
    let after = usage.as_ref().map(hardware::Usage::mib);
    let verdicts = verdicts.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut problems: Vec<String> = Vec::new();
    let panicker = if victim_panics { job.victim } else { None };
    let spawn = match (&result, panicker) {
        (Ok(_), None) => "Ok".to_string(),
        (Err(e @ Error::RankPanicked { rank, .. }), Some(v)) if *rank == v => kind(e),
        (Ok(_), Some(v)) => {
            problems.push(format!("rank {v} was to panic, and the job returned Ok"));
            "Ok".to_string()
        }
        (Err(e), _) => {
            problems.push(format!("the job returned {e}"));
            kind(e)
        }
    };
    for (rank, verdict) in verdicts.iter().enumerate() {
        match verdict {
            Some(Ok(())) => {}
            None if panicker == Some(rank) => {}
            Some(Err(e)) => problems.push(e.clone()),
            None => problems.push(format!("rank {rank} never finished its body")),
        }
    }
    let mut lines = vec![format!("spawn={spawn}")];
    if let (Some(before), Some(after)) = (before, after) {
        lines.push(format!("held={}", hardware::Usage::left(&before, &after)));
    }
    if problems.is_empty() {
        lines.push("pass=yes".to_string());
    } else {
        lines.push(format!("failed={}", problems.join("; ")));
    }
    let _ = std::fs::write(job.out.join(format!("{case}.job")), lines.join("\n") + "\n");
    assert!(problems.is_empty(), "{}", problems.join("; "));
}
