//! Recovery after a lost rank: a new world over the survivors, through the
//! same authenticated rendezvous as at the start, served by the lowest
//! live rank.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use nccl_safe::{ABORT_ALLOWANCE, Comm, UniqueId};

use super::World;
use super::options::WorldOptions;
use super::resolved::{Resolved, Shape};
use crate::error::{Error, Result};
use crate::launch::{Launch, Launcher};
use crate::liveness::Liveness;
use crate::rendezvous;

mod settle;
pub(crate) use settle::Survivors;
use settle::settled;

/// How long a rank that knows of no loss waits for one before it says
/// that nothing was lost (the channel names a dead rank within 2 s).
pub(super) const FIRST_LOSS: Duration = Duration::from_secs(2);

/// What a world given up for a new one keeps until the new one is made:
/// its channel membership (its goodbye must not read as a loss to anyone)
/// and its watchdog. Its communicators are gone ([`World::give_up`]).
pub(super) struct GivenUp {
    presence: super::Presence,
    _watchdog: Option<crate::watchdog::Watchdog>,
}

impl World {
    /// Gives this world's communicators up before the survivors make new
    /// ones on the same GPUs: the signal asks every one of them, on every
    /// thread, to abort (done already where a loss fired it), this rank's
    /// handles go, and this waits until NCCL is done with all of them
    /// ([`nccl_safe::AbortSignal::wait_settled`]), at most the operation
    /// timeout plus [`nccl_safe::ABORT_ALLOWANCE`] (a drop's bounded wait, then
    /// NCCL's abort), else [`nccl_safe::Error::Timeout`].
    /// NCCL allows no calls on independent communicators of one GPU from
    /// several threads at once, and those aborts run on the threads that
    /// made them (a liveness hook's, a watchdog's). With a thread per GPU
    /// the last abort of the world's ranks frees the resources of all of
    /// them. Without this wait, three survivors of four H100s saw one
    /// survivor's first all-reduce on the new world done without its peers
    /// (a third of the data right) and theirs hung; with it, the same
    /// cases pass there.
    pub(super) fn give_up(self) -> Result<GivenUp> {
        let _span = tracing::debug_span!("nccl.recover_give_up").entered();
        let World {
            presence,
            kept,
            comm,
            control,
            watchdog,
            signal,
            mut retired,
            ..
        } = self;
        // Nothing is shrunk: the parked ones are aborted too (the meshes'
        // kept ones included, which then go).
        signal.end_parking();
        signal.trigger(nccl_safe::AbortCause::Other(
            "World::recover: the world was given up for the survivors' new one".into(),
        ));
        let limit = comm.timeout();
        // Here and now, a team's yard or not: NCCL is to be done with
        // them before the new world's are made.
        kept.tear_down();
        drop(comm);
        drop(control);
        // Those of earlier worlds carry their own signals: their drops
        // wait for their aborts.
        drop(retired.take());
        let (started, until) = abort_deadline(limit);
        if !signal.wait_settled(until) {
            return Err(Error::Nccl(nccl_safe::Error::Timeout {
                op: "World::recover: NCCL's teardown of the old world's communicators",
                waited: started.elapsed(),
            }));
        }
        Ok(GivenUp {
            presence,
            _watchdog: watchdog,
        })
    }
}

/// What a recovery's leader hands out instead of a unique id when the
/// survivors shrink their parked communicators: `ncclGetUniqueId` never
/// makes it (its id starts with a random magic, then a socket address).
const SHRINK_MARK: UniqueId = UniqueId::from_bytes(shrink_mark());

const fn shrink_mark() -> [u8; UniqueId::BYTES] {
    let tag = b"nccl-rs recovery: the survivors shrink their parked communicators";
    let mut bytes = [0u8; UniqueId::BYTES];
    let mut i = 0;
    while i < tag.len() {
        bytes[i] = tag[i];
        i += 1;
    }
    bytes
}

/// A survivor told to shrink whose communicators are not parked (NCCL
/// reported an error on one before the loss was named, say, or its
/// options differ): it tells the old world's channel that it is gone,
/// which cuts the others' shrinks short (any abort asked for during one
/// ends it), and gives its world up.
fn decline_shrink(old: Old) -> Error {
    let error = not_parked();
    old.gone(&error);
    match old.give_up() {
        Ok(_) => error,
        Err(e) => e,
    }
}

