//! Recovery of a world with a thread per GPU ([`World::spawn_local`]):
//! the survivors are threads of this process, so they meet on a board in
//! memory instead of a rendezvous. The first survivor makes what the new
//! world's ranks share (its unique id, in-process liveness channel,
//! watchdog and abort signal) and posts it; the others take it, each
//! within the options' rendezvous timeout. A survivor that counted
//! differently is refused, and tells the new world's ranks that it will
//! not come (so they are not left waiting in their init).
//!
//! Limits: `spawn_local` aborts the others at once when a thread fails in
//! the world it made; in a recovered world a thread that panics is named
//! by the new world's channel (its presence reports it), but one that
//! returns an error is not, and its peers wait for it up to the operation
//! timeout. A loss reported on the old world's channel after the new one
//! was made is not carried over.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nccl_safe::UniqueId;

use super::options::WorldOptions;
use super::recover::{Old, Survivors, not_parked};
use super::resolved::{Resolved, Shape};
use super::yard::{Meeting, Met};
use super::{Keepers, Presence, World, abort_on_loss, watched};
use crate::error::{Error, Result};
use crate::launch::{Launch, Launcher};
use crate::liveness::{Liveness, LossCause, PeerLoss};
use crate::watchdog::Watchdog;

const OP: &str = "World::recover";

/// Where the threads of one in-process world meet to rebuild it: one
/// posting, for the one world that follows this one.
#[derive(Default)]
pub(super) struct Board {
    posted: Mutex<Option<Posted>>,
    cv: Condvar,
    /// Where the world's threads release their old communicators
    /// together ([`World::release_retired`]).
    meeting: Meeting,
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board").finish_non_exhaustive()
    }
}

/// A rank's communicators: the world's, the nonblocking one it was split
/// from, the configuration of children.
pub(super) type Parts = (nccl_safe::Comm, Option<nccl_safe::Comm>, nccl_safe::Config);

/// What the first survivor posted: the new world's shared parts, or why
/// it could not make them.
type Posted = std::result::Result<Arc<Team>, String>;

/// What the ranks of the rebuilt world share.
struct Team {
    /// The old ranks that make the new world, in new-rank order.
    survivors: Vec<usize>,
    /// The new world's id; `None`: the survivors shrink their parked
    /// communicators instead (the first one could).
    id: Option<UniqueId>,
    resolved: Resolved,
    watchdog: Option<Watchdog>,
    liveness: Option<Liveness>,
    /// Where the new worlds keep their meshes' communicators on a loss.
    keepers: Keepers,
    /// The board of the new world, for its own recovery.
    next: Arc<Board>,
}

impl Board {
    /// Posts once and returns the posting that stands: this one, or one
    /// made first (two survivors that each counted themselves first).
    fn post(&self, posted: Posted) -> Posted {
        let mut slot = self.posted.lock().unwrap_or_else(|p| p.into_inner());
        let standing = slot.get_or_insert(posted).clone();
        self.cv.notify_all();
        standing
    }

    /// The posting, once there, or `None` at `until`.
    fn take(&self, until: Instant) -> Option<Posted> {
        let guard = self.posted.lock().unwrap_or_else(|p| p.into_inner());
        nccl_control::wait::until(&self.cv, guard, until, |slot| slot.clone())
    }
}

impl World {
    /// [`World::release_retired`] for a world whose ranks are threads of
    /// this process: collective, on the world's `board`.
    pub(super) fn release_with_team(&mut self, board: &Board) -> Result<usize> {
        let ranks = self.launch.world_size;
        if self.resident.live() > ranks {
            return Err(Error::InvalidArgument {
                op: "World::release_retired",
                reason: "a World of something else lives in this process beside this world's threads (its threads may be issuing NCCL calls): the old communicators stay until the worlds drop".into(),
            });
        }
        let _span = tracing::debug_span!("nccl.release_retired", local = true).entered();
        // Nothing of this rank's on the world's stream runs beside the
        // teardown.
        crate::synchronize(&self.comm, self.comm.stream())?;
        let meshes = self.kept.release_adopted();
        let retired = self.retired.take();
        let mine = meshes.len() + retired.len();
        let timeout = self.comm.timeout();
        let started = Instant::now();
        let until = started.checked_add(timeout).unwrap_or(started);
        // The teardown's rounds (the meshes', then one per retired
        // communicator of a rank), each bounded by the timeout and a
        // second, as `drop_together` is.
        let rounds = u32::try_from(retired.len() + 1).unwrap_or(u32::MAX);
        let allowance = timeout
            .saturating_add(Duration::from_secs(1))
            .saturating_mul(rounds)
            .saturating_add(Duration::from_secs(1));
        match board
            .meeting
            .release(ranks, meshes, retired, until, allowance)
        {
            Met::Released => Ok(mine),
            Met::Missed(meshes, retired) => {
                self.kept.adopt(meshes);
                self.retired.extend(retired);
                Err(Error::Nccl(nccl_safe::Error::Timeout {
                    op: "World::release_retired: waiting for every thread of the world to call it (its old communicators are kept)",
                    waited: started.elapsed(),
                }))
            }
            Met::Late => Err(Error::Nccl(nccl_safe::Error::Timeout {
                op: "World::release_retired: the teardown of the world's old communicators (it goes on in the background)",
                waited: started.elapsed(),
            })),
        }
    }

