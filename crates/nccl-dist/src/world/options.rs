//! How a world bootstraps: [`WorldOptions`], the rendezvous method, the
//! default configurations and the settings read from the environment.

use std::path::PathBuf;
use std::time::Duration;

use nccl_safe::{Config, Encryption};

use crate::error::{Error, Result};
use crate::launch::{Launch, Launcher};
use crate::liveness::LivenessOptions;
use crate::secret::Secret;
use crate::watchdog::WatchdogOptions;

pub use crate::env::PORT_ENV;

/// How rank 0's unique id reaches the other ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RendezvousMethod {
    /// Rank 0 listens on `master_addr`, the others connect; every peer
    /// proves it knows the shared [`Secret`] (the default).
    Tcp,
    /// Rank 0 writes the id to this file (mode 0600, atomically), the
    /// others wait for it. The file is authenticated with the shared
    /// [`Secret`] and dated: a file written without it, or older than ten
    /// minutes, is refused (see [`crate::rendezvous`]). Use a fresh path
    /// (or secret) per job all the same: a recent file of an earlier job
    /// with the same secret would hand out its id.
    File(PathBuf),
}

/// How [`World::init_with`](crate::World::init_with) bootstraps.
#[derive(Debug, Clone)]
pub struct WorldOptions {
    pub(super) secret: Option<Secret>,
    pub(super) timeout: Duration,
    pub(super) config: Option<Config>,
    pub(super) op_timeout: Option<Duration>,
    pub(super) method: RendezvousMethod,
    pub(super) device: Option<usize>,
    pub(super) port: Option<u16>,
    pub(super) watchdog: Option<WatchdogOptions>,
    pub(super) no_watchdog: bool,
    pub(super) check_calls: Option<bool>,
    pub(super) liveness: Option<LivenessOptions>,
    pub(super) encryption: Option<Encryption>,
    pub(super) lazy_connect: bool,
    pub(super) shrink_recovery: Option<bool>,
}

impl Default for WorldOptions {
    fn default() -> Self {
        WorldOptions::new()
    }
}

impl WorldOptions {
    /// The defaults, which are both safe and fast: TCP rendezvous with the
    /// secret from the environment ([`Secret::from_env`]) and a 300 s
    /// deadline; blocking communicators on the hot path (made by a
    /// nonblocking init and split, so that creation can be cut short); the
    /// watchdog on ([`WatchdogOptions::from_env`]: off only with
    /// `NCCL_RS_WATCHDOG=0`); liveness on ([`LivenessOptions::from_env`]);
    /// the operation timeout from `NCCL_RS_TIMEOUT` or 300 s; the GPU of
    /// `LOCAL_RANK`.
    pub fn new() -> WorldOptions {
        WorldOptions {
            secret: None,
            timeout: Duration::from_secs(300),
            config: None,
            op_timeout: None,
            method: RendezvousMethod::Tcp,
            device: None,
            port: None,
            watchdog: None,
            no_watchdog: false,
            check_calls: None,
            liveness: None,
            encryption: None,
            lazy_connect: false,
            shrink_recovery: None,
        }
    }

    /// Whether a world recovers by shrink (on by default). On, the world's
    /// two communicators park on a loss instead of aborting
    /// ([`nccl_safe::Config::park_on_peer_loss`], where NCCL has
    /// `ncclCommShrink`, 2.27+), and [`crate::World::recover`] shrinks the
    /// parked one (`NCCL_SHRINK_ABORT`) instead of waiting for NCCL's
    /// teardown of the old world (up to 500 ms per communicator: proxy
    /// threads that poll at that interval): on 2 H100s, 45–65 ms from the
    /// loss known to the first all-reduce on the recovered world, against
    /// 920–960 ms with `false`. `false` aborts the old world and gives it
    /// up before the recovery makes new communicators (so does a library
    /// older than 2.27, a graph that may refer to the world, or a
    /// communicator NCCL reports an error on). Default:
    /// `NCCL_RS_RECOVER_BY_SHRINK` (`0` turns it off), else on.
    ///
    /// ```
    /// use nccl_dist::WorldOptions;
    /// // Give the old world up on a recovery instead.
    /// let options = WorldOptions::new().recover_by_shrink(false);
    /// # let _ = options;
    /// ```
    pub fn recover_by_shrink(mut self, on: bool) -> Self {
        self.shrink_recovery = Some(on);
        self
    }

