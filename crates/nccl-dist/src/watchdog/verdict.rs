//! A timeout's verdict: where the ranks diverge, from the flight records
//! of every rank (over the liveness channel's exchange, or, among threads
//! of one process, read from the sibling watches directly).

use std::sync::Arc;

use super::label::{exchange_key, label_rank};
use super::{SYMMETRIC, Watch, culprit, lock_liveness};
use crate::liveness::EXCHANGE_WAIT;

impl Watch {
    /// After a timeout, where the ranks diverge, from the flight-recorder
    /// exchange over the liveness channel (at most [`EXCHANGE_WAIT`]).
    pub(super) fn diverged(&self) -> Option<Box<culprit::Divergence>> {
        let key = exchange_key(&self.label);
        // Only where sequence numbers mean the same call on every rank, so
        // a verdict is never wrong (no verdict is the plain timeout):
        // - the world's own communicator: the sub-communicators of a mesh
        //   share their labels across groups, whose ranks would be mixed;
        // - collectives that every rank records once: point-to-point
        //   calls, and the forms made of them (all-to-all, gather,
        //   scatter), record a different number of calls per rank.
        if key.contains('/') {
            return None;
        }
        let tail: Vec<(u64, culprit::Call)> = {
            let st = self.lock();
            if st.history.iter().any(|r| !SYMMETRIC.contains(&r.op)) {
                return None;
            }
            st.history.iter().map(|r| (r.seq, r.call())).collect()
        };
        match lock_liveness(&self.registry).clone() {
            Some(liveness) => liveness.exchange(&key, tail, EXCHANGE_WAIT),
            None => self.diverged_here(&key, tail),
        }
    }

    /// The exchange without a channel: ranks that are threads of this
    /// process (`World::spawn_local`, `World::local`) share this
    /// watchdog, so their tails are read here, from the watches of the
    /// same key.
    fn diverged_here(
        &self,
        key: &str,
        tail: Vec<(u64, culprit::Call)>,
    ) -> Option<Box<culprit::Divergence>> {
        let me = label_rank(&self.label)?;
        let siblings = self
            .registry
            .live()
            .into_iter()
            .filter(|w| !std::ptr::eq(Arc::as_ptr(w), self) && exchange_key(&w.label) == key);
        let mut tails: Vec<culprit::Tail> = vec![(me, tail)];
        for w in siblings {
            let Some(rank) = label_rank(&w.label) else {
                continue;
            };
            let st = w.lock();
            if st.history.iter().any(|r| !SYMMETRIC.contains(&r.op)) {
                return None;
            }
            tails.push((rank, st.history.iter().map(|r| (r.seq, r.call())).collect()));
        }
        tails.sort_by_key(|(r, _)| *r);
        tails.dedup_by_key(|(r, _)| *r);
        culprit::analyze(&tails).map(Box::new)
    }
}
