//! The world communicator: every rank of the job, on its GPU.
//!
//! Three ways to get one:
//!
//! - [`World::init`]: a process per GPU, started by torchrun, `srun`,
//!   `mpirun` or `cargo xtask launch`. It reads the launch environment
//!   ([`Launch::detect`]), hands rank 0's unique id to every rank over the
//!   authenticated TCP rendezvous (or a file), and calls `init_rank` on the
//!   GPU of `LOCAL_RANK`.
//! - [`World::spawn_local`]: one process, a thread per GPU; each thread gets
//!   its own `World` and runs your closure.
//! - [`World::local`]: one process and one thread driving every GPU; the
//!   `World`s come back together and their collectives go in one group.

use std::net::{Ipv4Addr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use nccl_safe::cudarc::driver::CudaContext;
use nccl_safe::{Comm, Config, Encryption, PresharedKey, Topology, UniqueId};

use crate::error::{Error, Result};
use crate::launch::{Launch, Launcher};
use crate::rendezvous;
use crate::secret::Secret;
use crate::watchdog::{Watchdog, WatchdogOptions};

/// Environment variable that sets the rendezvous port, overriding the
/// launcher's (see [`WorldOptions::port`]).
pub const PORT_ENV: &str = "NCCL_RS_PORT";

/// How rank 0's unique id reaches the other ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RendezvousMethod {
    /// Rank 0 listens on `master_addr`, the others connect; every peer
    /// proves it knows the shared [`Secret`] (the default).
    Tcp,
    /// Rank 0 writes the id to this file (mode 0600, atomically), the
    /// others wait for it. Use a fresh path per job: a file left over from
    /// an earlier job would hand out a stale id.
    File(PathBuf),
}

/// How [`World::init_with`] bootstraps.
#[derive(Debug, Clone)]
pub struct WorldOptions {
    secret: Option<Secret>,
    timeout: Duration,
    config: Config,
    method: RendezvousMethod,
    device: Option<usize>,
    port: Option<u16>,
    watchdog: Option<WatchdogOptions>,
    encryption: Option<Encryption>,
}

impl Default for WorldOptions {
    fn default() -> Self {
        WorldOptions::new()
    }
}

impl WorldOptions {
    /// TCP rendezvous with the secret from the environment
    /// ([`Secret::from_env`]), a 300 s rendezvous deadline,
    /// [`default_config`], the GPU of `LOCAL_RANK`, the watchdog as the
    /// environment says ([`WatchdogOptions::from_env`]).
    pub fn new() -> WorldOptions {
        WorldOptions {
            secret: None,
            timeout: Duration::from_secs(300),
            config: default_config(),
            method: RendezvousMethod::Tcp,
            device: None,
            port: None,
            watchdog: None,
            encryption: None,
        }
    }

    /// Encrypt NCCL's socket traffic ([`nccl_safe::set_encryption`],
    /// NCCL 2.32+) before the communicator is made, instead of what
    /// `NCCL_RS_ENCRYPTION` says. An older library makes `init` fail.
    pub fn encryption(mut self, encryption: Encryption) -> Self {
        self.encryption = Some(encryption);
        self
    }

