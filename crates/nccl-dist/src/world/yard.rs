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

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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
        let retired = std::mem::take(&mut left.retired);
        let _span = tracing::debug_span!("nccl.yard_teardown").entered();
        tear_down(meshes, retired);
    }
}

/// Tears down old communicators of one or more worlds (a team's, or
/// one world's at [`super::World::release_retired`]): the meshes' kept
/// communicators together (children of the retired ones), then the
/// retired ones in rounds, every world's first together, then every
/// world's second, and so on (children before parents). Each round's
/// teardowns run at once, as the ranks' teardowns of one communicator
/// wait for each other, and each round is bounded as
/// [`nccl_safe::drop_together`] is (one with a single list drops it in
/// its order, each waited for, as dropping the list would).
pub(super) fn tear_down<M, C>(meshes: Vec<M>, retired: Vec<Vec<C>>) {
    nccl_safe::drop_together(meshes);
    let mut lists: Vec<_> = retired.into_iter().map(Vec::into_iter).collect();
    loop {
        let round: Vec<C> = lists.iter_mut().filter_map(Iterator::next).collect();
        if round.is_empty() {
            break;
        }
        nccl_safe::drop_together(round);
    }
}

/// Where the threads of one world meet to release their old
/// communicators together ([`super::World::release_retired`] with a
/// thread per GPU): each leaves its own here; the last of the world's
/// ranks to come tears everything down at once (as a yard does), while
/// the others wait, so no thread of the team issues a call beside a
/// teardown, and none goes on before the teardown is over.
pub(super) struct Meeting<M = KeptComm, C = Comm> {
    state: Mutex<Gathering<M, C>>,
    cv: Condvar,
}

struct Gathering<M, C> {
    /// Meetings held so far: a waiter's meeting is over once it moved on.
    held: u64,
    /// The last one came: the teardown runs.
    tearing: bool,
    /// Who is here, under a ticket of their own, with what they left.
    here: Vec<(u64, Vec<M>, Vec<C>)>,
    tickets: u64,
}

/// How a meeting ended for one of its ranks.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Met<M, C> {
    /// Everything was torn down, this rank's included.
    Released,
    /// Not every rank came by the deadline: this rank's are given back.
    Missed(Vec<M>, Vec<C>),
    /// Every rank came, but the teardown outlasted its allowance: it goes
    /// on in the background, this rank's included.
    Late,
}

impl<M, C> Default for Meeting<M, C> {
    fn default() -> Self {
        Meeting {
            state: Mutex::new(Gathering {
                held: 0,
                tearing: false,
                here: Vec::new(),
                tickets: 0,
            }),
            cv: Condvar::new(),
        }
    }
}

