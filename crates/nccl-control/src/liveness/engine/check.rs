//! The opt-in call check: before a call on a checked communicator, every
//! rank sends it to the hub (`Check`), the hub collects one call per live
//! rank for that key and sequence number, compares them and sends every
//! member the outcome (`Checked`). Bounded everywhere: a rank waits at most
//! its timeout, the hub gives up on a check at its deadline and naming the
//! ranks that did not come, and it holds at most [`MAX_PENDING`] checks.
//! Nothing here runs, locks or allocates unless the check is on.
//!
//! The same machinery serves the connection gate (`Shared::gate_all`): a check
//! whose key ends in `|` and the world ranks that take part (`…|2,3`),
//! made before a call that may connect inside NCCL. The hub waits for
//! those ranks only; at its deadline it names the ones that did not come
//! to those that did, and reports them lost
//! ([`LossCause::NeverCalled`]), so every rank, the silent one included,
//! learns it. Ranks of one process (threads) meet in `checks` itself, each
//! waiter ending a gate whose deadline passed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Role, Shared};
use crate::culprit::{Call, Checked};
use crate::link::{Link, lock};
use crate::liveness::{LossCause, PeerLoss};
use crate::wire::Msg;

/// Unfinished checks the hub holds at once, or twice the world where that
/// is more (gates of two ranks can be pending for every pair at once): a
/// peer cannot make it store more; one past that is answered at once as
/// not checked in by the rest.
const MAX_PENDING: usize = 64;
/// Outcomes kept for a waiter that has not taken its own yet.
const MAX_RESULTS: usize = 64;
/// The hub's share of the check wait before it gives up on the ranks that
/// did not check in (the rest carries the outcome back).
const HUB_SHARE: f64 = 0.9;
/// How long the hub waits for every rank when nobody told it (the
/// default operation timeout).
const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// One check the hub is collecting.
struct Pending {
    key: String,
    seq: u64,
    deadline: Instant,
    calls: Vec<(usize, Call)>,
    /// A gate's ranks (from its key); `None` for a call check (every
    /// rank).
    members: Option<Vec<usize>>,
}

/// What a gate's ranks all send: gates compare nothing but who came.
pub(crate) const GATE_CALL: Call = Call {
    op: "ncclAllReduce",
    count: 0,
    dtype: nccl_sys::ncclDataType_t::ncclInt8,
    peer: None,
    reduction: None,
};

/// The ranks of a gate, from its key (`…|r1,r2,…`, or `…|a+d*n` for
/// the `n` ranks `a`, `a + d`, …): distinct, in the world, at least one;
/// `None` for any other key (a call check).
pub fn gate_members(key: &str, world: usize) -> Option<Vec<usize>> {
    let (_, list) = key.rsplit_once('|')?;
    let out: Vec<usize> = match list.split_once('+') {
        Some((a, rest)) => {
            let (d, n) = rest.split_once('*')?;
            let (a, d, n): (usize, usize, usize) =
                (a.parse().ok()?, d.parse().ok()?, n.parse().ok()?);
            if d == 0 || n == 0 || n > world {
                return None;
            }
            (0..n)
                .map(|i| a.checked_add(i.checked_mul(d)?))
                .collect::<Option<_>>()?
        }
        None => list
            .split(',')
            .map(|p| p.parse().ok())
            .collect::<Option<_>>()?,
    };
    let mut seen = out.clone();
    seen.sort_unstable();
    seen.dedup();
    (!out.is_empty() && seen.len() == out.len() && out.iter().all(|&r| r < world)).then_some(out)
}

/// Call-check state of one rank.
pub(super) struct Checks {
    pending: Vec<Pending>,
    /// Among threads: losses a gate found, for the waiter to report.
    reports: Vec<PeerLoss>,
    results: Vec<(String, u64, Checked)>,
    /// How long the hub waits for every rank of a check.
    wait: Duration,
}

