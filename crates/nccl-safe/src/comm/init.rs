//! Making communicators: one rank, several ids, every local GPU at once.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaContext;
use nccl_sys::{ncclComm_t, ncclResult_t};

use crate::comm::handle::{Shared, State};
use crate::comm::teardown::Clique;
use crate::comm::{Comm, Parts, Reached, c_int, cuda, refuse_in_group, require_cuda_driver};
use crate::config::{Config, RawConfig};
use crate::group::GroupGuard;
use crate::library::Library;
use crate::unique_id::UniqueId;
use crate::{Error, Feature, Result};

impl Comm {
    pub(super) fn parts(device: usize, config: &Config) -> Result<(Parts, RawConfig)> {
        crate::secrecy::check_comm_id_env("communicator init")?;
        let lib = Library::get()?;
        require_cuda_driver()?;
        if !config.is_blocking() {
            lib.capabilities().require(Feature::Nonblocking)?;
        }
        let raw_config = config.to_raw(lib.version())?;
        let ctx = CudaContext::new(device).map_err(cuda("CudaContext::new"))?;
        ctx.bind_to_thread().map_err(cuda("bind_to_thread"))?;
        Ok((
            Parts {
                lib,
                ctx,
                blocking: config.is_blocking(),
                timeout: config.get_timeout(),
                signal: config.get_abort_signal().cloned(),
                park_on_loss: config.parks_on_peer_loss(),
                parentless: true,
            },
            raw_config,
        ))
    }

    /// Wraps a freshly created raw communicator; finishes a nonblocking
    /// creation by polling (its errors name `op`, the call that made it),
    /// then reads rank, size and device.
    pub(super) fn adopt(
        raw: ncclComm_t,
        parts: Parts,
        clique: Option<Arc<Clique>>,
        op: &'static str,
    ) -> Result<Comm> {
        let Parts {
            lib,
            ctx,
            blocking,
            timeout,
            signal,
            park_on_loss,
            parentless,
        } = parts;
        let stream = ctx.new_stream().map_err(cuda("new_stream"));
        let compute_capability = ctx.compute_capability().map_err(cuda("compute_capability"));
        let shared = Arc::new(Shared {
            state: Mutex::new(State::Live(raw)),
            lib,
            ctx,
            blocking,
            timeout,
            clique,
            cause: OnceLock::new(),
            in_open_group: AtomicBool::new(false),
            group_thread: AtomicU64::new(0),
            handles: std::sync::atomic::AtomicUsize::new(1),
            reached: Mutex::new(Reached::default()),
            signal: signal.clone(),
            drain: Mutex::new(None),
            last_observer: Mutex::new(None),
            spare_events: Mutex::new(Vec::new()),
            kernel_words: OnceLock::new(),
            park_on_loss,
            parked: AtomicBool::new(false),
            stop_pending: AtomicBool::new(false),
            stopper: Mutex::new(None),
            unparked: AtomicBool::new(false),
            shrinking: AtomicBool::new(false),
            creating: AtomicBool::new(!blocking && parentless),
            enrolment: crate::abort::Enrolment::new(),
        });
        // Enrolled before the wait, so a signal can cut a nonblocking init
        // short.
        if let Some(signal) = &signal {
            let member = Arc::downgrade(&shared) as std::sync::Weak<dyn crate::abort::Abortable>;
            signal.enroll(member, &shared.enrolment);
        }
        // From here on, `shared`'s Drop owns the handle.
        if !blocking && parentless {
            // An init: no other thread aborts it meanwhile (`creating`).
            // On an error `creating` stays, and the drop makes a due abort
            // (another thread's would wait while NCCL's init thread still
            // loads kernels).
            shared.wait_created(op)?;
            shared.creating.store(false, Ordering::SeqCst);
            // A loss that came as the creation ended found it creating and
            // left its abort to this thread (the store and `set_cause`'s
            // fence order the two looks): the drop makes it.
            std::sync::atomic::fence(Ordering::SeqCst);
            if shared.abort_due() {
                return Err(shared.aborted(op));
            }
        } else if !blocking {
            // A child: NCCL's job that made it may have read its parent,
            // which the signal aborts after it, as at any time.
            shared.wait_ready(op)?;
        }
        let (stream, compute_capability) = (stream?, compute_capability?);
        let query = |op: &'static str,
                     f: fn(
            &Library,
        )
            -> Result<nccl_sys::pfn::ncclCommCount, nccl_sys::SymbolError>| {
            shared.with_raw(op, |raw| {
                let get = f(lib)?;
                let mut value = 0;
                // SAFETY: `raw` is live; one int is written.
                let code = unsafe { get(raw, &mut value) };
                lib.check(op, code, raw)?;
                usize::try_from(value).map_err(|_| Error::InvalidArgument {
                    op,
                    reason: "negative value from NCCL",
                })
            })
        };
        let size = query("ncclCommCount", |l| l.raw().ncclCommCount())?;
        let rank = query("ncclCommUserRank", |l| l.raw().ncclCommUserRank())?;
        let device = query("ncclCommCuDevice", |l| l.raw().ncclCommCuDevice())?;
        Ok(Comm {
            shared: std::mem::ManuallyDrop::new(shared),
            stream,
            rank,
            size,
            device,
            compute_capability,
            force_send_recv: Cell::new(false),
            observer: RefCell::new(None),
            checks_before: Cell::new(false),
            gates: Cell::new(false),
            met: Cell::new(Default::default()),
            borrowed: RefCell::new(None),
            _not_sync: PhantomData,
        })
    }

