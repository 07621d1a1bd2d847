//! What a world's options come to once the environment is read, and how
//! this rank's communicators are made from them (every way of forming a
//! world ends here).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nccl_safe::cudarc::driver::CudaContext;
use nccl_safe::{AbortCause, AbortSignal, Comm, Config, ReduceOp, UniqueId};

use super::options::{DEFAULT_OP_TIMEOUT, WorldOptions, default_config, op_timeout_from_lookup};
use super::recover::abort_deadline;
use crate::error::{Error, Result};
use crate::liveness::LivenessOptions;
use crate::watchdog::{Watchdog, WatchdogOptions};

/// What the options come to once the environment is read.
pub(super) struct Resolved {
    pub(super) op_timeout: Duration,
    watchdog: Option<WatchdogOptions>,
    pub(super) liveness: LivenessOptions,
    pub(super) signal: AbortSignal,
    /// The user's configuration, with the signal (and the operation
    /// timeout when one was given) added.
    pub(super) user_config: Option<Config>,
    /// Connect the world's communicator before returning it (not
    /// [`WorldOptions::lazy_connect`]).
    connect: bool,
    /// The world's communicators park on a loss
    /// ([`WorldOptions::recover_by_shrink`], where the library can shrink).
    park: bool,
}

impl Resolved {
    pub(super) fn new(options: &WorldOptions) -> Result<Resolved> {
        let env = |k: &str| std::env::var(k).ok();
        let op_timeout = match options.op_timeout {
            Some(t) => t,
            None => op_timeout_from_lookup(env)?.unwrap_or(DEFAULT_OP_TIMEOUT),
        };
        let watchdog = if options.no_watchdog {
            None
        } else {
            match &options.watchdog {
                Some(w) => Some(w.clone()),
                None => WatchdogOptions::from_env()?.map(|w| {
                    // A timeout given in code wins over the environment's.
                    if options.op_timeout.is_some() {
                        w.timeout(op_timeout)
                    } else {
                        w
                    }
                }),
            }
            .map(|w| match options.check_calls {
                Some(on) => w.check_calls(on),
                None => w,
            })
        };
        let liveness = match &options.liveness {
            Some(l) => l.clone(),
            None => LivenessOptions::from_env()?,
        };
        // Whether the library can shrink is asked later, in `parks`: here
        // it would load libnccl before the rendezvous.
        let park = recovers_by_shrink(options.shrink_recovery, env)?;
        let signal = AbortSignal::new();
        let user_config = options.config.as_ref().map(|c| {
            let c = c.clone().abort_signal(&signal);
            match options.op_timeout {
                Some(t) => c.timeout(t),
                None => c,
            }
        });
        Ok(Resolved {
            op_timeout,
            watchdog,
            liveness,
            signal,
            user_config,
            connect: !options.lazy_connect,
            park,
        })
    }

    /// Whether the world's communicators park on a loss
    /// ([`WorldOptions::recover_by_shrink`], where the library can shrink).
    pub(super) fn parks(&self) -> bool {
        self.park && parks()
    }

    /// Whether the communicators [`Resolved::make_comms`] makes for a
    /// world of `size` ranks of this `shape` park on a loss: only the
    /// split pair does (not the user's own configuration, nor the one
    /// communicator of an outside id or of a single rank).
    pub(super) fn parks_for(&self, shape: Shape, size: usize) -> bool {
        self.user_config.is_none() && shape == Shape::Split && size > 1 && self.parks()
    }

    /// The configuration of the hot-path communicators: blocking.
    pub(super) fn data_config(&self) -> Config {
        default_config()
            .timeout(self.op_timeout)
            .abort_signal(&self.signal)
    }

    /// The configuration of the init that the blocking communicator is
    /// split from: nonblocking, so that a peer lost mid-init aborts it.
    /// With [`WorldOptions::recover_by_shrink`] (where the library can
    /// shrink, [`parks`]), it parks on a loss: the survivors'
    /// [`World::recover`](super::World::recover) shrink it. It runs no
    /// collective (worlds and meshes are split from it with their own
    /// configurations), so it takes [`CONTROL_MAX_CTAS`] channels.
    fn init_config(&self) -> Config {
        self.data_config()
            .blocking(false)
            .park_on_peer_loss(self.parks())
            .max_ctas(CONTROL_MAX_CTAS)
    }