impl Default for Checks {
    fn default() -> Self {
        Checks {
            pending: Vec::new(),
            reports: Vec::new(),
            results: Vec::new(),
            wait: DEFAULT_WAIT,
        }
    }
}

impl Shared {
    /// How long the hub waits for every rank of a check (the operation
    /// timeout; [`HUB_SHARE`] of it).
    pub(super) fn set_check_wait(&self, wait: Duration) {
        lock(&self.checks).wait = wait;
    }

    /// The hub: adds `rank`'s `call` to the check `seq` of `key`, and
    /// finishes the check once every live rank is in.
    fn add_check(&self, key: &str, seq: u64, rank: usize, call: Call) {
        let done = {
            let mut checks = lock(&self.checks);
            let wait = checks.wait;
            let at = checks
                .pending
                .iter()
                .position(|p| p.key == key && p.seq == seq);
            let at = match at {
                Some(at) => at,
                None if checks.pending.len() >= MAX_PENDING.max(2 * self.world) => {
                    drop(checks);
                    let others = (0..self.world).filter(|r| *r != rank).collect();
                    let outcome = Checked::of(seq, &[], others);
                    return self.deliver(key.to_string(), seq, outcome, Some(rank));
                }
                None => {
                    checks.pending.push(Pending {
                        key: key.to_string(),
                        seq,
                        deadline: crate::frame::deadline_after(
                            Instant::now(),
                            wait.mul_f64(HUB_SHARE),
                        ),
                        calls: Vec::with_capacity(self.world),
                        members: gate_members(key, self.world),
                    });
                    checks.pending.len() - 1
                }
            };
            let p = &mut checks.pending[at];
            if !p.calls.iter().any(|(r, _)| *r == rank) {
                p.calls.push((rank, call));
            }
            let missing = self.missing(p);
            missing.is_empty().then(|| checks.pending.remove(at))
        };
        if let Some(p) = done {
            self.finish(p);
        }
    }

    /// Sends the outcome of a finished check or gate; a gate's missing
    /// ranks are then reported lost (after the outcome, so a waiter reads
    /// the names before the loss).
    fn finish(&self, p: Pending) {
        let missing = self.missing(&p);
        let outcome = Checked::of(p.seq, &p.calls, missing.clone());
        let arrived: Vec<usize> = p.calls.iter().map(|(r, _)| *r).collect();
        if self.role == Role::InProcess {
            // Every waiting thread takes a copy, by its own rank.
            for r in &arrived {
                self.on_checked(p.key.clone(), *r as u64, outcome.clone());
            }
        } else if p.members.is_some() {
            // A gate's outcome goes to the ranks that came only: the
            // others' bounded store of outcomes must keep their own.
            for r in &arrived {
                self.deliver(p.key.clone(), p.seq, outcome.clone(), Some(*r));
            }
        } else {
            self.deliver(p.key.clone(), p.seq, outcome, None);
        }
        // Once a loss is known the job is being torn down: a rank that
        // did not come to a gate may have stopped at that loss, and is not
        // named a second culprit.
        if p.members.is_some() && !self.knows_a_loss() {
            let waited = lock(&self.checks).wait;
            let seen_by = self.rank.or(arrived.first().copied()).unwrap_or(0);
            let call = p.key.rsplit_once('|').map_or(p.key.as_str(), |(k, _)| k);
            let losses: Vec<PeerLoss> = missing
                .into_iter()
                .map(|rank| PeerLoss {
                    rank,
                    cause: LossCause::NeverCalled {
                        what: format!(
                            "the call that connects it ({call}) that ranks {arrived:?} \
                             waited in for {waited:?}"
                        ),
                    },
                    seen_by,
                })
                .collect();
            if self.role == Role::InProcess {
                // Among threads the report runs the hooks on the
                // reporter's thread, and they abort every communicator of
                // the job: not on the waiter's, which returns its outcome
                // first (`Exchanger::gate` reports on a thread of its own).
                lock(&self.checks).reports.extend(losses);
                return;
            }
            for loss in losses {
                self.report(loss);
            }
        }
    }

