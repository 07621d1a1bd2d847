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
//! over, never beside them (NCCL allows no calls on independent
//! communicators of one GPU from several threads at once).

use std::sync::{Arc, Mutex, Weak};

use nccl_safe::{AbortCause, AbortSignal, Comm, KeptComm, WeakAbortHandle};

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
    kept: Vec<KeptComm>,
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

    /// The kept communicators, handed over (to a recovered world).
    fn take(&self) -> Vec<KeptComm> {
        std::mem::take(&mut self.state().kept)
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
        st.kept.extend(kept);
    }

    /// The world drops: keeps nothing from now on, and gives back what it
    /// kept (for the caller to drop, outside the lock).
    fn close(&self) -> Vec<KeptComm> {
        let mut st = self.state();
        st.closed = true;
        st.watched.clear();
        std::mem::take(&mut st.kept)
    }
}

/// A world's [`Keeper`], where its communicators park on a loss and a
/// liveness channel names losses; its drop tears down what it kept, on the
/// dropping thread, before the world's own communicators go (a field
/// before them).
#[derive(Default)]
pub(super) struct Kept(Option<Arc<Keeper>>);

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Kept(on)"
        } else {
            "Kept(off)"
        })
    }
}

impl Kept {
    /// A keeper that a loss named on `liveness` fills, where `parks`; none
    /// otherwise. The channel's hook holds it weakly: once the world is
    /// gone a loss keeps nothing.
    pub(super) fn on(liveness: Option<&Liveness>, parks: bool) -> Kept {
        let Some(liveness) = liveness.filter(|_| parks) else {
            return Kept(None);
        };
        let keeper = Arc::new(Keeper::default());
        let weak = Arc::downgrade(&keeper);
        liveness.on_loss(Arc::new(move |_: &PeerLoss| {
            if let Some(k) = weak.upgrade() {
                k.keep_all();
            }
        }));
        Kept(Some(keeper))
    }

    /// Where a mesh of this world watches its communicators.
    pub(super) fn weak(&self) -> Weak<Keeper> {
        self.0.as_ref().map_or_else(Weak::new, Arc::downgrade)
    }

    /// What this world kept, handed over to the world recovered from it.
    pub(super) fn take(&self) -> Vec<KeptComm> {
        self.0.as_ref().map(|k| k.take()).unwrap_or_default()
    }

    /// Takes over what an old world kept (torn down with this world).
    pub(super) fn adopt(&self, kept: Vec<KeptComm>) {
        match &self.0 {
            Some(k) => k.adopt(kept),
            None => nccl_safe::drop_together(kept),
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(k) = self.0.take() {
            nccl_safe::drop_together(k.close());
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
        // No keeper where the world parks not, or no channel names losses.
        assert!(Kept::on(Some(&live), false).weak().upgrade().is_none());
        assert!(Kept::on(None, true).weak().upgrade().is_none());
        let kept = Kept::on(Some(&live), true);
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
    }
}
