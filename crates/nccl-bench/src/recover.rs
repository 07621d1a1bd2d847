//! `--recover`: how long a world takes to go on without a lost rank.
//!
//! - A thread per GPU: each repetition makes a world with default options
//!   (`World::spawn_local_with_options`), runs one all-reduce on every
//!   rank (its connections made), then the last rank's thread panics (a
//!   lost rank: its presence reports it to the others). The panic prints
//!   its message on stderr: it is the lost rank, on purpose.
//! - A process per GPU (under a launcher): one repetition a launch. The
//!   world is made with default options, every rank runs one all-reduce,
//!   then the last rank's process kills itself (SIGKILL: its connections
//!   close as a crashed process's do; `cargo xtask bench` expects that
//!   rank's death and only that).
//!
//! Each survivor issues all-reduces until one fails with
//! `Error::PeerLost`; from then (the loss known) it times `World::recover`
//! and the first all-reduce on the recovered world, synchronised. The
//! slowest survivor's times are reported (`recover_ms` in the summary:
//! the median over repetitions, the slower mode's); with processes the
//! survivors agree on the slowest over the new world, and the spans are
//! its rank 0's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nccl_dist::nccl_safe::ReduceOp;
use nccl_dist::{Error, HostCollectives, Launch, World};
use serde_json::json;

use crate::cli::{Mode, Opts};
use crate::error::{BoxError, Result};
use crate::ms;

/// How long a survivor keeps calling before it gives up on learning of
/// the loss.
const LEARN_WITHIN: Duration = Duration::from_secs(30);

/// One survivor's times, in ms: `World::recover`, then the first
/// all-reduce on the new world, from the loss known.
#[derive(Debug, Clone, Default)]
struct Times {
    rebuild: f64,
    total: f64,
    /// The recovery's `nccl.*` spans on this survivor's thread, ms by name.
    spans: HashMap<&'static str, f64>,
}

/// One all-reduce of one element on `world`'s communicator, synchronised.
fn all_reduce(world: &World) -> std::result::Result<(), Error> {
    let comm = world.comm();
    let mut x = comm
        .stream()
        .clone_htod(&[1f32])
        .map_err(|e| Error::InvalidArgument {
            op: "bench --recover",
            reason: format!("a one-element buffer: {e}"),
        })?;
    comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
    nccl_dist::synchronize(comm, comm.stream())
}

/// A survivor's side: calls until the loss is known, then recovers; the
/// times and the recovered world.
fn survive(
    world: World,
    options: &nccl_dist::WorldOptions,
) -> std::result::Result<(Times, World), Error> {
    let started = Instant::now();
    loop {
        match all_reduce(&world) {
            // The loss, named, or arriving as another error of the
            // aborted call.
            Err(Error::PeerLost(_)) => break,
            Err(_) if !world.lost_ranks().is_empty() => break,
            Err(e) => return Err(e),
            Ok(()) if started.elapsed() > LEARN_WITHIN => {
                return Err(Error::InvalidArgument {
                    op: "bench --recover",
                    reason: format!("no loss known after {LEARN_WITHIN:?}"),
                });
            }
            Ok(()) => {}
        }
    }
    let known = Instant::now();
    // What this thread's spans timed before the loss is not the
    // recovery's.
    crate::spans::take_thread();
    let world = world.recover(options)?;
    let rebuild = ms(known);
    all_reduce(&world)?;
    let times = Times {
        rebuild,
        total: ms(known),
        spans: crate::spans::take_thread(),
    };
    Ok((times, world))
}

/// One repetition: the slowest survivor's times.
fn one_rep(devices: &[usize], options: &nccl_dist::WorldOptions) -> Result<Times> {
    let n = devices.len();
    let times = Mutex::new(Vec::new());
    // The lost rank's panic ends `spawn_local` with `RankPanicked`; the
    // survivors' results come back through `times`.
    let ended: std::result::Result<Vec<()>, Error> =
        World::spawn_local_with_options(devices, options, |world| {
            all_reduce(&world)?;
            if world.rank() == n - 1 {
                panic!(
                    "bench --recover: rank {} is lost on purpose (not an error)",
                    n - 1
                );
            }
            let (t, _recovered) = survive(world, options)?;
            times.lock().unwrap_or_else(|p| p.into_inner()).push(t);
            Ok(())
        });
    let times = times.into_inner().unwrap_or_else(|p| p.into_inner());
    if times.len() != n - 1 {
        let why = match ended {
            Err(e) => e.to_string(),
            Ok(_) => "the lost rank did not panic".into(),
        };
        return Err(format!("{} of {} survivors recovered ({why})", times.len(), n - 1).into());
    }
    // The slowest survivor (by its recovery and first all-reduce).
    times
        .into_iter()
        .max_by(|a, b| a.total.total_cmp(&b.total))
        .ok_or_else(|| "no survivor".into())
}

