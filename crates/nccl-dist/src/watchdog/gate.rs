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

use std::sync::atomic::Ordering;

use nccl_safe::{CheckError, OpInfo};

use super::check::CheckFailure;
use super::culprit::Checked;
use super::{Watch, exchange_key, lock_gating};

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
        Gating {
            members,
            rank,
            base: format!("{}@{generation}", exchange_key(label)),
        }
    }
}

fn csv(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    list.join(",")
}

impl Watch {
    /// The gate of calls (see the module docs): each with the
    /// communicator ranks it meets (every rank for a collective). The
    /// meetings are taken in the order of their keys, the same on every
    /// rank, so ranks that each wait for several never wait in a circle.
    pub(super) fn gate_calls(&self, calls: &[(OpInfo, &[usize])]) -> Result<(), CheckError> {
        let Some(g) = &self.gating else {
            return Ok(());
        };
        let Some(liveness) = lock_gating(&self.registry).clone() else {
            return Ok(());
        };
        if self.lock().failure.is_some() {
            return Ok(());
        }
        let me = g.members[g.rank];
        let waited = self.options.timeout;
        let mut gates: Vec<(String, Vec<usize>, &'static str)> = Vec::new();
        for (info, with) in calls {
            if with.iter().any(|&r| r >= g.members.len()) {
                continue;
            }
            if with.contains(&g.rank) {
                let mut all = g.members.clone();
                all.sort_unstable();
                gates.push((format!("{}:c|{}", g.base, csv(&all)), all, info.op));
            } else {
                for &r in *with {
                    let peer = g.members[r];
                    let pair = vec![me.min(peer), me.max(peer)];
                    gates.push((format!("{}:p|{}", g.base, csv(&pair)), pair, info.op));
                }
            }
        }
        gates.sort_by(|a, b| a.0.cmp(&b.0));
        gates.dedup_by(|a, b| a.0 == b.0);
        for (key, ranks, op) in gates {
            let outcome = liveness.gate(&key, me, waited);
            let missing = match outcome {
                Some(Checked::Agree) | Some(Checked::Diverged(_)) => continue,
                Some(Checked::Missing(missing, _)) => missing,
                None => Vec::new(),
            };
            self.gated.fetch_add(1, Ordering::Relaxed);
            let failure = CheckFailure::Silent {
                comm: self.label.clone(),
                op,
                ranks: missing,
                among: ranks,
                waited,
            };
            tracing::error!("{failure}");
            return Err(Box::new(failure));
        }
        Ok(())
    }
}
