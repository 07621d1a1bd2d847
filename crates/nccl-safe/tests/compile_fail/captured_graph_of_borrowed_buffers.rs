//! Borrowed memory cannot be handed to a captured graph: after the graph
//! is gone the owner could free it while a launch still runs.

use nccl_safe::cudarc::driver::CudaSlice;
use nccl_safe::{Comm, ReduceOp, Result, capture};

fn issue(comm: &Comm, grads: &mut CudaSlice<f32>) -> Result<()> {
    let stream = comm.stream().clone();
    let mut graph = capture(&stream, grads, |cap, g| {
        cap.on(comm).all_reduce_in_place(*g, ReduceOp::Sum)
    })?;
    graph.launch()
}

fn main() {
    let _ = issue;
}