/// Ends this process as a crash would: SIGKILL, no destructor, no
/// goodbye on the liveness channel, NCCL's communicators left as they
/// are.
fn kill_this_process(rank: usize) -> ! {
    eprintln!("bench --recover: rank {rank} kills its process on purpose (not an error)");
    // SAFETY: kill(2) on this process's own id; it touches no memory.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    // SIGKILL cannot be caught; this only keeps the type `!` honest.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// One repetition with a process per GPU (this launch): on a survivor,
/// the slowest survivor's times and whether this rank reports them (the
/// recovered world's rank 0). The last rank does not return.
fn one_process_rep(options: &nccl_dist::WorldOptions) -> Result<(Times, bool, usize)> {
    let launch = Launch::detect()
        .map_err(|e| format!("--recover --mode processes needs a launcher ({e})"))?;
    let n = launch.world_size;
    if n < 2 {
        return Err(format!("--recover needs 2 ranks or more ({n} launched)").into());
    }
    let world = World::init_with(launch, options)?;
    all_reduce(&world)?;
    if world.rank() == n - 1 {
        kill_this_process(n - 1);
    }
    let (mut t, recovered) = survive(world, options)?;
    let mut slowest = [t.rebuild, t.total];
    recovered
        .comm()
        .all_reduce_host(&mut slowest, ReduceOp::Max)?;
    t.rebuild = slowest[0];
    t.total = slowest[1];
    Ok((t, recovered.rank() == 0, n))
}

pub fn run(opts: &Opts) -> Result<()> {
    let options = match opts.recover_by_shrink {
        Some(on) => crate::world_options(opts).recover_by_shrink(on),
        None => crate::world_options(opts),
    };
    if !crate::spans::install() {
        eprintln!("bench: another tracing subscriber is installed; the span columns stay empty");
    }
    let row = |rep: usize, t: &Times| {
        println!("  {rep:>4} {:>16.1} {:>24.1}", t.rebuild, t.total);
        json!({
            "rep": rep,
            "recover_ms": t.rebuild,
            "recover_and_first_all_reduce_ms": t.total,
            "spans": t.spans,
        })
    };
    let header = || {
        println!(
            "# {:>4} {:>16} {:>24}",
            "rep", "recover(ms)", "recover+first(ms)"
        )
    };
    let mut rows = Vec::new();
    let n = match opts.mode {
        Mode::Threads => {
            let devices = crate::devices(opts)?;
            let n = devices.len();
            if n < 2 {
                return Err(format!("--recover needs 2 GPUs or more ({n} visible)").into());
            }
            println!(
                "# nccl-rs bench --recover: {n} threads, rank {} lost each rep",
                n - 1
            );
            header();
            for rep in 0..opts.setup_reps {
                let t = one_rep(&devices, &options)?;
                rows.push(row(rep, &t));
            }
            n
        }
        Mode::Processes => {
            if opts.setup_reps != 1 {
                return Err(
                    "--recover --mode processes runs one rep a launch (--setup-reps 1): the lost rank's process is gone".into(),
                );
            }
            let (t, reports, n) = one_process_rep(&options)?;
            if !reports {
                return Ok(());
            }
            println!(
                "# nccl-rs bench --recover: {n} processes, rank {} killed",
                n - 1
            );
            header();
            rows.push(row(0, &t));
            n
        }
        Mode::Single => {
            return Err(
                "--recover runs with a thread or a process per GPU (--mode threads|processes)"
                    .into(),
            );
        }
    };
    if let Some(path) = &opts.json {
        let doc = json!({
            "meta": {
                "recover": true,
                "mode": opts.mode.name(),
                "ranks": n,
                "lost": n - 1,
                // What the flags and the environment asked for about
                // recovery by shrink (on by default; the span columns show
                // which path each rep took).
                "recover_by_shrink": opts.recover_by_shrink,
                "recover_by_shrink_env": std::env::var(nccl_dist::RECOVER_BY_SHRINK_ENV).ok(),
            },
            "recover": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .map_err(|e| BoxError::from(format!("writing {}: {e}", path.display())))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(())
}
