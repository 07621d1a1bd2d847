//! What a world does on a loss its liveness channel names: the signal
//! aborts (or parks) every communicator of the job ([`abort_on_loss`]),
//! and the world keeps its meshes' parked communicators from their
//! teardown ([`Keeper`]).
//!
//! A mesh's own communicators (its axes, a flattened group) park on a loss
//! as the world's do, where the world's park
//! ([`WorldOptions::recover_by_shrink`](super::WorldOptions::recover_by_shrink)).
//! Parked, NCCL still holds them, and only their teardown would abort
//! them: NCCL's abort, which waits up to half a second for each
//! communicator's proxy thread (`docs/architecture.md`, "Recovery,
//! measured"). So the world keeps them ([`nccl_safe::KeptComm`]) from the
//! moment of the loss: a mesh dropped after it (before or after
//! [`World::recover`](super::World::recover)) tears nothing down, the
//! recovery waits for no abort of them, and the recovered world takes
//! them over and tears them down when it drops, after its own calls are
//! over (with a thread per GPU: after every thread's world is gone,
//! [`super::yard`]), or at
//! [`World::release_retired`](super::World::release_retired) on the
//! caller's say, never beside them (NCCL allows no calls on independent
//! communicators of one GPU from several threads at once).

use std::sync::{Arc, Mutex, Weak};

use nccl_safe::{AbortCause, AbortSignal, Comm, KeptComm, WeakAbortHandle};

use super::yard::{Retired, Yard};
use crate::liveness::{Liveness, PeerLoss};
use crate::watchdog::Watchdog;

/// On a loss: every watched communicator fails with it (naming the
/// operation it was at), and the signal aborts every communicator of the
/// job, those still being made included. Never waits.
///
/// `parks` (the world's communicators park on a loss,
/// [`WorldOptions::recover_by_shrink`](super::WorldOptions::recover_by_shrink)): the signal goes first, so that its
/// one NCCL group sets every abort flag before any wait for kernels (a
/// parked world's are stopped only there, and the watchdog's aborts one at
/// a time could wait behind them); the watchdog then records the loss on
/// communicators already aborted or parked.
pub(super) fn abort_on_loss(
    liveness: &Liveness,
    watchdog: Option<Watchdog>,
    signal: AbortSignal,
    parks: bool,
) {
    // The hooks abort communicators: an exit waits for those the channel
    // runs on a thread of its own.
    liveness.hold_exit_with(Arc::new(|limit| Box::new(nccl_safe::ExitHold::new(limit))));
    liveness.on_loss(Arc::new(move |loss: &PeerLoss| {
        let trigger = || {
            signal.trigger(AbortCause::PeerLost {
                rank: loss.rank,
                detail: loss.to_string(),
            })
        };
        if parks {
            trigger();
        }
        if let Some(w) = &watchdog {
            w.peer_lost(loss);
        }
        if !parks {
            trigger();
        }
    }));
}

/// A world's meshes' own communicators: watched (weakly) while all is
/// well, kept from their teardown once a loss is named.
#[derive(Default)]
pub(crate) struct Keeper {
    state: Mutex<KeeperState>,
}

#[derive(Default)]
struct KeeperState {
    watched: Vec<WeakAbortHandle>,
    /// This world's own, kept since its loss.
    kept: Vec<KeptComm>,
    /// Older worlds' (those this one was recovered from), adopted.
    adopted: Vec<KeptComm>,
    /// The world dropped: nothing is kept any more.
    closed: bool,
}

