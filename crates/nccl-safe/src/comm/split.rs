//! Communicators made from others: split, shrink and grow.

use std::time::Duration;

use nccl_sys::{NCCL_SPLIT_NOCOLOR, ncclComm_t, ncclResult_t};

use crate::abort::AbortCause;
use crate::comm::handle::State;
use crate::comm::poll::poll_with_backoff;
use crate::comm::teardown::Clique;
use crate::comm::{Comm, Parts, c_int, refuse_in_group};
use crate::config::{Config, RawConfig};
use crate::group::GroupGuard;
use crate::unique_id::UniqueId;
use crate::{Error, Feature, Result};

impl Comm {
    /// `ncclCommSplit` on this communicator alone (one thread per rank).
    /// Ranks with the same `color` form a new communicator, ordered by
    /// `key`; `None` takes no part and gets `Ok(None)`. `config: None`
    /// inherits this communicator's configuration.
    pub fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: Option<&Config>,
    ) -> Result<Option<Comm>> {
        let mut out = Comm::split_all(&[self], &[color], &[key], config)?;
        Ok(out.pop().flatten())
    }

    /// `ncclCommSplit` on several communicators driven by this thread, in
    /// one group. Returns one entry per input.
    pub fn split_all(
        comms: &[&Comm],
        colors: &[Option<u32>],
        keys: &[i32],
        config: Option<&Config>,
    ) -> Result<Vec<Option<Comm>>> {
        const OP: &str = "ncclCommSplit";
        refuse_in_group(OP)?;
        if comms.len() != colors.len() || comms.len() != keys.len() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "one color and one key per communicator",
            });
        }
        let Some(first) = comms.first() else {
            return Ok(Vec::new());
        };
        let lib = first.shared.lib;
        lib.capabilities().require(Feature::Split)?;
        let colors = colors
            .iter()
            .map(|c| {
                c.map(i32::try_from)
                    .transpose()
                    .map(|c| c.unwrap_or(NCCL_SPLIT_NOCOLOR))
            })
            .collect::<Result<Vec<i32>, _>>()
            .map_err(|_| Error::InvalidArgument {
                op: OP,
                reason: "color exceeds i32",
            })?;
        let _span = tracing::debug_span!("nccl.split", comms = comms.len()).entered();
        let split = lib.raw().ncclCommSplit()?;
        let expected: Vec<bool> = colors.iter().map(|&c| c != NCCL_SPLIT_NOCOLOR).collect();
        Comm::grouped_children(OP, comms, &expected, config, |i, raw, slot, config_ptr| {
            // SAFETY: `raw` is live; `slot` and the config (null or valid)
            // stay valid until after the group ends.
            unsafe { split(raw, colors[i], keys[i], slot, config_ptr) }
        })
    }

    /// Creates one child per communicator in one group, as `ncclCommSplit`
    /// and `ncclCommShrink` need when one thread drives several. NCCL writes
    /// each new handle at group end, so the out-slots and configs live in
    /// vectors that are allocated once and read only after `end()`.
    fn grouped_children(
        op: &'static str,
        comms: &[&Comm],
        expected: &[bool],
        config: Option<&Config>,
        mut call: impl FnMut(
            usize,
            ncclComm_t,
            *mut ncclComm_t,
            *mut nccl_sys::ncclConfig_t,
        ) -> ncclResult_t,
    ) -> Result<Vec<Option<Comm>>> {
        let Some(first) = comms.first() else {
            return Ok(Vec::new());
        };
        let lib = first.shared.lib;
        let mut slots: Vec<ncclComm_t> = vec![std::ptr::null_mut(); comms.len()];
        let slot_base = slots.as_mut_ptr();
        // One config per call, built before the group so nothing is pushed
        // (and moved) while NCCL holds pointers into the vector.
        let mut raw_configs: Vec<Option<RawConfig>> = comms
            .iter()
            .map(|_| config.map(|c| c.to_raw(lib.version())).transpose())
            .collect::<Result<_>>()?;
        let config_base = raw_configs.as_mut_ptr();
        let mut parts = Vec::with_capacity(comms.len());
        let group = GroupGuard::start()?;
        let mut failure = None;
        for (i, comm) in comms.iter().enumerate() {
            // SAFETY: `i < len` for both vectors, which are not touched
            // through any other path until the group has ended.
            let (slot, config_slot) = unsafe { (slot_base.add(i), &mut *config_base.add(i)) };
            let config_ptr = config_slot
                .as_mut()
                .map_or(std::ptr::null_mut(), |c| &mut c.raw as *mut _);
            crate::group::touch(&comm.shared);
            let result = comm.shared.with_raw(op, |raw| {
                comm.shared.enter_group();
                let code = call(i, raw, slot, config_ptr);
                if code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress {
                    lib.check(op, code, raw)?;
                }
                Ok(())
            });
            if let Err(e) = result {
                failure = Some(e);
                break;
            }
            parts.push(Parts::child_of(&comm.shared, config));
        }
        let ended = group.end();
        // A nonblocking parent's child handle is written by NCCL's
        // background job when it finishes, after the group end returned.
        let timeout = first.shared.timeout;
        let nonblocking = comms.iter().any(|c| !c.shared.blocking);
        if nonblocking && ended.is_err() {
            // The group's end failed or timed out, so the background job
            // may not have finished: it may still write the slots, so they and the
            // configs are leaked rather than freed under it, with any
            // child it makes; and the parents are aborted (never
            // finalized while the job may still use them: the abort stops
            // and joins it).
            for c in comms {
                c.shared
                    .request_abort(AbortCause::Timeout { op, seq: None });
            }
            std::mem::forget(slots);
            std::mem::forget(raw_configs);
            return Err(failure.or(ended.err()).unwrap_or(Error::Timeout {
                op,
                waited: timeout,
            }));
        }
        if failure.is_none() && ended.is_ok() && !Comm::await_slots(&slots, expected, timeout) {
            // NCCL may still write into the slots and configs: leak them
            // rather than let it write into freed memory, and abort the
            // parents, whose background job may still run.
            for c in comms {
                c.shared
                    .request_abort(AbortCause::Timeout { op, seq: None });
            }
            std::mem::forget(slots);
            std::mem::forget(raw_configs);
            return Err(Error::Timeout {
                op,
                waited: timeout,
            });
        }
        drop(raw_configs);
        let children: Vec<(ncclComm_t, Parts)> = slots.into_iter().zip(parts).collect();
        if let Some(e) = failure.or(ended.err()) {
            for (raw, parts) in children {
                if !raw.is_null() {
                    Comm::adopt_failed(raw, parts);
                }
            }
            return Err(e);
        }
        let live = children.iter().filter(|(raw, _)| !raw.is_null()).count();
        let clique = (comms.len() > 1 && live > 0).then(|| Clique::new(live));
        Comm::adopt_together(children, clique, op)
    }

    /// Waits (up to `timeout`) until every expected slot holds a handle.
    fn await_slots(slots: &[ncclComm_t], expected: &[bool], timeout: Duration) -> bool {
        let filled = poll_with_backoff(timeout, || {
            Ok(!slots.iter().zip(expected).any(|(slot, &want)| {
                // SAFETY: a valid element of `slots`; NCCL's job may write it
                // concurrently, hence the volatile read of a pointer-sized
                // value.
                want && unsafe { std::ptr::read_volatile(slot) }.is_null()
            }))
        });
        matches!(filled, Ok(None))
    }

    /// `ncclCommShrink`: a new communicator without the ranks in `exclude`
    /// (NCCL 2.27+). Only the remaining ranks call it. With `abort_first`,
    /// the parent's pending work is aborted first (`NCCL_SHRINK_ABORT`), as
    /// after a peer failure.
    pub fn shrink(
        &self,
        exclude: &[usize],
        abort_first: bool,
        config: Option<&Config>,
    ) -> Result<Comm> {
        let mut out = Comm::shrink_all(&[self], exclude, abort_first, config)?;
        out.pop().flatten().ok_or(Error::InvalidArgument {
            op: "ncclCommShrink",
            reason: "NCCL returned no communicator",
        })
    }

    /// The survivors' new communicator after a loss, from this parked one
    /// ([`crate::Config::park_on_peer_loss`]): `ncclCommShrink` without the
    /// ranks in `exclude`, with `NCCL_SHRINK_ABORT` (NCCL stops this
    /// communicator's kernels, if any still run, then makes the new one
    /// with the survivors only). No proxy thread is joined, so it takes
    /// about as long as a split, where an abort and a new init wait up to
    /// 500 ms for NCCL's teardown. Where a blocking communicator made from
    /// this one parked too, its kernels stopped when it parked. This
    /// communicator stays parked (calls refused) and is aborted at its drop;
    /// keep it until the new one is no longer needed soon, as its teardown
    /// then takes that long.
    ///
    /// Every survivor calls it; the excluded ranks do not. Any abort asked
    /// for while it runs (a second loss seen on this communicator's signal
    /// or watchdog) aborts this communicator, which cuts NCCL's creation
    /// of the new one short; else it is bounded by this communicator's
    /// timeout. Typed errors, before any NCCL call: a communicator that is
    /// not parked (aborted, never lost a peer, or made without parking)
    /// or blocking (NCCL would make the new one inside the call, where no
    /// abort reaches it: park the nonblocking one a world is made from),
    /// and the errors of [`Comm::shrink`].
    pub fn shrink_parked(&self, exclude: &[usize], config: &Config) -> Result<Comm> {
        const OP: &str = "ncclCommShrink";
        refuse_in_group(OP)?;
        if self.shared.blocking {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "a blocking communicator: its shrink would wait inside NCCL, out of an abort's reach",
            });
        }
        if !self.is_parked() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the communicator is not parked (Config::park_on_peer_loss, a lost peer)",
            });
        }
        /// Clears the mark however the shrink ends.
        struct Shrinking<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Shrinking<'_> {
            fn drop(&mut self) {
                self.0.store(false, std::sync::atomic::Ordering::Release);
            }
        }
        self.shared
            .shrinking
            .store(true, std::sync::atomic::Ordering::Release);
        let _mark = Shrinking(&self.shared.shrinking);
        self.shrink(exclude, true, Some(config))
    }

    /// Whether this communicator was made to park on a loss
    /// ([`crate::Config::park_on_peer_loss`]).
    pub fn parks_on_peer_loss(&self) -> bool {
        self.shared.park_on_loss
    }

    /// Whether this communicator is parked: an abort for a lost peer was
    /// put off ([`crate::Config::park_on_peer_loss`]), calls are refused,
    /// and [`Comm::shrink_parked`] can make the survivors' communicator.
    /// An abort that is due (the signal fired) is settled first, here if
    /// no other thread is at it: parked or aborted, never still pending.
    /// Waits for a call in progress on another thread.
    pub fn is_parked(&self) -> bool {
        self.shared.settle_due();
        self.shared.is_parked() && matches!(*self.shared.lock(), State::Live(_))
    }

    /// `ncclCommShrink` on several communicators driven by this thread, in
    /// one group (the remaining ranks only). One child per input.
    pub fn shrink_all(
        comms: &[&Comm],
        exclude: &[usize],
        abort_first: bool,
        config: Option<&Config>,
    ) -> Result<Vec<Option<Comm>>> {
        const OP: &str = "ncclCommShrink";
        refuse_in_group(OP)?;
        let Some(first) = comms.first() else {
            return Ok(Vec::new());
        };
        let lib = first.shared.lib;
        lib.capabilities().require(Feature::Shrink)?;
        if exclude.is_empty() {
            // NCCL answers ncclInvalidArgument (seen on 2.28.9); say why.
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "nothing to exclude: shrink needs at least one excluded rank",
            });
        }
        let mut excluded = Vec::with_capacity(exclude.len());
        for &r in exclude {
            if r >= first.size {
                return Err(Error::RankOutOfRange {
                    op: OP,
                    what: "excluded rank",
                    rank: r,
                    size: first.size,
                });
            }
            excluded.push(r as i32);
        }
        if comms.iter().any(|c| exclude.contains(&c.rank)) {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "an excluded rank must not call shrink",
            });
        }
        let flags = if abort_first {
            nccl_sys::NCCL_SHRINK_ABORT
        } else {
            nccl_sys::NCCL_SHRINK_DEFAULT
        };
        let count = excluded.len() as i32;
        let list = excluded.as_mut_ptr();
        let _span =
            tracing::debug_span!("nccl.shrink", comms = comms.len(), excluded = exclude.len())
                .entered();
        let shrink = lib.raw().ncclCommShrink()?;
        // `excluded` outlives the group inside `grouped_children`.
        Comm::grouped_children(
            OP,
            comms,
            &vec![true; comms.len()],
            config,
            |_, raw, slot, config_ptr| {
                // SAFETY: `raw` is live; the exclude list (`count` ints), the
                // slot and the config stay valid until after the group ends.
                unsafe { shrink(raw, list, count, slot, config_ptr, flags) }
            },
        )
    }

    /// `ncclCommGetUniqueId`: an id for growing this communicator (root
    /// rank only; NCCL 2.29+).
    pub fn grow_id(&self) -> Result<UniqueId> {
        const OP: &str = "ncclCommGetUniqueId";
        let lib = self.shared.lib;
        lib.capabilities().require(Feature::Grow)?;
        self.shared.with_raw(OP, |raw| {
            let get = lib.raw().ncclCommGetUniqueId()?;
            let mut id = nccl_sys::ncclUniqueId::zeroed();
            // SAFETY: `raw` is live; one id is written.
            let code = unsafe { get(raw, &mut id) };
            lib.check(OP, code, raw)?;
            Ok(UniqueId::from_bytes(id.internal))
        })
    }

    /// `ncclCommGrow` from an existing rank: the new communicator of
    /// `new_size` ranks. The root passes the id from [`Comm::grow_id`];
    /// the others pass `None`. NCCL 2.29+.
    pub fn grow(
        &self,
        new_size: usize,
        id: Option<&UniqueId>,
        config: Option<&Config>,
    ) -> Result<Comm> {
        const OP: &str = "ncclCommGrow";
        refuse_in_group(OP)?;
        let lib = self.shared.lib;
        lib.capabilities().require(Feature::Grow)?;
        if new_size <= self.size {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the new size must exceed the current one",
            });
        }
        // Everything that can fail on this side, before NCCL is called.
        let new_size_c = c_int(OP, "size exceeds i32", new_size)?;
        let mut raw_config = config.map(|c| c.to_raw(lib.version())).transpose()?;
        let grow = lib.raw().ncclCommGrow()?;
        let raw_id = id.map(UniqueId::raw);
        let (child, code) = self.shared.with_raw(OP, |raw| {
            let mut child: ncclComm_t = std::ptr::null_mut();
            let id_ptr = raw_id.as_ref().map_or(std::ptr::null(), |i| i as *const _);
            let config_ptr = raw_config
                .as_mut()
                .map_or(std::ptr::null_mut(), |c| &mut c.raw as *mut _);
            // SAFETY: `raw` is live; id null or valid; rank -1 marks an
            // existing rank; valid out-pointer; config null or valid.
            let code = unsafe { grow(raw, new_size_c, id_ptr, -1, &mut child, config_ptr) };
            Ok((child, code))
        })?;
        let parts = Parts::child_of(&self.shared, config);
        if code != ncclResult_t::ncclSuccess && code != ncclResult_t::ncclInProgress {
            let err = self
                .shared
                .with_raw(OP, |raw| lib.check(OP, code, raw))
                .err();
            // A handle NCCL made before failing is aborted, not leaked.
            if !child.is_null() {
                Comm::adopt_failed(child, parts);
            }
            return Err(err.unwrap_or(Error::InvalidArgument {
                op: OP,
                reason: "grow failed",
            }));
        }
        if child.is_null() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "NCCL returned no communicator",
            });
        }
        Comm::adopt(child, parts, None, OP)
    }
}