    /// The configuration of the world's blocking communicator, and of its
    /// meshes' communicators: it parks with the one it is split from
    /// (parking stops its kernels at once, [`Config::park_on_peer_loss`]),
    /// and is kept until the recovered world drops (or
    /// [`World::release_retired`](super::World::release_retired)).
    fn world_config(&self) -> Config {
        self.data_config().park_on_peer_loss(self.parks())
    }

    /// `made`'s error as the world reports it (a loss named where the
    /// channel names one, [`lost_or`]). A failure after the signal fired
    /// also leaves the signal to the next world of the process
    /// ([`settle_failed`]): a creation cut short by a loss answers before
    /// NCCL's abort of it is done.
    fn outcome<T>(&self, made: nccl_safe::Result<T>) -> Result<T> {
        made.map_err(|e| {
            let e = lost_or(&self.signal, e);
            if self.signal.is_triggered() {
                remember_failed(&self.signal, self.op_timeout);
            }
            e
        })
    }

    /// Makes the connections of a world's communicators now, unless lazy
    /// ([`WorldOptions::lazy_connect`]): a one-element all-reduce on each
    /// (in one group when one thread drives them all) and its stream's
    /// synchronisation, through the watchdog's gate. One-rank worlds have
    /// nothing to connect.
    pub(super) fn connect(&self, comms: &[&Comm]) -> Result<()> {
        if !self.connect || comms.iter().all(|c| c.size() < 2) {
            return Ok(());
        }
        let _span = tracing::debug_span!("nccl.connect", comms = comms.len()).entered();
        let made = (|| {
            let cuda = |source| nccl_safe::Error::Cuda {
                op: "World connection",
                source,
            };
            let mut bufs = comms
                .iter()
                .map(|c| c.stream().alloc_zeros::<f32>(1).map_err(cuda))
                .collect::<nccl_safe::Result<Vec<_>>>()?;
            let done = (|| {
                if let [comm] = comms {
                    comm.all_reduce_in_place(&mut bufs[0], ReduceOp::Sum)?;
                } else {
                    nccl_safe::group(|g| {
                        for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
                            g.on(comm).all_reduce_in_place(buf, ReduceOp::Sum)?;
                        }
                        Ok(())
                    })?;
                }
                comms.iter().try_for_each(|c| c.synchronize(c.stream()))
            })();
            if done.is_err() {
                // A kernel cut short may still touch them: 4 bytes each
                // are left to the process rather than freed (their stream
                // and events are released).
                for buf in bufs {
                    let _ = buf.leak();
                }
            }
            done
        })();
        self.outcome(made)
    }

    pub(super) fn start_watchdog(&self) -> Result<Option<Watchdog>> {
        self.watchdog.clone().map(Watchdog::start).transpose()
    }

    /// Makes this rank's communicators: with the user's configuration,
    /// one `init_rank`; by default a nonblocking init (abortable while
    /// peers are missing) and a blocking communicator split from it.
    ///
    /// `Shape::One` (a world formed from an outside id, whose other ranks
    /// may be in another language and make one communicator only): one
    /// init and no split; without a configuration of the user's, a
    /// nonblocking one, so that its creation is bounded and abortable.
    pub(super) fn make_comms(
        &self,
        id: &UniqueId,
        rank: usize,
        size: usize,
        device: usize,
        shape: Shape,
    ) -> Result<(Comm, Option<Comm>, Config)> {
        settle_failed(self.op_timeout)?;
        let made = (|| {
            if let Some(config) = &self.user_config {
                let comm = Comm::init_rank(id, rank, size, device, config)?;
                // Its children take it as they would inherit it, but never
                // park: only the world's own communicators do.
                return Ok((comm, None, config.clone().park_on_peer_loss(false)));
            }
            let data = self.data_config();
            if shape == Shape::One && size > 1 {
                // Nothing is split from it but meshes, and it is not
                // shrunk (no channel names a loss): a plain nonblocking one.
                let config = self.data_config().blocking(false);
                let comm = Comm::init_rank(id, rank, size, device, &config)?;
                return Ok((comm, None, data));
            }
            if size == 1 {
                let comm = Comm::init_rank(id, rank, size, device, &data)?;
                return Ok((comm, None, data));
            }
            let control = Comm::init_rank(id, rank, size, device, &self.init_config())?;
            let comm = self.split_world(&control, rank)?;
            // Meshes' communicators take the world's configuration and
            // park with it: its keeper keeps them past a loss
            // (`super::on_loss`).
            Ok((comm, Some(control), self.world_config()))
        })();
        self.outcome(made)
    }

    /// The world's blocking communicator, split from `control`.
    fn split_world(&self, control: &Comm, rank: usize) -> nccl_safe::Result<Comm> {
        control
            .split(Some(0), rank as i32, Some(&self.world_config()))?
            .ok_or(nccl_safe::Error::InvalidArgument {
                op: "ncclCommSplit",
                reason: "NCCL returned no communicator",
            })
    }

    /// [`Resolved::make_comms`] for survivors whose old world's nonblocking
    /// communicator `parked` is parked after a loss: the new nonblocking
    /// one shrunk from it without the ranks in `excluded`
    /// ([`Comm::shrink_parked`]: NCCL stops the old world's kernels and
    /// talks to the survivors only, joining no proxy thread), then the
    /// blocking one split from it; a world of one rank is the shrunk
    /// communicator alone, blocking.
    pub(super) fn shrink_comms(
        &self,
        parked: &Comm,
        excluded: &[usize],
        rank: usize,
        size: usize,
    ) -> Result<(Comm, Option<Comm>, Config)> {
        settle_failed(self.op_timeout)?;
        let made = (|| {
            let data = self.data_config();
            if size == 1 {
                return Ok((parked.shrink_parked(excluded, &data)?, None, data));
            }
            let control = parked.shrink_parked(excluded, &self.init_config())?;
            let comm = self.split_world(&control, rank)?;
            Ok((comm, Some(control), self.world_config()))
        })();
        self.outcome(made)
    }
}