    /// The live ranks that have not checked in to `p`.
    fn missing(&self, p: &Pending) -> Vec<usize> {
        let all: Vec<usize>;
        let ranks = match &p.members {
            Some(m) => m.as_slice(),
            None => {
                all = (0..self.world).collect();
                &all
            }
        };
        ranks
            .iter()
            .copied()
            .filter(|r| {
                !p.calls.iter().any(|(c, _)| c == r) && !self.is_lost(*r) && !self.is_gone(*r)
            })
            .collect()
    }

    /// The hub: sends `outcome` to every member (or only to `only`) and
    /// keeps it for this rank's own waiter.
    fn deliver(&self, key: String, seq: u64, outcome: Checked, only: Option<usize>) {
        for link in self.links() {
            if !link.to_hub && only.is_none_or(|r| r == link.peer) {
                link.send(&Msg::Checked {
                    key: key.clone(),
                    seq,
                    outcome: outcome.clone(),
                });
            }
        }
        if only.is_none_or(|r| Some(r) == self.rank) {
            self.on_checked(key, seq, outcome);
        }
    }

    /// The hub: ends the checks whose deadline passed, naming the ranks
    /// that did not check in, and those that wait for no live rank any
    /// more (the ones missing were lost or left since).
    pub(super) fn expire_checks(&self) {
        let now = Instant::now();
        let expired: Vec<Pending> = {
            let mut checks = lock(&self.checks);
            if checks.pending.is_empty() {
                return;
            }
            let over = |p: &Pending| p.deadline <= now || self.missing(p).is_empty();
            if !checks.pending.iter().any(over) {
                return;
            }
            let (gone, kept): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut checks.pending)
                .into_iter()
                .partition(over);
            checks.pending = kept;
            gone
        };
        for p in expired {
            self.finish(p);
        }
    }

    /// Whether this rank knows of a lost rank.
    fn knows_a_loss(&self) -> bool {
        !lock(&self.state).losses.is_empty()
    }

    /// The earliest deadline of the hub's checks (caps the thread's wait).
    pub(super) fn check_deadline(&self) -> Option<Instant> {
        lock(&self.checks).pending.iter().map(|p| p.deadline).min()
    }

    /// A member's check came in.
    pub(super) fn on_check(&self, link: &Arc<Link>, key: &str, seq: u64, call: Call) {
        self.add_check(key, seq, link.peer, call);
        self.wake();
    }

    /// The outcome of a check came in (or, on the hub, was found).
    pub(super) fn on_checked(&self, key: String, seq: u64, outcome: Checked) {
        let mut checks = lock(&self.checks);
        if checks.results.len() >= MAX_RESULTS {
            checks.results.remove(0);
        }
        checks.results.push((key, seq, outcome));
        drop(checks);
        self.check_cv.notify_all();
    }

    /// This rank is about to launch `call`, its `seq`-th checked call on
    /// `key`: the outcome within `within`, `Some(Agree)` with no channel
    /// to check over, `None` when no outcome came in time.
    pub(super) fn check(
        &self,
        key: &str,
        seq: u64,
        call: Call,
        within: Duration,
    ) -> Option<Checked> {
        let until = crate::frame::deadline_after(Instant::now(), within);
        match self.role {
            Role::Hub => {
                self.add_check(key, seq, self.rank.unwrap_or(0), call);
                self.wake();
            }
            Role::Member => {
                let Some(hub) = self.links().into_iter().find(|l| l.to_hub) else {
                    return Some(Checked::Agree);
                };
                hub.send(&Msg::Check {
                    key: key.to_string(),
                    seq,
                    call,
                });
            }
            Role::InProcess | Role::Off => return Some(Checked::Agree),
        }
        self.await_outcome(key, seq, None, until)
    }
}