    /// [`World::recover`] for a world whose ranks are threads of this
    /// process: `survivors` as this rank counted them.
    pub(super) fn rebuild_local(
        self,
        board: &Board,
        survivors: Survivors,
        options: &WorldOptions,
    ) -> Result<World> {
        let refuse = |reason: String| Error::InvalidArgument { op: OP, reason };
        let _span = tracing::debug_span!(
            "nccl.world_recover",
            rank = self.launch.rank,
            new_rank = survivors.me,
            survivors = survivors.ranks.len(),
            local = true
        )
        .entered();
        let n = survivors.ranks.len();
        let (old_rank, device) = (self.launch.rank, self.comm.device());
        let shrinkable = self.can_shrink(&survivors.ranks);
        // A world that does not park gives its communicators up first,
        // before the posting, as before parking existed; NCCL is then done
        // with every thread's old communicators before anyone makes new
        // ones on the same GPUs (see `World::give_up`).
        let old = match Old::of(self) {
            Ok(old) => old,
            Err(e) => {
                // The others must not wait blind: the first survivor posts
                // why there is no new world; another takes the posting and
                // tells the new world's ranks that it will not come.
                if survivors.me == 0 {
                    let _ =
                        board.post(Err(format!("its old world was not torn down in time: {e}")));
                } else if let Some(Ok(team)) = board.take(Instant::now() + options.timeout) {
                    team.decline(old_rank, "its old world was not torn down in time");
                }
                return Err(e);
            }
        };
        // The posting (no NCCL call in it) says whether the survivors
        // shrink their parked communicators (the first survivor decides)
        // or give them up for new ones.
        let post = tracing::debug_span!("nccl.recover_post").entered();
        let posted = if survivors.me == 0 {
            let made = Team::new(survivors.ranks.clone(), shrinkable, options);
            Some(board.post(made.map_err(|e| e.to_string())))
        } else {
            board.take(Instant::now() + options.timeout)
        };
        drop(post);
        let team = match posted {
            Some(Ok(team)) => team,
            Some(Err(reason)) => {
                return Err(refuse(format!(
                    "the first survivor could not make the new world: {reason}"
                )));
            }
            None => {
                return Err(refuse(format!(
                    "the first survivor (old rank {}) posted no new world within {:?}",
                    survivors.leader(),
                    options.timeout
                )));
            }
        };
        if team.survivors != survivors.ranks {
            team.decline(old_rank, "it counted the survivors differently");
            return Err(refuse(format!(
                "the survivors were counted differently: ranks {:?} here, {:?} by the first survivor",
                survivors.ranks, team.survivors
            )));
        }
        let me = survivors.me;
        let Some(id) = &team.id else {
            let this = match old {
                Old::Kept(this) if shrinkable => this,
                old => {
                    let error = not_parked();
                    // The others' shrinks end at any abort asked for
                    // meanwhile: a loss on the old world's channel asks
                    // for one.
                    old.gone(&error);
                    team.decline(old_rank, "its communicators were aborted or do not park");
                    return Err(error);
                }
            };
            let shrinking = match this.park_for_shrink(&survivors.ranks) {
                Ok(s) => s,
                Err(e) => {
                    team.decline(
                        old_rank,
                        "its old world's other communicators were not aborted in time",
                    );
                    return Err(e);
                }
            };
            let made = thread_comms(
                &team.resolved,
                me,
                team.liveness.as_ref(),
                &team.watchdog,
                |r| r.shrink_comms(&shrinking.parked, &shrinking.excluded, me, n),
            )
            .map(|parts| team.world(me, parts));
            return shrinking.finish(made);
        };
        let old = match old.give_up() {
            Ok(old) => old,
            Err(e) => {
                // The others must not wait blind for this rank in their
                // init: it tells the new world that it will not come.
                team.decline(old_rank, "its old world was not torn down in time");
                return Err(e);
            }
        };
        let parts = thread_comms(
            &team.resolved,
            me,
            team.liveness.as_ref(),
            &team.watchdog,
            |r| r.make_comms(id, me, n, device, Shape::Split),
        )?;
        let world = team.world(me, parts);
        // The rest of the old world (its channel membership, its
        // watchdog) goes only now.
        let _old = tracing::debug_span!("nccl.recover_drop_old").entered();
        drop(old);
        Ok(world)
    }
}

