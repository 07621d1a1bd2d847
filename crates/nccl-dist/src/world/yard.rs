//! Where the worlds of one team of threads ([`super::World::spawn_local`],
//! and each team recovered from it) leave the old communicators they hold
//! when they drop: the parked ones of the worlds they were shrunk from
//! ([`Retired`]) and their meshes' kept ones ([`super::Kept`]).
//!
//! A world dropping on one thread must not tear those down while the
//! team's other threads may still be in their last calls on the new
//! world's communicators: NCCL allows no calls on independent
//! communicators of one GPU from several threads at once, and with a
//! thread per GPU the last teardown of an old communicator's ranks frees
//! the resources of all of them. Torn down that way at
//! [`super::World::release_retired`], three survivors of four H100s saw
//! the third one's next all-reduce on the new world come back two-thirds
//! wrong. So a team's worlds leave them here, and the yard tears them all
//! down when its last holder goes: after every thread of the team has
//! ended, on the thread that returns from `spawn_local`. A process's
//! world (a process per GPU) has no yard and tears its own down when it
//! drops, as before.

use std::sync::{Arc, Mutex};

use nccl_safe::{Comm, KeptComm};

/// What a team's worlds left, torn down when the last holder drops it:
/// the meshes' kept communicators together, then the retired ones in
/// rounds, the children of every world together before their parents
/// (each world's list is in that order, and every world of a team went
/// through the same recoveries).
pub(super) struct Yard<M = KeptComm, C = Comm> {
    left: Mutex<Left<M, C>>,
}

struct Left<M, C> {
    meshes: Vec<M>,
    /// One list per world, children before parents.
    retired: Vec<Vec<C>>,
}

impl<M, C> Default for Yard<M, C> {
    fn default() -> Self {
        Yard {
            left: Mutex::new(Left {
                meshes: Vec::new(),
                retired: Vec::new(),
            }),
        }
    }
}

impl<M, C> std::fmt::Debug for Yard<M, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Yard").finish_non_exhaustive()
    }
}

impl<M, C> Yard<M, C> {
    fn left(&self) -> std::sync::MutexGuard<'_, Left<M, C>> {
        self.left.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leaves a world's meshes' kept communicators.
    pub(super) fn leave_meshes(&self, meshes: Vec<M>) {
        if !meshes.is_empty() {
            self.left().meshes.extend(meshes);
        }
    }

    /// Leaves a world's retired communicators (children before parents).
    fn leave_retired(&self, retired: Vec<C>) {
        if !retired.is_empty() {
            self.left().retired.push(retired);
        }
    }
}

impl<M, C> Drop for Yard<M, C> {
    fn drop(&mut self) {
        let left = self.left.get_mut().unwrap_or_else(|p| p.into_inner());
        let meshes = std::mem::take(&mut left.meshes);
        let mut lists: Vec<_> = std::mem::take(&mut left.retired)
            .into_iter()
            .map(Vec::into_iter)
            .collect();
        if meshes.is_empty() && lists.is_empty() {
            return;
        }
        let _span = tracing::debug_span!("nccl.yard_teardown").entered();
        // Children of the retired ones: first. Every teardown of a round
        // at once, as the ranks' teardowns of one communicator wait for
        // each other.
        nccl_safe::drop_together(meshes);
        loop {
            let round: Vec<C> = lists.iter_mut().filter_map(Iterator::next).collect();
            if round.is_empty() {
                break;
            }
            nccl_safe::drop_together(round);
        }
    }
}

/// A world's retired communicators (the parked ones of the worlds it was
/// shrunk from, children before parents): with a yard (a world of a team
/// of threads) left there when the world drops, else dropped with it, in
/// their order.
pub(super) struct Retired<M = KeptComm, C = Comm> {
    comms: Vec<C>,
    yard: Option<Arc<Yard<M, C>>>,
}

impl<M, C> std::fmt::Debug for Retired<M, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retired")
            .field("comms", &self.comms.len())
            .field("yard", &self.yard.is_some())
            .finish()
    }
}

impl<M, C> Retired<M, C> {
    /// None yet; left in `yard` (where there is one) when the world drops.
    pub(super) fn new(yard: Option<Arc<Yard<M, C>>>) -> Self {
        Retired {
            comms: Vec::new(),
            yard,
        }
    }

    /// Takes over `comms` (children before parents) after those held.
    pub(super) fn extend(&mut self, comms: Vec<C>) {
        self.comms.extend(comms);
    }

    /// Hands them over (to a recovered world, or for a drop now).
    pub(super) fn take(&mut self) -> Vec<C> {
        std::mem::take(&mut self.comms)
    }
}

impl<M, C> Drop for Retired<M, C> {
    fn drop(&mut self) {
        let comms = self.take();
        match &self.yard {
            Some(yard) => yard.leave_retired(comms),
            None => drop(comms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    /// Records its name where it drops.
    struct Mark(&'static str, Arc<StdMutex<Vec<&'static str>>>);

    impl Drop for Mark {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    #[test]
    fn a_team_yard_tears_down_after_its_last_holder_meshes_first_then_round_by_round() {
        let log = Arc::new(StdMutex::new(Vec::new()));
        let mark = |name| Mark(name, Arc::clone(&log));
        let yard: Arc<Yard<Mark, Mark>> = Arc::default();
        // Two worlds of the team, each shrunk once from a parked world:
        // the old world's blocking communicator (child) and its parked
        // parent.
        let mut a = Retired::new(Some(Arc::clone(&yard)));
        a.extend(vec![mark("a-child"), mark("a-parent")]);
        let mut b = Retired::new(Some(Arc::clone(&yard)));
        b.extend(vec![mark("b-child")]);
        b.extend(vec![mark("b-parent")]);
        yard.leave_meshes(vec![mark("a-mesh")]);
        drop(a);
        drop(b);
        // The worlds are gone; the yard holds everything.
        assert!(log.lock().unwrap().is_empty());
        drop(yard);
        let log = log.lock().unwrap().clone();
        assert_eq!(log[0], "a-mesh");
        let (children, parents) = log[1..].split_at(2);
        let mut children = children.to_vec();
        children.sort();
        assert_eq!(children, ["a-child", "b-child"]);
        let mut parents = parents.to_vec();
        parents.sort();
        assert_eq!(parents, ["a-parent", "b-parent"]);
    }

    #[test]
    fn without_a_yard_they_drop_with_the_world_in_their_order() {
        let log = Arc::new(StdMutex::new(Vec::new()));
        let mut r: Retired<Mark, Mark> = Retired::new(None);
        r.extend(vec![
            Mark("child", Arc::clone(&log)),
            Mark("parent", Arc::clone(&log)),
        ]);
        drop(r);
        assert_eq!(*log.lock().unwrap(), ["child", "parent"]);
        // Taken ones are the taker's: nothing left to drop.
        let mut r: Retired<Mark, Mark> = Retired::new(Some(Arc::default()));
        r.extend(vec![Mark("taken", Arc::clone(&log))]);
        let taken = r.take();
        drop(r);
        assert_eq!(log.lock().unwrap().len(), 2);
        drop(taken);
        assert_eq!(log.lock().unwrap().len(), 3);
    }
}
