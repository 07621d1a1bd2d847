//! Aborting and closing: [`AbortHandle`] (any thread), and `Comm`'s
//! revoke, finalize, destroy and abort.

use std::sync::Arc;

use crate::abort::AbortCause;
use crate::comm::handle::{CommStatus, Shared, State};
use crate::comm::teardown::drop_waited;
use crate::comm::{Comm, cuda, refuse_in_group};
use nccl_sys::ncclResult_t;

use crate::{Feature, Result};

/// Aborts a communicator from any thread. Cheap to clone.
#[derive(Clone)]
pub struct AbortHandle {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortHandle { .. }")
    }
}

/// An [`AbortHandle`] that does not keep the communicator alive: for a
/// watchdog, which must not delay the teardown of what it watches.
#[derive(Clone)]
pub struct WeakAbortHandle {
    shared: std::sync::Weak<Shared>,
}

impl std::fmt::Debug for WeakAbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakAbortHandle { .. }")
    }
}

impl WeakAbortHandle {
    /// The handle, while the communicator exists.
    pub fn upgrade(&self) -> Option<AbortHandle> {
        self.shared.upgrade().map(|shared| AbortHandle { shared })
    }

    /// Whether the communicator still exists, without taking a handle
    /// (so the caller never ends up holding the last one and its teardown).
    pub fn is_alive(&self) -> bool {
        self.shared.strong_count() > 0
    }

    /// Keeps the communicator from its teardown, while it exists: until
    /// the [`KeptComm`] drops, dropping its last [`Comm`] handle (a mesh's
    /// axis, say) does not tear it down. For a communicator parked on a
    /// loss ([`crate::Config::park_on_peer_loss`]), which only its
    /// teardown would abort: the layer that recovers keeps it past the
    /// recovery, so that NCCL's abort of it (up to a second) is neither
    /// waited for on the recovery's path nor run beside the recovered
    /// communicators' calls.
    pub fn keep(&self) -> Option<KeptComm> {
        self.shared.upgrade().map(|shared| KeptComm {
            shared: Some(shared),
        })
    }
}

/// A communicator kept from its teardown ([`WeakAbortHandle::keep`]). It
/// is no handle: nothing can be issued through it. Dropped last, it tears
/// the communicator down as its last [`Comm`] would (the dropping thread
/// waits for the teardown, bounded by the communicator's timeout).
pub struct KeptComm {
    shared: Option<Arc<Shared>>,
}

impl std::fmt::Debug for KeptComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptComm { .. }")
    }
}

impl Drop for KeptComm {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            drop_waited(shared);
        }
    }
}