    /// Leave the world's connections to its first collective, as NCCL
    /// does by default (`NCCL_RUNTIME_CONNECT=1`), instead of making them
    /// before the world is returned.
    ///
    /// By default a world whose ranks are all ours ([`World::init_with`],
    /// [`World::spawn_local_with_options`], [`World::local_with`],
    /// [`World::recover`]; not [`World::from_unique_id`], whose other ranks
    /// may not make the same call) ends its creation with one one-element
    /// all-reduce, so NCCL connects the ring of its communicator there:
    /// the world's first collective, and the first of every mesh axis that
    /// holds the world's ranks in order (which shares the world's
    /// communicator, [`crate::DeviceMesh::new`]), then pay nothing more,
    /// and a rank that cannot connect fails its world's creation, under
    /// the creation's deadline and the liveness channel, rather than the
    /// first step. The connection took 136–149 ms between two processes
    /// and 15–20 ms between two threads on 2 H200s (NCCL 2.28), with
    /// NCCL's buffers for each peer of the ring. Lazy, a world that is
    /// never used for a collective (every call on meshes of smaller axes)
    /// keeps that time and memory. Every rank must choose alike: the
    /// ranks that connect wait for the others in the connection's gate,
    /// which names them silent.
    ///
    /// [`World::init_with`]: crate::World::init_with
    /// [`World::spawn_local_with_options`]: crate::World::spawn_local_with_options
    /// [`World::local_with`]: crate::World::local_with
    /// [`World::recover`]: crate::World::recover
    /// [`World::from_unique_id`]: crate::World::from_unique_id
    pub fn lazy_connect(mut self) -> Self {
        self.lazy_connect = true;
        self
    }

    /// How long one operation may take before its communicator is aborted
    /// (the watchdog's timeout), which also bounds every wait of the
    /// communicators (nonblocking creation, [`crate::synchronize`], drop).
    /// Default: `NCCL_RS_TIMEOUT` (seconds) or 300 s.
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = Some(timeout);
        self
    }

    /// No watchdog (it is on by default).
    pub fn no_watchdog(mut self) -> Self {
        self.no_watchdog = true;
        self.watchdog = None;
        self
    }

    /// Compare every call on the world's communicator across the ranks
    /// before it launches (instead of what `NCCL_RS_CHECK_CALLS` says; off
    /// by default), for debugging: a call on which the ranks disagree
    /// (operation, count, dtype (f32 against i32 of the same width too),
    /// reduction, root) is refused on every rank before launch with
    /// [`nccl_safe::Error::CheckFailed`], whose source is a
    /// [`CheckFailure`](crate::CheckFailure) (get it with
    /// [`CheckFailure::of`](crate::CheckFailure::of)) carrying the same
    /// [`Divergence`](crate::Divergence) report a timeout gives; ranks that
    /// do not check in within the watchdog's timeout (the operation
    /// timeout unless the watchdog has its own) are named instead. Every
    /// rank must turn it on alike: a rank that checks while the others do
    /// not waits out that timeout on every call. A rank lost meanwhile
    /// ends the wait (the call then meets the communicator's abort, whose
    /// error names the lost rank). A call refused on one rank only (by its
    /// own validation: a short buffer, say) or skipped there (count 0)
    /// is not numbered there, so the ranks' checks fall out of step: the
    /// others are refused as missing that rank, and later checks compare
    /// different calls; make a new world after such an error.
    /// Needs the watchdog (it is its observer) and the liveness channel of
    /// a process job (a world of threads, or one without liveness, passes
    /// every check); only the world's communicator is checked (with the
    /// axes of a mesh in the world's order that share it), not a split,
    /// and only calls made outside a group and a capture. Each checked call costs a round trip to rank 0 and back:
    /// measured with every rank a thread over loopback on a 2-core x86 VM
    /// (debug build), a median of about 0.14 ms per call with 2 or 3 ranks
    /// and 0.22 ms with 4 (`docs/troubleshooting.md`), far more than a
    /// small collective.
    pub fn check_calls(mut self, on: bool) -> Self {
        self.check_calls = Some(on);
        self
    }

    /// Liveness settings, instead of the environment's.
    pub fn liveness(mut self, options: LivenessOptions) -> Self {
        self.liveness = Some(options);
        self
    }

    /// Encrypt NCCL's socket traffic ([`nccl_safe::set_encryption`],
    /// NCCL 2.32+) before the communicator is made, instead of what
    /// `NCCL_RS_ENCRYPTION` says. An older library makes `init` fail.
    pub fn encryption(mut self, encryption: Encryption) -> Self {
        self.encryption = Some(encryption);
        self
    }

    /// Watch the world's communicator, and every communicator split from
    /// it (meshes, axes), with a [`Watchdog`](crate::Watchdog) (instead of what the
    /// environment says).
    pub fn watchdog(mut self, options: WatchdogOptions) -> Self {
        self.watchdog = Some(options);
        self.no_watchdog = false;
        self
    }

    /// The job's secret: the one given, else the environment's.
    pub(super) fn job_secret(&self) -> Result<std::borrow::Cow<'_, Secret>> {
        Ok(match &self.secret {
            Some(s) => std::borrow::Cow::Borrowed(s),
            None => std::borrow::Cow::Owned(Secret::from_env()?),
        })
    }

    /// The shared secret, instead of reading it from the environment.
    pub fn secret(mut self, secret: Secret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// How long the rendezvous may take (rank 0 waiting for everyone, the
    /// others retrying their connection).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The communicator configuration, instead of the default pair (a
    /// nonblocking init, then a blocking communicator split from it): the
    /// world's communicator is made by one `init_rank` with exactly this
    /// configuration (its timeout is the operation timeout unless
    /// [`WorldOptions::op_timeout`] is set). A blocking configuration
    /// cannot be cut short while NCCL blocks the calling thread, in init
    /// included; [`nonblocking_config`] is NCCL's nonblocking mode (every
    /// call polled, about 10x the latency of small collectives).
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// TCP (default) or file rendezvous.
    pub fn method(mut self, method: RendezvousMethod) -> Self {
        self.method = method;
        self
    }

    /// The GPU to use, instead of the one numbered `LOCAL_RANK`.
    pub fn device(mut self, device: usize) -> Self {
        self.device = Some(device);
        self
    }

    /// The rendezvous port. Without it: `NCCL_RS_PORT` if set; else, under
    /// torchrun, `MASTER_PORT + 1` (torchrun's own store already listens on
    /// `MASTER_PORT`); else the launch's `master_port`.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    pub(super) fn rendezvous_port(&self, launch: &Launch) -> Result<u16> {
        if let Some(p) = self.port {
            return Ok(p);
        }
        if let Some(v) = std::env::var_os(PORT_ENV) {
            return Ok(crate::launch::port(PORT_ENV, v.to_string_lossy().trim())?);
        }
        if launch.launcher == Launcher::Torchrun {
            return launch
                .master_port
                .checked_add(1)
                .ok_or_else(|| Error::InvalidArgument {
                    op: "World::init",
                    reason:
                        "MASTER_PORT is 65535, so MASTER_PORT + 1 does not exist; set NCCL_RS_PORT"
                            .into(),
                });
        }
        Ok(launch.master_port)
    }
}

