//! A barrier for the threads of one process, with a deadline.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;

/// A barrier for the threads of this process that drive ranks (one in
/// single and processes mode, one per GPU in threads mode), with a
/// deadline, so a thread that failed makes the others fail instead of
/// hang. Waiting allocates nothing.
pub struct HostBarrier {
    n: usize,
    state: Mutex<(usize, u64)>,
    turned: Condvar,
    timeout: Duration,
}

impl HostBarrier {
    pub fn new(n: usize, timeout: Duration) -> HostBarrier {
        HostBarrier {
            n,
            state: Mutex::new((0, 0)),
            turned: Condvar::new(),
            timeout,
        }
    }

    /// Threads of this process driving ranks.
    pub fn threads(&self) -> usize {
        self.n
    }

    pub fn wait(&self) -> Result<()> {
        if self.n == 1 {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        let mut st = self.state.lock().map_err(|_| "host barrier poisoned")?;
        let generation = st.1;
        st.0 += 1;
        if st.0 == self.n {
            *st = (0, generation + 1);
            self.turned.notify_all();
            return Ok(());
        }
        while st.1 == generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "the other threads of this process did not reach the host barrier within {:?} (one of them failed?)",
                    self.timeout
                )
                .into());
            }
            st = self
                .turned
                .wait_timeout(st, left)
                .map_err(|_| "host barrier poisoned")?
                .0;
        }
        Ok(())
    }
}