impl Shared {
    /// Among threads: the losses gates found, not yet reported.
    pub(super) fn take_reports(&self) -> Vec<PeerLoss> {
        std::mem::take(&mut lock(&self.checks).reports)
    }

    /// The connection gates `keys` (see the module docs), for `me` (a
    /// world rank): arrives at every one (members follow each key's `|`),
    /// then waits for their outcomes, at most `within` in all. Per gate:
    /// `Some(Agree)` when all came (or no channel can tell: liveness off),
    /// `Some(Missing)` naming those that did not, `None` when no outcome
    /// came in time.
    pub(super) fn gate_all(
        &self,
        keys: &[&str],
        me: usize,
        within: Duration,
    ) -> Vec<Option<Checked>> {
        let until = crate::frame::deadline_after(Instant::now(), within);
        let seq = match self.role {
            Role::Hub => {
                for key in keys {
                    self.add_check(key, 0, me, GATE_CALL);
                }
                self.wake();
                0
            }
            Role::Member => {
                let Some(hub) = self.links().into_iter().find(|l| l.to_hub) else {
                    return vec![None; keys.len()];
                };
                for key in keys {
                    hub.send(&Msg::Check {
                        key: key.to_string(),
                        seq: 0,
                        call: GATE_CALL,
                    });
                }
                0
            }
            Role::InProcess => {
                for key in keys {
                    self.add_check(key, 0, me, GATE_CALL);
                }
                me as u64
            }
            Role::Off => return vec![Some(Checked::Agree); keys.len()],
        };
        let among_threads = (self.role == Role::InProcess).then_some(me);
        keys.iter()
            .map(|key| self.await_outcome(key, seq, among_threads, until))
            .collect()
    }