impl<M, C> Meeting<M, C> {
    /// Leaves `meshes` and `retired` here until `ranks` ranks have come,
    /// each within `until`; the last one tears down what all of them left
    /// and waits for it, the others wait for it at most `allowance` past
    /// `until`. A rank that comes when the others are gone waits for its
    /// own deadline and gets its own back.
    pub(super) fn release(
        &self,
        ranks: usize,
        meshes: Vec<M>,
        retired: Vec<C>,
        until: Instant,
        allowance: Duration,
    ) -> Met<M, C> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Come while a teardown runs (only a rank whose own wait ran out
        // before can): it waits for the meeting after that one.
        let meeting = st.held + u64::from(st.tearing);
        let ticket = st.tickets;
        st.tickets += 1;
        st.here.push((ticket, meshes, retired));
        if st.here.len() >= ranks && !st.tearing {
            st.tearing = true;
            let here = std::mem::take(&mut st.here);
            drop(st);
            let (meshes, retired): (Vec<Vec<M>>, Vec<Vec<C>>) =
                here.into_iter().map(|(_, m, c)| (m, c)).unzip();
            tear_down(meshes.into_iter().flatten().collect(), retired);
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.held += 1;
            st.tearing = false;
            drop(st);
            self.cv.notify_all();
            return Met::Released;
        }
        let torn_by = until.checked_add(allowance).unwrap_or(until);
        loop {
            if st.held > meeting {
                return Met::Released;
            }
            // Still here: waiting for the others, until `until`. Taken:
            // its meeting's teardown runs, waited for until `torn_by`.
            let mine = st.here.iter().position(|(t, ..)| *t == ticket);
            let limit = if mine.is_some() { until } else { torn_by };
            let left = limit.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return match mine.map(|i| st.here.remove(i)) {
                    Some((_, meshes, retired)) => Met::Missed(meshes, retired),
                    None => Met::Late,
                };
            }
            st = nccl_control::wait::at_most(&self.cv, st, left);
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

    /// Sleeps `.1` in its drop, then records its name.
    struct Slow(&'static str, Duration, Arc<StdMutex<Vec<&'static str>>>);

    impl Drop for Slow {
        fn drop(&mut self) {
            std::thread::sleep(self.1);
            self.2.lock().unwrap().push(self.0);
        }
    }

    const LONG: Duration = Duration::from_secs(20);

    #[test]
    fn a_meeting_tears_down_once_every_rank_came_and_lets_them_all_go_after() {
        let log = Arc::new(StdMutex::new(Vec::new()));
        let meeting: Arc<Meeting<Mark, Mark>> = Arc::default();
        let names = [("m0", "c0"), ("m1", "c1"), ("m2", "c2")];
        let ranks: Vec<_> = names
            .into_iter()
            .map(|(m, c)| {
                let (meeting, log) = (Arc::clone(&meeting), Arc::clone(&log));
                std::thread::spawn(move || {
                    let met = meeting.release(
                        3,
                        vec![Mark(m, Arc::clone(&log))],
                        vec![Mark(c, Arc::clone(&log))],
                        Instant::now() + LONG,
                        LONG,
                    );
                    // Nobody leaves before everything is torn down.
                    (matches!(met, Met::Released), log.lock().unwrap().len())
                })
            })
            .collect();
        for r in ranks {
            assert_eq!(r.join().unwrap(), (true, 6));
        }
        let log = log.lock().unwrap().clone();
        let mut meshes = log[..3].to_vec();
        meshes.sort();
        assert_eq!(meshes, ["m0", "m1", "m2"]);
        // A second meeting of the same ranks works the same way.
        let again: Vec<_> = (0..2)
            .map(|_| {
                let meeting = Arc::clone(&meeting);
                std::thread::spawn(move || {
                    matches!(
                        meeting.release(2, Vec::new(), Vec::new(), Instant::now() + LONG, LONG),
                        Met::Released
                    )
                })
            })
            .collect();
        assert!(again.into_iter().all(|h| h.join().unwrap()));
    }

    #[test]
    fn a_rank_whose_peers_do_not_come_gets_its_own_back_and_nothing_is_torn_down() {
        let log = Arc::new(StdMutex::new(Vec::new()));
        let meeting: Meeting<Mark, Mark> = Meeting::default();
        let started = Instant::now();
        let met = meeting.release(
            2,
            vec![Mark("m", Arc::clone(&log))],
            vec![Mark("c", Arc::clone(&log))],
            started + Duration::from_millis(50),
            LONG,
        );
        assert!(started.elapsed() >= Duration::from_millis(50));
        let Met::Missed(meshes, retired) = met else {
            panic!("expected Missed");
        };
        assert_eq!((meshes.len(), retired.len()), (1, 1));
        assert!(log.lock().unwrap().is_empty());
        // The next meeting starts empty: one rank alone completes it.
        assert!(matches!(
            meeting.release(1, Vec::new(), Vec::new(), Instant::now() + LONG, LONG),
            Met::Released
        ));
        assert!(log.lock().unwrap().is_empty());
        drop((meshes, retired));
        assert_eq!(log.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_teardown_past_its_allowance_lets_the_waiters_go_and_goes_on() {
        let log = Arc::new(StdMutex::new(Vec::new()));
        let meeting: Arc<Meeting<Slow, Slow>> = Arc::default();
        let started = Instant::now();
        // Comes first; its peers must come within 500 ms, the teardown
        // then be over 100 ms after that.
        let waiter = {
            let (meeting, log) = (Arc::clone(&meeting), Arc::clone(&log));
            std::thread::spawn(move || {
                let slow = Slow("w", Duration::from_millis(1500), log);
                let met = meeting.release(
                    2,
                    Vec::new(),
                    vec![slow],
                    started + Duration::from_millis(500),
                    Duration::from_millis(100),
                );
                (matches!(met, Met::Late), started.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        // The last one comes in time and tears both down (3 s).
        let met = meeting.release(
            2,
            Vec::new(),
            vec![Slow("l", Duration::from_millis(1500), Arc::clone(&log))],
            Instant::now() + LONG,
            LONG,
        );
        let took = started.elapsed();
        let (late, waited) = waiter.join().unwrap();
        assert!(late, "the waiter left before the teardown's end");
        assert!(
            waited >= Duration::from_millis(600) && waited < Duration::from_millis(2500),
            "{waited:?}"
        );
        assert!(matches!(met, Met::Released));
        assert!(took >= Duration::from_millis(3000), "{took:?}");
        assert_eq!(log.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_rank_that_comes_during_a_teardown_waits_for_the_next_meeting() {
        let log = Arc::new(StdMutex::new(Vec::new()));
        let meeting: Arc<Meeting<Slow, Slow>> = Arc::default();
        let slow = |name| Slow(name, Duration::from_millis(800), Arc::clone(&log));
        // A rank of a two-rank meeting with time to spare.
        let come = |item: Slow| {
            let meeting = Arc::clone(&meeting);
            std::thread::spawn(move || {
                matches!(
                    meeting.release(2, Vec::new(), vec![item], Instant::now() + LONG, LONG),
                    Met::Released
                )
            })
        };
        let first = come(slow("a"));
        std::thread::sleep(Duration::from_millis(50));
        // The second one completes the meeting and tears down for 1.6 s.
        let second = come(slow("b"));
        std::thread::sleep(Duration::from_millis(300));
        // A third comes meanwhile: not part of that meeting, it waits for
        // the next one, which nobody else joins, and gets its own back.
        let met = meeting.release(
            2,
            Vec::new(),
            vec![slow("late")],
            Instant::now() + Duration::from_millis(200),
            LONG,
        );
        let Met::Missed(_, back) = met else {
            panic!("expected Missed");
        };
        assert_eq!(back.len(), 1);
        assert!(first.join().unwrap() && second.join().unwrap());
        let mut torn = log.lock().unwrap().clone();
        torn.sort();
        assert_eq!(torn, ["a", "b"]);
        drop(back);
    }
}
