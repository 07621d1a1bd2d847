//! Copies between the memory of two GPUs (`cuMemcpyPeerAsync`), ordered
//! after the source stream's work. Which GPUs reach which is nccl-dist's
//! placement probe.

use cudarc::driver::{CudaStream, sys};

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::NcclType;
use crate::error::Role;
use crate::{Error, Result};

fn cuda(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |source| Error::Cuda { op, source }
}

/// Copies all of `src` (on `src_stream`'s device) into `dst` (on
/// `dst_stream`'s device) on `dst_stream`, after the work queued so far on
/// `src_stream` (an event orders the two streams). `dst` must hold at least
/// `src.len()` elements.
pub fn copy_peer_async<T: NcclType>(
    src: &(impl DeviceBuffer<T> + ?Sized),
    src_stream: &CudaStream,
    dst: &mut (impl DeviceBufferMut<T> + ?Sized),
    dst_stream: &CudaStream,
) -> Result<()> {
    const OP: &str = "cuMemcpyPeerAsync";
    let (src_ctx, dst_ctx) = (src_stream.context(), dst_stream.context());
    if src.device() != src_ctx.ordinal() {
        return Err(Error::WrongDevice {
            op: OP,
            role: Role::Send,
            expected: src_ctx.ordinal(),
            found: src.device(),
        });
    }
    if dst.device() != dst_ctx.ordinal() {
        return Err(Error::WrongDevice {
            op: OP,
            role: Role::Recv,
            expected: dst_ctx.ordinal(),
            found: dst.device(),
        });
    }
    if dst.len() < src.len() {
        return Err(Error::Length {
            op: OP,
            role: Role::Recv,
            needed: src.len(),
            given: dst.len(),
        });
    }
    let bytes = src
        .len()
        .checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::Overflow {
            op: OP,
            count: src.len(),
            factor: std::mem::size_of::<T>(),
        })?;
    if bytes == 0 {
        return Ok(());
    }
    let _span = tracing::trace_span!(
        "nccl.copy_peer",
        bytes,
        from = src_ctx.ordinal(),
        to = dst_ctx.ordinal()
    )
    .entered();
    // Each buffer's bookkeeping stays on its own stream (cudarc records
    // events in the stream's context); events join the two streams.
    let (sp, sa) = src.read(src_stream);
    let ready = src_stream
        .record_event(None)
        .map_err(cuda("cuEventRecord"))?;
    dst_stream.wait(&ready).map_err(cuda("cuStreamWaitEvent"))?;
    let (dp, da) = dst.write(dst_stream);
    dst_ctx.bind_to_thread().map_err(cuda(OP))?;
    // SAFETY: `bytes` bytes readable at `sp` on the source's device and
    // writable at `dp` on the destination's (checked above); both contexts
    // are live primary contexts; ordered on `dst_stream` after the source's
    // stream.
    let copied = unsafe {
        sys::cuMemcpyPeerAsync(
            dp,
            dst_ctx.cu_ctx(),
            sp,
            src_ctx.cu_ctx(),
            bytes,
            dst_stream.cu_stream(),
        )
    }
    .result()
    .map_err(cuda(OP));
    // Later work on the source's stream (its free included) waits for the
    // copy, even when the copy could not be queued.
    let done = dst_stream
        .record_event(None)
        .map_err(cuda("cuEventRecord"))?;
    src_stream.wait(&done).map_err(cuda("cuStreamWaitEvent"))?;
    drop((sa, da));
    copied
}

/// [`copy_peer_async`], then waits for the copy.
pub fn copy_peer<T: NcclType>(
    src: &(impl DeviceBuffer<T> + ?Sized),
    src_stream: &CudaStream,
    dst: &mut (impl DeviceBufferMut<T> + ?Sized),
    dst_stream: &CudaStream,
) -> Result<()> {
    copy_peer_async(src, src_stream, dst, dst_stream)?;
    dst_stream
        .synchronize()
        .map_err(cuda("cuStreamSynchronize"))
}