/// The signals of this process's worlds whose making failed after their
/// signal fired, with their operation timeouts, while NCCL may still be
/// aborting their communicators.
static FAILED: Mutex<Vec<(AbortSignal, Duration)>> = Mutex::new(Vec::new());

fn failed_worlds() -> MutexGuard<'static, Vec<(AbortSignal, Duration)>> {
    FAILED.lock().unwrap_or_else(|p| p.into_inner())
}

/// A world's making failed: NCCL's aborts of its communicators may still
/// run (on the liveness hook's thread, which the survivors' error does
/// not wait for, or on a teardown's).
fn remember_failed(signal: &AbortSignal, timeout: Duration) {
    let mut failed = failed_worlds();
    if !failed.iter().any(|(s, _)| s == signal) {
        failed.push((signal.clone(), timeout));
    }
}

/// Waits, before a world makes its communicators, until NCCL is done with
/// those of every world of the process whose making failed, parked ones
/// aside ([`AbortSignal::wait_quiet`]: no abort or teardown of theirs
/// runs): NCCL allows no calls on independent communicators of one GPU
/// from several threads at once (see `World::give_up`). At most the
/// longest of `timeout` and theirs plus [`nccl_safe::ABORT_ALLOWANCE`],
/// else [`nccl_safe::Error::Timeout`]. Each is waited for once: those that
/// came quiet, and those that did not in time (reported by that
/// timeout), are forgotten, so that one teardown stuck in NCCL does not
/// hold every later world of the process.
fn settle_failed(timeout: Duration) -> Result<()> {
    let pending = failed_worlds().clone();
    if pending.is_empty() {
        return Ok(());
    }
    let _span = tracing::debug_span!("nccl.settle_failed_worlds", worlds = pending.len()).entered();
    let longest = pending.iter().map(|(_, t)| *t).fold(timeout, Duration::max);
    let (started, until) = abort_deadline(longest);
    // Each gets its look, even past the deadline.
    let late = pending.iter().filter(|(s, _)| !s.wait_quiet(until)).count();
    failed_worlds().retain(|(s, _)| !pending.iter().any(|(p, _)| p == s));
    if late == 0 {
        return Ok(());
    }
    Err(Error::Nccl(nccl_safe::Error::Timeout {
        op: "World: NCCL's aborts of an earlier world's communicators (its making failed)",
        waited: started.elapsed(),
    }))
}

