//! One thread's share of a run: the ranks it drives (every GPU in single
//! mode, one otherwise), their buffers, and how an operation is issued,
//! timed and checked through each layer.
//!
//! Each rank has two communicators over the same ranks: `comm`, blocking
//! and unwatched, for the raw and safe layers (what a C program and a
//! careful nccl-safe user have), and `dist`, the world's communicator as
//! `World` makes it by default (watchdog on), for the dist layer. Every
//! layer queues on one stream per rank, the dist communicator's own (the
//! dist layer passes no stream, so no wrapper is made per call).

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_dist::Communicator;
use nccl_dist::DType;
use nccl_dist::nccl_safe::cudarc::driver::result::ctx as cudarc_ctx;
use nccl_dist::nccl_safe::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, sys};
use nccl_dist::nccl_safe::nccl_sys::{cudaStream_t, ncclComm_t, ncclResult_t};
use nccl_dist::nccl_safe::{Comm, GroupGuard, OnStream, OpObserver, ReduceOp};

use crate::alloc;
use crate::barrier::HostBarrier;
use crate::check::{count_wrong, expected, fill, inputs};
use crate::cli::{Check, Opts};
use crate::coll::{Coll, Elem, Layer, Shape, Spec};
use crate::error::{BoxError, Result, cuda_err};
use crate::fns::Fns;

mod graph;

/// The communicators of one rank that this thread drives.
pub struct RankComms<'c> {
    /// Blocking, unwatched: the raw and safe layers.
    pub comm: &'c Comm,
    /// The world's communicator with default options (single mode: none).
    pub dist: Option<&'c Comm>,
    /// A watchdog's observer for `comm`, set only while the `safe_wd`
    /// layer is measured.
    pub watch: Option<Arc<dyn OpObserver>>,
}

/// A rank this thread drives, with the buffers of the current shape.
struct Rank<'c, T> {
    comm: &'c Comm,
    dist: Option<&'c Comm>,
    watch: Option<Arc<dyn OpObserver>>,
    stream: Arc<CudaStream>,
    /// The raw handle while [`Driver::holding`] holds the communicator
    /// (null otherwise).
    raw_comm: ncclComm_t,
    raw_stream: cudaStream_t,
    send: Option<CudaSlice<T>>,
    recv: Option<CudaSlice<T>>,
    /// Device addresses of `send` and `recv`.
    sp: u64,
    rp: u64,
}

/// What one measurement gave on this thread.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub seconds: f64,
    /// The issuing loop alone (the calls returned, the GPU maybe not
    /// done), per call: the host's cost of a call, slowest rank.
    pub issue_seconds: f64,
    /// Allocations by every thread of the process during the timed
    /// window, per call this process issued (the most of any process).
    pub allocs_per_call: f64,
    /// Allocations by the issuing thread alone, per call.
    pub allocs_per_call_thread: f64,
}

pub struct Driver<'c, T> {
    ranks: Vec<Rank<'c, T>>,
    host: &'c HostBarrier,
    /// Ranks in the communicator (all threads, all processes).
    size: usize,
    fns: Fns,
    timeout: Duration,
    check: Check,
    iters: usize,
    warmup: usize,
    graph_launches: usize,
    min_seconds: f64,
}