impl AbortHandle {
    /// Whether both are handles of one communicator.
    pub(crate) fn same_as(&self, other: &AbortHandle) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// A handle that does not keep the communicator alive.
    pub fn downgrade(&self) -> WeakAbortHandle {
        WeakAbortHandle {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// `ncclCommAbort`: stops the communicator's work and frees it. Later
    /// calls on the `Comm` return `Error::Aborted`. Aborting twice is a
    /// no-op. On a blocking communicator this waits for a call in progress
    /// on another thread to return; a nonblocking one is interrupted
    /// between polls. When a group open on another thread holds calls on
    /// the communicator, the abort happens at that group's end (NCCL still
    /// refers to the communicator until then) and this returns at once.
    pub fn abort(&self) -> Result<()> {
        self.abort_with(AbortCause::Requested)
    }

    /// As [`AbortHandle::abort`], with the cause later calls report.
    pub fn abort_with(&self, cause: AbortCause) -> Result<()> {
        // On the thread that has a group open, the group still refers to
        // the communicator: abort after it ends.
        refuse_in_group("ncclCommAbort")?;
        self.shared.abort(cause)
    }

    /// Asks for an abort with `cause` without ever waiting: done at once
    /// when no other thread is inside a call on the communicator, else by
    /// that thread as soon as its call returns (or at the end of the group
    /// that holds calls on it). Returns whether it is aborted now. For
    /// watchdogs, which must never wait behind a blocking NCCL call.
    pub fn request_abort(&self, cause: AbortCause) -> bool {
        self.shared.request_abort(cause)
    }

    /// `ncclCommGetAsyncError`, from any thread: how a watchdog learns
    /// that a peer failed. [`crate::Error::Aborted`] once aborted. Waits for a
    /// call in progress on another thread; see [`AbortHandle::try_status`].
    pub fn status(&self) -> Result<CommStatus> {
        self.shared.status()
    }

    /// As [`AbortHandle::status`], but `None` at once when another thread
    /// is inside a call on the communicator.
    pub fn try_status(&self) -> Option<Result<CommStatus>> {
        self.shared.status_nowait()
    }

    /// Whether the communicator was aborted, or an abort was asked for.
    pub fn is_aborted(&self) -> bool {
        self.shared.abort_requested()
    }

    /// Why it was aborted (or is to be), once it was.
    pub fn cause(&self) -> Option<AbortCause> {
        self.shared
            .abort_requested()
            .then(|| self.shared.cause.get().cloned())
            .flatten()
    }
}

impl Comm {
    /// `ncclCommRevoke`: stops in-flight work so that the communicator can
    /// be split, shrunk or destroyed (NCCL 2.28.7+). It cannot be used for
    /// collectives afterwards.
    pub fn revoke(&self) -> Result<()> {
        const OP: &str = "ncclCommRevoke";
        refuse_in_group(OP)?;
        let lib = self.shared.lib;
        lib.capabilities().require(Feature::Revoke)?;
        let code = self.shared.with_raw(OP, |raw| {
            let revoke = lib.raw().ncclCommRevoke()?;
            // SAFETY: `raw` is live; the flags are the only valid value.
            Ok(unsafe { revoke(raw, nccl_sys::NCCL_REVOKE_DEFAULT) })
        })?;
        match code {
            ncclResult_t::ncclSuccess => Ok(()),
            ncclResult_t::ncclInProgress => self.shared.wait_ready(OP),
            code => self.shared.with_raw(OP, |raw| lib.check(OP, code, raw)),
        }
    }

    /// Finalizes and destroys the communicator, returning the errors
    /// `Drop` can only log. For a communicator of a group created
    /// together (`init_all`, `split_all`), this hands it in like `Drop` and
    /// the group is torn down when its last member goes.
    pub fn finalize(self) -> Result<()> {
        const OP: &str = "ncclCommFinalize";
        refuse_in_group(OP)?;
        self.refuse_shared(OP)?;
        if self.shared.clique.is_some() {
            return Ok(());
        }
        let lib = self.shared.lib;
        let _span = tracing::debug_span!("nccl.finalize").entered();
        let code = self.shared.with_raw(OP, |raw| {
            let finalize = lib.raw().ncclCommFinalize()?;
            // SAFETY: `raw` is live.
            Ok(unsafe { finalize(raw) })
        })?;
        if code == ncclResult_t::ncclInProgress
            || (code == ncclResult_t::ncclSuccess && !self.shared.blocking)
        {
            self.shared.wait_ready(OP)?;
        } else {
            self.shared.with_raw(OP, |raw| lib.check(OP, code, raw))?;
        }
        self.destroy()
    }

    /// `ncclCommDestroy` (which finalizes first if that was not done).
    ///
    /// NCCL's destroy waits inside NCCL, with no deadline, until every
    /// rank that connected to this one has finalized too. Dropping the
    /// `Comm` instead never waits there: the drop finalizes (bounded) and
    /// frees with `ncclCommAbort`.
    pub fn destroy(self) -> Result<()> {
        const OP: &str = "ncclCommDestroy";
        refuse_in_group(OP)?;
        self.refuse_shared(OP)?;
        if self.shared.clique.is_some() {
            return Ok(());
        }
        let lib = self.shared.lib;
        let mut state = self.shared.lock();
        let State::Live(raw) = *state else {
            return Ok(());
        };
        if self.shared.abort_due() {
            // Its work may wait for a lost peer (a parked one's does):
            // NCCL's destroy would wait for it with no deadline.
            drop(state);
            return self.shared.abort(AbortCause::Requested);
        }
        *state = State::Closed;
        drop(state);
        self.shared.ctx.bind_to_thread().map_err(cuda(OP))?;
        let destroy = lib.raw().ncclCommDestroy()?;
        // SAFETY: `raw` was live and the state now says Closed, so nothing
        // else frees or uses it.
        let code = unsafe { destroy(raw) };
        lib.check(OP, code, std::ptr::null_mut())
    }

    /// Finalize and destroy end the communicator for every handle: only
    /// the last may ([`Comm::share`]). Once this is the last handle, no
    /// other can appear (a handle is made from a handle).
    fn refuse_shared(&self, op: &'static str) -> Result<()> {
        if self
            .shared
            .handles
            .load(std::sync::atomic::Ordering::Acquire)
            > 1
        {
            return Err(crate::Error::InvalidArgument {
                op,
                reason: "other handles share this communicator (Comm::share): drop them first",
            });
        }
        Ok(())
    }

    /// `ncclCommAbort` now.
    pub fn abort(self) -> Result<()> {
        refuse_in_group("ncclCommAbort")?;
        self.shared.abort(AbortCause::Requested)
    }

    /// A handle that can abort this communicator from another thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// `ncclCommGetAsyncError`.
    pub fn status(&self) -> Result<CommStatus> {
        self.shared.status()
    }
}