/// The error of a survivor told to shrink whose communicators are not
/// parked, in a world of processes or of threads.
pub(super) fn not_parked() -> Error {
    Error::InvalidArgument {
        op: "World::recover",
        reason: "the survivors shrink their parked communicators, but this rank's were aborted or do not park".into(),
    }
}

/// Now, and how long a wait for NCCL's aborts of communicators with the
/// operation timeout `timeout` may last: that timeout (a drop's bounded
/// wait) plus [`ABORT_ALLOWANCE`] (NCCL's abort).
pub(super) fn abort_deadline(timeout: Duration) -> (Instant, Instant) {
    let started = Instant::now();
    let until = started
        .checked_add(timeout.saturating_add(ABORT_ALLOWANCE))
        .unwrap_or(started + ABORT_ALLOWANCE);
    (started, until)
}

/// The ranks of a world of `size` that are not in `keep`.
fn excluded(size: usize, keep: &[usize]) -> Vec<usize> {
    (0..size).filter(|r| !keep.contains(r)).collect()
}

impl World {
    /// Whether this rank can make the new world of `keep` (old ranks, in
    /// new-rank order) by shrinking its parked communicators: both are
    /// parked ([`nccl_safe::Config::park_on_peer_loss`]; NCCL 2.27+, no
    /// graph, no NCCL error), and `keep` is in the old order, which a
    /// shrink keeps.
    ///
    /// The loss's hook parks them from the thread that learned of the loss
    /// (in one process, the lost rank's own, after the watchdog's turn):
    /// this waits for the signal to fire (at most [`FIRST_LOSS`]; the
    /// survivors were counted, so a loss is known), then settles here what
    /// is due.
    pub(super) fn can_shrink(&self, keep: &[usize]) -> bool {
        // A world that does not park (the default) decides at once.
        if !self.parks() || !keep.windows(2).all(|w| w[0] < w[1]) {
            return false;
        }
        let until = Instant::now() + FIRST_LOSS;
        while !self.signal.is_triggered() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.control.as_ref().is_some_and(Comm::is_parked) && self.comm.is_parked()
    }

    /// Whether this world's communicators park on a loss
    /// ([`WorldOptions::recover_by_shrink`]).
    fn parks(&self) -> bool {
        self.control.as_ref().is_some_and(Comm::parks_on_peer_loss)
    }

    /// The survivors' world from this one's parked communicators
    /// ([`Resolved::shrink_comms`]); `keep`: the old ranks that make it.
    pub(super) fn shrink_into(
        self,
        launch: Launch,
        resolved: Resolved,
        liveness: Option<Liveness>,
        keep: &[usize],
    ) -> Result<World> {
        let shrinking = self.park_for_shrink(keep)?;
        let (rank, size) = (launch.rank, launch.world_size);
        let world = World::form_with(launch, resolved, liveness, Shape::Split, |r| {
            r.shrink_comms(&shrinking.parked, &shrinking.excluded, rank, size)
        });
        shrinking.finish(world)
    }

    /// Takes this world apart for a shrink to the ranks in `keep`, once
    /// NCCL is done with every communicator of it that is not parked (its
    /// splits, aborted for the loss; see [`World::give_up`]).
    pub(super) fn park_for_shrink(self, keep: &[usize]) -> Result<Shrinking> {
        let _span = tracing::debug_span!("nccl.recover_quiet").entered();
        let excluded = excluded(self.launch.world_size, keep);
        let World {
            presence,
            kept,
            comm,
            control,
            watchdog,
            signal,
            mut retired,
            ..
        } = self;
        let mut retired = retired.take();
        // The meshes' parked communicators go on being kept, by the new
        // world (not waited for here: they are parked).
        let meshes = kept.take();
        drop(kept);
        let parked = control.ok_or(Error::InvalidArgument {
            op: "World::recover",
            reason: "no parked communicator to shrink".into(),
        })?;
        let (started, until) = abort_deadline(comm.timeout());
        // The child before its parent.
        retired.push(comm);
        if !signal.wait_quiet(until) {
            let error = Error::Nccl(nccl_safe::Error::Timeout {
                op: "World::recover: NCCL's aborts of the old world's other communicators",
                waited: started.elapsed(),
            });
            presence.gone(&error);
            return Err(error);
        }
        Ok(Shrinking {
            parked,
            excluded,
            meshes,
            retired,
            old: GivenUp {
                presence,
                _watchdog: watchdog,
            },
        })
    }
}

