//! When a survivor counts the survivors: once the losses its liveness
//! channel knows stop changing for a window that depends on how they were
//! found ([`settle_window`]).

use std::time::{Duration, Instant};

use super::FIRST_LOSS;
use crate::liveness::{Liveness, LossCause, PeerLoss};

/// How long a survivor of a process job waits for the losses it knows to
/// stop changing before it counts the survivors, where each was seen the
/// moment it happened: a closed connection (a killed process), a reported
/// panic or exit, ranks a connection gate found missing (the hub names
/// them all in one outcome). The hub passes each loss on to every member
/// at once, so this covers the frames in flight and deaths a few
/// milliseconds apart (a host's processes killed together).
const SETTLE: Duration = Duration::from_millis(50);

/// [`SETTLE`] among threads of one process: they share one channel, so
/// every survivor sees a loss the moment it is reported; this only lets
/// losses that happen together (threads failing at once) all arrive.
const SETTLE_IN_PROCESS: Duration = Duration::from_millis(20);

/// Who takes part in a recovery, as this rank sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Survivors {
    /// The old ranks that live, in order; the new rank of each is its
    /// place here.
    pub(crate) ranks: Vec<usize>,
    /// This rank's new rank.
    pub(crate) me: usize,
}

impl Survivors {
    /// The survivors among `world` ranks, `lost` telling which are gone;
    /// `None` when nothing was lost or `rank` itself is.
    pub(crate) fn of(world: usize, rank: usize, lost: impl Fn(usize) -> bool) -> Option<Survivors> {
        let ranks: Vec<usize> = (0..world).filter(|&r| !lost(r)).collect();
        if ranks.len() == world {
            return None;
        }
        let me = ranks.iter().position(|&r| r == rank)?;
        Some(Survivors { ranks, me })
    }

    /// The lowest live rank: it serves the new rendezvous.
    pub(crate) fn leader(&self) -> usize {
        self.ranks[0]
    }
}

/// How long the losses in `losses` must stay unchanged before the
/// survivors are counted: [`SETTLE_IN_PROCESS`] among threads of one
/// process, [`SETTLE`] where every loss was seen the moment it happened,
/// and a `heartbeat` more (at least [`LATE_AT_LEAST`]) where one was found
/// by silence or a hub was lost. Ranks that stop together (a host that
/// loses power) are each found a silence limit after their own last
/// heartbeat, so up to a heartbeat apart; and after a hub's loss the
/// members find the next hub, which tells each the losses it missed.
fn settle_window(losses: &[PeerLoss], in_process: bool, heartbeat: Duration) -> Duration {
    if in_process {
        return SETTLE_IN_PROCESS;
    }
    // The hub is the lowest live rank: a hub was lost (rank 0, and maybe
    // ranks that took over after it) exactly when rank 0 was.
    let hub_lost = losses.iter().any(|l| l.rank == 0);
    let by_silence = losses
        .iter()
        .any(|l| matches!(l.cause, LossCause::Silent { .. }));
    if hub_lost || by_silence {
        SETTLE.saturating_add(heartbeat.max(LATE_AT_LEAST))
    } else {
        SETTLE
    }
}

/// The least that [`settle_window`] adds where a loss was found late: the
/// default heartbeat, so that a shorter heartbeat never settles sooner
/// than the fixed 300 ms every recovery waited before session 23 (after a
/// hub's loss a member that cannot reach the next hub finds it lost only
/// after a second: such a recovery may still count differently, and is
/// refused by the rendezvous).
const LATE_AT_LEAST: Duration = Duration::from_millis(250);

