//! `--profile PATH` (built with `--features profile`): samples every
//! thread of this process on CPU time (`SIGPROF`, so it works where the
//! hardware counters `perf` needs are missing, as in the lent VMs) for the
//! whole run, and writes the stacks in the folded form flame-graph tools
//! read (`thread;outer;...;inner samples`, one line per stack) to
//! `PATH.<process id>`. Build unstripped, with line tables, so inlined
//! frames are named:
//!
//! ```text
//! CARGO_PROFILE_RELEASE_STRIP=false CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
//!   cargo build --release -p nccl-bench --features profile
//! ```

use std::path::{Path, PathBuf};

use crate::error::Result;

/// Samples per second of CPU time, per thread.
const HZ: i32 = 4999;

/// A running profile; [`Profile::finish`] writes it.
pub struct Profile {
    #[cfg(feature = "profile")]
    guard: pprof::ProfilerGuard<'static>,
    path: PathBuf,
}

impl Profile {
    /// Starts sampling for `--profile path`, or says why it cannot.
    pub fn start(path: &Path) -> Result<Profile> {
        let path = PathBuf::from(format!("{}.{}", path.display(), std::process::id()));
        #[cfg(feature = "profile")]
        {
            let guard = pprof::ProfilerGuardBuilder::default()
                .frequency(HZ)
                .blocklist(&[
                    "libc.so",
                    "libc-",
                    "libgcc",
                    "libpthread",
                    "vdso",
                    "ld-linux",
                ])
                .build()
                .map_err(|e| format!("--profile: {e}"))?;
            Ok(Profile { guard, path })
        }
        #[cfg(not(feature = "profile"))]
        {
            let _ = (HZ, path);
            Err("--profile: this nccl-bench was built without the `profile` feature".into())
        }
    }

    /// Stops sampling and writes the folded stacks; returns the file.
    pub fn finish(self) -> Result<PathBuf> {
        #[cfg(feature = "profile")]
        {
            use std::fmt::Write as _;
            let report = self
                .guard
                .report()
                .build()
                .map_err(|e| format!("--profile: {e}"))?;
            let mut lines: Vec<(isize, String)> = report
                .data
                .iter()
                .map(|(frames, count)| {
                    let mut line = frames.thread_name_or_id();
                    // Outermost first, inlined callees after their caller.
                    for frame in frames.frames.iter().rev() {
                        for symbol in frame.iter().rev() {
                            let _ = write!(line, ";{symbol}");
                        }
                    }
                    (*count, line)
                })
                .collect();
            lines.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            let text: String = lines.iter().map(|(n, l)| format!("{l} {n}\n")).collect();
            std::fs::write(&self.path, text)
                .map_err(|e| format!("writing {}: {e}", self.path.display()))?;
        }
        Ok(self.path)
    }
}
