//! Errors as the watchdog saw them: [`synchronize`] and [`explain`] turn
//! an error from an operation or a wait on a watched communicator into the
//! watchdog's account of it (its failure, a lost peer, the ranks'
//! divergence).

use std::time::{Duration, Instant};

use nccl_safe::cudarc::driver::CudaStream;
use nccl_safe::{AbortCause, Comm};

use super::{Failure, FailureKind, Watch, Watched, lock_liveness};
use crate::error::{Error, Result};

/// Waits for the work queued so far on `stream` ([`Comm::synchronize`]:
/// bounded by the communicator's timeout, checking NCCL's async error). On
/// a watched communicator, a failure the watchdog handled comes back as
/// [`Error::Watchdog`], naming the operation and its sequence number.
pub fn synchronize(comm: &Comm, stream: &CudaStream) -> Result<()> {
    comm.synchronize(stream).map_err(|e| explain(comm, e))
}

/// An error from an operation on `comm` (its enqueue or a wait), as the
/// watchdog's [`Failure`] when the watchdog has acted on `comm`; otherwise
/// unchanged. Where the watchdog has not acted yet, an NCCL error of a
/// wait (or one a dead peer's closed connection gives) is handed to it at
/// once (it names a lost peer, or the ranks' divergence, when the
/// liveness channel and the flight records show one), and a communicator
/// timeout is accounted for as the watchdog's own (the flight-record
/// exchange: at most 1 s). An enqueue that NCCL keeps in progress (a peer that never
/// joins the connection setup) ends in `Aborted` when the watchdog aborts;
/// this names the operation that timed out instead.
pub fn explain(comm: &Comm, err: nccl_safe::Error) -> Error {
    let watched = Watched::of(comm);
    let Some(w) = watched.as_ref().filter(|w| w.failure().is_none()) else {
        return explain_known(comm, err);
    };
    match &err {
        // NCCL's own error for the work waited for (a truncated
        // message): as the watchdog would report it at its next look,
        // with the flight recorders' verdict when they diverge.
        nccl_safe::Error::Nccl { op, code, .. } if *op == "synchronize" || peer_error(*code) => {
            w.watch.fail_nccl(err.to_string(), peer_error(*code));
        }
        // The communicator's own deadline is the watchdog's, and fires
        // at about the same moment: its account (the diverging rank and
        // field from the other ranks' flight records, or the plain
        // timeout) is the better error. Taken here, unless the watchdog
        // thread takes it already: the wait aborted the communicator, so
        // the work drains and the watchdog thread may never see it time
        // out.
        nccl_safe::Error::Timeout { .. } => w.watch.fail_timeout(),
        _ => {}
    }
    explain_known(comm, err)
}

/// [`explain`] without acting: the watchdog's failure of `comm` when it
/// has one, a lost peer when the abort names one, else `err` as it is.
/// For an error that may come from another communicator than `comm` (a
/// world's mesh axes): it never records a failure on `comm`.
pub(crate) fn explain_known(comm: &Comm, err: nccl_safe::Error) -> Error {
    let watched = Watched::of(comm);
    match watched.as_ref().and_then(Watched::failure) {
        Some(failure) => from_failure(failure),
        None => match err {
            nccl_safe::Error::Aborted {
                op,
                cause: AbortCause::PeerLost { rank, detail },
            } => {
                let history = watched.map(|w| w.history()).unwrap_or_default();
                let seq = history.last().map_or(0, |r| r.seq);
                crate::error::peer_lost(
                    crate::error::loss_of(rank, detail),
                    format!("rank {}", comm.rank()),
                    op,
                    seq,
                    history,
                )
            }
            other => Error::Nccl(other),
        },
    }
}

/// How long an NCCL error that a dead peer gives waits for the liveness
/// channel to name the peer (it does within milliseconds of a death).
const LOSS_GRACE: Duration = Duration::from_secs(1);

/// Whether NCCL's `code` is one a dead peer's closed connection gives.
fn peer_error(code: nccl_safe::nccl_sys::ncclResult_t) -> bool {
    use nccl_safe::nccl_sys::ncclResult_t as R;
    matches!(code, R::ncclRemoteError | R::ncclSystemError)
}

/// A watchdog failure as this crate's error: [`Error::PeerLost`] when a
/// peer was lost, else [`Error::Watchdog`].
pub(crate) fn from_failure(failure: Failure) -> Error {
    match &failure.kind {
        FailureKind::PeerLost(loss) => Error::PeerLost(Box::new(crate::error::PeerLost {
            rank: loss.rank,
            loss: loss.clone(),
            failure,
        })),
        _ => Error::Watchdog(Box::new(failure)),
    }
}

impl Watch {
    /// NCCL's error came back from a call or a wait: a lost peer when the
    /// liveness channel names one within [`LOSS_GRACE`] (`peer`: the error
    /// is one a dead peer's closed connection gives), else as
    /// [`Watch::fail_async`].
    fn fail_nccl(&self, error: String, peer: bool) {
        let liveness = lock_liveness(&self.registry).clone();
        if peer && let Some(loss) = liveness.and_then(|l| l.await_loss(LOSS_GRACE)) {
            self.fail(FailureKind::PeerLost(loss));
            return;
        }
        self.fail_async(error);
    }

    /// The failure once the watchdog has recorded one, waiting at most
    /// `within` for it.
    pub(super) fn await_failure(&self, within: Duration) -> Option<Failure> {
        let until = Instant::now() + within;
        nccl_control::wait::until(&self.changed, self.lock(), until, |st| st.failure.clone())
    }
}