/// The old world during a recovery: kept whole while it may still be
/// shrunk, else given up before anything else (as before parking
/// existed: a world that does not park).
pub(super) enum Old {
    Kept(Box<World>),
    GivenUp(GivenUp),
}

impl Old {
    /// `world` kept where it parks on a loss, else given up now.
    pub(super) fn of(world: World) -> Result<Old> {
        if world.parks() {
            Ok(Old::Kept(Box::new(world)))
        } else {
            world.give_up().map(Old::GivenUp)
        }
    }

    /// Reports this rank lost on the old channel (see [`Presence::gone`]).
    pub(super) fn gone(&self, error: &Error) {
        match self {
            Old::Kept(world) => world.presence.gone(error),
            Old::GivenUp(old) => old.presence.gone(error),
        }
    }

    /// The old world given up, if it was not yet.
    pub(super) fn give_up(self) -> Result<GivenUp> {
        match self {
            Old::Kept(world) => world.give_up(),
            Old::GivenUp(old) => Ok(old),
        }
    }
}

/// A world taken apart for a shrink ([`World::park_for_shrink`]).
pub(super) struct Shrinking {
    /// The parked communicator the new ones are shrunk from.
    pub(super) parked: Comm,
    /// The old ranks that are not in the new world.
    pub(super) excluded: Vec<usize>,
    /// The old world's meshes' parked communicators, kept
    /// ([`super::on_loss`]): the new world keeps them.
    meshes: Vec<nccl_safe::KeptComm>,
    /// The parked communicators the new world keeps: the old world's own
    /// and those it kept.
    retired: Vec<Comm>,
    old: GivenUp,
}

impl Shrinking {
    /// The new world keeps the old communicators; the rest of the old
    /// world (its channel, its watchdog) goes only now: its goodbye is not
    /// a loss to anyone.
    pub(super) fn finish(self, world: Result<World>) -> Result<World> {
        let Shrinking {
            parked,
            meshes,
            mut retired,
            old,
            ..
        } = self;
        retired.push(parked);
        let mut world = match world {
            Ok(world) => world,
            Err(error) => {
                old.presence.gone(&error);
                // The meshes' communicators first: they are children of
                // the retired ones.
                super::yard::tear_down(meshes, vec![retired]);
                return Err(error);
            }
        };
        world.kept.adopt(meshes);
        world.retired.extend(retired);
        let _old = tracing::debug_span!("nccl.recover_drop_old").entered();
        drop(old);
        Ok(world)
    }
}