    /// Watch the world's communicator, and every communicator split from
    /// it (meshes, axes), with a [`Watchdog`] (instead of what the
    /// environment says).
    pub fn watchdog(mut self, options: WatchdogOptions) -> Self {
        self.watchdog = Some(options);
        self
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

    /// The communicator configuration ([`default_config`] unless set).
    /// A blocking configuration cannot be interrupted by a deadline or
    /// the watchdog while NCCL blocks the calling thread.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
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

    fn rendezvous_port(&self, launch: &Launch) -> Result<u16> {
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

/// Every rank of the job: this rank's communicator over all of them, and
/// where it sits in the launch.
#[derive(Debug)]
pub struct World {
    comm: Comm,
    launch: Launch,
    watchdog: Option<Watchdog>,
}

/// The configuration `nccl-dist` uses unless told otherwise: NCCL's
/// defaults, but nonblocking, so that every wait has a deadline and a stuck
/// call can be aborted (`Config::new().blocking(false)`).
pub fn default_config() -> Config {
    Config::new().blocking(false)
}

/// Environment variable: `psk` encrypts NCCL's sockets with the key in
/// [`PSK_ENV`]; `none` or unset leaves them as NCCL has them.
pub const ENCRYPTION_ENV: &str = "NCCL_RS_ENCRYPTION";
/// Environment variable with the pre-shared key for [`ENCRYPTION_ENV`].
pub const PSK_ENV: &str = "NCCL_RS_PSK";

/// The encryption the environment asks for: `None` when it asks for none.
/// `psk` without a usable key is an error, never plaintext.
pub fn encryption_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<Encryption>> {
    let bad = |reason: String| Error::InvalidArgument {
        op: ENCRYPTION_ENV,
        reason,
    };
    match lookup(ENCRYPTION_ENV).as_deref().map(str::trim) {
        None | Some("" | "none") => Ok(None),
        Some("psk") => {
            let key = lookup(PSK_ENV)
                .filter(|k| !k.is_empty())
                .ok_or_else(|| bad(format!("psk encryption needs the key in {PSK_ENV}")))?;
            let key = PresharedKey::new(key).map_err(|e| bad(format!("{PSK_ENV}: {e}")))?;
            Ok(Some(Encryption::Psk(key)))
        }
        Some(other) => Err(bad(format!("{other:?} is not `psk` or `none`"))),
    }
}

/// Applies the encryption `options` ask for, else the environment's.
fn apply_encryption(options: Option<&Encryption>) -> Result<()> {
    let encryption = match options {
        Some(e) => Some(e.clone()),
        None => encryption_from_lookup(|k| std::env::var(k).ok())?,
    };
    if let Some(e) = encryption {
        nccl_safe::set_encryption(&e)?;
    }
    Ok(())
}

/// The watchdog `options` ask for, else the environment's; started.
fn start_watchdog(options: Option<&WatchdogOptions>) -> Result<Option<Watchdog>> {
    let options = match options {
        Some(o) => Some(o.clone()),
        None => WatchdogOptions::from_env()?,
    };
    options.map(Watchdog::start).transpose()
}

fn watched(comm: &Comm, watchdog: &Option<Watchdog>) {
    if let Some(w) = watchdog {
        w.watch(comm, format!("world[{}]", comm.rank()));
    }
}

fn local_launch(rank: usize, size: usize) -> Launch {
    Launch {
        rank,
        world_size: size,
        local_rank: rank,
        local_world_size: size,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        launcher: Launcher::Local,
    }
}

/// Checks that every device exists and none repeats.
fn check_devices(op: &'static str, devices: &[usize]) -> Result<()> {
    if devices.is_empty() {
        return Err(Error::InvalidArgument {
            op,
            reason: "no devices".into(),
        });
    }
    let count = CudaContext::device_count().map_err(crate::error::cuda(op))? as usize;
    for (i, &d) in devices.iter().enumerate() {
        if d >= count {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("device {d} does not exist: this machine has {count} GPUs"),
            });
        }
        if devices[..i].contains(&d) {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("device {d} is listed twice"),
            });
        }
    }
    Ok(())
}

impl World {
    /// A process per GPU: [`Launch::detect`], then [`World::init_with`]
    /// with [`WorldOptions::new`].
    pub fn init() -> Result<World> {
        World::init_with(Launch::detect()?, &WorldOptions::new())
    }

    /// A process per GPU with the launch and options given: rank 0 makes the
    /// unique id and hands it out (TCP or file), then every rank calls
    /// `init_rank`. A one-rank world needs no rendezvous.
    pub fn init_with(launch: Launch, options: &WorldOptions) -> Result<World> {
        let device = options.device.unwrap_or(launch.local_rank);
        let _span = tracing::debug_span!(
            "nccl.world_init",
            rank = launch.rank,
            world = launch.world_size,
            device
        )
        .entered();
        apply_encryption(options.encryption.as_ref())?;
        let id = if launch.world_size == 1 {
            UniqueId::new()?
        } else {
            match &options.method {
                RendezvousMethod::Tcp => World::exchange_tcp(&launch, options)?,
                RendezvousMethod::File(path) => {
                    if launch.rank == 0 {
                        let id = UniqueId::new()?;
                        rendezvous::publish_file(path, &id)?;
                        id
                    } else {
                        rendezvous::wait_file(path, options.timeout)?
                    }
                }
            }
        };
        let watchdog = start_watchdog(options.watchdog.as_ref())?;
        let comm = Comm::init_rank(&id, launch.rank, launch.world_size, device, &options.config)?;
        watched(&comm, &watchdog);
        Ok(World {
            comm,
            launch,
            watchdog,
        })
    }