impl Team {
    /// Where the new world counts old rank `old_rank`, its ranks would wait
    /// for it in their init: it tells them that it will not come.
    fn decline(&self, old_rank: usize, reason: &str) {
        if let (Some(l), Some(at)) = (
            &self.liveness,
            self.survivors.iter().position(|&r| r == old_rank),
        ) {
            l.report(PeerLoss {
                rank: at,
                cause: LossCause::Exited {
                    reason: reason.into(),
                },
                seen_by: at,
            });
        }
    }

    /// Rank `me`'s world of this team, of its communicators `parts`.
    fn world(&self, me: usize, (comm, control, child_config): Parts) -> World {
        World {
            presence: Presence {
                rank: me,
                liveness: self.liveness.clone(),
            },
            kept: self.keepers.kept(),
            comm,
            control,
            child_config,
            launch: local_launch(me, self.survivors.len()),
            watchdog: self.watchdog.clone(),
            signal: self.resolved.signal.clone(),
            local: Some(Arc::clone(&self.next)),
            retired: self.keepers.retired(),
            resident: super::resident::Resident::new(),
        }
    }

    fn new(survivors: Vec<usize>, shrink: bool, options: &WorldOptions) -> Result<Arc<Team>> {
        let resolved = Resolved::new(options)?;
        // `ncclGetUniqueId` starts a bootstrap root: only for new ones.
        let id = if shrink { None } else { Some(UniqueId::new()?) };
        let (watchdog, liveness, keepers) = local_team(&resolved, survivors.len())?;
        Ok(Arc::new(Team {
            survivors,
            id,
            resolved,
            watchdog,
            liveness,
            keepers,
            next: Arc::default(),
        }))
    }
}

/// What the threads of an in-process world of `n` ranks share: the
/// watchdog, and (liveness on, more than one rank) the in-process
/// channel, which gates their calls and aborts them all on a loss, with
/// the keepers of their meshes' communicators hooked before that abort.
pub(super) fn local_team(
    resolved: &Resolved,
    n: usize,
) -> Result<(Option<Watchdog>, Option<Liveness>, Keepers)> {
    let watchdog = resolved.start_watchdog()?;
    let liveness = (resolved.liveness.is_enabled() && n > 1).then(|| Liveness::in_process(n));
    let parks = resolved.parks_for(Shape::Split, n);
    let keepers = Keepers::first_on(liveness.as_ref(), parks).in_a_team();
    if let Some(l) = &liveness {
        if let Some(w) = &watchdog {
            w.gate_over(l);
        }
        abort_on_loss(l, watchdog.clone(), resolved.signal.clone(), parks);
    }
    Ok((watchdog, liveness, keepers))
}

/// This rank's communicators in a world of threads of one process (made
/// or recovered), watched and connected. A failure that is not a peer's
/// loss is reported as this rank's own, so the others, who wait for it
/// inside their init or connection, stop at once.
pub(super) fn thread_comms(
    resolved: &Resolved,
    rank: usize,
    liveness: Option<&Liveness>,
    watchdog: &Option<Watchdog>,
    make: impl FnOnce(&Resolved) -> Result<Parts>,
) -> Result<Parts> {
    let made = make(resolved).and_then(|(comm, control, child_config)| {
        watched(&comm, watchdog, true);
        resolved.connect(&[&comm])?;
        Ok((comm, control, child_config))
    });
    if let Err(e) = &made
        && let Some(l) = liveness
        && e.lost_rank().is_none()
    {
        l.report(PeerLoss {
            rank,
            cause: LossCause::Exited {
                reason: e.to_string(),
            },
            seen_by: rank,
        });
    }
    made
}

pub(super) fn local_launch(rank: usize, size: usize) -> Launch {
    Launch {
        rank,
        world_size: size,
        local_rank: rank,
        local_world_size: size,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        launcher: Launcher::Local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_posting_reaches_every_waiter_and_the_first_one_stays() {
        let board = Arc::new(Board::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let board = Arc::clone(&board);
                std::thread::spawn(move || {
                    board
                        .take(Instant::now() + Duration::from_secs(10))
                        .map(|p| p.err())
                })
            })
            .collect();
        assert_eq!(
            board.post(Err("first".into())).err().as_deref(),
            Some("first")
        );
        assert_eq!(
            board.post(Err("second".into())).err().as_deref(),
            Some("first")
        );
        for w in waiters {
            assert_eq!(w.join().unwrap(), Some(Some("first".to_string())));
        }
    }

    #[test]
    fn a_wait_without_a_posting_ends_at_its_deadline() {
        let board = Board::default();
        let started = Instant::now();
        assert!(
            board
                .take(Instant::now() + Duration::from_millis(50))
                .is_none()
        );
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
