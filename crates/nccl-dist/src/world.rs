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
//!
//! And one way to join a communicator whose id came from elsewhere (a
//! Python rank, a file, a configuration): [`World::from_unique_id`].

use std::net::{Ipv4Addr, TcpListener, ToSocketAddrs};

use nccl_safe::cudarc::driver::CudaContext;
use std::sync::Arc;

use nccl_safe::{AbortCause, AbortSignal, Comm, Config, UniqueId};

use crate::error::{Error, Result};
use crate::launch::{Launch, Launcher};
use crate::liveness::{Liveness, LossCause, PeerLoss};
use crate::rendezvous;
use crate::watchdog::Watchdog;

mod local;
use local::{local_launch, local_team, thread_comms};
mod on_loss;
pub(crate) use on_loss::Keeper;
use on_loss::{Keepers, Kept, abort_on_loss};
mod options;
mod recover;
mod resident;
mod resolved;
mod yard;
use options::apply_encryption;
pub use options::{
    DEFAULT_OP_TIMEOUT, ENCRYPTION_ENV, PORT_ENV, PSK_ENV, RECOVER_BY_SHRINK_ENV, RendezvousMethod,
    TIMEOUT_ENV, WorldOptions, default_config, encryption_from_lookup, nonblocking_config,
    op_timeout_from_lookup,
};
use resolved::{Resolved, Shape, beside_a_new_context, lost_or};

/// Every rank of the job: this rank's communicator over all of them, and
/// where it sits in the launch.
#[derive(Debug)]
pub struct World {
    /// First, so it drops first: the goodbye (or the loss report) goes out
    /// before the communicators are torn down.
    presence: Presence,
    /// Its meshes' communicators kept past a loss, torn down before its own.
    kept: Kept,
    comm: Comm,
    /// The nonblocking communicator the blocking one was split from: the
    /// parent of meshes, so that their creation can be cut short too.
    control: Option<Comm>,
    /// The configuration of children (meshes, axes): the world
    /// communicator's own (blocking, with the signal and the operation
    /// timeout, or the user's), so that a mesh can bound its one-rank
    /// axes' channels on top of it.
    child_config: Config,
    launch: Launch,
    watchdog: Option<Watchdog>,
    signal: AbortSignal,
    /// A world with a thread per GPU: where its threads meet to rebuild
    /// it after a loss ([`World::recover`]) and to release their old
    /// communicators together ([`World::release_retired`]).
    local: Option<Arc<local::Board>>,
    /// The parked communicators of the worlds this one was shrunk from
    /// ([`World::recover`]), children before parents: aborted when this
    /// world drops, after its own, off the recovery's path (with a thread
    /// per GPU: once every thread's world has dropped, `yard`), or earlier
    /// at [`World::release_retired`].
    retired: yard::Retired,
    /// Its place in the count of this process's worlds.
    resident: resident::Resident,
}

/// This rank's membership in the liveness channel. Dropped normally, it
/// says goodbye; dropped while the thread panics, it reports this rank
/// lost, so the peers stop waiting for it at once.
#[derive(Debug)]
struct Presence {
    rank: usize,
    liveness: Option<Liveness>,
}

impl Presence {
    /// Reports this rank lost on its channel, for `error` (a survivor whose
    /// part in a recovery failed): the others' waits for it end, a shrink
    /// of theirs included (any abort asked for during one cuts it short).
    fn gone(&self, error: &Error) {
        if let Some(liveness) = &self.liveness {
            liveness.report(PeerLoss {
                rank: self.rank,
                cause: LossCause::Exited {
                    reason: format!("its part in the recovery failed: {error}"),
                },
                seen_by: self.rank,
            });
        }
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        let Some(liveness) = self.liveness.take() else {
            return;
        };
        if std::thread::panicking() {
            liveness.report(PeerLoss {
                rank: self.rank,
                cause: LossCause::Panicked {
                    message: "its thread unwound while it held its World".into(),
                },
                seen_by: self.rank,
            });
        } else {
            liveness.leave();
        }
    }
}

/// Tells `spawn_local` that a rank's thread ended, and how, even when it
/// unwinds from a panic.
struct EndNotice {
    rank: usize,
    tx: std::sync::mpsc::Sender<(usize, Option<String>)>,
    /// `None`: it ended well.
    failure: Option<String>,
}

