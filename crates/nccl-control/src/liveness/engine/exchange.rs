//! The flight-recorder exchange after a timeout: members send the tails
//! of their recorders for one communicator to the hub, the hub gathers
//! them from every live rank (bounded by a deadline), finds where they
//! diverge and sends every member the verdict. Nothing here runs, locks
//! or allocates until a timeout starts an exchange.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{Role, Shared};
use crate::culprit::{Call, Checked, Divergence, Tail, analyze};
use crate::link::{Link, lock};
use crate::wire::Msg;

/// Where a rank's tails come from when the hub asks: the watchdog's
/// flight recorder of the communicator with that key.
pub type TailSource = Arc<dyn Fn(&str) -> Option<Vec<(u64, Call)>> + Send + Sync>;

/// A rank's means to run an exchange, without keeping its channel alive
/// (the watchdog holds it; the channel's hooks hold the watchdog).
#[derive(Clone)]
pub struct Exchanger(pub(super) Weak<Shared>);

impl Exchanger {
    /// The first loss this rank knows of, waiting at most `within` for
    /// one (NCCL may see a dead peer's closed socket a moment before the
    /// channel names it). `None` without a channel or a loss.
    pub fn await_loss(&self, within: Duration) -> Option<crate::liveness::PeerLoss> {
        let until = crate::frame::deadline_after(Instant::now(), within);
        loop {
            let shared = self.0.upgrade()?;
            if let Some(loss) = lock(&shared.state).losses.first().cloned() {
                return Some(loss);
            }
            drop(shared);
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// This rank timed out on the communicator `key`: sends `tail` to the
    /// hub and waits (at most `within`) for where the ranks diverge.
    /// `None` without a channel, in time, or a divergence.
    pub fn exchange(
        &self,
        key: &str,
        tail: Vec<(u64, Call)>,
        within: Duration,
    ) -> Option<Box<Divergence>> {
        self.0.upgrade()?.exchange(key, tail, within)
    }

    /// This rank is about to launch `call`, its `seq`-th checked call on
    /// the communicator `key`: what the hub found, within `within`
    /// (`Some(Agree)` without a channel to check over; `None` when no
    /// outcome came in time).
    pub fn check(&self, key: &str, seq: u64, call: Call, within: Duration) -> Option<Checked> {
        match self.0.upgrade() {
            Some(shared) => shared.check(key, seq, call, within),
            None => Some(Checked::Agree),
        }
    }

    /// The connection gate `key` (its members after the `|`) for world
    /// rank `me`: see `Shared::gate_all`. `Some(Agree)` without a channel.
    #[cfg(test)]
    pub fn gate(&self, key: &str, me: usize, within: Duration) -> Option<Checked> {
        self.gate_all(&[key], me, within).pop().flatten()
    }

    /// The gates `keys` for world rank `me`: arrives at every one, then
    /// waits for each outcome, at most `within` in all (see `Shared::gate_all`).
    pub fn gate_all(&self, keys: &[&str], me: usize, within: Duration) -> Vec<Option<Checked>> {
        let Some(shared) = self.0.upgrade() else {
            return vec![Some(Checked::Agree); keys.len()];
        };
        let outcome = shared.gate_all(keys, me, within);
        let losses = shared.take_reports();
        if !losses.is_empty() {
            // The hooks abort every communicator of the job: on a thread
            // of their own, which the process's exit waits for.
            let hold = shared.hold_exit(within);
            let spawned = std::thread::Builder::new()
                .name("nccl-gate-report".into())
                .spawn(move || {
                    let _hold = hold;
                    for loss in losses {
                        shared.report(loss);
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!("no thread for a gate's report of a silent rank: {e}");
            }
        }
        outcome
    }

    /// The ranks this rank knows to be lost, lowest first.
    pub fn lost_ranks(&self) -> Vec<usize> {
        let Some(shared) = self.0.upgrade() else {
            return Vec::new();
        };
        let mut lost: Vec<usize> = lock(&shared.state).losses.iter().map(|l| l.rank).collect();
        lost.sort_unstable();
        lost.dedup();
        lost
    }

    /// How long the hub waits for every rank of a check.
    pub fn set_check_wait(&self, wait: Duration) {
        if let Some(shared) = self.0.upgrade() {
            shared.set_check_wait(wait);
        }
    }
}

/// How long a rank that timed out waits for the verdict: the issue's
/// "within the timeout plus 1 s".
pub const WAIT: Duration = Duration::from_secs(1);

/// The hub's share of the time it gathers tails in, of a rank's whole wait
/// (the rest carries the verdict back).
const GATHER_SHARE: f64 = 0.8;

/// The hub's gathering of one communicator's tails.
struct Gather {
    key: String,
    deadline: Instant,
    tails: Vec<Tail>,
    /// Ranks that answered (with a tail, or without one).
    answered: Vec<usize>,
}

/// Verdicts kept at once (a peer cannot make the list grow without end).
const MAX_VERDICTS: usize = 8;

/// Exchange state of one rank.
#[derive(Default)]
pub(super) struct Exchange {
    gather: Option<Gather>,
    verdicts: Vec<Verdict>,
    source: Option<TailSource>,
}

/// How long a verdict stays after it was first taken: every thread of the
/// rank that asked at about the same time (the watchdog's and the waiter's)
/// gets it; a later timeout of the same label gathers afresh.
const RETAIN: Duration = Duration::from_secs(2);

/// The hub's verdict for one key, and when a thread of this rank first
/// took it.
struct Verdict {
    key: String,
    divergence: Option<Box<Divergence>>,
    taken: Option<Instant>,
}

impl Exchange {
    /// Drops the verdicts taken longer than [`RETAIN`] ago.
    fn prune(&mut self, now: Instant) {
        self.verdicts.retain(|v| {
            v.taken
                .is_none_or(|t| now.saturating_duration_since(t) < RETAIN)
        });
    }

    /// The verdict for `key`, if one is here (and not stale).
    fn verdict(&mut self, key: &str) -> Option<&mut Verdict> {
        self.prune(Instant::now());
        self.verdicts.iter_mut().find(|v| v.key == key)
    }

    /// Keeps a verdict that came in, unless one for its key is here.
    fn keep(&mut self, key: String, divergence: Option<Box<Divergence>>) {
        if self.verdict(&key).is_some() {
            return;
        }
        if self.verdicts.len() >= MAX_VERDICTS {
            self.verdicts.remove(0);
        }
        self.verdicts.push(Verdict {
            key,
            divergence,
            taken: None,
        });
    }
}

impl Shared {
    pub(super) fn set_tail_source(&self, source: TailSource) {
        lock(&self.exchange).source = Some(source);
    }

    fn own_tail(&self, key: &str) -> Option<Vec<(u64, Call)>> {
        let source = lock(&self.exchange).source.clone()?;
        source(key)
    }

    /// The hub: starts gathering `key` unless it does already, asking
    /// every member; adds `tail` from `rank`.
    fn gather(&self, key: &str, rank: usize, tail: Option<Vec<(u64, Call)>>, within: Duration) {
        let start = {
            let mut ex = lock(&self.exchange);
            if ex.verdict(key).is_some() {
                return;
            }
            let start = ex.gather.is_none();
            let g = ex.gather.get_or_insert_with(|| Gather {
                key: key.to_string(),
                deadline: crate::frame::deadline_after(
                    Instant::now(),
                    within.mul_f64(GATHER_SHARE),
                ),
                tails: Vec::new(),
                answered: Vec::new(),
            });
            if g.key != key {
                // One exchange at a time: another communicator's timeout
                // falls back to the plain error.
                return;
            }
            if !g.answered.contains(&rank) {
                g.answered.push(rank);
                if let Some(t) = tail.filter(|t| !t.is_empty()) {
                    g.tails.push((rank, t));
                }
            }
            start
        };
        if start {
            for link in self.links() {
                if !link.to_hub {
                    link.send(&Msg::Ask {
                        key: key.to_string(),
                    });
                }
            }
            if rank != 0 {
                let own = self.own_tail(key);
                self.gather(key, 0, own, within);
            }
        }
        self.finish_gather(false);
        self.wake();
    }

    /// The hub: ends the gathering once every live rank answered, or
    /// `now` is past its deadline (`force`), sending every member the
    /// verdict.
    pub(super) fn finish_gather(&self, force: bool) {
        let (key, divergence) = {
            let mut ex = lock(&self.exchange);
            let Some(g) = &ex.gather else {
                return;
            };
            let all = (0..self.world)
                .all(|r| g.answered.contains(&r) || self.is_lost(r) || self.is_gone(r));
            if !(all || force && Instant::now() >= g.deadline) {
                return;
            }
            let Some(g) = ex.gather.take() else {
                return;
            };
            let divergence = analyze(&g.tails).map(Box::new);
            ex.keep(g.key.clone(), divergence.clone());
            (g.key, divergence)
        };
        for link in self.links() {
            if !link.to_hub {
                link.send(&Msg::Verdict {
                    key: key.clone(),
                    divergence: divergence.clone(),
                });
            }
        }
        self.exchange_cv.notify_all();
    }

    /// The hub's gathering deadline, if one runs (caps the thread's wait).
    pub(super) fn gather_deadline(&self) -> Option<Instant> {
        lock(&self.exchange).gather.as_ref().map(|g| g.deadline)
    }

    /// A member's tail came in. When the verdict for `key` is already
    /// here (the member asks after the others got theirs), it goes back
    /// to that member at once.
    pub(super) fn on_tail(&self, link: &Arc<Link>, key: &str, calls: Vec<(u64, Call)>) {
        let known = lock(&self.exchange)
            .verdict(key)
            .map(|v| v.divergence.clone());
        match known {
            Some(divergence) => {
                link.send(&Msg::Verdict {
                    key: key.to_string(),
                    divergence,
                });
            }
            None => self.gather(key, link.peer, Some(calls), WAIT),
        }
    }

    /// The hub asks for this rank's tail of `key`.
    pub(super) fn on_ask(&self, link: &Arc<Link>, key: String) {
        let calls = self.own_tail(&key).unwrap_or_default();
        link.send(&Msg::Tail { key, calls });
    }

    /// The hub's verdict came in.
    pub(super) fn on_verdict(&self, key: String, divergence: Option<Box<Divergence>>) {
        lock(&self.exchange).keep(key, divergence);
        self.exchange_cv.notify_all();
    }

    /// This rank timed out on `key`: its tail goes to the hub, and the
    /// verdict comes back within `within` (`None`: no divergence found,
    /// no channel, or no verdict in time).
    pub(super) fn exchange(
        &self,
        key: &str,
        tail: Vec<(u64, Call)>,
        within: Duration,
    ) -> Option<Box<Divergence>> {
        let mut until = crate::frame::deadline_after(Instant::now(), within);
        match self.role {
            Role::Hub => self.gather(key, 0, Some(tail), within),
            Role::Member => {
                let sent = self
                    .links()
                    .into_iter()
                    .find(|l| l.to_hub)
                    .is_some_and(|hub| {
                        hub.send(&Msg::Tail {
                            key: key.to_string(),
                            calls: tail,
                        })
                    });
                if !sent {
                    // The hub is gone (it left once it had its own verdict,
                    // or was lost): a verdict it sent before still counts,
                    // and no other will come.
                    until = Instant::now();
                }
            }
            Role::InProcess | Role::Off => return None,
        }
        // Kept for the rank's other asking thread a moment ([`RETAIN`]);
        // a later timeout of the same label gathers afresh.
        let verdict = crate::wait::until(&self.exchange_cv, lock(&self.exchange), until, |ex| {
            let v = ex.verdict(key)?;
            v.taken.get_or_insert_with(Instant::now);
            Some(v.divergence.clone())
        });
        verdict.flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::culprit::Field;
    use crate::liveness::Liveness;
    use crate::liveness::engine::testing::{ar, channel};

    /// Three ranks over loopback: rank 2 issued a different count at seq
    /// 5; only rank 1 times out, the hub asks the others, and every rank
    /// gets the same verdict within the wait.
    #[test]
    fn every_rank_gets_the_verdict_naming_the_culprit() {
        let ranks = channel(3);
        let tail = |rank: usize| -> Vec<(u64, Call)> {
            (0..6)
                .map(|s| (s, ar(if s == 5 && rank == 2 { 2048 } else { 1024 })))
                .collect()
        };
        for (rank, l) in ranks.iter().enumerate() {
            l.set_tail_source(Arc::new(move |key: &str| {
                (key == "world").then(|| tail(rank))
            }));
        }
        let started = Instant::now();
        let waiters: Vec<_> = ranks
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != 1)
            .map(|(_, l)| {
                let ex = l.exchanger();
                std::thread::spawn(move || {
                    // These did not time out: they wait for the verdict
                    // the hub sends anyway (rank 0's wait starts its own
                    // gather too, which joins the same one).
                    std::thread::sleep(Duration::from_millis(50));
                    ex.0.upgrade().and_then(|s| {
                        let mut ex = lock(&s.exchange);
                        let until = Instant::now() + WAIT * 2;
                        loop {
                            if let Some(v) = ex.verdicts.iter().find(|v| v.key == "world") {
                                return v.divergence.clone();
                            }
                            if Instant::now() >= until {
                                return None;
                            }
                            ex = s.exchange_cv.wait_timeout(ex, WAIT).unwrap().0;
                        }
                    })
                })
            })
            .collect();
        let verdict = ranks[1].exchanger().exchange("world", tail(1), WAIT);
        assert!(started.elapsed() < WAIT + Duration::from_millis(500));
        let d = verdict.expect("a verdict");
        assert_eq!((d.seq, d.field, d.culprit), (5, Field::Count, Some(2)));
        for w in waiters {
            assert_eq!(w.join().unwrap(), Some(d.clone()));
        }
        for l in &ranks {
            l.leave();
        }
    }

    /// Two ranks whose waits both fail (NCCL saw the mismatch on each):
    /// both ask, at once or one a moment after the other, and both get
    /// the verdict.
    #[test]
    fn both_ranks_that_ask_get_the_verdict() {
        for delay_ms in [0u64, 200] {
            let world = 2;
            let ranks = channel(world);
            let tail = |rank: usize| -> Vec<(u64, Call)> {
                (0..4)
                    .map(|s| (s, ar(if s == 3 && rank == 1 { 64 } else { 1 })))
                    .collect()
            };
            for (rank, l) in ranks.iter().enumerate() {
                l.set_tail_source(Arc::new(move |key: &str| {
                    (key == "world").then(|| tail(rank))
                }));
            }
            // Two threads per rank ask (the watchdog's and the waiter's),
            // each with more than the real wait: on a loaded 2-core CI
            // machine the hub's gathering missed `WAIT` once in five runs.
            let asks: Vec<_> = ranks
                .iter()
                .enumerate()
                .chain(ranks.iter().enumerate())
                .map(|(rank, l)| {
                    let ex = l.exchanger();
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(delay_ms * rank as u64));
                        ex.exchange("world", tail(rank), WAIT * 5)
                    })
                })
                .collect();
            for (i, a) in asks.into_iter().enumerate() {
                let rank = i % world;
                let d = a.join().unwrap();
                assert!(
                    d.is_some(),
                    "rank {rank} got no verdict (delay {delay_ms} ms)"
                );
                assert_eq!(d.unwrap().field, Field::Count);
            }
            for l in &ranks {
                l.leave();
            }
        }
    }

    /// The hub gets its verdict and leaves (its rank is done); the member
    /// asks only then: the verdict the hub sent it before still counts.
    #[test]
    fn a_member_that_asks_after_the_hub_left_keeps_the_verdict() {
        let [hub, member]: [Liveness; 2] = channel(2).try_into().unwrap();
        let tail = |rank: usize| -> Vec<(u64, Call)> {
            (0..4)
                .map(|s| (s, ar(if s == 3 && rank == 1 { 64 } else { 1 })))
                .collect()
        };
        for (rank, l) in [&hub, &member].into_iter().enumerate() {
            l.set_tail_source(Arc::new(move |key: &str| {
                (key == "world").then(|| tail(rank))
            }));
        }
        let d = hub.exchanger().exchange("world", tail(0), WAIT);
        assert_eq!(d.map(|d| d.field), Some(Field::Count));
        hub.leave();
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let d = member.exchanger().exchange("world", tail(1), WAIT);
        assert_eq!(d.map(|d| d.field), Some(Field::Count));
        assert!(started.elapsed() < WAIT);
        member.leave();
    }
}
