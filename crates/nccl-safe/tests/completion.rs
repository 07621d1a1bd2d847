//! GPU tests of completion futures (`nccl_safe::Completion`): many in
//! flight complete bit-exact; a dropped future keeps its buffers until the
//! GPU is done; an abort or the deadline resolves every pending future.
//! `#[ignore]`d: `cargo xtask gpu-test` runs them (target
//! `nccl-safe-completion`, once per world size, one thread driving every
//! GPU of the world; one GPU is enough).
//!
//! A `Gate` holds a stream still with a host function that waits until
//! the test opens it, so the work behind a completion is unfinished for as
//! long as the test needs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nccl_safe::cudarc::driver::{CudaSlice, CudaStream, sys};
use nccl_safe::{AbortCause, Comm, Completion, Config, Error, ReduceOp, group};
use nccl_testkit::{TestResult, check, world};

/// Holds streams still until opened.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

unsafe extern "C" fn wait_for_gate(gate: *mut std::ffi::c_void) {
    // SAFETY: `gate` is the `&'static Gate` given to `hold`.
    let gate = unsafe { &*(gate as *const Gate) };
    let mut open = gate.open.lock().unwrap_or_else(|p| p.into_inner());
    while !*open {
        open = gate.opened.wait(open).unwrap_or_else(|p| p.into_inner());
    }
}

impl Gate {
    /// A gate that lives for the rest of the process (a host function of
    /// a stream may run after the test has given up).
    fn new() -> &'static Gate {
        Box::leak(Box::default())
    }

    /// Work enqueued on `stream` after this waits for [`Gate::open`].
    fn hold(&'static self, stream: &CudaStream) -> TestResult {
        stream.context().bind_to_thread()?;
        let data = self as *const Gate as *mut std::ffi::c_void;
        // SAFETY: a live stream; the callback reads a `'static` gate and
        // calls no CUDA function.
        let code = unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(wait_for_gate), data) };
        if code != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuLaunchHostFunc: {code:?}").into());
        }
        Ok(())
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.opened.notify_all();
    }
}

/// Says when it is dropped: rides along with the buffers of a completion.
#[derive(Debug)]
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// One communicator per GPU of the world, driven by this thread, and
/// connected: NCCL connects the ranks at their first collective. On 2
/// H200s, a first group whose streams a test's gate held never returned
/// from its end (the set-up waits behind the held streams, as far as we
/// can tell), so the test waited for itself.
fn comms(timeout: Duration) -> TestResult<Vec<Comm>> {
    let devices: Vec<usize> = (0..world().max(1)).collect();
    let comms = Comm::init_all(&devices, &Config::new().timeout(timeout))?;
    let mut bufs = comms
        .iter()
        .map(|c| c.stream().alloc_zeros::<f32>(1024))
        .collect::<Result<Vec<_>, _>>()?;
    sum_in_place(&comms, &mut bufs)?;
    for c in &comms {
        c.synchronize(c.stream())?;
    }
    Ok(comms)
}

/// In-place sums of `bufs` (one per communicator) on each communicator's
/// stream, in one group when there are several.
fn sum_in_place(comms: &[Comm], bufs: &mut [CudaSlice<f32>]) -> TestResult {
    group(|g| {
        for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
            g.on(comm).all_reduce_in_place(buf, ReduceOp::Sum)?;
        }
        Ok(())
    })?;
    Ok(())
}

/// Rank `r`'s input of request `k`: small integers, exact in f32.
fn input(r: usize, k: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((r + 1) * (k + 1) + i % 7) as f32)
        .collect()
}

/// Two rounds of 64 requests: the second reuses the events of the first
/// and has every other future spin (`spin_for`).
#[test]
#[ignore = "needs 1 GPU: cargo xtask gpu-test"]
fn sixty_four_futures_in_flight_complete_bit_exact() {
    check((|| {
        let comms = comms(Duration::from_secs(60))?;
        for round in 0..2 {
            sixty_four_requests(&comms, round == 1)?;
        }
        Ok(())
    })());
}