impl Drop for EndNotice {
    fn drop(&mut self) {
        let _ = self.tx.send((self.rank, self.failure.take()));
    }
}

/// Watches the world's communicator; `gated`: one thread per rank, so
/// its calls that may connect inside NCCL are gated (the world rank is
/// the communicator's).
pub(super) fn watched(comm: &Comm, watchdog: &Option<Watchdog>, gated: bool) {
    if let Some(w) = watchdog {
        let members = gated.then(|| (0..comm.size()).collect());
        w.watch_ranks(comm, format!("world[{}]", comm.rank()), members);
    }
}

/// The GPUs of this machine, after checking for the driver (cudarc panics
/// without libcuda: this says so as an error first).
fn gpu_count(op: &'static str) -> Result<usize> {
    nccl_safe::require_cuda_driver()?;
    Ok(CudaContext::device_count().map_err(crate::error::cuda(op))? as usize)
}

/// Checks that every device exists and none repeats; answers the number
/// of GPUs.
fn check_devices(op: &'static str, devices: &[usize]) -> Result<usize> {
    if devices.is_empty() {
        return Err(Error::InvalidArgument {
            op,
            reason: "no devices".into(),
        });
    }
    let count = gpu_count(op)?;
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
    Ok(count)
}

impl World {
    /// A process per GPU: [`Launch::detect`], then [`World::init_with`]
    /// with [`WorldOptions::new`].
    pub fn init() -> Result<World> {
        World::init_with(Launch::detect()?, &WorldOptions::new())
    }

    /// A process per GPU with the launch and options given: rank 0 makes the
    /// unique id and hands it out (TCP or file), while a thread of each
    /// rank makes its device's CUDA context; then every rank makes its
    /// communicators. A device that does not exist is
    /// [`Error::InvalidArgument`] before the rendezvous. A one-rank world
    /// needs no rendezvous. Over TCP the rendezvous connections stay open
    /// as the liveness channel: a rank that dies is named to every
    /// survivor, whose communicators are aborted ([`Error::PeerLost`]).
    pub fn init_with(launch: Launch, options: &WorldOptions) -> Result<World> {
        const OP: &str = "World::init_with";
        let device = options.device.unwrap_or(launch.local_rank);
        let _span = tracing::debug_span!(
            "nccl.world_init",
            rank = launch.rank,
            world = launch.world_size,
            device
        )
        .entered();
        // Before the rendezvous: a rank without a driver fails at once
        // instead of after its peers have waited for it.
        nccl_safe::require_cuda_driver()?;
        let resolved = Resolved::new(options)?;
        apply_encryption(options.encryption.as_ref())?;
        check_devices(OP, &[device])?;
        // The device's context is made beside the rendezvous (see
        // `beside_a_new_context`), and held until the world is formed.
        let (_context, exchanged) = beside_a_new_context(device, OP, || {
            Ok(if launch.world_size == 1 {
                (UniqueId::new()?, None)
            } else {
                match &options.method {
                    RendezvousMethod::Tcp => World::exchange_tcp(&launch, options, &resolved)?,
                    RendezvousMethod::File(path) => {
                        // The same secret as over TCP: given, else the
                        // environment's (a missing one is the same error).
                        let secret = options.job_secret()?;
                        let secret = &*secret;
                        let id = if launch.rank == 0 {
                            let id = UniqueId::new()?;
                            rendezvous::publish_file(path, &id.raw(), secret)?;
                            id
                        } else {
                            rendezvous::wait_file(path, secret, options.timeout)?.into()
                        };
                        (id, None)
                    }
                }
            })
        })?;
        let (id, liveness) = exchanged;
        World::form(&id, launch, device, resolved, liveness, Shape::Split)
    }