/// The configuration `nccl-dist` uses unless told otherwise: NCCL's
/// defaults (blocking: no NCCL nonblocking group on the per-call path)
/// with a [`DEFAULT_OP_TIMEOUT`] bound on our own waits.
pub fn default_config() -> Config {
    Config::new().timeout(DEFAULT_OP_TIMEOUT)
}

/// NCCL's nonblocking mode: every call returns at once and is polled
/// against the timeout. NCCL runs each nonblocking group end on a new host
/// thread, so a small collective costs tens of microseconds more; choose it
/// only when a call must never hold the calling thread.
pub fn nonblocking_config() -> Config {
    default_config().blocking(false)
}

/// The operation timeout unless `NCCL_RS_TIMEOUT` or
/// [`WorldOptions::op_timeout`] says otherwise: long, for training steps
/// that take minutes (PyTorch's default is 10 minutes).
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(300);

pub use crate::env::TIMEOUT_ENV;

/// The operation timeout from the environment (`NCCL_RS_TIMEOUT`, seconds,
/// at least 0.001), `None` when unset.
pub fn op_timeout_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Duration>> {
    Ok(crate::env::op_timeout(lookup)?)
}

pub use crate::env::{ENCRYPTION_ENV, PSK_ENV, RECOVER_BY_SHRINK_ENV};

/// The encryption the environment asks for: `None` when it asks for none.
/// `psk` without a usable key is an error, never plaintext.
pub fn encryption_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<Encryption>> {
    Ok(crate::env::encryption(lookup)?)
}

/// Applies the encryption `options` ask for, else the environment's.
pub(super) fn apply_encryption(options: Option<&Encryption>) -> Result<()> {
    let encryption = match options {
        Some(e) => Some(e.clone()),
        None => encryption_from_lookup(|k| std::env::var(k).ok())?,
    };
    if let Some(e) = encryption {
        nccl_safe::set_encryption(&e)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_env as env;

    #[test]
    fn psk_without_a_key_is_an_error_never_plaintext() {
        assert_eq!(encryption_from_lookup(env(&[])).unwrap(), None);
        assert_eq!(
            encryption_from_lookup(env(&[("NCCL_RS_ENCRYPTION", "none")])).unwrap(),
            None
        );
        for bad in [
            &[("NCCL_RS_ENCRYPTION", "psk")][..],
            &[("NCCL_RS_ENCRYPTION", "psk"), ("NCCL_RS_PSK", "")],
            &[("NCCL_RS_ENCRYPTION", "psk"), ("NCCL_RS_PSK", "short")],
            &[("NCCL_RS_ENCRYPTION", "tls")],
        ] {
            let pairs: &'static [(&'static str, &'static str)] = bad;
            assert!(
                matches!(
                    encryption_from_lookup(env(pairs)),
                    Err(Error::InvalidArgument {
                        op: "NCCL_RS_ENCRYPTION",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        let ok = encryption_from_lookup(env(&[
            ("NCCL_RS_ENCRYPTION", "psk"),
            ("NCCL_RS_PSK", "0123456789abcdef0123"),
        ]))
        .unwrap();
        assert!(matches!(ok, Some(Encryption::Psk(_))));
    }
}
