//! The nccl-sys entry points the raw layer calls, looked up once.

use nccl_dist::nccl_safe::Library;
use nccl_dist::nccl_safe::nccl_sys::pfn;

use crate::error::Result;

/// The nccl-sys entry points the raw layer and the raw step call, looked
/// up once.
pub struct Fns {
    pub all_reduce: pfn::ncclAllReduce,
    pub all_gather: pfn::ncclAllGather,
    pub reduce_scatter: pfn::ncclReduceScatter,
    pub broadcast: pfn::ncclBroadcast,
    pub reduce: pfn::ncclReduce,
    pub all_to_all: Option<pfn::ncclAlltoAll>,
    pub send: pfn::ncclSend,
    pub recv: pfn::ncclRecv,
    pub group_start: pfn::ncclGroupStart,
    pub group_end: pfn::ncclGroupEnd,
    pub async_error: pfn::ncclCommGetAsyncError,
    pub premul_create: pfn::ncclRedOpCreatePreMulSum,
    pub premul_destroy: pfn::ncclRedOpDestroy,
}

impl Fns {
    pub fn load() -> Result<Fns> {
        let raw = Library::get()?.raw();
        Ok(Fns {
            all_reduce: raw.ncclAllReduce()?,
            all_gather: raw.ncclAllGather()?,
            reduce_scatter: raw.ncclReduceScatter()?,
            broadcast: raw.ncclBroadcast()?,
            reduce: raw.ncclReduce()?,
            all_to_all: raw.ncclAlltoAll().ok(),
            send: raw.ncclSend()?,
            recv: raw.ncclRecv()?,
            group_start: raw.ncclGroupStart()?,
            group_end: raw.ncclGroupEnd()?,
            async_error: raw.ncclCommGetAsyncError()?,
            premul_create: raw.ncclRedOpCreatePreMulSum()?,
            premul_destroy: raw.ncclRedOpDestroy()?,
        })
    }
}