    /// This rank's world from a unique id obtained elsewhere: made by a
    /// Python rank (PyTorch, CuPy, JAX) and handed over by the caller's
    /// own means, read from a file ([`UniqueId::read_file`]), given as hex
    /// in a configuration ([`UniqueId::from_hex`]), or fetched over our
    /// rendezvous ([`crate::rendezvous::join`]). Every rank of the
    /// communicator must call `ncclCommInitRank` (here, or in the other
    /// language) with the same id and size and its own rank.
    ///
    /// There is no rendezvous, and so no liveness channel: a peer that
    /// dies is not named within seconds ([`Error::PeerLost`]); this rank
    /// finds out when an operation fails or passes the watchdog's timeout
    /// (on by default, [`WorldOptions::watchdog`]). The world's
    /// communicator is made by one `ncclCommInitRank`, as ranks in other
    /// languages make theirs (no split, which every rank would have to
    /// join): by default a nonblocking one, so its creation is bounded by
    /// the operation timeout and abortable (a blocking configuration given
    /// with [`WorldOptions::config`] is used as it is). The other options
    /// apply as for [`World::init_with`]: the operation timeout,
    /// encryption (which every rank must agree on); the secret, rendezvous
    /// method, port and liveness settings do not. The device is [`WorldOptions::device`], else `rank`
    /// modulo this machine's GPU count. [`World::launch`] then answers
    /// [`Launcher::Explicit`] with `local_rank` the device and
    /// `local_world_size` the GPU count, and no rendezvous address.
    ///
    /// `size` 0 or `rank >= size` is [`Error::InvalidArgument`] before any
    /// NCCL or driver call; a machine without the CUDA driver is refused
    /// next, before NCCL is loaded.
    pub fn from_unique_id(
        id: &UniqueId,
        rank: usize,
        size: usize,
        options: &WorldOptions,
    ) -> Result<World> {
        const OP: &str = "World::from_unique_id";
        if rank >= size {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("rank {rank} is out of range for a world of {size} ranks"),
            });
        }
        let device = match options.device {
            Some(d) => d,
            None => rank % gpu_count(OP)?.max(1),
        };
        let gpus = check_devices(OP, &[device])?;
        let _span = tracing::debug_span!(
            "nccl.world_init",
            rank,
            world = size,
            device,
            outside_id = true
        )
        .entered();
        let resolved = Resolved::new(options)?;
        apply_encryption(options.encryption.as_ref())?;
        let launch = Launch {
            rank,
            world_size: size,
            local_rank: device,
            local_world_size: gpus,
            master_addr: String::new(),
            master_port: 0,
            launcher: Launcher::Explicit,
        };
        World::form(id, launch, device, resolved, None, Shape::One)
    }

    /// The end of every way of forming a world in a process per rank: the
    /// watchdog, the liveness channel's abort hook, this rank's
    /// communicators on `device`, and the `World` holding them.
    fn form(
        id: &UniqueId,
        launch: Launch,
        device: usize,
        resolved: Resolved,
        liveness: Option<Liveness>,
        shape: Shape,
    ) -> Result<World> {
        let (rank, size) = (launch.rank, launch.world_size);
        World::form_with(launch, resolved, liveness, shape, |resolved| {
            resolved.make_comms(id, rank, size, device, shape)
        })
    }

    /// [`World::form`], the communicators made by `make` once the
    /// watchdog runs and a loss on the channel aborts them.
    fn form_with(
        launch: Launch,
        resolved: Resolved,
        liveness: Option<Liveness>,
        shape: Shape,
        make: impl FnOnce(&Resolved) -> Result<(Comm, Option<Comm>, Config)>,
    ) -> Result<World> {
        let watchdog = resolved.start_watchdog()?;
        let parks = resolved.parks_for(shape, launch.world_size);
        // Before the abort hook: keep the meshes' before the signal parks.
        let keepers = Keepers::first_on(liveness.as_ref(), parks);
        if let Some(l) = &liveness {
            if let Some(w) = &watchdog {
                w.exchange_over(l);
            }
            abort_on_loss(l, watchdog.clone(), resolved.signal.clone(), parks);
        }
        // Ranks in other languages (an outside id) make no gates.
        let gated = matches!(shape, Shape::Split);
        let (comm, control, child_config) = make(&resolved)?;
        watched(&comm, &watchdog, gated);
        // Ranks in other languages would not make the connecting call.
        if shape == Shape::Split {
            resolved.connect(&[&comm])?;
        }
        let kept = keepers.kept();
        Ok(World {
            presence: Presence {
                rank: launch.rank,
                liveness,
            },
            kept,
            comm,
            control,
            child_config,
            launch,
            watchdog,
            signal: resolved.signal,
            local: None,
            retired: keepers.retired(),
            resident: resident::Resident::new(),
        })
    }

    fn exchange_tcp(
        launch: &Launch,
        options: &WorldOptions,
        resolved: &Resolved,
    ) -> Result<(UniqueId, Option<Liveness>)> {
        let secret = options.job_secret()?;
        let secret = &*secret;
        let port = options.rendezvous_port(launch)?;
        let host = launch.master_addr.as_str();
        if launch.rank != 0 {
            // With liveness off this is the plain join, and the handle
            // never reports a loss.
            let (id, liveness) = rendezvous::join_live(
                (host, port),
                launch.rank,
                launch.world_size,
                secret,
                options.timeout,
                &resolved.liveness,
            )?;
            return Ok((id.into(), Some(liveness)));
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
        let (liveness, refused) = rendezvous::serve_live(
            &listener,
            launch.world_size,
            secret,
            &id.raw(),
            options.timeout,
            &resolved.liveness,
        )?;
        for error in refused {
            tracing::warn!(%error, "rendezvous: refused a peer");
        }
        Ok((id, Some(liveness)))
    }

    /// One process, one thread driving `n` GPUs (devices `0..n`): see
    /// [`World::local_with`].
    pub fn local(n: usize) -> Result<Vec<World>> {
        World::local_with(&(0..n).collect::<Vec<_>>(), &default_config())
    }

    /// One process, one thread driving `devices` (rank i on `devices[i]`),
    /// made together with `Comm::init_all`. Collectives on these worlds
    /// (and on meshes built from them) must be issued inside one group
    /// ([`nccl_safe::group`]). The watchdog is on unless the environment
    /// turns it off; there is no peer to lose but this thread.
    pub fn local_with(devices: &[usize], config: &Config) -> Result<Vec<World>> {
        check_devices("World::local", devices)?;
        let n = devices.len();
        let options = WorldOptions::new().config(config.clone());
        let resolved = Resolved::new(&options)?;
        let watchdog = resolved.start_watchdog()?;
        apply_encryption(None)?;
        let config = resolved
            .user_config
            .clone()
            .unwrap_or_else(|| resolved.data_config());
        let comms = Comm::init_all(devices, &config)?;
        for comm in &comms {
            watched(comm, &watchdog, false);
        }
        resolved.connect(&comms.iter().collect::<Vec<_>>())?;
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| World {
                presence: Presence {
                    rank,
                    liveness: None,
                },
                kept: Kept::default(),
                comm,
                control: None,
                child_config: config.clone().park_on_peer_loss(false),
                launch: local_launch(rank, n),
                watchdog: watchdog.clone(),
                signal: resolved.signal.clone(),
                local: None,
                retired: yard::Retired::new(None),
                resident: resident::Resident::new(),
            })
            .collect())
    }

    /// One process, a thread per GPU (devices `0..n`), default options:
    /// see [`World::spawn_local_with_options`].
    ///
    /// The closure's error type is the caller's: anything our errors
    /// convert into, so `?` works on this crate's calls and on the
    /// caller's own. With a boxed error, name it in the closure's return
    /// type:
    ///
    /// ```no_run
    /// use nccl_dist::World;
    /// use nccl_dist::nccl_safe::ReduceOp;
    ///
    /// type BoxError = Box<dyn std::error::Error + Send + Sync>;
    ///
    /// let sums = World::spawn_local(2, |world| -> Result<f32, BoxError> {
    ///     let scale: f32 = std::env::var("SCALE")?.parse()?; // the caller's errors
    ///     let stream = world.comm().stream();
    ///     let mut x = stream.clone_htod(&[scale])?; // cudarc's
    ///     world.comm().all_reduce_in_place(&mut x, ReduceOp::Sum)?; // ours
    ///     Ok(stream.clone_dtoh(&x)?[0])
    /// })?;
    /// println!("{sums:?}");
    /// # Ok::<(), BoxError>(())
    /// ```
    ///
    /// With this crate's [`Error`] the return type is inferred as soon as
    /// one of the closure's paths has that type, or from the caller's:
    ///
    /// ```no_run
    /// use nccl_dist::{Result, World};
    ///
    /// fn ranks() -> Result<Vec<usize>> {
    ///     World::spawn_local(2, |world| Ok(world.rank()))
    /// }
    /// ```
    pub fn spawn_local<R, E>(
        n: usize,
        f: impl Fn(World) -> Result<R, E> + Sync,
    ) -> Result<Vec<R>, E>
    where
        R: Send,
        E: From<Error> + std::fmt::Display + Send,
    {
        World::spawn_local_with_options(&(0..n).collect::<Vec<_>>(), &WorldOptions::new(), f)
    }

    /// As [`World::spawn_local_with_options`] with `config` as the
    /// communicators' configuration ([`WorldOptions::config`]).
    pub fn spawn_local_with<R, E>(
        devices: &[usize],
        config: &Config,
        f: impl Fn(World) -> Result<R, E> + Sync,
    ) -> Result<Vec<R>, E>
    where
        R: Send,
        E: From<Error> + std::fmt::Display + Send,
    {
        World::spawn_local_with_options(devices, &WorldOptions::new().config(config.clone()), f)
    }

    /// One process, a thread per device of `devices`: each thread joins
    /// rank i on `devices[i]` and runs `f` with its `World`. Returns every
    /// rank's result in rank order, or the root cause's error: a panic
    /// ([`Error::RankPanicked`], converted into `E`), else the error of
    /// the rank that the job's abort signal names as the first to fail or
    /// be lost (the others' errors follow from it), else the first rank's
    /// error. `E` is any error type that this crate's [`Error`] converts
    /// into ([`World::spawn_local`] shows two). The rendezvous, secret,
    /// port and device options do not apply. A rank whose thread panics (or fails to make
    /// its communicators) is reported lost to the others at once: their
    /// communicators are aborted and their operations answer
    /// [`Error::PeerLost`] naming it.
    ///
    /// Dropping communicators (a [`crate::DeviceMesh`], a split) while
    /// another rank's thread has already launched its next collective can
    /// hang: NCCL may free one rank's resources from another rank's thread
    /// with device-synchronising calls, which wait for that collective,
    /// which waits for the rank being torn down. Let the threads meet on the
    /// host (a `std::sync::Barrier`) after such drops. (Seen with NCCL
    /// 2.28.9 on 2 and 4 GPUs; one thread per process is not affected.)
    pub fn spawn_local_with_options<R, E>(
        devices: &[usize],
        options: &WorldOptions,
        f: impl Fn(World) -> Result<R, E> + Sync,
    ) -> Result<Vec<R>, E>
    where
        R: Send,
        E: From<Error> + std::fmt::Display + Send,
    {
        check_devices("World::spawn_local", devices)?;
        let n = devices.len();
        let resolved = Resolved::new(options)?;
        apply_encryption(options.encryption.as_ref())?;
        let id = UniqueId::new().map_err(Error::from)?;
        let (watchdog, liveness, keepers) = local_team(&resolved, n)?;
        let board = Arc::new(local::Board::default());
        let (id, f, watchdog, liveness, resolved) = (&id, &f, &watchdog, &liveness, &resolved);
        let (board, keepers) = (&board, &keepers);
        // Each rank says when it ends, and whether well, so the first to
        // fail (an error or a panic) aborts the others at once, whatever
        // order they end in: a rank waiting in a collective for a rank that
        // is gone would otherwise hold the join until its own timeout.
        let (ended_tx, ended_rx) = std::sync::mpsc::channel::<(usize, Option<String>)>();
        std::thread::scope(|scope| {
            let handles: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, &device)| {
                    let ended = EndNotice {
                        rank,
                        tx: ended_tx.clone(),
                        failure: Some("it panicked".into()),
                    };
                    scope.spawn(move || {
                        let mut ended = ended;
                        let result = (|| {
                            let (comm, control, child_config) =
                                thread_comms(resolved, rank, liveness.as_ref(), watchdog, |r| {
                                    r.make_comms(id, rank, n, device, Shape::Split)
                                })
                                .map_err(E::from)?;
                            f(World {
                                presence: Presence {
                                    rank,
                                    liveness: liveness.clone(),
                                },
                                kept: keepers.kept(),
                                comm,
                                control,
                                child_config,
                                launch: local_launch(rank, n),
                                watchdog: watchdog.clone(),
                                signal: resolved.signal.clone(),
                                local: Some(Arc::clone(board)),
                                retired: keepers.retired(),
                                resident: resident::Resident::new(),
                            })
                        })();
                        ended.failure = result.as_ref().err().map(|e| e.to_string());
                        result
                    })
                })
                .collect();
            drop(ended_tx);
            for (rank, failure) in ended_rx.iter() {
                if let Some(detail) = failure {
                    // The channel learns of it too, so the survivors can
                    // `World::recover` without it (a panic's presence
                    // reports itself; an error returned does not).
                    if let Some(l) = liveness
                        && !l.is_lost(rank)
                    {
                        l.report(PeerLoss {
                            rank,
                            cause: LossCause::Exited {
                                reason: detail.clone(),
                            },
                            seen_by: rank,
                        });
                    }
                    // Ends the others' NCCL calls (the signal aborts every
                    // communicator of this world); a no-op after the first.
                    resolved.signal.trigger(AbortCause::PeerLost {
                        rank,
                        detail: format!("rank {rank} ended early: {detail}"),
                    });
                }
            }
            // Every rank has ended: the signal names the root cause when
            // it was a rank (the first to fail or to be lost).
            let cause = resolved.signal.cause();
            let lost_elsewhere = |rank| match &cause {
                Some(AbortCause::PeerLost { rank: lost, .. }) => *lost != rank,
                _ => false,
            };
            let mut out = Vec::with_capacity(n);
            let mut first_error = None;
            for (rank, handle) in handles.into_iter().enumerate() {
                match handle.join() {
                    Ok(Ok(r)) => out.push(r),
                    Ok(Err(e)) => {
                        let lost = lost_elsewhere(rank);
                        // The root cause wins over the losses it caused.
                        if first_error
                            .as_ref()
                            .is_none_or(|&(_, first_lost): &(E, bool)| first_lost && !lost)
                        {
                            first_error = Some((e, lost));
                        }
                    }
                    Err(panic) => {
                        let message = panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        // A panic is the root cause; the others' PeerLost
                        // errors follow from it.
                        if first_error.as_ref().is_none_or(|&(_, lost)| lost) {
                            first_error =
                                Some((Error::RankPanicked { rank, message }.into(), false));
                        }
                    }
                }
            }
            match first_error {
                Some((e, _)) => Err(e),
                None => Ok(out),
            }
        })
    }

    /// The first `n` GPUs in an order that keeps neighbours on NVLink: the
    /// largest NVLink island first, each island in its ring order
    /// ([`Topology::ring_order`](crate::placement::Topology::ring_order)). Pass it to [`World::local_with`].
    pub fn nvlink_order(n: usize) -> Result<Vec<usize>> {
        crate::placement::nvlink_order(n)
    }

    /// This rank's communicator over the whole world.
    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    /// The watchdog watching this world's communicator, if any.
    pub fn watchdog(&self) -> Option<&Watchdog> {
        self.watchdog.as_ref()
    }

    /// The communicator, giving up the rest (this world's liveness ends
    /// with a goodbye).
    pub fn into_comm(self) -> Comm {
        self.comm
    }

    /// A world of [`World::local`] with other ranks: one thread drives
    /// them all, so its collective calls (splits included) must be made
    /// for every rank together.
    pub(crate) fn driven_with_others(&self) -> bool {
        self.launch.launcher == Launcher::Local && self.local.is_none() && self.size() > 1
    }

    /// The nonblocking communicator the world's was split from, if any
    /// (else the world's own): the parent of meshes, so their creation can
    /// be cut short.
    pub(crate) fn split_parent(&self) -> &Comm {
        self.control.as_ref().unwrap_or(&self.comm)
    }

    /// The configuration for communicators split from this world.
    pub(crate) fn child_config(&self) -> &Config {
        &self.child_config
    }

    /// An error of an operation on this world's communicators, as the
    /// watchdog or the liveness channel explain it ([`Error::PeerLost`]
    /// when a peer was lost). It only reads what they know: for an error
    /// of the world's own communicator, [`crate::watchdog::explain`] (and
    /// [`crate::synchronize`]) also hand a fresh NCCL error or timeout to
    /// the watchdog, which then names the diverging rank where the flight
    /// records show one.
    pub fn explain(&self, err: nccl_safe::Error) -> Error {
        match crate::watchdog::explain_known(&self.comm, err) {
            Error::Nccl(e) => lost_or(&self.signal, e),
            other => other,
        }
    }

    /// The liveness channel, if this world has one.
    pub fn liveness(&self) -> Option<&Liveness> {
        self.presence.liveness.as_ref()
    }

    /// The signal that aborts every communicator of this world (and of
    /// meshes made from it).
    pub fn abort_signal(&self) -> &AbortSignal {
        &self.signal
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