impl World {
    /// After a peer was lost ([`Error::PeerLost`]): a new world over the
    /// survivors, this world's communicators given up (the watchdog has
    /// aborted them).
    ///
    /// Every survivor calls it with the options its world was made with.
    /// The survivors keep their order and are renumbered from 0 (the world
    /// of ranks 0..4 that lost rank 1 becomes ranks 0, 1, 2 for the old
    /// 0, 2, 3); each keeps its GPU. The lowest live rank serves a new
    /// rendezvous, on the rendezvous port of the first, at its own address
    /// (the one in the liveness channel's roster: for rank 0, the launch's
    /// address); the others join it with the job's secret, and the new
    /// world has its own liveness channel and watchdog. Buffers and
    /// streams made before stay valid: they belong to the GPU's context,
    /// not to a communicator.
    ///
    /// By default ([`WorldOptions::recover_by_shrink`], where NCCL has
    /// `ncclCommShrink`, 2.27+) the world's communicators parked on the
    /// loss instead of aborting (their kernels stopped), and the new world
    /// is made by shrinking the parked one: no wait for NCCL's teardown
    /// (tens of ms on 2 H100s). The old communicators are kept by the new
    /// world until it drops, or until [`World::release_retired`]; with a
    /// thread per GPU, until every thread's world has dropped (the last
    /// one's drop, or `spawn_local`'s return, tears them all down, so no
    /// thread's teardown runs beside another's calls). Where a
    /// survivor cannot shrink (recovery by shrink off, an older NCCL, a
    /// CUDA graph that may refer to the world, an NCCL error on it), the
    /// leader hands out a fresh id instead, and every survivor gives its
    /// old world up and makes the new communicator by `ncclCommInitRank`.
    /// That happens only after NCCL is done with every communicator of
    /// this world, on every thread (their aborts run on the threads that
    /// made them, and NCCL allows no calls on independent communicators
    /// of one GPU from several threads at once): a teardown that outlasts
    /// the operation timeout by 10 s is [`nccl_safe::Error::Timeout`].
    ///
    /// Each survivor counts the survivors from the losses its liveness
    /// channel knows, once they stopped changing for a moment: 50 ms where
    /// every loss was seen as it happened (a killed process, a reported
    /// exit, ranks a connection gate found missing), a heartbeat more (at
    /// least 250 ms) where one was found by silence or rank 0 (the
    /// channel's hub) was lost, 20 ms among threads of one process. Ranks
    /// that count differently (a second rank died during the recovery, or
    /// two died more than that apart) are refused by the rendezvous with a
    /// typed error, within the options' rendezvous timeout. A world without a liveness channel (liveness
    /// off, a file rendezvous, [`World::from_unique_id`]) is
    /// [`Error::InvalidArgument`] before anything happens. In a world with
    /// a thread per GPU ([`World::spawn_local`]) the survivors are threads
    /// of this process: they meet in memory instead of a rendezvous (the
    /// first survivor makes the new world's id, channel and watchdog, the
    /// others take them within the options' rendezvous timeout), and each
    /// keeps its GPU; the silent or failed thread's own world stays given
    /// up. A rank that knows of no loss
    /// waits up to 2 s for its channel to name one (NCCL may fail a moment
    /// before), then gets [`Error::InvalidArgument`] too, as does a rank
    /// that the others count as lost.
    ///
    /// ```no_run
    /// use nccl_dist::nccl_safe::ReduceOp;
    /// use nccl_dist::{Error, HostCollectives, Launch, World, WorldOptions};
    ///
    /// let options = WorldOptions::new();
    /// let mut world = World::init_with(Launch::detect()?, &options)?;
    /// let mut loss = [0.5f32];
    /// if let Err(Error::PeerLost(lost)) = world.comm().all_reduce_host(&mut loss, ReduceOp::Avg) {
    ///     eprintln!("rank {} was lost; going on without it", lost.rank);
    ///     world = world.recover(&options)?;
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn recover(self, options: &WorldOptions) -> Result<World> {
        let (liveness, survivors) = self.settle("World::recover", options)?;
        self.rebuild_any(&liveness, survivors, options)
    }

    /// As [`World::recover`], with the new world's ranks chosen: `keep`
    /// lists the old ranks that make it, in the order of their new ranks
    /// (rank `keep[0]` serves the rendezvous). A rank not in `keep` gets
    /// `Ok(None)` and its world is given up; nothing waits for it. For a
    /// mesh, [`crate::DeviceMesh::without_replicas`] gives `keep` by the
    /// policy of dropping the replicas that lost a rank.
    ///
    /// `keep` empty, with a rank twice, a rank outside the world or one
    /// this rank counts as lost is [`Error::InvalidArgument`], as are the
    /// cases [`World::recover`] refuses. Every rank must pass the same
    /// list: compute it after the losses settled (as
    /// [`World::lost_ranks`] says), or ranks that disagree are refused by
    /// the rendezvous within its timeout.
    pub fn recover_keeping(self, keep: &[usize], options: &WorldOptions) -> Result<Option<World>> {
        const OP: &str = "World::recover_keeping";
        let (liveness, _) = self.settle(OP, options)?;
        let size = self.launch.world_size;
        let bad = keep.iter().enumerate().find_map(|(i, &r)| {
            if r >= size {
                Some(format!("rank {r} is outside a world of {size}"))
            } else if keep[..i].contains(&r) {
                Some(format!("rank {r} is listed twice"))
            } else if liveness.is_lost(r) {
                Some(format!("rank {r} was lost"))
            } else {
                None
            }
        });
        let reason = match (keep.is_empty(), bad) {
            (true, _) => Some("no rank to keep".to_string()),
            (false, bad) => bad,
        };
        if let Some(reason) = reason {
            return Err(Error::InvalidArgument { op: OP, reason });
        }
        match keep.iter().position(|&r| r == self.launch.rank) {
            None => Ok(None),
            Some(me) => {
                let survivors = Survivors {
                    ranks: keep.to_vec(),
                    me,
                };
                self.rebuild_any(&liveness, survivors, options).map(Some)
            }
        }
    }

