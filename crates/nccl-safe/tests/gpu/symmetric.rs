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

/// Elements of `T` per rank the one-shot tests use: tails (fewer than a
/// 16-byte vector), one block, several blocks, and the kernel's largest.
fn one_shot_sizes<T: TestType>(world: usize) -> Vec<usize> {
    let most = one_shot_most::<T>(world);
    vec![1, 3, 8, 9, 1027, 4096 + 5, 1 << 16, most / 2 + 3, most]
}

/// The most elements of `T` the kernel takes on `world` ranks.
fn one_shot_most<T: TestType>(world: usize) -> usize {
    nccl_safe::one_shot_max_bytes(world) / std::mem::size_of::<T>()
}

/// Small integers whose sums over up to 8 ranks are exact in bf16 and f16.
fn one_shot_input(rank: usize, i: usize) -> f64 {
    ((rank + 1) * (i % 7 + 1)) as f64
}

/// This rank's check of `got` against the exact sums.
fn check_sums<T: TestType>(r: &Rank, what: &str, got: &[T]) -> TestResult {
    check_scaled(r, what, got, 1.0)
}

/// This rank's check of `got` against the exact sums times `scale`.
fn check_scaled<T: TestType>(r: &Rank, what: &str, got: &[T], scale: f64) -> TestResult {
    let want = |i: usize| scale * (0..r.world).map(|q| one_shot_input(q, i)).sum::<f64>();
    match (0..got.len()).find(|&i| got[i] != T::from_f64(want(i))) {
        Some(i) => Err(format!(
            "rank {}: {what}: [{i}] = {:?}, want {}",
            r.rank,
            got[i],
            want(i)
        )
        .into()),
        None => Ok(()),
    }
}

/// Fills a symmetric buffer of this rank with [`one_shot_input`].
fn fill<T: TestType>(r: &Rank, b: &mut SymmetricBuffer<'_, T>) -> TestResult {
    let host: Vec<T> = (0..b.len())
        .map(|i| T::from_f64(one_shot_input(r.rank, i)))
        .collect();
    b.copy_from(r.stream(), &r.stream().clone_htod(&host)?)?;
    Ok(())
}

fn read_back<T: TestType>(r: &Rank, b: &SymmetricBuffer<'_, T>) -> TestResult<Vec<T>> {
    let mut dev = r.stream().alloc_zeros::<T>(b.len())?;
    b.copy_to(r.stream(), &mut dev)?;
    Ok(r.stream().clone_dtoh(&dev)?)
}

/// Back to back with no host wait between: in-place calls on one buffer,
/// the one-shot kernel and NCCL's path taking turns (the last one ours),
/// each reading what the one before wrote. On Hopper the kernel may be
/// launched once the blocks of the kernel ahead of it on the stream have
/// exited, before that kernel has completed: this exercises the wait (a
/// missing one would show rarely). Each call multiplies the sums by the
/// rank count, exact while that is a power of two and they stay small.
fn chained_rank<T: TestType>(r: &Rank, n: usize) -> TestResult {
    let ranks = r.world;
    if !ranks.is_power_of_two() {
        return Ok(());
    }
    // Each call multiplies the sums (7 * ranks * (ranks + 1) / 2 at most,
    // their odd parts at most 7 bits) by the rank count: the values stay
    // exact in every type while below 2^14, at most six calls more.
    let largest = 7 * ranks * (ranks + 1) / 2;
    let mut extra = 0u32;
    while extra < 6 && largest * ranks.pow(extra + 1) < 1 << 14 {
        extra += 1;
    }
    let mut buf = SymmetricBuffer::<T>::new(&r.comm, n)?;
    // On more than four ranks NCCL's partial sums of bf16 could round
    // (5 and 7 times a sum have odd parts of 9 bits; the kernel adds in
    // f32): the kernel only, and one call where it is not there (its
    // availability is agreed by every rank).
    if ranks > 4 && !buf.uses_one_shot() {
        extra = 0;
    }
    fill(r, &mut buf)?;
    for call in 0..=extra {
        // Every rank turns the kernel off and on alike.
        buf.set_one_shot(ranks > 4 || call % 2 == 0 || call == extra);
        r.comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
    }
    buf.set_one_shot(true);
    check_scaled(
        r,
        &format!("{n}, {} calls back to back", extra + 1),
        &read_back(r, &buf)?,
        ranks.pow(extra) as f64,
    )
}

