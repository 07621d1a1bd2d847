//! A group captured over several GPUs borrows its communicators: one
//! cannot be dropped while the graph may still launch its calls.

use nccl_safe::cudarc::driver::CudaSlice;
use nccl_safe::{Comm, ReduceOp, Result, capture_group};

fn issue(comms: Vec<Comm>, grads: Vec<(CudaSlice<f32>, CudaSlice<f32>)>) -> Result<()> {
    let lanes: Vec<_> = comms.iter().map(|c| (c, c.stream())).collect();
    let mut graph = capture_group(&lanes, grads, |cap, bufs| {
        for (comm, (send, recv)) in comms.iter().zip(bufs) {
            cap.on(comm)?.all_reduce(send, recv, ReduceOp::Sum)?;
        }
        Ok(())
    })?;
    drop(lanes);
    drop(comms);
    graph.launch()
}

fn main() {
    let _ = issue;
}