    /// The ranks this world's liveness channel counts as lost, in order
    /// (none without a channel): what this rank knows now. A rank that got
    /// [`Error::PeerLost`] knows that loss; with several ranks lost at
    /// once the ranks may count differently for a moment, so a list built
    /// from this for [`World::recover_keeping`] is best built after a short
    /// wait (the rendezvous refuses lists that differ).
    pub fn lost_ranks(&self) -> Vec<usize> {
        let Some(liveness) = &self.presence.liveness else {
            return Vec::new();
        };
        (0..self.launch.world_size)
            .filter(|&r| liveness.is_lost(r))
            .collect()
    }

    /// Tears down now the communicators a recovery by shrink kept from the
    /// worlds this one was made from (their parked world communicators and
    /// their meshes' own), which would otherwise hold their GPU memory
    /// until this world drops, one set more with every recovery (594–882
    /// MiB a rank on 2 and 4 H100s). Returns how many handles it let go of
    /// (0 when none were kept).
    ///
    /// Each teardown runs as a [`nccl_safe::Comm`]'s drop does, on a
    /// teardown thread that this call waits for, bounded by the operation
    /// timeout and a second; one that outlasts it goes on in the
    /// background (logged), as after a drop. NCCL's teardowns take their
    /// time: 1.1–2.4 s for the two of a world on 2 and 4 H100s, which is
    /// why [`World::recover`] leaves them out of the recovery's path. Call
    /// it with nothing of this rank in flight on its GPU and outside a
    /// group (inside one, the teardowns wait for the group's end), for
    /// example right after [`World::recover`] returns, before the next
    /// collective. This world's own communicators are not touched.
    ///
    /// A mesh of an old world that the caller still holds keeps its
    /// communicators, and its share of the old world's, until it drops:
    /// little is freed then (10 MiB in fault case s2), and that drop
    /// becomes the NCCL teardown, on the dropping thread.
    ///
    /// With a thread per GPU ([`World::spawn_local`]) it is collective:
    /// every thread of the world calls it at the same point, each waits
    /// for the world's stream, and the last to come tears down what all
    /// of them kept while the others wait, so no thread of the world
    /// issues beside a teardown (on 4 H100s, teardowns on two threads
    /// beside the third's first all-reduce on the new world left that
    /// all-reduce two-thirds wrong). A thread whose peers do not all come
    /// within the operation timeout gets [`nccl_safe::Error::Timeout`]
    /// with its communicators kept; never calling it, a team tears them
    /// down once every thread's world is gone. [`Error::InvalidArgument`],
    /// before anything is torn down, wherever a `World` of something else
    /// lives in the process (its threads may be issuing NCCL calls).
    ///
    /// ```no_run
    /// use nccl_dist::nccl_safe::ReduceOp;
    /// use nccl_dist::{Error, HostCollectives, Launch, World, WorldOptions};
    ///
    /// let options = WorldOptions::new();
    /// let mut world = World::init_with(Launch::detect()?, &options)?;
    /// let mut loss = [0.5f32];
    /// if let Err(Error::PeerLost(_)) = world.comm().all_reduce_host(&mut loss, ReduceOp::Avg) {
    ///     world = world.recover(&options)?;
    ///     let released = world.release_retired()?;
    ///     eprintln!("{released} old communicators torn down");
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn release_retired(&mut self) -> Result<usize> {
        if let Some(board) = self.local.clone() {
            return self.release_with_team(&board);
        }
        if !self.resident.alone() {
            return Err(Error::InvalidArgument {
                op: "World::release_retired",
                reason: "another World lives in this process, and its threads may be issuing NCCL calls: the old communicators stay until this world drops".into(),
            });
        }
        let _span = tracing::debug_span!("nccl.release_retired").entered();
        let meshes = self.kept.release_adopted();
        let retired = self.retired.take();
        let released = meshes.len() + retired.len();
        // The meshes' communicators first: they are children of the
        // retired ones, which go children before parents (their order).
        super::yard::tear_down(meshes, vec![retired]);
        Ok(released)
    }