/// The survivors once the losses this rank knows have not changed for
/// their [`settle_window`] (at most `within`). Where this rank knows of
/// no loss it waits at most [`FIRST_LOSS`] for one (a caller that saw
/// NCCL fail a moment before the channel named the dead rank), then gives
/// up: `Err` names which of "nothing lost" and "this rank itself counts
/// as lost" it is.
pub(super) fn settled(
    liveness: &Liveness,
    world: usize,
    rank: usize,
    within: Duration,
) -> std::result::Result<Survivors, &'static str> {
    let in_process = liveness.rank().is_none();
    let heartbeat = liveness.heartbeat();
    let step = Duration::from_millis(5);
    let started = Instant::now();
    let until = started + within;
    // The survivors as the losses known now count them, and how long
    // those losses must stay as they are.
    let count = || {
        let losses = liveness.losses();
        let survivors = Survivors::of(world, rank, |r| losses.iter().any(|l| l.rank == r));
        (survivors, settle_window(&losses, in_process, heartbeat))
    };
    let (mut seen, mut window) = count();
    let mut stable_since = Instant::now();
    while Instant::now() < until {
        if seen.is_none() && started.elapsed() >= FIRST_LOSS {
            break;
        }
        if seen.is_some() && stable_since.elapsed() >= window {
            break;
        }
        std::thread::sleep(step);
        let (now, w) = count();
        window = w;
        if now != seen {
            seen = now;
            stable_since = Instant::now();
        }
    }
    match seen {
        Some(survivors) => Ok(survivors),
        None if liveness.is_lost(rank) => {
            Err("this rank itself counts as lost: the others went on without it")
        }
        None => Err("no rank of this world was lost"),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn loss(rank: usize, cause: LossCause) -> PeerLoss {
        PeerLoss {
            rank,
            cause,
            seen_by: 0,
        }
    }

    #[test]
    fn the_settle_window_follows_how_the_losses_were_found() {
        let beat = Duration::from_millis(250);
        let closed = |r| loss(r, LossCause::ConnectionClosed);
        let silent = |r| {
            loss(
                r,
                LossCause::Silent {
                    for_: Duration::from_secs(10),
                },
            )
        };
        // Threads of one process share one channel.
        assert_eq!(settle_window(&[silent(0)], true, beat), SETTLE_IN_PROCESS);
        // Killed members, a member's exit and ranks a gate found missing:
        // seen at once, passed on by the live hub.
        assert_eq!(settle_window(&[closed(3)], false, beat), SETTLE);
        let seen_at_once = [
            closed(2),
            loss(
                3,
                LossCause::Exited {
                    reason: "error".into(),
                },
            ),
            loss(
                1,
                LossCause::NeverCalled {
                    what: "ncclAllReduce".into(),
                },
            ),
        ];
        assert_eq!(settle_window(&seen_at_once, false, beat), SETTLE);
        // Found by silence: others that stopped with it come up to a
        // heartbeat later.
        assert_eq!(
            settle_window(&[closed(2), silent(3)], false, beat),
            SETTLE + beat
        );
        // Rank 0, the hub, lost; or rank 1 after it (it had taken over).
        assert_eq!(settle_window(&[closed(0)], false, beat), SETTLE + beat);
        assert_eq!(
            settle_window(&[closed(0), closed(1)], false, beat),
            SETTLE + beat
        );
        // Rank 1 lost while rank 0 lives: not a hub.
        assert_eq!(settle_window(&[closed(1)], false, beat), SETTLE);
        // The heartbeat is the channel's own, never less than the default.
        let slow = Duration::from_secs(1);
        assert_eq!(settle_window(&[silent(1)], false, slow), SETTLE + slow);
        let quick = Duration::from_millis(20);
        assert_eq!(
            settle_window(&[silent(1)], false, quick),
            SETTLE + LATE_AT_LEAST
        );
        assert_eq!(settle_window(&[closed(1)], false, quick), SETTLE);
    }

    #[test]
    fn a_loss_seen_at_once_settles_within_tens_of_ms() {
        // Threads of one process (the one channel a test can make without
        // sockets): the count settles after its window, not a heartbeat.
        let live = Liveness::in_process(3);
        live.report(loss(2, LossCause::ConnectionClosed));
        let started = Instant::now();
        let s = settled(&live, 3, 0, Duration::from_secs(5)).expect("settled");
        assert_eq!(s.ranks, vec![0, 1]);
        let took = started.elapsed();
        assert!(took >= SETTLE_IN_PROCESS, "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        // Nothing lost: the wait for a first loss is bounded.
        let quiet = Liveness::in_process(2);
        let started = Instant::now();
        assert_eq!(
            settled(&quiet, 2, 0, Duration::from_millis(300)),
            Err("no rank of this world was lost")
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn survivors_are_renumbered_in_order_and_the_lowest_leads() {
        let s = Survivors::of(4, 3, |r| r == 1).unwrap();
        assert_eq!(s.ranks, vec![0, 2, 3]);
        assert_eq!(s.me, 2);
        assert_eq!(s.leader(), 0);
        let s = Survivors::of(4, 2, |r| r == 0).unwrap();
        assert_eq!((s.leader(), s.me), (1, 1));
        // Nothing lost, or this rank itself lost: no recovery.
        assert!(Survivors::of(4, 2, |_| false).is_none());
        assert!(Survivors::of(4, 2, |r| r == 2).is_none());
    }
}
