//! What the host pays for the pieces a call through the typed API adds to
//! NCCL's own: the driver calls the enqueue path makes (the capture status,
//! the context binding), a clock read, a lock and an `Arc` clone, and for
//! comparison the ones the watchdog and cudarc's event tracking make
//! (stream and event queries, an event record), each timed alone on the
//! rank's own stream and context, in nanoseconds. The
//! latency sweep writes them into its JSON's `meta.host_costs_ns`, beside
//! each row's `issue_us` (the issuing loop alone), so the per-call excess
//! of the safe and dist layers can be read against its parts.

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nccl_dist::nccl_safe::cudarc::driver::{CudaStream, sys};
use serde_json::{Map, Value, json};

use crate::error::Result;

/// Calls per timing; the best of [`TRIES`] is kept (the least disturbed).
const CALLS: u32 = 20_000;
const TRIES: usize = 5;

/// Nanoseconds per call of `f`, the best of a few tries.
fn per_call(mut f: impl FnMut()) -> f64 {
    (0..TRIES)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..CALLS {
                f();
            }
            t0.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS)
        })
        .fold(f64::INFINITY, f64::min)
}

/// The costs on `stream` (idle when called; left idle).
pub fn measure(stream: &Arc<CudaStream>) -> Result<Value> {
    let ctx = stream.context();
    ctx.bind_to_thread()
        .map_err(|e| format!("binding the context: {e}"))?;
    let raw = stream.cu_stream();
    let event = ctx
        .new_event(None)
        .map_err(|e| format!("making an event: {e}"))?;
    let mut costs = Map::new();
    let mut put = |name: &str, ns: f64| {
        costs.insert(name.into(), json!((ns * 10.0).round() / 10.0));
    };
    put(
        "cuStreamIsCapturing",
        per_call(|| {
            let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            // SAFETY: a live stream of this context; one status written.
            black_box(unsafe { sys::cuStreamIsCapturing(raw, &mut status) });
        }),
    );
    put(
        "cuCtxGetCurrent",
        per_call(|| {
            let mut current = std::ptr::null_mut();
            // SAFETY: writes one context handle.
            black_box(unsafe { sys::cuCtxGetCurrent(&mut current) });
        }),
    );
    put(
        "bind_to_thread",
        per_call(|| {
            black_box(ctx.bind_to_thread().is_ok());
        }),
    );
    put(
        "cuStreamQuery",
        per_call(|| {
            // SAFETY: a live stream of this context.
            black_box(unsafe { sys::cuStreamQuery(raw) });
        }),
    );
    put(
        "cuEventRecord",
        per_call(|| {
            // SAFETY: the event and the stream belong to this context.
            black_box(unsafe { sys::cuEventRecord(event.cu_event(), raw) });
        }),
    );
    put(
        "cuEventQuery",
        per_call(|| {
            // SAFETY: a live event of this context.
            black_box(unsafe { sys::cuEventQuery(event.cu_event()) });
        }),
    );
    put(
        "Instant::now",
        per_call(|| {
            black_box(Instant::now());
        }),
    );
    let lock = Mutex::new(0u64);
    put(
        "Mutex lock+unlock",
        per_call(|| {
            *black_box(&lock).lock().unwrap_or_else(|p| p.into_inner()) += 1;
        }),
    );
    put(
        "Arc clone+drop",
        per_call(|| {
            drop(black_box(Arc::clone(stream)));
        }),
    );
    stream
        .synchronize()
        .map_err(|e| format!("synchronising: {e}"))?;
    Ok(Value::Object(costs))
}