/// One rank (a thread or a process per rank): every size, out of place and
/// in place, three calls each (the flags' epochs move on), then NCCL's
/// path on the same buffers, then calls back to back with no host wait,
/// then a graph replayed and an eager call after it, all bit-exact.
fn one_shot_rank<T: TestType>(r: &Rank) -> TestResult {
    // The kernel's NCCL range (the window descriptor's known layout).
    let v = r.comm.library().version();
    let new_enough = v.at_least(2, 28, 0) && !v.at_least(2, 31, 0);
    for n in one_shot_sizes::<T>(r.world) {
        let mut send = SymmetricBuffer::<T>::new(&r.comm, n)?;
        let mut recv = SymmetricBuffer::<T>::new(&r.comm, n)?;
        if new_enough && r.world <= nccl_safe::ONE_SHOT_MAX_RANKS && !send.uses_one_shot() {
            return Err(format!("rank {}: no one-shot kernel for {n} elements", r.rank).into());
        }
        for round in 0..3 {
            fill(r, &mut send)?;
            r.comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
            check_sums(
                r,
                &format!("{n} out of place, call {round}"),
                &read_back(r, &recv)?,
            )?;
            r.comm.all_reduce_in_place(&mut send, ReduceOp::Sum)?;
            check_sums(
                r,
                &format!("{n} in place, call {round}"),
                &read_back(r, &send)?,
            )?;
        }
        // NCCL's path on the same buffers, then ours again.
        send.set_one_shot(false);
        fill(r, &mut send)?;
        r.comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
        check_sums(r, &format!("{n} through NCCL"), &read_back(r, &recv)?)?;
        send.set_one_shot(true);
        r.comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
        check_sums(r, &format!("{n} after NCCL"), &read_back(r, &recv)?)?;
        r.comm.synchronize(r.stream())?;
    }
    let most = one_shot_most::<T>(r.world);
    for n in [9, 4096 + 5, most] {
        chained_rank::<T>(r, n)?;
    }
    // Graphs of all-reduces on symmetric buffers, replayed, then an eager
    // call: 4101 elements (at most 64 KiB: NCCL's symmetric kernels inside
    // a graph, the one-shot kernel eager) and half the kernel's limit (the
    // kernel, many blocks, both ways).
    for n in [4096 + 5, most / 2 + 3] {
        let mut pair = (
            SymmetricBuffer::<T>::new(&r.comm, n)?,
            SymmetricBuffer::<T>::new(&r.comm, n)?,
        );
        fill(r, &mut pair.0)?;
        let mut graph = nccl_safe::capture(r.stream(), pair, |cap, (send, recv)| {
            cap.on(&r.comm).all_reduce(send, recv, ReduceOp::Sum)
        })?;
        for _ in 0..3 {
            graph.launch()?;
        }
        let (send, recv) = graph.buffers().ok_or("no buffers")?;
        check_sums(r, &format!("graph of {n}"), &read_back(r, recv)?)?;
        r.comm.all_reduce(send, recv, ReduceOp::Sum)?;
        check_sums(
            r,
            &format!("eager after the graph of {n}"),
            &read_back(r, recv)?,
        )?;
        drop(graph);
    }
    Ok(())
}

/// This thread's rank when it drives one rank of several (a thread or a
/// process per rank): one thread driving every rank calls inside groups,
/// where NCCL's path is kept (the buffers' own test covers it).
fn one_rank_of_several(ranks: &[Rank]) -> Option<&Rank> {
    match ranks {
        [r] if r.world >= 2 => Some(r),
        _ => None,
    }
}

pub fn one_shot_all_reduce_is_bit_exact_eager_in_place_and_in_graphs() {
    run(Config::new(), |ranks| {
        let Some(r) = one_rank_of_several(ranks) else {
            return Ok(());
        };
        one_shot_rank::<f32>(r)?;
        one_shot_rank::<nccl_safe::half::bf16>(r)?;
        one_shot_rank::<nccl_safe::half::f16>(r)
    });
}

/// Rank 0 launches a one-shot all-reduce no other rank makes, then aborts:
/// the kernel stops waiting (its abort word), the stream drains within
/// seconds, and the communicator reports the abort. The other ranks abort
/// too, so no drop waits for rank 0.
pub fn one_shot_kernel_stops_waiting_when_the_communicator_aborts() {
    run(Config::new(), |ranks| {
        let Some(r) = one_rank_of_several(ranks) else {
            return Ok(());
        };
        let mut buf = SymmetricBuffer::<f32>::new(&r.comm, 1024)?;
        if !buf.uses_one_shot() {
            return Ok(());
        }
        if r.rank == 0 {
            r.comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
            std::thread::sleep(std::time::Duration::from_millis(200));
            let event = r.stream().record_event(None)?;
            if event.is_complete() {
                return Err("the lone one-shot call finished without its peers".into());
            }
            r.comm.abort_handle().abort()?;
            let t = std::time::Instant::now();
            while !event.is_complete() {
                if t.elapsed() > std::time::Duration::from_secs(10) {
                    return Err("the kernel did not stop within 10 s of the abort".into());
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if !matches!(r.comm.synchronize(r.stream()), Err(Error::Aborted { .. })) {
                return Err("synchronize after the abort did not report it".into());
            }
        } else {
            r.comm.abort_handle().abort()?;
        }
        drop(buf);
        Ok(())
    });
}
