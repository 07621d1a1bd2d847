//! A captured graph borrows its communicators: one cannot be dropped while
//! the graph may still launch its calls.

use nccl_safe::cudarc::driver::CudaSlice;
use nccl_safe::{Comm, ReduceOp, Result, capture};

fn issue(comm: Comm, grads: (CudaSlice<f32>, CudaSlice<f32>)) -> Result<()> {
    let stream = comm.stream().clone();
    let mut graph = capture(&stream, grads, |cap, (send, recv)| {
        cap.on(&comm).all_reduce(send, recv, ReduceOp::Sum)
    })?;
    drop(comm);
    graph.launch()
}

fn main() {
    let _ = issue;
}