impl<'c, T: Elem> Driver<'c, T> {
    pub fn new(
        comms: Vec<RankComms<'c>>,
        host: &'c HostBarrier,
        opts: &Opts,
    ) -> Result<Driver<'c, T>> {
        let size = comms.first().ok_or("no rank to drive")?.comm.size();
        let ranks = comms
            .into_iter()
            .map(|RankComms { comm, dist, watch }| {
                if let Some(d) = dist
                    && (d.rank() != comm.rank() || d.size() != comm.size())
                {
                    return Err(BoxError::from(
                        "the dist communicator does not match the raw one",
                    ));
                }
                let stream = Arc::clone(dist.unwrap_or(comm).stream());
                if !opts.cudarc_events {
                    // SAFETY: the bench's buffers are used on this one
                    // stream only (collectives, fills and read-backs), so
                    // cudarc's cross-stream events have nothing to order.
                    unsafe { stream.context().disable_event_tracking() };
                }
                let raw_stream = stream.cu_stream() as cudaStream_t;
                Ok(Rank {
                    comm,
                    dist,
                    watch,
                    stream,
                    raw_comm: std::ptr::null_mut(),
                    raw_stream,
                    send: None,
                    recv: None,
                    sp: 0,
                    rp: 0,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Driver {
            size,
            ranks,
            host,
            fns: Fns::load()?,
            timeout: opts.timeout,
            check: opts.check,
            iters: opts.iters,
            warmup: opts.warmup,
            graph_launches: opts.graph_launches,
            min_seconds: opts.min_ms / 1e3,
        })
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether this thread drives every rank (single mode).
    pub fn drives_all(&self) -> bool {
        self.ranks.len() == self.size
    }

    /// Buffers for `shape` on every rank (the previous ones are freed).
    pub fn prepare(&mut self, shape: &Shape) -> Result<()> {
        for r in &mut self.ranks {
            r.send = None;
            r.recv = None;
            let send = r
                .stream
                .alloc_zeros::<T>(shape.send)
                .map_err(cuda_err("allocating the send buffer"))?;
            let recv = r
                .stream
                .alloc_zeros::<T>(shape.recv)
                .map_err(cuda_err("allocating the receive buffer"))?;
            r.sp = send.device_ptr(&r.stream).0;
            r.rp = recv.device_ptr(&r.stream).0;
            (r.send, r.recv) = (Some(send), Some(recv));
        }
        self.wait()
    }

    /// Waits for every rank's stream by polling it (no sleeping, so the
    /// time of the last operation is not rounded up), within the deadline.
    pub fn wait(&self) -> Result<()> {
        let started = Instant::now();
        for r in &self.ranks {
            loop {
                // SAFETY: a live stream of this process.
                match unsafe { sys::cuStreamQuery(r.stream.cu_stream()) } {
                    sys::CUresult::CUDA_SUCCESS => break,
                    sys::CUresult::CUDA_ERROR_NOT_READY => {}
                    other => return Err(format!("waiting for the GPU: {other:?}").into()),
                }
                if started.elapsed() > self.timeout {
                    for r in &self.ranks {
                        let _ = r.comm.abort_handle().abort();
                    }
                    return Err(format!(
                        "the GPUs did not finish within {:?}; communicators aborted",
                        self.timeout
                    )
                    .into());
                }
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// Every rank of the communicator has got here (one-element
    /// all-reduce); this thread's streams are idle.
    pub fn barrier(&self) -> Result<()> {
        self.wait()?;
        if !self.drives_all() {
            Communicator::barrier(self.ranks[0].comm)?;
        }
        Ok(())
    }

    /// Element-wise `op` of `values` over every rank of the communicator
    /// (the identity in single mode, where one thread saw everything).
    pub fn over_ranks(&self, values: &[f64], op: ReduceOp) -> Result<Vec<f64>> {
        if self.drives_all() {
            return Ok(values.to_vec());
        }
        let r = &self.ranks[0];
        let mut buf = r
            .stream
            .clone_htod(values)
            .map_err(cuda_err("uploading results"))?;
        r.comm.on(&r.stream).all_reduce_in_place(&mut buf, op)?;
        r.comm.synchronize(&r.stream)?;
        r.stream
            .clone_dtoh(&buf)
            .map_err(cuda_err("downloading results"))
    }

    fn grouped(&self, spec: &Spec) -> bool {
        self.ranks.len() > 1
            || spec.coll == Coll::SendRecv
            || (spec.coll == Coll::AllToAll && self.fns.all_to_all.is_none())
    }

    /// Issues `spec` once on every rank of this thread through `layer`.
    pub fn issue(&mut self, layer: Layer, spec: &Spec) -> Result<()> {
        match layer {
            Layer::Raw => self.issue_raw(spec),
            Layer::RawProbe => {
                self.probe()?;
                self.issue_raw(spec)
            }
            Layer::Safe | Layer::SafeWd => self.issue_safe(spec),
            Layer::Dist => self.issue_dist(spec),
        }
    }

    /// Sets the watchdog's observer on every rank's safe communicator
    /// (`on`) or removes it: between measurements, never inside one.
    fn watchdog(&self, on: bool) -> Result<()> {
        for r in &self.ranks {
            match (&r.watch, on) {
                (Some(w), true) => r.comm.set_observer(Some(Arc::clone(w))),
                (_, false) => r.comm.set_observer(None),
                (None, true) => {
                    return Err("the safe_wd layer needs a watchdog observer on every rank".into());
                }
            }
        }
        Ok(())
    }

    /// Runs `f` with every rank's communicator held from rank `i` on
    /// (alive, not aborted, used by this thread only) and its raw handle
    /// in `raw_comm`: a loop of raw calls inside takes no lock of ours, as
    /// a C program's would not. Nothing inside may call the safe API on
    /// these communicators (it would wait for this thread).
    fn holding<R>(&mut self, i: usize, f: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        let Some(comm) = self.ranks.get(i).map(|r| r.comm) else {
            return f(self);
        };
        // SAFETY: the handle is used only by `issue_raw` on this thread,
        // for calls the typed API would make itself, and is cleared
        // before the closure returns.
        let held = unsafe {
            comm.with_raw(|raw| {
                self.ranks[i].raw_comm = raw;
                let out = self.holding(i + 1, f);
                self.ranks[i].raw_comm = std::ptr::null_mut();
                out
            })
        };
        held?
    }

    /// As [`Driver::holding`] for the raw layer; other layers run `f` as
    /// it is.
    fn held_for<R>(&mut self, layer: Layer, f: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        if matches!(layer, Layer::Raw | Layer::RawProbe) {
            self.holding(0, f)
        } else {
            f(self)
        }
    }

    /// The `raw_probe` layer's extra: on every rank of this thread, the
    /// driver calls a typed call makes before NCCL's (the capture status
    /// of the stream, the context bound to the thread).
    fn probe(&self) -> Result<()> {
        for r in &self.ranks {
            let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            // SAFETY: a live stream of this process; one status written.
            let code = unsafe { sys::cuStreamIsCapturing(r.stream.cu_stream(), &mut status) };
            if code != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuStreamIsCapturing: {code:?}").into());
            }
            // The typed path's binding: the current context compared, set
            // only when another is current (nccl-safe's `make_current`).
            let ctx = r.stream.context();
            let current = cudarc_ctx::get_current().map_err(cuda_err("reading the context"))?;
            if current != Some(ctx.cu_ctx()) {
                ctx.bind_to_thread()
                    .map_err(cuda_err("binding the context"))?;
            }
        }
        Ok(())
    }

    fn issue_raw(&self, spec: &Spec) -> Result<()> {
        let grouped = self.grouped(spec);
        let f = &self.fns;
        // SAFETY: what a C program would do: the buffers of `prepare` hold
        // the shape's elements, on each rank's device, and stay allocated
        // until `wait`; the handles are live.
        unsafe {
            if grouped {
                raw_ok("ncclGroupStart", (f.group_start)())?;
            }
            let mut code = ncclResult_t::ncclSuccess;
            for (i, r) in self.ranks.iter().enumerate() {
                let c = r.raw_issue(f, spec, self.size, self.rank_of(i));
                if code == ncclResult_t::ncclSuccess {
                    code = c;
                }
            }
            if grouped {
                let end = (f.group_end)();
                if code == ncclResult_t::ncclSuccess {
                    code = end;
                }
            }
            if code == ncclResult_t::ncclInProgress {
                // Bounded: the communicators are held (no abort can get
                // in), so a lost peer must end the wait here.
                let started = std::time::Instant::now();
                for r in &self.ranks {
                    let mut state = ncclResult_t::ncclInProgress;
                    while state == ncclResult_t::ncclInProgress {
                        raw_ok(
                            "ncclCommGetAsyncError",
                            (f.async_error)(r.raw_comm, &mut state),
                        )?;
                        if state == ncclResult_t::ncclInProgress && started.elapsed() > self.timeout
                        {
                            return Err(format!(
                                "a nonblocking enqueue still in progress after {:?}",
                                self.timeout
                            )
                            .into());
                        }
                    }
                    raw_ok("the enqueue", state)?;
                }
                return Ok(());
            }
            raw_ok(spec.coll.name(), code)
        }
    }

    fn rank_of(&self, i: usize) -> usize {
        self.ranks[i].comm.rank()
    }

    fn issue_safe(&mut self, spec: &Spec) -> Result<()> {
        let n = self.size;
        if self.grouped(spec) {
            let group = GroupGuard::start()?;
            for r in &mut self.ranks {
                let Rank {
                    comm,
                    stream,
                    send,
                    recv,
                    ..
                } = r;
                let me = comm.rank();
                issue_safe(group.on_stream(comm, stream), send, recv, spec, me, n)?;
            }
            group.end()?;
        } else {
            let Rank {
                comm,
                stream,
                send,
                recv,
                ..
            } = &mut self.ranks[0];
            let me = comm.rank();
            issue_safe(comm.on(stream), send, recv, spec, me, n)?;
        }
        Ok(())
    }

    fn issue_dist(&self, spec: &Spec) -> Result<()> {
        if self.ranks.len() != 1 {
            return Err("the dist layer needs a thread or process per rank".into());
        }
        let r = &self.ranks[0];
        let c: &dyn Communicator = r.dist.ok_or("the dist layer needs a World")?;
        let (sp, rp, count) = (r.sp, r.rp, spec.shape.count);
        let (dt, op, root) = (DType::of::<T>(), spec.op, spec.root);
        let slot = (r.comm.rank() * count * std::mem::size_of::<T>()) as u64;
        let n = self.size;
        let ip = spec.in_place;
        // SAFETY: the buffers of `prepare` hold the shape's elements on
        // this rank's device and stay allocated until `wait`; the
        // communicator's own stream is used, which is `r.stream`.
        unsafe {
            match spec.coll {
                Coll::AllReduce if ip => c.all_reduce(rp, rp, count, dt, op, None),
                Coll::AllReduce => c.all_reduce(sp, rp, count, dt, op, None),
                Coll::AllGather if ip => c.all_gather(rp + slot, rp, count, dt, None),
                Coll::AllGather => c.all_gather(sp, rp, count, dt, None),
                Coll::ReduceScatter if ip => c.reduce_scatter(sp, sp + slot, count, dt, op, None),
                Coll::ReduceScatter => c.reduce_scatter(sp, rp, count, dt, op, None),
                Coll::Broadcast if ip => c.broadcast(rp, rp, count, dt, root, None),
                Coll::Broadcast => c.broadcast(sp, rp, count, dt, root, None),
                Coll::Reduce if ip => c.reduce(rp, rp, count, dt, op, root, None),
                Coll::Reduce => c.reduce(sp, rp, count, dt, op, root, None),
                Coll::AllToAll => c.all_to_all(sp, rp, count, dt, None),
                Coll::SendRecv => {
                    let me = r.comm.rank();
                    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                    c.send_recv(sp, count, next, rp, count, prev, dt, None)
                }
            }?;
        }
        Ok(())
    }

    /// Warm-up, then `iters` timed calls (or, with `graph`, `iters` calls
    /// captured once and the graph replayed), slowest rank's time per call.
    pub fn measure(&mut self, layer: Layer, spec: &Spec, graph: bool) -> Result<Sample> {
        let wd = layer == Layer::SafeWd;
        if wd {
            self.watchdog(true)?;
        }
        let sample = self.measure_on(layer, spec, graph);
        // Off again even after a failure: the next layer is measured bare.
        let off = if wd { self.watchdog(false) } else { Ok(()) };
        let sample = sample?;
        off?;
        Ok(sample)
    }

    /// Opens the allocation window: every thread of this process has
    /// finished what came before (B1), reads the counters, and none starts
    /// issuing before all have read them (B2). Returns (process, thread).
    fn window_open(&self) -> Result<(u64, u64)> {
        self.host.wait()?;
        let counts = (alloc::process(), alloc::thread());
        alloc::trace_window(true);
        self.host.wait()?;
        Ok(counts)
    }

    /// Closes it once every thread of this process has issued its calls:
    /// (process, thread) allocations since `open`.
    fn window_close(&self, open: (u64, u64)) -> Result<(u64, u64)> {
        let thread = alloc::thread() - open.1;
        self.host.wait()?;
        let process = alloc::process() - open.0;
        alloc::trace_window(false);
        // Nobody moves on (and allocates) before every thread has read.
        self.host.wait()?;
        Ok((process, thread))
    }

    fn measure_on(&mut self, layer: Layer, spec: &Spec, graph: bool) -> Result<Sample> {
        self.barrier()?;
        let t0 = Instant::now();
        self.held_for(layer, |d| {
            for _ in 0..d.warmup {
                d.issue(layer, spec)?;
            }
            Ok(())
        })?;
        self.wait()?;
        let mut iters = self.iters;
        if !graph && self.min_seconds > 0.0 && self.warmup > 0 {
            // Every rank must run the same number of calls: the most any
            // rank wants.
            let per_call = t0.elapsed().as_secs_f64() / self.warmup as f64;
            let want = (self.min_seconds / per_call).ceil().min(1e6);
            iters = iters.max(self.over_ranks(&[want], ReduceOp::Max)?[0] as usize);
        }
        let (seconds, issue, calls, allocs) = if graph {
            let (seconds, calls, allocs) = self.measure_graph(layer, spec)?;
            (seconds, f64::NAN, calls, allocs)
        } else {
            self.barrier()?;
            let open = self.window_open()?;
            let t0 = Instant::now();
            let issued = self.held_for(layer, |d| {
                for _ in 0..iters {
                    d.issue(layer, spec)?;
                }
                Ok(())
            });
            let issue = t0.elapsed().as_secs_f64() / iters as f64;
            // Every thread closes the window, even after a failure, so
            // none waits for it until the deadline.
            let allocs = self.window_close(open)?;
            issued?;
            self.wait()?;
            (
                t0.elapsed().as_secs_f64() / iters as f64,
                issue,
                iters,
                allocs,
            )
        };
        // Calls this process issued in the window: `calls` on each rank of
        // each of its threads.
        let mine = (calls * self.ranks.len()) as f64;
        let process = (calls * self.ranks.len() * self.host.threads()) as f64;
        let worst = self.over_ranks(
            &[
                seconds,
                allocs.0 as f64 / process,
                allocs.1 as f64 / mine,
                issue,
            ],
            ReduceOp::Max,
        )?;
        Ok(Sample {
            seconds: worst[0],
            issue_seconds: worst[3],
            allocs_per_call: worst[1],
            allocs_per_call_thread: worst[2],
        })
    }

    /// Fills the inputs with known values, runs `spec` once through
    /// `layer`, and counts the elements that differ from what the
    /// operation must give (summed over every rank).
    pub fn check(&mut self, layer: Layer, spec: &Spec) -> Result<Option<u64>> {
        if self.check == Check::Off {
            return Ok(None);
        }
        self.wait()?;
        let n = self.size;
        for i in 0..self.ranks.len() {
            let me = self.rank_of(i);
            let r = &self.ranks[i];
            for (ptr, len, value) in inputs::<T>(spec, me, n, r.sp, r.rp) {
                fill(&r.stream, ptr, len, T::from_f64(value))?;
            }
        }
        self.wait()?;
        let wd = layer == Layer::SafeWd;
        if wd {
            self.watchdog(true)?;
        }
        let issued = self.held_for(layer, |d| d.issue(layer, spec));
        let off = if wd { self.watchdog(false) } else { Ok(()) };
        issued?;
        off?;
        self.wait()?;
        let mut wrong = 0u64;
        for i in 0..self.ranks.len() {
            let me = self.rank_of(i);
            let r = &self.ranks[i];
            r.stream
                .context()
                .bind_to_thread()
                .map_err(cuda_err("binding the context"))?;
            for (ptr, len, want) in expected::<T>(spec, me, n, r.sp, r.rp) {
                wrong += count_wrong::<T>(ptr, len, want, self.check)?;
            }
        }
        let total = self.over_ranks(&[wrong as f64], ReduceOp::Sum)?;
        Ok(Some(total[0] as u64))
    }
}

impl<T: Elem> Rank<'_, T> {
    /// # Safety
    ///
    /// Inside a group where the operation needs one; buffers as prepared.
    unsafe fn raw_issue(&self, f: &Fns, spec: &Spec, n: usize, me: usize) -> ncclResult_t {
        let e = std::mem::size_of::<T>() as u64;
        let count = spec.shape.count;
        let (s, r) = (self.sp, self.rp);
        let slot = me as u64 * count as u64 * e;
        let (dt, op) = (T::DATATYPE, spec.op.raw());
        let (comm, st) = (self.raw_comm, self.raw_stream);
        let root = spec.root as i32;
        let ip = spec.in_place;
        let p = |a: u64| a as *const c_void;
        let m = |a: u64| a as *mut c_void;
        // SAFETY: the caller's promise; pointers come from `prepare`.
        unsafe {
            match spec.coll {
                Coll::AllReduce if ip => (f.all_reduce)(p(r), m(r), count, dt, op, comm, st),
                Coll::AllReduce => (f.all_reduce)(p(s), m(r), count, dt, op, comm, st),
                Coll::AllGather if ip => (f.all_gather)(p(r + slot), m(r), count, dt, comm, st),
                Coll::AllGather => (f.all_gather)(p(s), m(r), count, dt, comm, st),
                Coll::ReduceScatter if ip => {
                    (f.reduce_scatter)(p(s), m(s + slot), count, dt, op, comm, st)
                }
                Coll::ReduceScatter => (f.reduce_scatter)(p(s), m(r), count, dt, op, comm, st),
                Coll::Broadcast if ip => (f.broadcast)(p(r), m(r), count, dt, root, comm, st),
                Coll::Broadcast => (f.broadcast)(p(s), m(r), count, dt, root, comm, st),
                Coll::Reduce if ip => (f.reduce)(p(r), m(r), count, dt, op, root, comm, st),
                Coll::Reduce => (f.reduce)(p(s), m(r), count, dt, op, root, comm, st),
                Coll::AllToAll => match f.all_to_all {
                    Some(a2a) => a2a(p(s), m(r), count, dt, comm, st),
                    None => {
                        let mut code = ncclResult_t::ncclSuccess;
                        for peer in 0..n {
                            let off = peer as u64 * count as u64 * e;
                            let a = (f.send)(p(s + off), count, dt, peer as i32, comm, st);
                            let b = (f.recv)(m(r + off), count, dt, peer as i32, comm, st);
                            for c in [a, b] {
                                if code == ncclResult_t::ncclSuccess {
                                    code = c;
                                }
                            }
                        }
                        code
                    }
                },
                Coll::SendRecv => {
                    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                    let a = (f.send)(p(s), count, dt, next as i32, comm, st);
                    let b = (f.recv)(m(r), count, dt, prev as i32, comm, st);
                    if a == ncclResult_t::ncclSuccess { b } else { a }
                }
            }
        }
    }
}

/// `spec` on one rank through the typed API.
fn issue_safe<'g, T: Elem>(
    on: OnStream<'_, 'g>,
    send: &'g mut Option<CudaSlice<T>>,
    recv: &'g mut Option<CudaSlice<T>>,
    spec: &Spec,
    me: usize,
    n: usize,
) -> nccl_dist::nccl_safe::Result<()> {
    let (op, root) = (spec.op, spec.root);
    let (Some(send), Some(recv)) = (send.as_mut(), recv.as_mut()) else {
        return Err(nccl_dist::nccl_safe::Error::InvalidArgument {
            op: "bench",
            reason: "no buffers prepared",
        });
    };
    let ip = spec.in_place;
    match spec.coll {
        Coll::AllReduce if ip => on.all_reduce_in_place(recv, op),
        Coll::AllReduce => on.all_reduce(send, recv, op),
        Coll::AllGather if ip => on.all_gather_in_place(recv),
        Coll::AllGather => on.all_gather(send, recv),
        Coll::ReduceScatter if ip => on.reduce_scatter_in_place(send, op),
        Coll::ReduceScatter => on.reduce_scatter(send, recv, op),
        Coll::Broadcast if ip => on.broadcast_in_place(recv, root),
        Coll::Broadcast => on.broadcast(Some(send), recv, root),
        Coll::Reduce if ip => on.reduce_in_place(recv, op, root),
        Coll::Reduce => on.reduce(send, Some(recv), op, root),
        Coll::AllToAll => on.all_to_all(send, recv),
        Coll::SendRecv => {
            on.send(send, (me + 1) % n)?;
            on.recv(recv, (me + n - 1) % n)
        }
    }
}

/// Raises a raw NCCL code as an error.
fn raw_ok(what: &str, code: ncclResult_t) -> Result<()> {
    if code == ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(format!("{what} returned {code:?}").into())
    }
}
