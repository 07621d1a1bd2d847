//! A captured graph owns its buffers: they are moved in, so they cannot be
//! freed (or used elsewhere) while the graph may still launch.

use nccl_safe::cudarc::driver::CudaSlice;
use nccl_safe::{Comm, ReduceOp, Result, capture};

fn issue(comm: &Comm, grads: (CudaSlice<f32>, CudaSlice<f32>)) -> Result<()> {
    let stream = comm.stream().clone();
    let mut graph = capture(&stream, grads, |cap, (send, recv)| {
        cap.on(comm).all_reduce(send, recv, ReduceOp::Sum)
    })?;
    drop(grads);
    graph.launch()
}

fn main() {
    let _ = issue;
}