impl Keeper {
    fn state(&self) -> std::sync::MutexGuard<'_, KeeperState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `comm` (a mesh's own communicator): kept if a loss is named
    /// while it exists. Never keeps it alive before that.
    pub(crate) fn watch(&self, comm: &Comm) {
        let mut st = self.state();
        if st.closed {
            return;
        }
        st.watched.retain(WeakAbortHandle::is_alive);
        st.watched.push(comm.abort_handle().downgrade());
    }

    /// A loss was named: keeps every watched communicator that still
    /// exists (parked, or aborted where it could not park).
    fn keep_all(&self) {
        let mut st = self.state();
        if st.closed {
            return;
        }
        let watched = std::mem::take(&mut st.watched);
        let kept: Vec<KeptComm> = watched.iter().filter_map(WeakAbortHandle::keep).collect();
        st.kept.extend(kept);
    }

    /// The kept communicators, the adopted ones first, handed over (to a
    /// recovered world).
    fn take(&self) -> Vec<KeptComm> {
        self.state().take_all()
    }

    /// The adopted communicators (older worlds'), given back for the
    /// caller to drop; this world's own stay.
    fn release_adopted(&self) -> Vec<KeptComm> {
        std::mem::take(&mut self.state().adopted)
    }

    /// Takes over `kept` (an old world's); dropped here at once where this
    /// keeper is closed.
    fn adopt(&self, kept: Vec<KeptComm>) {
        let mut st = self.state();
        if st.closed {
            drop(st);
            nccl_safe::drop_together(kept);
            return;
        }
        st.adopted.extend(kept);
    }

    /// The world drops: keeps nothing from now on, and gives back what it
    /// kept (for the caller to drop, outside the lock).
    fn close(&self) -> Vec<KeptComm> {
        let mut st = self.state();
        st.closed = true;
        st.watched.clear();
        st.take_all()
    }
}

impl KeeperState {
    /// Everything kept, the adopted ones first.
    fn take_all(&mut self) -> Vec<KeptComm> {
        let mut all = std::mem::take(&mut self.adopted);
        all.append(&mut self.kept);
        all
    }
}

/// The keepers of the worlds on one liveness channel (a process's world,
/// or the worlds of one process's threads), hooked onto the channel
/// before [`abort_on_loss`]: on a loss they keep their meshes'
/// communicators before the signal parks them. The trigger holds every
/// member for a moment; a mesh dropped meanwhile, not yet kept, would
/// otherwise be torn down on the channel's thread when the trigger lets
/// go, beside the survivors' recovery on the same GPU.
#[derive(Clone, Default)]
pub(super) struct Keepers {
    list: Option<Arc<Mutex<Vec<Weak<Keeper>>>>>,
    /// The worlds of a team of threads leave their old communicators
    /// here when they drop ([`super::yard`]).
    yard: Option<Arc<Yard>>,
}

impl Keepers {
    /// Hooks the keepers onto `liveness` where the worlds' communicators
    /// `parks`; none otherwise. Call before [`abort_on_loss`].
    pub(super) fn first_on(liveness: Option<&Liveness>, parks: bool) -> Keepers {
        let Some(liveness) = liveness.filter(|_| parks) else {
            return Keepers::default();
        };
        let list: Arc<Mutex<Vec<Weak<Keeper>>>> = Arc::default();
        let hooked = Arc::clone(&list);
        liveness.on_loss(Arc::new(move |_: &PeerLoss| {
            let keepers: Vec<Arc<Keeper>> = hooked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
            for k in keepers {
                k.keep_all();
            }
        }));
        Keepers {
            list: Some(list),
            yard: None,
        }
    }

    /// The keepers of a team of threads: its worlds leave their old
    /// communicators in one yard, torn down once all of them are gone.
    pub(super) fn in_a_team(self) -> Keepers {
        Keepers {
            yard: Some(Arc::default()),
            ..self
        }
    }

    /// A new world's [`Retired`]: left in the team's yard, if any.
    pub(super) fn retired(&self) -> Retired {
        Retired::new(self.yard.clone())
    }

    /// A new world's [`Kept`], filled by a loss on this channel (where
    /// there are keepers).
    pub(super) fn kept(&self) -> Kept {
        let keeper = Arc::new(Keeper::default());
        if let Some(list) = &self.list {
            let mut list = list.lock().unwrap_or_else(|p| p.into_inner());
            list.retain(|w| w.strong_count() > 0);
            list.push(Arc::downgrade(&keeper));
        }
        Kept {
            keeper,
            hooked: self.list.is_some(),
            yard: self.yard.clone(),
        }
    }
}

