//! The connection gate ([`nccl_safe::OpObserver::gate`]): before a call
//! that may make a connection inside NCCL (a communicator's first
//! collective, the first point-to-point call between two ranks), the
//! ranks that take part meet over the liveness channel, so that a rank
//! that is alive but never makes the call is named within the timeout,
//! before anyone enters NCCL, where a blocking communicator's connection
//! set-up waits for it with no deadline our abort can reach.
//!
//! A collective's gate holds every rank of the communicator; a
//! point-to-point call meets each new peer in a gate of two. All gates of
//! the calls at hand (one call, or a group's, which nccl-safe holds back
//! to the group's end) are taken in the order of their keys on every
//! rank, so ranks that each wait for several never wait in a circle (a
//! ring of sends to the next rank and receives from the one before would,
//! in each rank's own order). A gate that
//! ends without some rank refuses the call on the ranks that came
//! ([`CheckFailure::Silent`]) and the hub reports the missing ranks lost
//! ([`crate::liveness::LossCause::NeverCalled`]): every communicator of
//! the job is aborted, the silent rank's too, and `World::recover` goes on
//! without it.
//!
//! Gates need the world rank of every rank of the communicator (its
//! `members`): the world's communicator and a mesh's have them; a
//! communicator split otherwise is not gated.

use nccl_safe::{CheckError, OpInfo};

use super::check::CheckFailure;
use super::culprit::Checked;
use super::{Watch, exchange_key, lock_gating};
use crate::liveness::GATE_KEY_MAX as KEY_MAX;

/// What a watch needs to gate its communicator's calls.
pub(super) struct Gating {
    /// The world rank of each rank of the communicator.
    pub(super) members: Vec<usize>,
    /// This rank in the communicator.
    pub(super) rank: usize,
    /// The gates' key: the label without the rank, and the how-manieth
    /// communicator of that label this is (the same on every rank).
    pub(super) base: String,
}

impl Gating {
    pub(super) fn new(label: &str, generation: u64, members: Vec<usize>, rank: usize) -> Gating {
        // A digest keeps every key within the wire's bound (64 bytes)
        // whatever the label, and the same on every rank.
        let name = format!("{}@{generation}", exchange_key(label));
        let digest = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        // Readable in a loss's text: the label's start, then the digest.
        let mut end = name.len().min(16);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        Gating {
            members,
            rank,
            base: format!("{}~{digest:016x}", &name[..end]),
        }
    }
}

/// Sorted ranks as a gate key writes them: `a+d*n` for an arithmetic run
/// of three or more, else comma-separated.
fn members_text(ranks: &[usize]) -> String {
    if let [a, b, ..] = ranks
        && ranks.len() >= 3
        && b > a
        && ranks
            .windows(2)
            .all(|w| w[1].checked_sub(w[0]) == Some(b - a))
    {
        return format!("{a}+{}*{}", b - a, ranks.len());
    }
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    list.join(",")
}