/// Runs `exchange` (a world's rendezvous) while a thread of its own makes
/// `device`'s CUDA context, and returns both once both are done: the
/// rendezvous's error first, then the context's (`op` names it).
///
/// Made after the rendezvous, with the communicators, the context's
/// creation (up to 1.6 s in fresh processes starting together on 4 H100s)
/// came between a peer's load of libnccl and the survivors' first NCCL
/// call, where no loss cuts anything short: a peer that died there was
/// named only once it ended (fault case g, 1.1–1.6 s after the death at
/// world 4). Made beside the rendezvous, it is ready when the
/// communicators are made; and a rank whose context fails still joins the
/// rendezvous, so that its peers learn of the failure as a loss instead of
/// waiting there for it.
pub(super) fn beside_a_new_context<T>(
    device: usize,
    op: &'static str,
    exchange: impl FnOnce() -> Result<T>,
) -> Result<(Arc<CudaContext>, T)> {
    std::thread::scope(|scope| {
        let making = std::thread::Builder::new()
            .name("nccl-context".into())
            .spawn_scoped(scope, move || CudaContext::new(device));
        let exchanged = exchange();
        let context = match making {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: made here, after the rendezvous.
            Err(_) => CudaContext::new(device),
        };
        let exchanged = exchanged?;
        Ok((context.map_err(crate::error::cuda(op))?, exchanged))
    })
}

/// Whether a world is to recover by shrink: the option where given, else
/// [`RECOVER_BY_SHRINK_ENV`](crate::env::RECOVER_BY_SHRINK_ENV), else on.
fn recovers_by_shrink(
    option: Option<bool>,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<bool> {
    Ok(match option {
        Some(on) => on,
        None => crate::env::switch(lookup, crate::env::RECOVER_BY_SHRINK_ENV)?.unwrap_or(true),
    })
}

/// Whether a world's communicators park on a loss instead of aborting
/// ([`Config::park_on_peer_loss`]): where the library has
/// `ncclCommShrink` (NCCL 2.27+), which a recovery then uses.
fn parks() -> bool {
    nccl_safe::Library::get().is_ok_and(|l| l.capabilities().has(nccl_safe::Feature::Shrink))
}

/// How a world's communicators are made from its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// Every rank is ours: a nonblocking control communicator and the
    /// blocking world communicator split from it.
    Split,
    /// The id came from outside, and ranks in other languages make one
    /// communicator with `ncclCommInitRank`: one init, no split.
    One,
}

