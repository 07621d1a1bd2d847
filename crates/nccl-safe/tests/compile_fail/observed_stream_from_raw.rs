//! Only nccl-safe makes an `ObservedStream` (from a live stream): safe code
//! cannot hand an observer a forged handle.

use nccl_safe::ObservedStream;
use nccl_safe::nccl_sys::cudaStream_t;

fn forge(raw: cudaStream_t) -> ObservedStream<'static> {
    ObservedStream {
        raw,
        _stream: std::marker::PhantomData,
    }
}

fn main() {
    let _ = forge(std::ptr::null_mut());
}