/// A world's [`Keeper`]: filled by a loss where the world's communicators
/// park and a liveness channel names losses ([`Keepers`]), and holding
/// what an older world kept in any case (a recovered world of one rank
/// has no channel). Its drop tears down what it kept, on the dropping
/// thread, before the world's own communicators go (a field before them),
/// or leaves it in its team's yard.
#[derive(Default)]
pub(super) struct Kept {
    keeper: Arc<Keeper>,
    /// A loss fills it: meshes register with it.
    hooked: bool,
    yard: Option<Arc<Yard>>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("hooked", &self.hooked)
            .finish()
    }
}

impl Kept {
    /// Where a mesh of this world watches its communicators (a dangling
    /// reference where no loss fills this keeper).
    pub(super) fn weak(&self) -> Weak<Keeper> {
        if self.hooked {
            Arc::downgrade(&self.keeper)
        } else {
            Weak::new()
        }
    }

    /// What this world kept, handed over to the world recovered from it:
    /// first whatever it watches and still exists (idempotent: the hook
    /// may not have run yet when the signal already fired).
    pub(super) fn take(&self) -> Vec<KeptComm> {
        self.keeper.keep_all();
        self.keeper.take()
    }

    /// Takes over what an old world kept (torn down with this world, or
    /// at [`super::World::release_retired`]).
    pub(super) fn adopt(&self, kept: Vec<KeptComm>) {
        self.keeper.adopt(kept);
    }

    /// What this world took over from older worlds, given back for the
    /// caller to drop ([`super::World::release_retired`]).
    pub(super) fn release_adopted(&self) -> Vec<KeptComm> {
        self.keeper.release_adopted()
    }
}

impl Kept {
    /// Tears down what it kept now, on this thread, a team's yard or not
    /// (a world given up: NCCL must be done with them before the new
    /// world's communicators are made).
    pub(super) fn tear_down(mut self) {
        self.yard = None;
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        let kept = self.keeper.close();
        match &self.yard {
            Some(yard) => yard.leave_meshes(kept),
            None => nccl_safe::drop_together(kept),
        }
    }
}

impl super::World {
    /// Where a mesh of this world watches its own communicators, to have
    /// them kept past a loss (a dangling reference where they park not).
    pub(crate) fn keeper(&self) -> Weak<Keeper> {
        self.kept.weak()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::liveness::LossCause;

    fn loss(rank: usize) -> PeerLoss {
        PeerLoss {
            rank,
            cause: LossCause::ConnectionClosed,
            seen_by: rank,
        }
    }

    #[test]
    fn a_keeper_lives_with_its_world_and_only_where_it_parks() {
        let live = Liveness::in_process(3);
        // No keeper to register with where the world parks not, or no
        // channel names losses.
        let off = Keepers::first_on(Some(&live), false).kept();
        assert!(off.weak().upgrade().is_none());
        assert!(
            Keepers::first_on(None, true)
                .kept()
                .weak()
                .upgrade()
                .is_none()
        );
        // Adopted ones are held all the same (none here).
        off.adopt(Vec::new());
        assert!(off.release_adopted().is_empty());
        assert!(off.take().is_empty());
        let keepers = Keepers::first_on(Some(&live), true);
        let kept = keepers.kept();
        let weak = kept.weak();
        assert!(weak.upgrade().is_some());
        // A loss with nothing watched keeps nothing.
        live.report(loss(1));
        assert!(kept.take().is_empty());
        // The channel's hook holds it weakly: the world's drop ends it,
        // and a later loss finds none.
        drop(kept);
        assert!(weak.upgrade().is_none());
        live.report(loss(2));
        assert_eq!(live.losses().len(), 2);
        // The channel's list forgets dropped worlds' keepers.
        let again = keepers.kept();
        assert_eq!(
            keepers
                .list
                .as_ref()
                .map(|l| l.lock().unwrap_or_else(|p| p.into_inner()).len()),
            Some(1)
        );
        drop(again);
    }
}
