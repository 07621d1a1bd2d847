//! Symmetric buffers (`SymmetricBuffer`): made on every rank, a bit-exact
//! all-reduce between two of them (NCCL's symmetric kernels where it can
//! run them), a drop with work still in flight, and a CUDA graph that owns
//! two of them. One thread driving every rank makes and drops them
//! together (`new_all`, `drop_all`); a thread or a process per rank, one
//! each.

use nccl_safe::SymmetricBuffer;

use super::*;

/// Elements per rank: 1 MiB of f32, where NCCL's symmetric kernels serve
/// an all-reduce.
const N: usize = 1 << 18;

fn make<'c>(ranks: &'c [Rank], len: usize) -> TestResult<Vec<SymmetricBuffer<'c, f32>>> {
    if ranks.len() == 1 {
        return Ok(vec![SymmetricBuffer::new(&ranks[0].comm, len)?]);
    }
    let comms: Vec<&Comm> = ranks.iter().map(|r| &r.comm).collect();
    Ok(SymmetricBuffer::new_all(&comms, len)?)
}

fn release(bufs: Vec<SymmetricBuffer<'_, f32>>) {
    if bufs.len() == 1 {
        drop(bufs);
    } else {
        SymmetricBuffer::drop_all(bufs);
    }
}

pub fn symmetric_buffers_reduce_bit_exact_and_drop_on_every_rank() {
    run(Config::new(), |ranks| {
        let ranks: &[Rank] = ranks;
        let world = ranks[0].world;
        // Refused before any NCCL call.
        if !matches!(
            SymmetricBuffer::<f32>::new(&ranks[0].comm, 0),
            Err(Error::InvalidArgument { .. })
        ) {
            return Err("a symmetric buffer of no element was not refused".into());
        }
        let send = make(ranks, N)?;
        let recv = make(ranks, N)?;
        let mut pairs: Vec<_> = send.into_iter().zip(recv).collect();
        for (r, (s, _)) in ranks.iter().zip(pairs.iter_mut()) {
            let host: Vec<f32> = (0..N)
                .map(|i| ((r.rank + 1) * (i % 3 + 1)) as f32)
                .collect();
            s.copy_from(r.stream(), &r.stream().clone_htod(&host)?)?;
        }
        // All-reduce, symmetric to symmetric.
        each_rank!(ranks, pairs, |on, r, p| {
            let _ = r;
            on.all_reduce(&p.0, &mut p.1, ReduceOp::Sum)
        })?;
        let ranks_sum = (world * (world + 1) / 2) as f32;
        for (r, (_, b)) in ranks.iter().zip(&pairs) {
            let mut dev = r.stream().alloc_zeros::<f32>(N)?;
            b.copy_to(r.stream(), &mut dev)?;
            let host = r.stream().clone_dtoh(&dev)?;
            let want = |i: usize| ranks_sum * (i % 3 + 1) as f32;
            if let Some(i) = (0..N).find(|&i| host[i].to_bits() != want(i).to_bits()) {
                return Err(format!("rank {}: all_reduce[{i}] = {}", r.rank, host[i]).into());
            }
        }
        // A drop with work still in flight: it waits for it, then for the
        // ranks to meet, before the memory goes.
        each_rank!(ranks, pairs, |on, r, p| {
            let _ = r;
            on.all_reduce(&p.0, &mut p.1, ReduceOp::Sum)
        })?;
        let (send, recv): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
        release(recv);
        release(send);
        // A graph that owns a pair (a thread or a process per rank: one
        // thread driving several ranks would take its buffers back and
        // drop them together).
        if ranks.len() == 1 {
            let r = &ranks[0];
            let mut pair = (
                SymmetricBuffer::<f32>::new(&r.comm, N)?,
                SymmetricBuffer::<f32>::new(&r.comm, N)?,
            );
            let host = vec![(r.rank + 1) as f32; N];
            pair.0
                .copy_from(r.stream(), &r.stream().clone_htod(&host)?)?;
            let mut graph = nccl_safe::capture(r.stream(), pair, |cap, (send, recv)| {
                cap.on(&r.comm).all_reduce(send, recv, ReduceOp::Sum)
            })?;
            for _ in 0..2 {
                graph.launch()?;
            }
            let (_, recv) = graph.buffers().ok_or("no buffers")?;
            let mut dev = r.stream().alloc_zeros::<f32>(N)?;
            recv.copy_to(r.stream(), &mut dev)?;
            let got = r.stream().clone_dtoh(&dev)?;
            if got.iter().any(|v| *v != ranks_sum) {
                return Err(format!("a graph of symmetric buffers gave {}", got[0]).into());
            }
            drop(graph);
        }
        Ok(())
    });
}
