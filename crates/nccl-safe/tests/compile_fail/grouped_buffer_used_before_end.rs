//! A buffer given to a grouped call stays borrowed until the group ends:
//! nothing else may write it while NCCL has yet to launch the work.

use nccl_safe::cudarc::driver::CudaSlice;
use nccl_safe::{Comm, GroupGuard, ReduceOp, Result};

fn issue(comm: &Comm, grads: &mut CudaSlice<f32>) -> Result<()> {
    let group = GroupGuard::start()?;
    group.on(comm).all_reduce_in_place(grads, ReduceOp::Sum)?;
    let _ = comm.stream().memset_zeros(grads);
    group.end()
}

fn main() {
    let _ = issue;
}