    /// Checks that this world can recover and waits for its losses to
    /// settle: its channel and the survivors as it counts them.
    fn settle(&self, op: &'static str, options: &WorldOptions) -> Result<(Liveness, Survivors)> {
        let refuse = |reason: &str| Error::InvalidArgument {
            op,
            reason: reason.to_string(),
        };
        let Some(liveness) = self.presence.liveness.clone() else {
            return Err(refuse(
                "this world has no liveness channel (liveness off, a file rendezvous, or a world from a unique id)",
            ));
        };
        if liveness.rank().is_none() && self.local.is_none() {
            return Err(refuse(
                "the ranks of this world are threads of one process that share no board: make a new world for the survivors",
            ));
        }
        let _span = tracing::debug_span!("nccl.recover_settle").entered();
        let survivors = settled(
            &liveness,
            self.launch.world_size,
            self.launch.rank,
            options.timeout,
        )
        .map_err(refuse)?;
        Ok((liveness, survivors))
    }

    /// The new world of `survivors`: through a board in memory for a
    /// world with a thread per GPU, else through a rendezvous that its
    /// first rank serves.
    fn rebuild_any(
        mut self,
        liveness: &Liveness,
        survivors: Survivors,
        options: &WorldOptions,
    ) -> Result<World> {
        match self.local.take() {
            Some(board) if liveness.rank().is_none() => {
                self.rebuild_local(&board, survivors, options)
            }
            _ => self.rebuild(liveness, survivors, options),
        }
    }

    /// The new world of `survivors`, through a rendezvous that its first
    /// rank serves.
    fn rebuild(
        self,
        liveness: &Liveness,
        survivors: Survivors,
        options: &WorldOptions,
    ) -> Result<World> {
        let refuse = |reason: &str| Error::InvalidArgument {
            op: "World::recover",
            reason: reason.to_string(),
        };
        let _span = tracing::debug_span!(
            "nccl.world_recover",
            rank = self.launch.rank,
            new_rank = survivors.me,
            survivors = survivors.ranks.len()
        )
        .entered();
        let resolved = Resolved::new(options)?;
        let port = options.rendezvous_port(&self.launch)?;
        let leader_ip = if survivors.leader() == 0 {
            None
        } else {
            Some(
                liveness
                    .address_of(survivors.leader())
                    .map(|a| a.ip())
                    .ok_or_else(|| {
                        refuse("the liveness roster has no address for the new leader")
                    })?,
            )
        };
        let host = leader_ip.map_or_else(|| self.launch.master_addr.clone(), |ip| ip.to_string());
        let launch = Launch {
            rank: survivors.me,
            world_size: survivors.ranks.len(),
            master_addr: host.clone(),
            master_port: port,
            launcher: Launcher::Explicit,
            ..self.launch.clone()
        };
        let device = self.comm.device();
        let secret = options.job_secret()?;
        // The leader says whether the survivors shrink their parked
        // communicators: it hands out the mark instead of an id.
        let shrinkable = self.can_shrink(&survivors.ranks);
        let old = Old::of(self)?;
        let new_id = || {
            if shrinkable {
                Ok(SHRINK_MARK)
            } else {
                UniqueId::new()
            }
        };
        let (id, new_liveness) = if survivors.ranks.len() == 1 {
            (new_id()?, None)
        } else if survivors.me == 0 {
            // Rank 0 binds its launch address as at the start; another
            // leader binds every interface: the address in the roster is
            // the one the others reach it by, which need not be local
            // (members see a loopback entry rewritten to the host's).
            let at = if survivors.leader() == 0 {
                host.as_str()
            } else {
                ""
            };
            let listener = bind(at, port).map_err(rendezvous::RendezvousError::Io)?;
            let id = new_id()?;
            let (live, refused) = rendezvous::serve_live(
                &listener,
                launch.world_size,
                &secret,
                &id.raw(),
                options.timeout,
                &resolved.liveness,
            )?;
            for error in refused {
                tracing::warn!(%error, "recovery rendezvous: refused a peer");
            }
            (id, Some(live))
        } else {
            let (id, live) = rendezvous::join_live(
                (host.as_str(), port),
                launch.rank,
                launch.world_size,
                &secret,
                options.timeout,
                &resolved.liveness,
            )?;
            (id.into(), Some(live))
        };
        if id == SHRINK_MARK {
            return match old {
                Old::Kept(this) if shrinkable => {
                    this.shrink_into(launch, resolved, new_liveness, &survivors.ranks)
                }
                old => Err(decline_shrink(old)),
            };
        }
        let old = old.give_up()?;
        let world = World::form(&id, launch, device, resolved, new_liveness, Shape::Split)?;
        // The rest of the old world (its channel, its watchdog) goes only
        // now: its goodbye is not a loss to anyone.
        let _old = tracing::debug_span!("nccl.recover_drop_old").entered();
        drop(old);
        Ok(world)
    }
}

