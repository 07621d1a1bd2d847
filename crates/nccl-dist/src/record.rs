//! The flight recorder's records and a watched communicator's failure:
//! plain values, so the crate's error can carry them without importing
//! the watchdog itself.

use std::fmt::Write as _;
use std::time::Duration;

use nccl_safe::nccl_sys::{ncclDataType_t, ncclRedOp_t};

use crate::liveness::PeerLoss;
use nccl_control::culprit::{Call, Divergence};

/// Where an operation of the flight recorder stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpState {
    /// Issued; its event has not completed yet.
    InFlight,
    /// Finished on the GPU.
    Done,
    /// The oldest unfinished operation when the timeout struck.
    TimedOut,
    /// Unfinished when the communicator was aborted.
    Aborted,
    /// Not tracked (no CUDA event could be recorded for it).
    Untracked,
}

/// One operation in the flight recorder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// Issue order on its communicator, from 0.
    pub seq: u64,
    /// The NCCL function.
    pub op: &'static str,
    /// Elements per rank.
    pub count: usize,
    /// The element type.
    pub dtype: ncclDataType_t,
    /// The peer or root, if the operation has one.
    pub peer: Option<usize>,
    /// The reduction, for the reducing operations.
    pub reduction: Option<ncclRedOp_t>,
    /// Where it stands.
    pub state: OpState,
    /// When it was issued, counted from when the watch began. An operation
    /// that went through the watch's lane (a kept stream) carries the issue
    /// time of the first operation that waited in the lane with it: early
    /// by at most the time between two looks at the watch (a poll
    /// interval, 2 ms by default, while the watchdog thread keeps up).
    pub issued_at: Duration,
    /// How long it took, as the watchdog saw it: from the issue of the
    /// first operation of its batch (as `issued_at` gives it) to the
    /// batch's completion.
    pub took: Option<Duration>,
}

impl OpRecord {
    /// What the ranks must agree on in this operation.
    pub fn call(&self) -> Call {
        Call {
            op: self.op,
            count: self.count,
            dtype: self.dtype,
            peer: self.peer,
            reduction: self.reduction,
        }
    }
}

/// What went wrong on a watched communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// The operation did not finish within the watchdog's timeout.
    Timeout {
        /// The timeout.
        deadline: Duration,
    },
    /// NCCL reported an asynchronous error (a peer failed, a network
    /// error): its text.
    AsyncError(String),
    /// Someone else aborted the communicator while work was unfinished.
    Aborted,
    /// A peer of the job was lost; the communicator was aborted.
    PeerLost(PeerLoss),
    /// The operation did not finish within the timeout, and the ranks'
    /// flight recorders, exchanged over the liveness channel, show where
    /// they disagree: the rank and field that diverged.
    Diverged {
        /// The timeout.
        deadline: Duration,
        /// Where the ranks disagree.
        divergence: Box<Divergence>,
    },
    /// NCCL reported an error on the communicator (a message truncated: a
    /// mismatch NCCL noticed), and the ranks' flight recorders, exchanged
    /// as after a timeout, show where they disagree.
    Mismatch {
        /// NCCL's error.
        error: String,
        /// Where the ranks disagree.
        divergence: Box<Divergence>,
    },
}

/// A watched communicator's failure: which communicator, which operation,
/// what happened, and the flight recorder at that moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The label the communicator was watched under.
    pub comm: String,
    /// The operation that was unfinished (the oldest one), or the last one
    /// issued when none was unfinished.
    pub op: &'static str,
    /// Its sequence number.
    pub seq: u64,
    /// What happened.
    pub kind: FailureKind,
    /// How long after the operation was issued the watchdog acted.
    pub after: Duration,
    /// The flight recorder, oldest first.
    pub history: Vec<OpRecord>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.kind {
            FailureKind::Timeout { deadline } => format!("timed out (deadline {deadline:?})"),
            FailureKind::AsyncError(e) => format!("failed: {e}"),
            FailureKind::Mismatch { error, divergence } => {
                format!("failed because {divergence} (NCCL: {error})")
            }
            FailureKind::Aborted => "was aborted".to_string(),
            FailureKind::PeerLost(loss) => format!("stopped: {loss}"),
            FailureKind::Diverged {
                deadline,
                divergence,
            } => format!("timed out (deadline {deadline:?}) because {divergence}"),
        };
        write!(
            f,
            "communicator {:?}: {} #{} {} after {:?}; the communicator was aborted",
            self.comm, self.op, self.seq, what, self.after
        )
    }
}

impl Failure {
    /// The flight recorder as a table, one operation per line.
    pub fn render_history(&self) -> String {
        render(&self.comm, &self.history)
    }
}

/// The flight recorder `history` of the communicator `label`, one
/// operation per line.
pub(crate) fn render(label: &str, history: &[OpRecord]) -> String {
    let mut out = format!(
        "flight recorder of {label:?} (last {} ops):\n  {:>6} {:<22} {:>12} {:>10} {:>5} {:<9} {:>12} {:>12}\n",
        history.len(),
        "seq",
        "op",
        "count",
        "dtype",
        "peer",
        "state",
        "issued_at",
        "took"
    );
    for r in history {
        let peer = r.peer.map_or("-".to_string(), |p| p.to_string());
        let took = r.took.map_or("-".to_string(), |t| format!("{t:.1?}"));
        let _ = writeln!(
            out,
            "  {:>6} {:<22} {:>12} {:>10} {:>5} {:<9} {:>12} {:>12}",
            r.seq,
            r.op,
            r.count,
            format!("{:?}", r.dtype)
                .trim_start_matches("ncclDataType_t(")
                .trim_end_matches(')'),
            peer,
            format!("{:?}", r.state),
            format!("{:.1?}", r.issued_at),
            took
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flight_recorder_renders_each_operation() {
        let record = OpRecord {
            seq: 7,
            op: "ncclAllReduce",
            count: 1024,
            dtype: ncclDataType_t::ncclFloat32,
            peer: None,
            reduction: Some(ncclRedOp_t::ncclSum),
            state: OpState::TimedOut,
            issued_at: Duration::from_millis(12),
            took: None,
        };
        let text = render("world[0]", &[record]);
        assert!(text.contains("ncclAllReduce"), "{text}");
        assert!(text.contains("TimedOut"), "{text}");
        assert!(text.contains("1024"), "{text}");
    }
}