    fn exchange_tcp(launch: &Launch, options: &WorldOptions) -> Result<UniqueId> {
        let from_env;
        let secret = match &options.secret {
            Some(s) => s,
            None => {
                from_env = Secret::from_env()?;
                &from_env
            }
        };
        let port = options.rendezvous_port(launch)?;
        let host = launch.master_addr.as_str();
        if launch.rank != 0 {
            return Ok(rendezvous::join(
                (host, port),
                launch.rank,
                launch.world_size,
                secret,
                options.timeout,
            )?);
        }
        // Rank 0 listens on MASTER_ADDR when it is an address of this
        // machine, else on every interface (peers still need the secret).
        let listener = (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.find_map(|a| TcpListener::bind(a).ok()))
            .map_or_else(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)), Ok)
            .map_err(rendezvous::RendezvousError::Io)?;
        let id = UniqueId::new()?;
        let refused =
            rendezvous::serve(&listener, launch.world_size, secret, &id, options.timeout)?;
        for error in refused {
            tracing::warn!(%error, "rendezvous: refused a peer");
        }
        Ok(id)
    }

    /// One process, one thread driving `n` GPUs (devices `0..n`): see
    /// [`World::local_with`].
    pub fn local(n: usize) -> Result<Vec<World>> {
        World::local_with(&(0..n).collect::<Vec<_>>(), &default_config())
    }

    /// One process, one thread driving `devices` (rank i on `devices[i]`),
    /// made together with `Comm::init_all`. Collectives on these worlds
    /// (and on meshes built from them) must be issued inside one group
    /// ([`nccl_safe::group`]). The watchdog is as the environment says.
    pub fn local_with(devices: &[usize], config: &Config) -> Result<Vec<World>> {
        check_devices("World::local", devices)?;
        let n = devices.len();
        let watchdog = start_watchdog(None)?;
        apply_encryption(None)?;
        Ok(Comm::init_all(devices, config)?
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                watched(&comm, &watchdog);
                World {
                    comm,
                    launch: local_launch(rank, n),
                    watchdog: watchdog.clone(),
                }
            })
            .collect())
    }

    /// One process, a thread per GPU (devices `0..n`): see
    /// [`World::spawn_local_with`].
    pub fn spawn_local<R: Send>(n: usize, f: impl Fn(World) -> Result<R> + Sync) -> Result<Vec<R>> {
        World::spawn_local_with(&(0..n).collect::<Vec<_>>(), &default_config(), f)
    }

    /// One process, a thread per device of `devices`: each thread joins
    /// rank i on `devices[i]` and runs `f` with its `World`. Returns every
    /// rank's result in rank order, or the first rank's error (a panic is
    /// [`Error::RankPanicked`]). With a nonblocking `config` (as
    /// [`default_config`]), a rank that fails before the others finish
    /// `init_rank` makes its peers give up after the config's timeout
    /// instead of waiting for it. The watchdog is as the environment says.
    ///
    /// Dropping communicators (a [`crate::DeviceMesh`], a split) while
    /// another rank's thread has already launched its next collective can
    /// hang: NCCL may free one rank's resources from another rank's thread
    /// with device-synchronising calls, which wait for that collective,
    /// which waits for the rank being torn down. Let the threads meet on the
    /// host (a `std::sync::Barrier`) after such drops. (Seen with NCCL
    /// 2.28.9 on 2 and 4 GPUs; one thread per process is not affected.)
    pub fn spawn_local_with<R: Send>(
        devices: &[usize],
        config: &Config,
        f: impl Fn(World) -> Result<R> + Sync,
    ) -> Result<Vec<R>> {
        check_devices("World::spawn_local", devices)?;
        let n = devices.len();
        apply_encryption(None)?;
        let id = UniqueId::new()?;
        let watchdog = start_watchdog(None)?;
        let (id, f, watchdog) = (&id, &f, &watchdog);
        std::thread::scope(|scope| {
            let handles: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, &device)| {
                    scope.spawn(move || {
                        let comm = Comm::init_rank(id, rank, n, device, config)?;
                        watched(&comm, watchdog);
                        f(World {
                            comm,
                            launch: local_launch(rank, n),
                            watchdog: watchdog.clone(),
                        })
                    })
                })
                .collect();
            let mut out = Vec::with_capacity(n);
            let mut first_error = None;
            for (rank, handle) in handles.into_iter().enumerate() {
                match handle.join() {
                    Ok(Ok(r)) => out.push(r),
                    Ok(Err(e)) => {
                        first_error.get_or_insert(e);
                    }
                    Err(panic) => {
                        let message = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        first_error.get_or_insert(Error::RankPanicked { rank, message });
                    }
                }
            }
            match first_error {
                Some(e) => Err(e),
                None => Ok(out),
            }
        })
    }

    /// The first `n` GPUs in an order that keeps neighbours on NVLink: the
    /// largest NVLink island first, each island in its ring order
    /// ([`Topology::ring_order`]). Pass it to [`World::local_with`].
    pub fn nvlink_order(n: usize) -> Result<Vec<usize>> {
        let count = CudaContext::device_count().map_err(crate::error::cuda("nvlink_order"))?;
        let all: Vec<usize> = (0..count as usize).collect();
        let topology = Topology::probe(&all)?;
        let order = crate::device_mesh::device_order(&topology);
        if order.len() < n {
            return Err(Error::InvalidArgument {
                op: "World::nvlink_order",
                reason: format!("{n} GPUs asked for, this machine has {}", order.len()),
            });
        }
        Ok(order[..n].to_vec())
    }

    /// This rank's communicator over the whole world.
    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    /// The watchdog watching this world's communicator, if any.
    pub fn watchdog(&self) -> Option<&Watchdog> {
        self.watchdog.as_ref()
    }

    /// The communicator, giving up the rest.
    pub fn into_comm(self) -> Comm {
        self.comm
    }

    /// Global rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// Rank on this machine.
    pub fn local_rank(&self) -> usize {
        self.launch.local_rank
    }

    /// CUDA device ordinal of this rank.
    pub fn device(&self) -> usize {
        self.comm.device()
    }

    /// Where this rank's place in the job came from.
    pub fn launch(&self) -> &Launch {
        &self.launch
    }
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
