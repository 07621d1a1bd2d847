//! Why a communicator was aborted, and a signal that aborts many at once.
//!
//! An abort has a cause ([`AbortCause`]), which every later call on the
//! communicator reports in [`crate::Error::Aborted`], so that "the
//! communicator was aborted" always says why (a lost peer, a timeout, a
//! request). An [`AbortSignal`] is shared by the communicators of one job
//! (set with [`crate::Config::abort_signal`]; children inherit it): when it
//! is triggered, every one of them is aborted, including one whose
//! nonblocking init or split is still in progress, and every later call
//! answers with the signal's cause.

use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Why a communicator was aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortCause {
    /// [`crate::AbortHandle::abort`] or [`crate::Comm::abort`].
    Requested,
    /// A peer rank of the job was lost (`detail` says how).
    PeerLost {
        /// The lost rank (in the job's world).
        rank: usize,
        /// How it was lost, as the detector put it.
        detail: String,
    },
    /// An operation did not finish in time (a watchdog or a wait of ours).
    Timeout {
        /// The operation that was unfinished.
        op: &'static str,
        /// Its sequence number on the communicator, where known.
        seq: Option<u64>,
    },
    /// NCCL reported an asynchronous error.
    AsyncError(String),
    /// Another reason, in words.
    Other(String),
}

impl std::fmt::Display for AbortCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbortCause::Requested => f.write_str("abort requested"),
            AbortCause::PeerLost { rank, detail } => {
                write!(f, "peer rank {rank} was lost: {detail}")
            }
            AbortCause::Timeout { op, seq: Some(seq) } => write!(f, "{op} #{seq} timed out"),
            AbortCause::Timeout { op, seq: None } => write!(f, "{op} timed out"),
            AbortCause::AsyncError(e) => write!(f, "NCCL reported: {e}"),
            AbortCause::Other(why) => f.write_str(why),
        }
    }
}

impl AbortCause {
    /// The lost rank, when the cause is [`AbortCause::PeerLost`].
    pub fn lost_rank(&self) -> Option<usize> {
        match self {
            AbortCause::PeerLost { rank, .. } => Some(*rank),
            _ => None,
        }
    }
}

/// A communicator a signal can abort (implemented by the communicator's
/// shared state, which sits above this file).
pub(crate) trait Abortable: Send + Sync {
    /// Asks for an abort with `cause` without waiting.
    fn request_abort(&self, cause: AbortCause) -> bool;
}

struct SignalInner {
    /// Set once, when triggered: whether and why.
    cause: OnceLock<AbortCause>,
    members: Mutex<Vec<Weak<dyn Abortable>>>,
}

/// Aborts every communicator that carries it, once. Cheap to clone; all
/// clones are one signal.
///
/// Triggering never waits for a call in progress: a communicator whose
/// lock is held (a blocking NCCL call, an open group on another thread) is
/// aborted by that thread as soon as it lets go.
///
/// ```
/// use nccl_safe::{AbortCause, AbortSignal, Config};
/// let signal = AbortSignal::new();
/// let config = Config::new().abort_signal(&signal);
/// assert!(config.get_abort_signal().is_some());
/// signal.trigger(AbortCause::Other("shutting down".into()));
/// assert!(signal.is_triggered());
/// ```
#[derive(Clone)]
pub struct AbortSignal {
    inner: Arc<SignalInner>,
}

impl std::fmt::Debug for AbortSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortSignal")
            .field("cause", &self.inner.cause.get())
            .finish_non_exhaustive()
    }
}

impl PartialEq for AbortSignal {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for AbortSignal {}

impl Default for AbortSignal {
    fn default() -> Self {
        AbortSignal::new()
    }
}

impl AbortSignal {
    /// A signal not yet triggered.
    pub fn new() -> AbortSignal {
        AbortSignal {
            inner: Arc::new(SignalInner {
                cause: OnceLock::new(),
                members: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Aborts every communicator carrying the signal (now, or as soon as
    /// the thread in a call on it lets go) with `cause`. The first cause
    /// wins; triggering again does nothing.
    pub fn trigger(&self, cause: AbortCause) {
        let _ = self.inner.cause.set(cause);
        let members: Vec<Arc<dyn Abortable>> = self
            .inner
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let cause = self.cause().unwrap_or(AbortCause::Requested);
        for member in members {
            member.request_abort(cause.clone());
        }
    }

    /// Whether it was triggered.
    pub fn is_triggered(&self) -> bool {
        self.inner.cause.get().is_some()
    }

    /// The cause it was triggered with.
    pub fn cause(&self) -> Option<AbortCause> {
        self.inner.cause.get().cloned()
    }

    /// Adds a communicator (at its creation).
    pub(crate) fn enroll(&self, member: Weak<dyn Abortable>) {
        let mut members = self.inner.members.lock().unwrap_or_else(|p| p.into_inner());
        members.retain(|w| w.strong_count() > 0);
        members.push(member);
    }
}