    /// `ncclCommInitRankConfig`: joins rank `rank` of `nranks` on GPU
    /// `device`. Every rank passes the same `id` and `nranks` and calls at
    /// the same time (a thread or process each).
    pub fn init_rank(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        device: usize,
        config: &Config,
    ) -> Result<Comm> {
        const OP: &str = "ncclCommInitRankConfig";
        refuse_in_group(OP)?;
        if nranks == 0 || rank >= nranks {
            return Err(Error::RankOutOfRange {
                op: OP,
                what: "rank",
                rank,
                size: nranks,
            });
        }
        let nranks_c = c_int(OP, "nranks exceeds i32", nranks)?;
        let rank_c = c_int(OP, "rank exceeds i32", rank)?;
        let (parts, mut raw_config) = Comm::parts(device, config)?;
        let _span = tracing::debug_span!("nccl.init_rank", rank, nranks, device).entered();
        let init = parts.lib.raw().ncclCommInitRankConfig()?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer and config; the id is passed by value.
        let code = unsafe { init(&mut raw, nranks_c, id.raw(), rank_c, &mut raw_config.raw) };
        if raw.is_null() {
            parts.lib.check(OP, code, raw)?;
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "NCCL returned no communicator",
            });
        }
        if code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress {
            let err = parts.lib.check(OP, code, raw).err();
            let _ = Comm::adopt_failed(raw, parts);
            return Err(err.unwrap_or(Error::InvalidArgument {
                op: OP,
                reason: "init failed",
            }));
        }
        Comm::adopt(raw, parts, None, OP)
    }

    /// A handle NCCL gave back with an error: abort it so nothing leaks.
    pub(super) fn adopt_failed(raw: ncclComm_t, parts: Parts) -> Option<()> {
        let abort = parts.lib.raw().ncclCommAbort().ok()?;
        // SAFETY: a handle NCCL created; nobody else has it.
        let _ = unsafe { abort(raw) };
        Some(())
    }

    /// `ncclCommInitRankScalable`: as [`Comm::init_rank`] with several ids
    /// (the same list on every rank) to spread the bootstrap. NCCL 2.23+.
    pub fn init_rank_scalable(
        ids: &[UniqueId],
        rank: usize,
        nranks: usize,
        device: usize,
        config: &Config,
    ) -> Result<Comm> {
        const OP: &str = "ncclCommInitRankScalable";
        refuse_in_group(OP)?;
        let lib = Library::get()?;
        lib.capabilities().require(Feature::InitScalable)?;
        if ids.is_empty() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "no unique ids",
            });
        }
        if nranks == 0 || rank >= nranks {
            return Err(Error::RankOutOfRange {
                op: OP,
                what: "rank",
                rank,
                size: nranks,
            });
        }
        let (parts, mut raw_config) = Comm::parts(device, config)?;
        let _span = tracing::debug_span!(
            "nccl.init_rank_scalable",
            rank,
            nranks,
            device,
            ids = ids.len()
        )
        .entered();
        let init = lib.raw().ncclCommInitRankScalable()?;
        let mut raw_ids: Vec<_> = ids.iter().map(UniqueId::raw).collect();
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer, id array of the stated length, config.
        let code = unsafe {
            init(
                &mut raw,
                c_int(OP, "nranks exceeds i32", nranks)?,
                c_int(OP, "rank exceeds i32", rank)?,
                c_int(OP, "too many ids", raw_ids.len())?,
                raw_ids.as_mut_ptr(),
                &mut raw_config.raw,
            )
        };
        if raw.is_null()
            || (code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress)
        {
            let err = lib.check(OP, code, raw).err();
            if !raw.is_null() {
                Comm::adopt_failed(raw, parts);
            }
            return Err(err.unwrap_or(Error::InvalidArgument {
                op: OP,
                reason: "NCCL returned no communicator",
            }));
        }
        Comm::adopt(raw, parts, None, OP)
    }

    /// One communicator per device of `devices`, all in this process and
    /// driven from this thread (rank i on `devices[i]`). Created in one group
    /// with `ncclCommInitRankConfig`, which is what `ncclCommInitAll` does,
    /// but with a [`Config`]. Collectives on them must be issued inside a
    /// group ([`GroupGuard`]); they may be dropped in any order.
    pub fn init_all(devices: &[usize], config: &Config) -> Result<Vec<Comm>> {
        const OP: &str = "ncclCommInitAll";
        refuse_in_group(OP)?;
        if devices.is_empty() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "no devices",
            });
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "a device is listed twice",
                });
            }
        }
        let nranks = c_int(OP, "too many devices", devices.len())?;
        // Before the unique id, in `parts`' order: the library, then the
        // driver (without it, say so and call nothing).
        Library::get()?;
        require_cuda_driver()?;
        let id = UniqueId::new()?;
        let _span = tracing::debug_span!("nccl.init_all", nranks = devices.len()).entered();
        // What can fail on this side (contexts, configs, the symbol) is
        // done before the group opens: once some ranks' inits are queued, a
        // group ended without the others would wait for them forever.
        // Inside the group only NCCL's calls remain (a failure NCCL records
        // fails the whole group at its end) and making each device's
        // context current, which cannot fail for a context already made
        // and bound once above.
        let mut parts_list = Vec::with_capacity(devices.len());
        // Capacity reserved up front: pushing never moves the configs NCCL
        // already holds pointers to.
        let mut raw_configs: Vec<RawConfig> = Vec::with_capacity(devices.len());
        for &device in devices {
            let (parts, raw_config) = Comm::parts(device, config)?;
            parts_list.push(parts);
            raw_configs.push(raw_config);
        }
        let init = parts_list[0].lib.raw().ncclCommInitRankConfig()?;
        // As in `split_all`: out-slots and configs stay put until the group
        // has ended.
        let mut slots: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
        let slot_base = slots.as_mut_ptr();
        let config_base = raw_configs.as_mut_ptr();
        let group = GroupGuard::start()?;
        let mut failure = None;
        for (rank, parts) in parts_list.iter().enumerate() {
            if let Err(e) = parts.ctx.bind_to_thread() {
                failure = Some(Error::Cuda { op: OP, source: e });
                break;
            }
            // SAFETY: `rank < devices.len()`, the length of both vectors,
            // which are not touched through any other path until the group
            // has ended.
            let (slot, config_ptr) = unsafe {
                (
                    slot_base.add(rank),
                    &mut (*config_base.add(rank)).raw as *mut _,
                )
            };
            // SAFETY: out-slot and config stay valid until after the group
            // ends, where NCCL finishes the initialization.
            let code = unsafe { init(slot, nranks, id.raw(), rank as i32, config_ptr) };
            if code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress {
                failure = Some(
                    parts
                        .lib
                        .check(OP, code, std::ptr::null_mut())
                        .err()
                        .unwrap_or(Error::InvalidArgument {
                            op: OP,
                            reason: "init failed",
                        }),
                );
                break;
            }
        }
        let ended = group.end();
        if !config.is_blocking() && ended.is_err() {
            // NCCL's background init may still write the slots and read
            // the configs: leak them rather than free them under it.
            std::mem::forget(slots);
            std::mem::forget(raw_configs);
            return Err(failure.or(ended.err()).unwrap_or(Error::Timeout {
                op: OP,
                waited: config.get_timeout(),
            }));
        }
        drop(raw_configs);
        let created: Vec<(ncclComm_t, Parts)> = slots.into_iter().zip(parts_list).collect();
        if let Some(e) = failure.or(ended.err()) {
            for (raw, parts) in created {
                if !raw.is_null() {
                    Comm::adopt_failed(raw, parts);
                }
            }
            return Err(e);
        }
        // Members that will hand themselves in: the live handles only.
        let live = created.iter().filter(|(raw, _)| !raw.is_null()).count();
        let clique = Clique::new(live);
        Comm::adopt_together(created, Some(clique), OP)?
            .into_iter()
            .map(|c| {
                c.ok_or(Error::InvalidArgument {
                    op: OP,
                    reason: "NCCL returned no communicator",
                })
            })
            .collect()
    }

    /// Wraps handles created together. On a failure nothing leaks: the
    /// communicators wrapped so far are aborted, and the handles not yet
    /// wrapped are aborted raw and withdrawn from the clique (which then
    /// tears down the one that failed, instead of waiting for members that
    /// never come). Null handles (a rank that took no part) give `None`.
    pub(super) fn adopt_together(
        created: Vec<(ncclComm_t, Parts)>,
        clique: Option<Arc<Clique>>,
        op: &'static str,
    ) -> Result<Vec<Option<Comm>>> {
        let mut out: Vec<Option<Comm>> = Vec::with_capacity(created.len());
        let mut rest = created.into_iter();
        while let Some((raw, parts)) = rest.next() {
            if raw.is_null() {
                out.push(None);
                continue;
            }
            match Comm::adopt(raw, parts, clique.clone(), op) {
                Ok(comm) => out.push(Some(comm)),
                Err(e) => {
                    for comm in out.into_iter().flatten() {
                        let _ = comm.abort_handle().abort();
                    }
                    for (raw, parts) in rest {
                        if !raw.is_null() {
                            Comm::adopt_failed(raw, parts);
                            if let Some(clique) = &clique {
                                clique.withdraw();
                            }
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }
}
