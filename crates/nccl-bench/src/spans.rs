//! `--setup`'s phase breakdown: a `tracing` subscriber that times the
//! crates' set-up spans (`nccl.library_load`, `nccl.rendezvous_*`,
//! `nccl.init_rank`, `nccl.split`, `nccl.topology_probe`, ...) from
//! creation to close and sums them by name. Only spans at debug level or
//! above whose name starts with `nccl.` are timed; events are off, so the
//! per-call spans (trace level) and every log line cost nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::ThreadId;
use std::time::Instant;

use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A live span: its name, when it was made, and its handles.
struct Open {
    name: &'static str,
    thread: ThreadId,
    since: Instant,
    refs: usize,
}

#[derive(Default)]
struct State {
    open: HashMap<u64, Open>,
    /// Milliseconds summed by span name and the thread that made the
    /// span, since the last [`take`].
    done: HashMap<(&'static str, ThreadId), f64>,
}

struct SpanTimes {
    next: AtomicU64,
    state: Mutex<State>,
}

impl Default for SpanTimes {
    fn default() -> Self {
        SpanTimes {
            // Span ids start at 1 (0 is not a valid `Id`).
            next: AtomicU64::new(1),
            state: Mutex::new(State::default()),
        }
    }
}

static TIMES: OnceLock<Arc<SpanTimes>> = OnceLock::new();

impl SpanTimes {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Subscriber for SpanTimes {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_span()
            && *metadata.level() <= tracing::Level::DEBUG
            && metadata.name().starts_with("nccl.")
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let open = Open {
            name: span.metadata().name(),
            thread: std::thread::current().id(),
            since: Instant::now(),
            refs: 1,
        };
        self.lock().open.insert(id, open);
        Id::from_u64(id)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}

    fn clone_span(&self, id: &Id) -> Id {
        if let Some(open) = self.lock().open.get_mut(&id.into_u64()) {
            open.refs += 1;
        }
        id.clone()
    }

    fn try_close(&self, id: Id) -> bool {
        let mut state = self.lock();
        let key = id.into_u64();
        let closed = match state.open.get_mut(&key) {
            Some(open) if open.refs > 1 => {
                open.refs -= 1;
                false
            }
            Some(_) => true,
            None => false,
        };
        if closed && let Some(open) = state.open.remove(&key) {
            *state.done.entry((open.name, open.thread)).or_default() +=
                open.since.elapsed().as_secs_f64() * 1e3;
        }
        closed
    }
}

/// Installs the timing subscriber for the process (once; `false` when
/// another subscriber was installed first).
pub fn install() -> bool {
    let times = TIMES.get_or_init(|| Arc::new(SpanTimes::default()));
    tracing::subscriber::set_global_default(Arc::clone(times)).is_ok()
}

/// Per span name, the milliseconds summed over one thread's spans, the
/// largest over threads (a rank's share when each rank is a thread),
/// since the last call; then a fresh start.
pub fn take() -> HashMap<&'static str, f64> {
    let done = TIMES
        .get()
        .map(|t| std::mem::take(&mut t.lock().done))
        .unwrap_or_default();
    slowest_thread(done)
}

/// Per span name, the milliseconds summed over the calling thread's
/// spans since its last call (of this or [`take`]); other threads' stay.
pub fn take_thread() -> HashMap<&'static str, f64> {
    let me = std::thread::current().id();
    let Some(times) = TIMES.get() else {
        return HashMap::new();
    };
    let mut state = times.lock();
    let mine: Vec<_> = state.done.keys().filter(|k| k.1 == me).copied().collect();
    mine.into_iter()
        .filter_map(|k| state.done.remove(&k).map(|ms| (k.0, ms)))
        .collect()
}

fn slowest_thread(done: HashMap<(&'static str, ThreadId), f64>) -> HashMap<&'static str, f64> {
    let mut out: HashMap<&'static str, f64> = HashMap::new();
    for ((name, _), ms) in done {
        let slot = out.entry(name).or_default();
        *slot = slot.max(ms);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spans are summed by name; events and trace-level spans are not
    /// timed.
    #[test]
    fn spans_are_summed_by_name() {
        let times = Arc::new(SpanTimes::default());
        tracing::subscriber::with_default(Arc::clone(&times), || {
            for _ in 0..2 {
                let _s = tracing::debug_span!("nccl.split").entered();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            let _t = tracing::trace_span!("nccl.all_reduce").entered();
            let _o = tracing::debug_span!("other.span").entered();
        });
        let done = slowest_thread(std::mem::take(&mut times.lock().done));
        assert_eq!(done.len(), 1, "{done:?}");
        assert!(done["nccl.split"] >= 4.0, "{done:?}");
        assert!(times.lock().open.is_empty());
    }
}
