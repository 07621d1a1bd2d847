//! The opt-in call check ([`WatchdogOptions::check_calls`](super::WatchdogOptions::check_calls),
//! `NCCL_RS_CHECK_CALLS=1`): before each call on the world's communicator,
//! the ranks compare the call over the liveness channel and refuse it
//! together, before launch, when they disagree ([`CheckFailure`]).
//!
//! Only the world's own communicator is checked (the one the flight-record
//! exchange uses): the sub-communicators of a mesh or a split share their
//! labels across groups, whose ranks would be mixed. Point-to-point calls
//! (`send`, `recv`: two ranks only), and calls made inside a group or a
//! stream capture, are not checked (see
//! [`nccl_safe::OpObserver::before`]). A world of one rank, or one without
//! a liveness channel (liveness off, threads of one process), passes every
//! check at once.
//!
//! Calls are matched by their number among the checked calls of the
//! communicator (the same on every rank that makes the same calls in the
//! same order): the flight recorder's sequence number would differ between
//! ranks after a collective made of send/recv (gather, scatter, an
//! all-to-all with zero counts), which records a different number of
//! operations on each rank. A refused call is numbered on every rank (they
//! all refuse it) and never reaches the flight recorder.

use std::sync::atomic::Ordering;
use std::time::Duration;

use nccl_safe::{CheckError, OpInfo};

use super::culprit::{Call, Checked, Divergence};
use super::{Watch, exchange_key, lock_liveness};

/// Why the call check refused a call (inside
/// [`nccl_safe::Error::CheckFailed`]; get it with [`CheckFailure::of`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckFailure {
    /// The ranks disagree on this call: the same report as a timeout's
    /// [`FailureKind::Diverged`](super::FailureKind::Diverged), given to
    /// every rank before launch. Its `seq` is the call's number among the
    /// checked calls.
    #[error(
        "communicator {comm:?}: call #{seq} refused before launch by the call check: {divergence}"
    )]
    Diverged {
        /// The label the communicator is watched under.
        comm: String,
        /// The flight-recorder sequence number the call would have had
        /// on this rank.
        seq: u64,
        /// Where the ranks disagree.
        divergence: Box<Divergence>,
    },
    /// Not every rank checked in within the timeout (those listed issued
    /// fewer operations, or hang elsewhere): the call was not launched.
    #[error(
        "communicator {comm:?}: call #{seq} refused before launch: {}",
        missing_text(ranks, *unlisted, *waited)
    )]
    Missing {
        /// The label the communicator is watched under.
        comm: String,
        /// The flight-recorder sequence number the call would have had
        /// on this rank.
        seq: u64,
        /// The ranks that did not check in (at most eight, lowest first);
        /// empty when the hub did not answer at all.
        ranks: Vec<usize>,
        /// How many more did not.
        unlisted: usize,
        /// How long this rank waited.
        waited: Duration,
    },
    /// A call that may make a connection inside NCCL (the
    /// communicator's first collective, a first call between two ranks)
    /// was refused before launch because ranks that take part never made
    /// it within the timeout: they are alive but silent, or stuck
    /// elsewhere. They are reported lost, so every communicator of the
    /// job is aborted and [`crate::World::recover`] goes on without them.
    #[error("communicator {comm:?}: {}", silent_text(op, ranks, among, *waited))]
    Silent {
        /// The label the communicator is watched under.
        comm: String,
        /// The call.
        op: &'static str,
        /// The world ranks that never came (empty when the hub did not
        /// answer).
        ranks: Vec<usize>,
        /// The world ranks the call would connect (this one included).
        among: Vec<usize>,
        /// How long this rank waited.
        waited: Duration,
    },
}

fn silent_text(op: &str, ranks: &[usize], among: &[usize], waited: std::time::Duration) -> String {
    if ranks.is_empty() {
        return format!(
            "{op} may connect ranks {among:?} inside NCCL, and no answer came from the \
             liveness hub within {waited:?}: refused before launch"
        );
    }
    format!(
        "{op} may connect ranks {among:?} inside NCCL, and rank(s) {ranks:?} never made \
         the call within {waited:?} (alive but silent): refused before launch, the silent \
         rank(s) counted as lost"
    )
}

fn missing_text(ranks: &[usize], unlisted: usize, waited: Duration) -> String {
    if ranks.is_empty() {
        return format!("no answer from the call check's hub within {waited:?}");
    }
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    let more = if unlisted > 0 {
        format!(" (and {unlisted} more)")
    } else {
        String::new()
    };
    format!(
        "rank(s) {}{more} did not check in within {waited:?}: they issued fewer operations \
         on this communicator, or are stuck elsewhere",
        list.join(", ")
    )
}

impl CheckFailure {
    /// The silent ranks, for a gate's refusal ([`CheckFailure::Silent`]).
    pub fn silent_ranks(&self) -> Option<&[usize]> {
        match self {
            CheckFailure::Silent { ranks, .. } => Some(ranks),
            _ => None,
        }
    }

    /// The check's refusal inside `err`, when `err` is one.
    pub fn of(err: &nccl_safe::Error) -> Option<&CheckFailure> {
        match err {
            nccl_safe::Error::CheckFailed { source, .. } => source.downcast_ref(),
            _ => None,
        }
    }

    /// Where the ranks disagree, for a divergence.
    pub fn divergence(&self) -> Option<&Divergence> {
        match self {
            CheckFailure::Diverged { divergence, .. } => Some(divergence),
            CheckFailure::Missing { .. } | CheckFailure::Silent { .. } => None,
        }
    }
}

/// Whether a watch under `label` checks calls, given the options' switch.
pub(super) fn checks(on: bool, label: &str) -> bool {
    on && !exchange_key(label).contains('/')
}

impl Watch {
    /// The check of one call before its launch (see the module docs).
    pub(super) fn check_call(&self, info: &OpInfo) -> Result<(), CheckError> {
        // Point-to-point calls involve only two ranks: the others would
        // never check in.
        if matches!(info.op, "ncclSend" | "ncclRecv") {
            return Ok(());
        }
        let Some(liveness) = lock_liveness(&self.registry).clone() else {
            return Ok(());
        };
        let number = self.checked.fetch_add(1, Ordering::Relaxed);
        let call = Call {
            op: info.op,
            count: info.count,
            dtype: info.dtype,
            peer: info.peer,
            reduction: info.redop,
        };
        let waited = self.options.timeout;
        let outcome = liveness.check(&exchange_key(&self.label), number, call, waited);
        let seq = self.lock().next_seq;
        let comm = self.label.clone();
        let failure = match outcome {
            Some(Checked::Agree) => return Ok(()),
            Some(Checked::Diverged(divergence)) => CheckFailure::Diverged {
                comm,
                seq,
                divergence,
            },
            Some(Checked::Missing(ranks, unlisted)) => CheckFailure::Missing {
                comm,
                seq,
                ranks,
                unlisted,
                waited,
            },
            None => CheckFailure::Missing {
                comm,
                seq,
                ranks: Vec::new(),
                unlisted: 0,
                waited,
            },
        };
        tracing::error!("{failure}");
        Err(Box::new(failure))
    }
}
