//! The crates' `tracing` spans and events, with the thread and the time
//! since the first, written unbuffered to stderr, so a run that dies (a
//! signal at exit, say) still shows what happened up to then
//! (`NCCL_SAFE_TEST_TRACE=1`, see `env.rs`). Imports nothing of this crate.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

struct Stderr {
    started: Instant,
    next: AtomicU64,
    names: Mutex<Vec<(u64, &'static str)>>,
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl Stderr {
    fn line(&self, what: &str) {
        let thread = std::thread::current();
        eprintln!(
            "[trace {:>10.3} ms {}] {what}",
            self.started.elapsed().as_secs_f64() * 1e3,
            thread.name().unwrap_or("?")
        );
    }

    fn name(&self, id: &Id) -> &'static str {
        let names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        names
            .iter()
            .find(|(i, _)| *i == id.into_u64())
            .map_or("?", |(_, n)| n)
    }
}

impl Subscriber for Stderr {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::DEBUG
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut fields = Fields(String::new());
        span.record(&mut fields);
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, span.metadata().name()));
        self.line(&format!("new {}{}", span.metadata().name(), fields.0));
        Id::from_u64(id)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.line(&format!(
            "{} {}{}",
            event.metadata().level(),
            event.metadata().target(),
            fields.0
        ));
    }

    fn enter(&self, span: &Id) {
        self.line(&format!("enter {}", self.name(span)));
    }

    fn exit(&self, span: &Id) {
        self.line(&format!("exit {}", self.name(span)));
    }
}

/// Installs the stderr trace as the process's subscriber (once; later
/// calls, or another subscriber already set, change nothing).
pub(crate) fn install() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing::subscriber::set_global_default(Stderr {
            started: Instant::now(),
            next: AtomicU64::new(1),
            names: Mutex::new(Vec::new()),
        });
    });
}