impl Watch {
    /// The gate of calls (see the module docs): each with the
    /// communicator ranks it meets, this rank included for a call every
    /// rank makes (a first collective, all-to-all, gather or scatter by
    /// root), else the peers of the point-to-point directions it
    /// connects. This rank arrives at every meeting first and then waits
    /// for their outcomes, so ranks that each meet several others never
    /// wait for each other in a circle.
    pub(super) fn gate_calls(&self, calls: &[(OpInfo, &[usize])]) -> Result<(), CheckError> {
        let Some(g) = &self.gating else {
            return Ok(());
        };
        let Some(liveness) = lock_gating(&self.registry).clone() else {
            return Ok(());
        };
        let me = g.members[g.rank];
        let waited = self.options.timeout;
        // A call on a communicator that failed, or in a job that lost a
        // rank, is refused: it would go into NCCL's connection before the
        // abort lands, and wait there for a rank that will not come.
        let refuse = |op: &'static str, ranks: Vec<usize>, among: Vec<usize>| -> CheckError {
            let failure = CheckFailure::Silent {
                comm: self.label.clone(),
                op,
                ranks,
                among,
                waited,
            };
            tracing::error!("{failure}");
            Box::new(failure)
        };
        let first_op = calls.first().map_or("ncclGroupEnd", |(i, _)| i.op);
        if self.lock().failure.is_some() || !liveness.lost_ranks().is_empty() {
            let lost = liveness.lost_ranks();
            return Err(refuse(first_op, lost.clone(), lost));
        }
        let mut gates: Vec<(String, Vec<usize>, &'static str)> = Vec::new();
        for (info, with) in calls {
            if with.iter().any(|&r| r >= g.members.len()) {
                continue;
            }
            if with.contains(&g.rank) {
                let mut all = g.members.clone();
                all.sort_unstable();
                let tag = match info.op {
                    // A symmetric window's registration: its own meeting,
                    // apart from the first collective's.
                    "ncclCommWindowRegister" => "w".to_string(),
                    "ncclAlltoAll" => "a".to_string(),
                    "all_to_all_v" => "v".to_string(),
                    "ncclGather" | "ncclScatter" => {
                        let root = info
                            .peer
                            .and_then(|r| g.members.get(r))
                            .copied()
                            .unwrap_or(0);
                        format!("{}{root}", &info.op[4..5])
                    }
                    _ => "c".to_string(),
                };
                let key = format!("{}:{tag}|{}", g.base, members_text(&all));
                if key.len() <= KEY_MAX {
                    gates.push((key, all, info.op));
                    continue;
                }
                // Too many ranks, in no regular order, for one key: every
                // rank meets every other in pairs, which ends the same.
                for peer in all.into_iter().filter(|&r| r != me) {
                    let pair = vec![me.min(peer), me.max(peer)];
                    let key = format!("{}:{tag}p|{}", g.base, members_text(&pair));
                    gates.push((key, pair, info.op));
                }
                continue;
            }
            for &r in *with {
                let peer = g.members[r];
                // The directions this call connects: a send this rank's
                // to the peer, a receive the peer's to this rank, an
                // all-to-all-v both (its counts say which exist; both
                // sides name the same pairs).
                let edges: &[(usize, usize)] = match info.op {
                    "ncclSend" => &[(me, peer)],
                    "ncclRecv" => &[(peer, me)],
                    _ => &[(me, peer), (peer, me)],
                };
                for &(from, to) in edges {
                    let pair = vec![me.min(peer), me.max(peer)];
                    let key = format!("{}:e{from}>{to}|{}", g.base, members_text(&pair));
                    gates.push((key, pair, info.op));
                }
            }
        }
        gates.sort_by(|a, b| a.0.cmp(&b.0));
        gates.dedup_by(|a, b| a.0 == b.0);
        let keys: Vec<&str> = gates.iter().map(|(k, _, _)| k.as_str()).collect();
        let outcomes = liveness.gate_all(&keys, me, waited);
        let lost = liveness.lost_ranks();
        let mut missing: Vec<usize> = Vec::new();
        let mut among: Vec<usize> = Vec::new();
        let mut op = first_op;
        for ((_, ranks, call), outcome) in gates.iter().zip(outcomes) {
            match outcome {
                // Met, and nobody lost meanwhile (a lost member counts as
                // arrived at the hub, and a known loss ends the wait).
                Some(Checked::Agree) | Some(Checked::Diverged(_)) if lost.is_empty() => continue,
                Some(Checked::Missing(named, _)) if !named.is_empty() => missing.extend(named),
                _ => missing.extend(lost.iter().copied()),
            }
            among.extend(ranks);
            op = call;
        }
        if missing.is_empty() && among.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        missing.dedup();
        among.sort_unstable();
        among.dedup();
        Err(refuse(op, missing, among))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lists_stay_short_where_they_are_regular() {
        let world: Vec<usize> = (0..1024).collect();
        assert_eq!(members_text(&world), "0+1*1024");
        assert_eq!(members_text(&[1, 3, 5, 7]), "1+2*4");
        assert_eq!(members_text(&[3, 7]), "3,7");
        assert_eq!(members_text(&[0, 2, 3]), "0,2,3");
        let g = Gating::new(
            "world[3]/mesh/a-very-long-axis-name-that-goes-on-and-on",
            0,
            vec![0],
            0,
        );
        assert_eq!(g.base.len(), 33);
        assert_eq!(
            g.base,
            Gating::new(
                "world[5]/mesh/a-very-long-axis-name-that-goes-on-and-on",
                0,
                vec![0],
                0
            )
            .base,
            "the same on every rank"
        );
        assert_ne!(g.base, Gating::new("world[3]/mesh/dp", 0, vec![0], 0).base);
        for text in [
            members_text(&world),
            members_text(&[1, 3, 5, 7]),
            members_text(&[3, 7]),
        ] {
            let key = format!("{}:c|{text}", g.base);
            assert!(key.len() <= KEY_MAX, "{key}");
            let parsed = crate::liveness::gate_members(&key, 1024).unwrap();
            assert_eq!(members_text(&parsed), text);
        }
    }
}
