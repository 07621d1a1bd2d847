//! CUDA-graph measurements: the calls of a measurement captured once and
//! the graph replayed. A thread per GPU captures its own stream; one
//! thread driving several GPUs captures one graph over all of them.

use std::sync::Arc;
use std::time::Instant;

use nccl_dist::nccl_safe::cudarc::driver::{CudaGraph, CudaStream, result as cuda, sys};

use super::Driver;
use crate::coll::{Elem, Layer, Spec};
use crate::error::{BoxError, Result, cuda_err};

impl<T: Elem> Driver<'_, T> {
    /// (seconds per call, calls captured per rank, allocations while
    /// capturing).
    /// `spec`'s timed iterations through `layer`, issued inside
    /// `allow_capture` (onto the streams being captured).
    ///
    /// # Safety
    ///
    /// The buffers and communicators of `prepare` outlive every launch of
    /// the graph being captured.
    unsafe fn issue_captured(&mut self, layer: Layer, spec: &Spec) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe {
            nccl_dist::nccl_safe::allow_capture(|| {
                self.held_for(layer, |d| {
                    for _ in 0..d.iters {
                        d.issue(layer, spec)?;
                    }
                    Ok(())
                })
            })
        }
    }

    pub(super) fn measure_graph(
        &mut self,
        layer: Layer,
        spec: &Spec,
    ) -> Result<(f64, usize, (u64, u64))> {
        if self.ranks.len() > 1 {
            return self.measure_graph_one_thread(layer, spec);
        }
        self.wait()?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        for r in &self.ranks {
            r.stream
                .begin_capture(mode)
                .map_err(cuda_err("beginning a capture"))?;
        }
        let open = self.window_open()?;
        // SAFETY: the buffers and communicators of `prepare` outlive the
        // graphs below, whose launches are waited for before they go.
        let issued = unsafe { self.issue_captured(layer, spec) };
        let allocs = self.window_close(open)?;
        // Every capture is ended, even after a failure, so no stream is
        // left capturing.
        let graphs: Vec<Result<Option<CudaGraph>, cuda::DriverError>> = self
            .ranks
            .iter()
            .map(|r| r.stream.end_capture(sys::CUgraphInstantiate_flags(0)))
            .collect();
        issued?;
        let graphs = graphs
            .into_iter()
            .map(|g| {
                g.map_err(cuda_err("ending the capture"))?
                    .ok_or_else(|| BoxError::from("the capture recorded nothing"))
            })
            .collect::<Result<Vec<_>>>()?;
        for g in &graphs {
            g.upload().map_err(cuda_err("uploading the graph"))?;
            g.launch().map_err(cuda_err("launching the graph"))?;
        }
        self.barrier()?;
        let t0 = Instant::now();
        for _ in 0..self.graph_launches {
            for g in &graphs {
                g.launch().map_err(cuda_err("launching the graph"))?;
            }
        }
        self.wait()?;
        let calls = (self.iters * self.graph_launches) as f64;
        Ok((t0.elapsed().as_secs_f64() / calls, self.iters, allocs))
    }

    /// As [`Driver::measure_graph`] for one thread driving several GPUs:
    /// one capture over all of them, so one graph and one launch. It
    /// begins on the first rank's stream, every other rank's stream joins
    /// it through an event (fork), the grouped calls are issued, each
    /// stream is joined back and the capture ends once. A capture per
    /// stream fails here: the thread still has the other thread-local
    /// captures open when the first graph is instantiated, which CUDA
    /// refuses (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), and NCCL warns
    /// that graphs launched one GPU after another from one thread may
    /// deadlock (docs/research/one-thread-graph-capture.md).
    fn measure_graph_one_thread(
        &mut self,
        layer: Layer,
        spec: &Spec,
    ) -> Result<(f64, usize, (u64, u64))> {
        self.wait()?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        let origin = Arc::clone(&self.ranks[0].stream);
        origin
            .begin_capture(mode)
            .map_err(cuda_err("beginning a capture"))?;
        // Fork: an event recorded into the capture and waited for on
        // another stream brings that stream into the same capture.
        let mut forked = 0;
        let mut fork = Ok(());
        for r in &self.ranks[1..] {
            if let Err(e) = r.stream.join(&origin) {
                fork = Err(e);
                break;
            }
            forked += 1;
        }
        // No early return until the capture has ended.
        let mut allocs = Ok((0, 0));
        let issued = match fork.is_ok().then(|| self.window_open()) {
            Some(Ok(open)) => {
                // SAFETY: the buffers and communicators of `prepare`
                // outlive the graph below, whose launches are waited for
                // before it goes.
                let issued = unsafe { self.issue_captured(layer, spec) };
                allocs = self.window_close(open);
                issued
            }
            Some(Err(e)) => Err(e),
            None => Ok(()),
        };
        // Join every forked stream back and end the capture, even after a
        // failure, so no stream is left capturing.
        let mut joined = Ok(());
        for r in &self.ranks[1..=forked] {
            if let Err(e) = origin.join(&r.stream)
                && joined.is_ok()
            {
                joined = Err(e);
            }
        }
        let graph = origin.end_capture(sys::CUgraphInstantiate_flags(0));
        for r in &self.ranks {
            stop_capture(&r.stream);
        }
        fork.map_err(cuda_err("forking the capture to every GPU"))?;
        issued?;
        let allocs = allocs?;
        joined.map_err(cuda_err("joining every GPU back into the capture"))?;
        let graph = graph
            .map_err(cuda_err("ending the capture"))?
            .ok_or("the capture recorded nothing")?;
        graph.upload().map_err(cuda_err("uploading the graph"))?;
        graph.launch().map_err(cuda_err("launching the graph"))?;
        self.barrier()?;
        let t0 = Instant::now();
        for _ in 0..self.graph_launches {
            graph.launch().map_err(cuda_err("launching the graph"))?;
        }
        // The launches run on the first rank's stream, which `wait`
        // polls: a launch ends when its work on every GPU has.
        self.wait()?;
        let calls = (self.iters * self.graph_launches) as f64;
        Ok((t0.elapsed().as_secs_f64() / calls, self.iters, allocs))
    }
}

/// Ends a capture still open on `stream` (an end that failed) and
/// destroys its graph, so the stream can be used again.
fn stop_capture(stream: &CudaStream) {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream of this process; one status is written.
    let code = unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) };
    if code != sys::CUresult::CUDA_SUCCESS
        || status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    {
        return;
    }
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: a live stream; `graph` receives the captured graph, if any,
    // which nothing else holds.
    let code = unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) };
    if code == sys::CUresult::CUDA_SUCCESS && !graph.is_null() {
        // SAFETY: the graph just returned to us, never instantiated;
        // destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
    }
}