/// A creation error as [`Error::PeerLost`] when the job's signal fired
/// because a peer was lost (the communicators were aborted for it).
pub(super) fn lost_or(signal: &AbortSignal, err: nccl_safe::Error) -> Error {
    // NCCL often sees a dead peer's closed socket a few milliseconds before
    // the liveness channel names it (seen: `ncclRemoteError` 1-4 ms before
    // the loss on 2 H200s): give the channel a moment to say who it was.
    if !signal.is_triggered() && may_be_a_loss(&err) {
        let until = Instant::now() + LOSS_GRACE;
        while !signal.is_triggered() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    match signal.cause() {
        Some(AbortCause::PeerLost { rank, detail }) => {
            let op = match &err {
                nccl_safe::Error::Aborted { op, .. } | nccl_safe::Error::Timeout { op, .. } => op,
                _ => "communicator creation",
            };
            crate::error::peer_lost(
                crate::error::loss_of(rank, detail),
                "world".into(),
                op,
                0,
                Vec::new(),
            )
        }
        _ => Error::Nccl(err),
    }
}

/// The channels of a world's control communicator, which NCCL otherwise
/// sets up at init as for any other (24 on 2 H100s, NCCL 2.28.3) though
/// the control communicator only creates. NCCL takes a child's channels
/// from the configuration given to the split or shrink, not from its
/// parent's (`parseCommConfig`, NCCL 2.18 to 2.30), and every child made
/// from it is given its own configuration. `NCCL_MAX_CTAS` still
/// overrides it.
const CONTROL_MAX_CTAS: i32 = 1;

/// How long an NCCL error that may come from a lost peer waits for the
/// liveness channel to name it.
const LOSS_GRACE: Duration = Duration::from_millis(500);

/// NCCL's errors for a peer that went away (a closed socket, a remote
/// failure), and our timeouts.
fn may_be_a_loss(err: &nccl_safe::Error) -> bool {
    use nccl_safe::nccl_sys::ncclResult_t as R;
    matches!(err, nccl_safe::Error::Timeout { .. })
        || matches!(
            err.nccl_code(),
            Some(R::ncclRemoteError | R::ncclSystemError | R::ncclInternalError)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_env as env;

    #[test]
    fn recovery_by_shrink_is_on_unless_the_option_or_the_environment_says_off() {
        assert!(recovers_by_shrink(None, env(&[])).unwrap());
        let off = env(&[("NCCL_RS_RECOVER_BY_SHRINK", "0")]);
        assert!(!recovers_by_shrink(None, off).unwrap());
        let on = env(&[("NCCL_RS_RECOVER_BY_SHRINK", "on")]);
        assert!(recovers_by_shrink(None, on).unwrap());
        // The option wins over the environment.
        let off = env(&[("NCCL_RS_RECOVER_BY_SHRINK", "0")]);
        assert!(recovers_by_shrink(Some(true), off).unwrap());
        assert!(!recovers_by_shrink(Some(false), env(&[])).unwrap());
        let bad = env(&[("NCCL_RS_RECOVER_BY_SHRINK", "maybe")]);
        assert!(recovers_by_shrink(None, bad).is_err());
    }

    /// The control communicator sets up one channel; the world split from
    /// it, and what meshes split, keep NCCL's default.
    #[test]
    fn the_control_communicator_takes_one_channel_and_its_children_the_default() {
        let resolved = Resolved::new(&WorldOptions::new()).unwrap();
        let control = resolved.init_config();
        assert_eq!(control.get_max_ctas(), Some(CONTROL_MAX_CTAS));
        assert!(!control.is_blocking());
        assert_eq!(resolved.world_config().get_max_ctas(), None);
        assert!(resolved.world_config().is_blocking());
        assert_eq!(resolved.data_config().get_max_ctas(), None);
    }

    /// A world whose making failed after its signal fired is left to the
    /// next world, which waits until NCCL is done with it and forgets it;
    /// one that failed otherwise is not kept.
    #[test]
    fn a_failed_world_is_settled_by_the_next_one_only_after_a_loss() {
        let quiet = Resolved::new(&WorldOptions::new()).unwrap();
        let refused = || nccl_safe::Error::InvalidArgument {
            op: "test",
            reason: "refused",
        };
        assert!(quiet.outcome::<()>(Err(refused())).is_err());
        assert!(!failed_worlds().iter().any(|(s, _)| *s == quiet.signal));

        let lost = Resolved::new(&WorldOptions::new()).unwrap();
        lost.signal.trigger(AbortCause::PeerLost {
            rank: 1,
            detail: "test".into(),
        });
        let e = lost.outcome::<()>(Err(refused())).unwrap_err();
        assert_eq!(e.lost_rank(), Some(1), "{e}");
        assert!(failed_worlds().iter().any(|(s, _)| *s == lost.signal));
        // Nothing of it is left for NCCL (it has no communicator).
        settle_failed(Duration::from_secs(1)).unwrap();
        assert!(!failed_worlds().iter().any(|(s, _)| *s == lost.signal));
    }
}
