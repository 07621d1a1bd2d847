//! The correctness check after the timing: the values each rank puts in
//! its buffers, what it must find afterwards, and the read-back.

use nccl_dist::nccl_safe::cudarc::driver::{CudaStream, result as cuda, sys};

use crate::cli::Check;
use crate::coll::Spec;
use crate::coll::{self, Coll, Elem};
use crate::error::{Result, cuda_err};

/// `(address, elements, value)` regions that make up rank `me`'s inputs.
pub fn inputs<T: Elem>(
    spec: &Spec,
    me: usize,
    n: usize,
    sp: u64,
    rp: u64,
) -> Vec<(u64, usize, f64)> {
    let c = spec.shape.count;
    let e = std::mem::size_of::<T>() as u64;
    let block = |base: u64, j: usize| base + (j * c) as u64 * e;
    let v = |j: usize| coll::input(spec.op, me, j);
    let ip = spec.in_place;
    match spec.coll {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce if ip => {
            vec![(rp, c, v(0))]
        }
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => {
            vec![(sp, c, v(0)), (rp, c, 0.0)]
        }
        Coll::AllGather if ip => (0..n)
            .map(|j| (block(rp, j), c, if j == me { v(0) } else { 0.0 }))
            .collect(),
        Coll::AllGather => vec![(sp, c, v(0)), (rp, n * c, 0.0)],
        Coll::ReduceScatter | Coll::AllToAll => {
            let mut out: Vec<_> = (0..n).map(|j| (block(sp, j), c, v(j))).collect();
            if !ip {
                out.push((rp, spec.shape.recv, 0.0));
            }
            out
        }
    }
}

/// `(address, elements, value)` regions rank `me` must hold afterwards.
pub fn expected<T: Elem>(
    spec: &Spec,
    me: usize,
    n: usize,
    sp: u64,
    rp: u64,
) -> Vec<(u64, usize, f64)> {
    let c = spec.shape.count;
    let e = std::mem::size_of::<T>() as u64;
    let block = |base: u64, j: usize| base + (j * c) as u64 * e;
    let all = |j: usize| coll::reduce::<T>(spec.op, (0..n).map(|q| coll::input(spec.op, q, j)));
    let ip = spec.in_place;
    match spec.coll {
        Coll::AllReduce => vec![(rp, c, all(0))],
        Coll::AllGather => (0..n)
            .map(|i| (block(rp, i), c, coll::input(spec.op, i, 0)))
            .collect(),
        Coll::ReduceScatter if ip => vec![(block(sp, me), c, all(me))],
        Coll::ReduceScatter => vec![(rp, c, all(me))],
        Coll::Broadcast => vec![(rp, c, coll::input(spec.op, spec.root, 0))],
        Coll::Reduce if me == spec.root => vec![(rp, c, all(0))],
        Coll::Reduce => Vec::new(),
        Coll::AllToAll => (0..n)
            .map(|i| (block(rp, i), c, coll::input(spec.op, i, me)))
            .collect(),
        Coll::SendRecv => vec![(rp, c, coll::input(spec.op, (me + n - 1) % n, 0))],
    }
}

/// Sets `len` elements at `ptr` to `value` on `stream`: one upload of up
/// to 64 Ki elements, then copies that double the filled part.
pub fn fill<T: Elem>(stream: &CudaStream, ptr: u64, len: usize, value: T) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(cuda_err("binding the context"))?;
    let e = std::mem::size_of::<T>();
    let first = len.min(1 << 16);
    let host = vec![value; first];
    let st = stream.cu_stream();
    // SAFETY: `ptr` addresses `len` elements of a live buffer of this
    // context; `host` outlives the copy (synchronous for pageable memory,
    // and the stream is waited for before `host` is dropped below).
    unsafe {
        sys::cuMemcpyHtoDAsync_v2(ptr, host.as_ptr().cast(), first * e, st).result()?;
        let mut done = first;
        while done < len {
            let k = done.min(len - done);
            sys::cuMemcpyDtoDAsync_v2(ptr + (done * e) as u64, ptr, k * e, st).result()?;
            done += k;
        }
        sys::cuStreamSynchronize(st).result()?;
    }
    drop(host);
    Ok(())
}

/// Elements of `len` at `ptr` that differ from `want`: all of them, or
/// with `Check::Sampled` above 64 MiB, the first and last 64 Ki and 16
/// evenly spaced runs of 4 Ki.
pub fn count_wrong<T: Elem>(ptr: u64, len: usize, want: f64, check: Check) -> Result<u64> {
    let e = std::mem::size_of::<T>();
    let runs: Vec<(usize, usize)> = if check == Check::Full || len * e <= 64 << 20 {
        (0..len)
            .step_by(1 << 22)
            .map(|o| (o, (1 << 22).min(len - o)))
            .collect()
    } else {
        let (edge, run) = (1usize << 16, 1usize << 12);
        let mut v = vec![(0, edge), (len - edge, edge)];
        v.extend((1..=16).map(|k| (k * (len - run) / 17, run)));
        v
    };
    let mut wrong = 0u64;
    let mut host: Vec<T> = Vec::new();
    for (offset, n) in runs {
        host.clear();
        host.resize(n, T::from_f64(0.0));
        // SAFETY: `offset + n <= len` elements of a live buffer; the
        // context is current (the caller bound it) and its streams idle.
        unsafe { cuda::memcpy_dtoh_sync(&mut host, ptr + (offset * e) as u64) }
            .map_err(cuda_err("reading back"))?;
        wrong += host.iter().filter(|v| !coll::matches(**v, want)).count() as u64;
    }
    Ok(wrong)
}
