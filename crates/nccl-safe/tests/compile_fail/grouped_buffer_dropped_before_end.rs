//! NCCL launches a group's work at its end: a buffer given to a grouped
//! call cannot be freed before that.

use nccl_safe::cudarc::driver::CudaSlice;
use nccl_safe::{Comm, GroupGuard, ReduceOp, Result};

fn issue(comm: &Comm, mut grads: CudaSlice<f32>) -> Result<()> {
    let group = GroupGuard::start()?;
    let on = group.on(comm);
    on.all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
    drop(grads);
    group.end()
}

fn main() {
    let _ = issue;
}