impl World {
    /// Lets `count` new ranks in (replacements for lost ones, after
    /// [`World::recover`]): a new world of `size() + count` ranks, this
    /// world's ranks first with their numbers, the newcomers after them.
    ///
    /// Every rank of this world calls it with the options its world was
    /// made with; its rank 0 (after a recovery, the lowest rank that
    /// lived) serves the rendezvous at this world's address and port
    /// ([`World::newcomer_launch`] says which), and the others join it. Each
    /// newcomer calls [`World::init_with`] with the launch
    /// [`World::newcomer_launch`] gives for it (handed over by whoever
    /// starts it) and the same secret. The new world has its own liveness
    /// channel and watchdog; this world is given up once it is made.
    /// Bounded by the options' rendezvous timeout; `count` 0 or a world
    /// with one thread per GPU is [`Error::InvalidArgument`] before
    /// anything happens.
    pub fn admit(self, count: usize, options: &WorldOptions) -> Result<World> {
        let refuse = |reason: &str| Error::InvalidArgument {
            op: "World::admit",
            reason: reason.to_string(),
        };
        if count == 0 {
            return Err(refuse("no rank to admit (count 0)"));
        }
        if self
            .presence
            .liveness
            .as_ref()
            .is_some_and(|l| l.rank().is_none())
        {
            return Err(refuse(
                "the ranks of this world are threads of one process: make a new world",
            ));
        }
        let size = self
            .launch
            .world_size
            .checked_add(count)
            .ok_or_else(|| refuse("the new world's size overflows"))?;
        let launch = Launch {
            world_size: size,
            master_port: options.rendezvous_port(&self.launch)?,
            launcher: Launcher::Explicit,
            ..self.launch.clone()
        };
        let device = self.comm.device();
        let world = World::init_with(launch, &options.clone().device(device))?;
        drop(self);
        Ok(world)
    }

    /// The launch of newcomer `index` (from 0) of `count` that
    /// [`World::admit`] with `options` lets in: rank `size() + index` of
    /// `size() + count`, at this world's rendezvous address and port. Its
    /// local rank is `index` (set the device with [`WorldOptions::device`]
    /// where that is not its GPU). Its `master_port` is the rendezvous
    /// port itself: handed over in torchrun's variables, also set
    /// `NCCL_RS_PORT` to it (under torchrun the rendezvous is otherwise
    /// at `MASTER_PORT + 1`). `index >= count` is
    /// [`Error::InvalidArgument`].
    pub fn newcomer_launch(
        &self,
        index: usize,
        count: usize,
        options: &WorldOptions,
    ) -> Result<Launch> {
        if index >= count {
            return Err(Error::InvalidArgument {
                op: "World::newcomer_launch",
                reason: format!("newcomer {index} of {count}"),
            });
        }
        let size =
            self.launch
                .world_size
                .checked_add(count)
                .ok_or_else(|| Error::InvalidArgument {
                    op: "World::newcomer_launch",
                    reason: "the new world's size overflows".to_string(),
                })?;
        Ok(Launch::explicit(
            size - count + index,
            size,
            index,
            count,
            self.launch.master_addr.clone(),
            options.rendezvous_port(&self.launch)?,
        )?)
    }
}

/// Binds the recovery rendezvous at `host` (an address of this machine),
/// else on every interface.
fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    let at = host
        .parse::<IpAddr>()
        .ok()
        .and_then(|ip| TcpListener::bind(SocketAddr::new(ip, port)).ok());
    match at {
        Some(listener) => Ok(listener),
        None => TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)),
    }
}