fn sixty_four_requests(comms: &[Comm], spin: bool) -> TestResult {
    const REQUESTS: usize = 64;
    const LEN: usize = 4099;
    let n = comms.len();
    let mut pending: Vec<Vec<Completion<CudaSlice<f32>>>> = Vec::new();
    for k in 0..REQUESTS {
        let mut bufs = comms
            .iter()
            .enumerate()
            .map(|(r, c)| c.stream().clone_htod(&input(r, k, LEN)))
            .collect::<Result<Vec<_>, _>>()?;
        if n == 1 {
            // The owned form: enqueue and track in one call.
            let buf = bufs.pop().ok_or("no buffer")?;
            pending.push(vec![comms[0].all_reduce_in_place_owned(buf, ReduceOp::Sum)]);
        } else {
            sum_in_place(comms, &mut bufs)?;
            pending.push(
                comms
                    .iter()
                    .zip(bufs)
                    .map(|(c, b)| c.completion(c.stream(), b))
                    .collect(),
            );
        }
    }
    for (k, request) in pending.into_iter().enumerate() {
        let want: Vec<f32> = (0..LEN)
            .map(|i| (0..n).map(|r| input(r, k, LEN)[i]).sum())
            .collect();
        for (comm, done) in comms.iter().zip(request) {
            let done = if spin && k % 2 == 1 {
                done.spin_for(Duration::from_micros(20))
            } else {
                done
            };
            let buf = done.wait()?;
            let got = comm.stream().clone_dtoh(&buf)?;
            let exact = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            if !exact {
                return Err(format!("request {k} on rank {}: wrong sum", comm.rank()).into());
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs 1 GPU: cargo xtask gpu-test"]
fn a_dropped_future_keeps_its_buffers_until_the_gpu_is_done() {
    check((|| {
        let comms = comms(Duration::from_secs(60))?;
        let gate = Gate::new();
        let mut bufs = Vec::new();
        for c in &comms {
            gate.hold(c.stream())?;
            bufs.push(c.stream().alloc_zeros::<f32>(1 << 20)?);
        }
        sum_in_place(&comms, &mut bufs)?;
        let flags: Vec<Arc<AtomicBool>> = comms.iter().map(|_| Arc::default()).collect();
        for ((c, b), f) in comms.iter().zip(bufs).zip(&flags) {
            let done = c.completion(c.stream(), (b, DropFlag(Arc::clone(f))));
            drop(done);
        }
        std::thread::sleep(Duration::from_millis(300));
        if flags.iter().any(|f| f.load(Ordering::SeqCst)) {
            gate.open();
            return Err("buffers were freed while the GPU could still use them".into());
        }
        gate.open();
        let started = Instant::now();
        while !flags.iter().all(|f| f.load(Ordering::SeqCst)) {
            if started.elapsed() > Duration::from_secs(10) {
                return Err("buffers still held 10 s after the work finished".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        for c in &comms {
            c.synchronize(c.stream())?;
        }
        Ok(())
    })());
}

#[test]
#[ignore = "needs 1 GPU: cargo xtask gpu-test"]
fn an_aborted_communicator_resolves_every_pending_future_with_its_cause() {
    check((|| {
        let comms = comms(Duration::from_secs(60))?;
        let gate = Gate::new();
        let mut pending = Vec::new();
        let flags: Vec<Arc<AtomicBool>> = (0..8).map(|_| Arc::default()).collect();
        for flag in &flags {
            let mut bufs = comms
                .iter()
                .map(|c| c.stream().alloc_zeros::<f32>(1024))
                .collect::<Result<Vec<_>, _>>()?;
            sum_in_place(&comms, &mut bufs)?;
            for (c, b) in comms.iter().zip(bufs) {
                // NCCL's kernels run; the gate holds the event behind them,
                // so the future is pending when the abort comes.
                gate.hold(c.stream())?;
                pending.push(c.completion(c.stream(), (b, DropFlag(Arc::clone(flag)))));
            }
        }
        let aborted = Instant::now();
        // Asked on threads of their own: NCCL's abort may wait for the
        // device, which the gate holds until the futures have resolved.
        let aborters: Vec<_> = comms
            .iter()
            .map(|c| {
                let handle = c.abort_handle();
                std::thread::spawn(move || {
                    handle.request_abort(AbortCause::Other("test abort".into()));
                })
            })
            .collect();
        for done in pending {
            match done.wait() {
                Err(Error::Aborted {
                    cause: AbortCause::Other(why),
                    ..
                }) if why == "test abort" => {}
                other => {
                    gate.open();
                    return Err(format!("expected the abort's cause, got {other:?}").into());
                }
            }
        }
        let took = aborted.elapsed();
        let early = flags.iter().any(|f| f.load(Ordering::SeqCst));
        gate.open();
        for a in aborters {
            let _ = a.join();
        }
        if took > Duration::from_secs(2) {
            return Err(format!("the futures resolved {took:?} after the abort").into());
        }
        if early {
            return Err("an aborted future's buffers were freed before the GPU was done".into());
        }
        Ok(())
    })());
}

#[test]
#[ignore = "needs 1 GPU: cargo xtask gpu-test"]
fn a_future_past_the_timeout_resolves_to_timeout_and_aborts_the_communicator() {
    check((|| {
        let timeout = Duration::from_secs(1);
        let comms = comms(timeout)?;
        let gate = Gate::new();
        let mut bufs = comms
            .iter()
            .map(|c| c.stream().alloc_zeros::<f32>(1024))
            .collect::<Result<Vec<_>, _>>()?;
        sum_in_place(&comms, &mut bufs)?;
        gate.hold(comms[0].stream())?;
        let started = Instant::now();
        let got = comms[0].completion(comms[0].stream(), bufs).wait();
        let took = started.elapsed();
        gate.open();
        if !matches!(got, Err(Error::Timeout { .. })) {
            return Err(format!("expected a timeout, got {got:?}").into());
        }
        if took < timeout || took > timeout + Duration::from_secs(1) {
            return Err(format!("resolved after {took:?}, the timeout is {timeout:?}").into());
        }
        // The abort runs on a thread of its own (NCCL's abort may wait for
        // the device the gate held): it lands soon after the gate opens.
        let until = Instant::now() + Duration::from_secs(5);
        while !comms[0].abort_handle().is_aborted() {
            if Instant::now() > until {
                return Err("the communicator was not aborted within 5 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    })());
}