    /// The one wait of checks and gates: the outcome of `seq` of `key`,
    /// until `until`. `Some(Agree)` once a loss is known: the
    /// communicator is being aborted with it, and the call goes on to
    /// meet that abort (its typed error names the lost rank) instead of
    /// waiting out the timeout here. `among_threads`: this waiter's rank
    /// when the ranks are threads of this process, where no hub thread
    /// ends gates past their deadline, so the waiters do; one that gives
    /// up leaves the gate, so a late rank never finds it there and goes
    /// into NCCL alone.
    fn await_outcome(
        &self,
        key: &str,
        seq: u64,
        among_threads: Option<usize>,
        until: Instant,
    ) -> Option<Checked> {
        let mut checks = lock(&self.checks);
        loop {
            if let Some(i) = checks
                .results
                .iter()
                .position(|(k, s, _)| k == key && *s == seq)
            {
                return Some(checks.results.remove(i).2);
            }
            if self.knows_a_loss() {
                return Some(Checked::Agree);
            }
            let now = Instant::now();
            let left = until.saturating_duration_since(now);
            if left.is_zero() {
                if let Some(me) = among_threads {
                    for p in checks.pending.iter_mut().filter(|p| p.key == key) {
                        p.calls.retain(|(r, _)| *r != me);
                    }
                }
                return None;
            }
            let mut wait = left;
            if among_threads.is_some() {
                if checks.pending.iter().any(|p| p.deadline <= now) {
                    drop(checks);
                    self.expire_checks();
                    checks = lock(&self.checks);
                    continue;
                }
                if let Some(d) = checks.pending.iter().map(|p| p.deadline).min() {
                    wait = wait.min(d.saturating_duration_since(now));
                }
            }
            checks = crate::wait::at_most(&self.check_cv, checks, wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use nccl_sys::{ncclDataType_t, ncclRedOp_t};

    use super::*;
    use crate::culprit::Field;
    use crate::liveness::engine::testing::{ar, channel};
    use crate::liveness::{Exchanger, Liveness};

    /// Every rank checks `call(rank)` as check `seq`; their outcomes.
    fn check_all(
        ranks: &[Liveness],
        seq: u64,
        call: impl Fn(usize) -> Option<Call>,
        within: Duration,
    ) -> Vec<Option<Checked>> {
        let waiters: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(r, l)| (l.exchanger(), call(r)))
            .map(|(ex, call): (Exchanger, Option<Call>)| {
                std::thread::spawn(move || call.map(|c| ex.check("world", seq, c, within)))
            })
            .collect();
        waiters
            .into_iter()
            .filter_map(|w| w.join().unwrap())
            .collect()
    }

    #[test]
    fn every_rank_gets_the_same_divergence_before_launch() {
        let int32 = Call {
            dtype: ncclDataType_t::ncclInt32,
            ..ar(64)
        };
        let max = Call {
            reduction: Some(ncclRedOp_t::ncclMax),
            ..ar(64)
        };
        let bcast = |root| Call {
            op: "ncclBroadcast",
            peer: Some(root),
            reduction: None,
            ..ar(64)
        };
        let cases: [(Call, Call, Field); 5] = [
            (ar(64), ar(65), Field::Count),
            (ar(64), int32, Field::Dtype),
            (ar(64), max, Field::Reduction),
            (bcast(0), bcast(1), Field::Root),
            (ar(64), bcast(0), Field::Op),
        ];
        for world in [2, 3, 4] {
            let ranks = channel(world);
            for (seq, (common, odd, field)) in cases.iter().enumerate() {
                let seq = seq as u64;
                let started = Instant::now();
                let outcomes = check_all(
                    &ranks,
                    seq,
                    |r| Some(if r == world - 1 { *odd } else { *common }),
                    Duration::from_secs(5),
                );
                assert!(started.elapsed() < Duration::from_secs(2));
                assert_eq!(outcomes.len(), world);
                let Some(Checked::Diverged(d)) = &outcomes[0] else {
                    panic!("{world} ranks, {field}: {:?}", outcomes[0]);
                };
                assert_eq!((d.seq, d.field), (seq, *field), "{world} ranks");
                // With two ranks there is no majority: both side by side.
                let culprit = (world > 2).then_some(world - 1);
                assert_eq!(d.culprit, culprit, "{d}");
                assert!(outcomes.iter().all(|o| *o == outcomes[0]), "{outcomes:?}");
            }
            // PreMulSum handles of different numbers are the same call.
            let premul = |r: usize| {
                Some(Call {
                    reduction: Some(ncclRedOp_t(5 + r as u32)),
                    ..ar(8)
                })
            };
            let outcomes = check_all(&ranks, 99, premul, Duration::from_secs(5));
            assert!(outcomes.iter().all(|o| *o == Some(Checked::Agree)));
            for l in &ranks {
                l.leave();
            }
        }
    }

    /// A rank is lost while the others wait for it in a check: they stop
    /// waiting at once (their calls go on to meet the abort the loss
    /// brings), long before the check's own deadline.
    #[test]
    fn a_lost_rank_ends_the_wait_for_its_check() {
        let ranks = channel(3);
        let wait = Duration::from_secs(20);
        ranks[0].exchanger().set_check_wait(wait);
        let started = Instant::now();
        let waiters: Vec<_> = ranks[..2]
            .iter()
            .map(|l| {
                let ex = l.exchanger();
                std::thread::spawn(move || ex.check("world", 0, ar(8), wait))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        ranks[2].report(crate::liveness::PeerLoss {
            rank: 2,
            cause: crate::liveness::LossCause::Panicked {
                message: "a test".into(),
            },
            seen_by: 2,
        });
        for w in waiters {
            assert_eq!(w.join().unwrap(), Some(Checked::Agree));
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        for l in &ranks {
            l.leave();
        }
    }

    #[test]
    fn a_rank_that_never_checks_in_is_named_within_the_timeout() {
        let ranks = channel(3);
        let wait = Duration::from_millis(400);
        ranks[0].exchanger().set_check_wait(wait);
        let started = Instant::now();
        let outcomes = check_all(&ranks, 0, |r| (r != 2).then(|| ar(8)), wait * 3);
        let took = started.elapsed();
        assert!(took < wait * 2, "{took:?}");
        assert_eq!(outcomes.len(), 2);
        for o in &outcomes {
            assert_eq!(*o, Some(Checked::Missing(vec![2], 0)));
        }
        // A member whose hub never answers waits its own time, no more.
        let started = Instant::now();
        let quiet = ranks[1].exchanger();
        let lone = std::thread::spawn(move || quiet.check("world", 7, ar(8), wait / 4));
        assert_eq!(lone.join().unwrap(), None);
        assert!(started.elapsed() < wait * 2);
        for l in &ranks {
            l.leave();
        }
    }

    #[test]
    fn the_hub_holds_a_bounded_number_of_checks() {
        let ranks = channel(2);
        let ex = ranks[1].exchanger();
        let hub = ranks[0].exchanger();
        // The member runs ahead: each check waits a moment, unanswered,
        // and stays pending on the hub.
        for seq in 0..MAX_PENDING as u64 {
            assert_eq!(
                ex.check("world", seq, ar(1), Duration::from_millis(5)),
                None
            );
        }
        let past = ex.check("world", 1000, ar(1), Duration::from_secs(5));
        assert_eq!(past, Some(Checked::Missing(vec![0], 0)));
        let pending = hub.0.upgrade().map(|s| lock(&s.checks).pending.len());
        assert_eq!(pending, Some(MAX_PENDING));
        for l in &ranks {
            l.leave();
        }
    }

    /// The gate: ranks 0 and 1 of a pair gate meet; in a gate of three
    /// where rank 2 never comes, the others are told within the timeout,
    /// rank 2 is reported lost (to itself too), and a gate naming ranks
    /// outside the world is an ordinary check.
    fn gate_names_the_silent_rank(ranks: &[Liveness], me: impl Fn(usize) -> usize) {
        let wait = Duration::from_millis(400);
        ranks[0].exchanger().set_check_wait(wait);
        let pair: Vec<_> = (0..2)
            .map(|r| {
                let ex = ranks[r].exchanger();
                let me = me(r);
                std::thread::spawn(move || ex.gate("world@0:p|0,1", me, wait * 3))
            })
            .collect();
        for t in pair {
            assert_eq!(t.join().unwrap(), Some(Checked::Agree));
        }
        let started = Instant::now();
        let waiting: Vec<_> = (0..2)
            .map(|r| {
                let ex = ranks[r].exchanger();
                let me = me(r);
                std::thread::spawn(move || ex.gate("world@0:c|0,1,2", me, wait * 3))
            })
            .collect();
        for t in waiting {
            assert_eq!(t.join().unwrap(), Some(Checked::Missing(vec![2], 0)));
        }
        assert!(started.elapsed() < wait * 2, "{:?}", started.elapsed());
        let until = Instant::now() + wait * 4;
        for l in ranks {
            while !l.is_lost(2) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            let loss = l.first_loss().expect("rank 2 reported lost");
            assert_eq!(loss.rank, 2);
            assert!(
                matches!(&loss.cause, crate::liveness::LossCause::NeverCalled { what } if what.contains("world@0:c")),
                "{loss}"
            );
        }
        assert_eq!(gate_members("world@0:c|0,1,2", 3), Some(vec![0, 1, 2]));
        assert_eq!(gate_members("k:c|1+2*3", 6), Some(vec![1, 3, 5]));
        assert_eq!(gate_members("k:c|1+2*3", 5), None);
        assert_eq!(gate_members("k:c|0+0*3", 5), None);
        assert_eq!(gate_members("world@0:c|0,3", 3), None);
        assert_eq!(gate_members("world@0:c|1,1", 3), None);
        assert_eq!(gate_members("world", 3), None);
    }

    #[test]
    fn a_gate_over_the_channel_names_the_rank_that_never_came() {
        let ranks = channel(3);
        gate_names_the_silent_rank(&ranks, |r| r);
        for l in &ranks {
            l.leave();
        }
    }

    #[test]
    fn a_gate_among_threads_names_the_thread_that_never_came() {
        let live = Liveness::in_process(3);
        let ranks = vec![live.clone(), live.clone(), live];
        gate_names_the_silent_rank(&ranks, |r| r);
    }

    /// A ring (each rank sends to the next and receives from the one
    /// before, in one group): every rank takes its two pair gates in key
    /// order, as the watchdog does, and all of them meet at once; in each
    /// rank's own call order they would wait for each other in a circle.
    #[test]
    fn a_ring_of_pair_gates_in_key_order_meets_without_waiting() {
        let n = 4;
        let live = Liveness::in_process(n);
        live.exchanger().set_check_wait(Duration::from_secs(5));
        let started = Instant::now();
        let threads: Vec<_> = (0..n)
            .map(|r| {
                let ex = live.exchanger();
                std::thread::spawn(move || {
                    let pair = |a: usize, b: usize| format!("world@0:p|{},{}", a.min(b), a.max(b));
                    let mut keys = [pair(r, (r + 1) % n), pair((r + n - 1) % n, r)];
                    keys.sort();
                    keys.iter()
                        .map(|k| ex.gate(k, r, Duration::from_secs(5)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for t in threads {
            for outcome in t.join().unwrap() {
                assert_eq!(outcome, Some(Checked::Agree));
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(live.losses().is_empty());
    }

    /// The same ring, each rank arriving at both of its gates at once, in
    /// its own order (send, then receive): arriving never waits, so no
    /// order is needed.
    #[test]
    fn a_ring_of_pair_gates_arrived_at_together_meets_in_any_order() {
        let n = 4;
        let live = Liveness::in_process(n);
        live.exchanger().set_check_wait(Duration::from_secs(5));
        let threads: Vec<_> = (0..n)
            .map(|r| {
                let ex = live.exchanger();
                std::thread::spawn(move || {
                    let pair = |a: usize, b: usize| format!("world@0:p|{},{}", a.min(b), a.max(b));
                    let keys = [pair(r, (r + 1) % n), pair((r + n - 1) % n, r)];
                    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                    ex.gate_all(&keys, r, Duration::from_secs(5))
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), vec![Some(Checked::Agree); 2]);
        }
        assert!(live.losses().is_empty());
    }

    #[test]
    fn threads_of_one_process_pass_at_once() {
        let live = Liveness::in_process(4);
        let outcome = live.exchanger().check("world", 0, ar(1), Duration::ZERO);
        assert_eq!(outcome, Some(Checked::Agree));
    }

    /// The cost of one check, round trip to the hub and back, with every
    /// rank a thread over loopback (the figure in the docs). Prints the
    /// median per call.
    #[test]
    fn the_cost_of_a_check_is_measured() {
        for world in [2, 3, 4] {
            let ranks = channel(world);
            let rounds = 400u64;
            let runs: Vec<_> = ranks
                .iter()
                .map(|l| {
                    let ex = l.exchanger();
                    std::thread::spawn(move || {
                        let mut took: Vec<Duration> = (0..rounds)
                            .map(|seq| {
                                let t = Instant::now();
                                let o = ex.check("world", seq, ar(1), Duration::from_secs(5));
                                assert_eq!(o, Some(Checked::Agree));
                                t.elapsed()
                            })
                            .collect();
                        took.sort_unstable();
                        took[took.len() / 2]
                    })
                })
                .collect();
            let medians: Vec<Duration> = runs.into_iter().map(|r| r.join().unwrap()).collect();
            let worst = medians.iter().max().copied().unwrap_or_default();
            println!("call check, {world} ranks over loopback: median {worst:.1?} per call");
            for l in &ranks {
                l.leave();
            }
        }
    }
}
