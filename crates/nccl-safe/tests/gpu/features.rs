//! Features around the collectives: graph capture, group simulation,
//! NCCL memory and registration, nonblocking communicators, streams,
//! symmetric windows and shrink.

use super::*;

pub fn graph_capture_replays_collectives() {
    use nccl_safe::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    run(Config::new(), |ranks| {
        let world = ranks[0].world;
        let mut pairs: Vec<(
            nccl_safe::cudarc::driver::CudaSlice<f32>,
            nccl_safe::cudarc::driver::CudaSlice<f32>,
        )> = ranks
            .iter()
            .map(|r| {
                Ok((
                    r.stream().clone_htod(&vec![1.0f32; 4096])?,
                    r.stream().alloc_zeros::<f32>(4096)?,
                ))
            })
            .collect::<TestResult<_>>()?;
        for r in ranks.iter() {
            // cudarc's cross-stream events cannot be recorded into a graph
            // being captured; the capture orders everything on one stream.
            // SAFETY: every buffer of this test lives on its rank's one stream.
            unsafe { r.stream().context().disable_event_tracking() };
            r.stream().synchronize()?;
            r.stream()
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        }
        // Outside `allow_capture` the safe API refuses a capturing stream
        // (a launch could outlive the buffers): a typed error, nothing
        // enqueued, and the capture can still be used.
        let refused = each_rank!(ranks, pairs, |on, r, p| {
            let _ = r;
            on.all_reduce(&p.0, &mut p.1, ReduceOp::Sum)
        });
        if !matches!(refused, Err(ref e) if e.to_string().contains("captured into a CUDA graph")) {
            for r in ranks.iter() {
                let _ = r.stream().end_capture(CUgraphInstantiate_flags(0));
            }
            return Err(
                format!("a capture outside allow_capture was not refused: {refused:?}").into(),
            );
        }
        // SAFETY: `pairs` and the communicators outlive `graphs`, whose
        // launches are waited for (clone_dtoh) before the test returns.
        unsafe {
            nccl_safe::allow_capture(|| {
                each_rank!(ranks, pairs, |on, r, p| {
                    let _ = r;
                    on.all_reduce(&p.0, &mut p.1, ReduceOp::Sum)
                })
            })
        }?;
        let graphs: Vec<_> = ranks
            .iter()
            .map(|r| {
                r.stream()
                    .end_capture(CUgraphInstantiate_flags(0))?
                    .ok_or_else(|| "empty graph".into())
            })
            .collect::<TestResult<_>>()?;
        for round in 1..=3u32 {
            // New input, then replay on every rank at once.
            for (r, p) in ranks.iter().zip(pairs.iter_mut()) {
                r.stream()
                    .memcpy_htod(&vec![(round * (r.rank as u32 + 1)) as f32; 4096], &mut p.0)?;
            }
            for g in &graphs {
                g.launch()?;
            }
            let want: f32 = (0..world).map(|r| (round * (r as u32 + 1)) as f32).sum();
            for (r, p) in ranks.iter().zip(&pairs) {
                let got = r.stream().clone_dtoh(&p.1)?;
                if got.iter().any(|v| *v != want) {
                    return Err(
                        format!("replay {round} on rank {}: {} != {want}", r.rank, got[0]).into(),
                    );
                }
            }
        }
        Ok(())
    });
}

pub fn group_simulate_estimates_without_launching() {
    run(Config::new(), |ranks| {
        if !ranks[0].comm.capabilities().has(Feature::GroupSimulate) {
            return Ok(());
        }
        let mut pairs: Vec<_> = ranks
            .iter()
            .map(|r| {
                Ok((
                    r.stream().clone_htod(&vec![1.0f32; 1 << 20])?,
                    r.stream().alloc_zeros::<f32>(1 << 20)?,
                ))
            })
            .collect::<TestResult<_>>()?;
        let g = nccl_safe::GroupGuard::start()?;
        for (r, p) in ranks.iter().zip(pairs.iter_mut()) {
            g.on(&r.comm).all_reduce(&p.0, &mut p.1, ReduceOp::Sum)?;
        }
        let estimate = g.simulate()?;
        match (ranks[0].world, estimate) {
            // One rank: NCCL models no cost and leaves the estimate unset.
            (1, None) => {}
            (w, Some(t)) if w > 1 && t > 0.0 && t.is_finite() => {}
            (w, other) => return Err(format!("world {w}: estimated time {other:?}").into()),
        }
        // With several ranks nothing ran. With one, NCCL runs a collective
        // at the call (its one-rank copy path bypasses the group), so the
        // output is already there: documented on `GroupGuard::simulate`.
        let want = if ranks[0].world == 1 { 1.0 } else { 0.0 };
        for p in &pairs {
            if p.1.stream().clone_dtoh(&p.1)?.iter().any(|v| *v != want) {
                return Err(format!("after a simulated group the output is not {want}").into());
            }
        }
        Ok(())
    });
}

pub fn nccl_memory_and_registered_buffers_reduce_correctly() {
    run(Config::new(), |ranks| {
        let world = ranks[0].world;
        let mut mems: Vec<NcclMemory<f32>> = ranks
            .iter()
            .map(|r| NcclMemory::alloc(&r.comm, 8192))
            .collect::<nccl_safe::Result<_>>()?;
        for (r, m) in ranks.iter().zip(mems.iter_mut()) {
            let host = vec![(r.rank + 1) as f32; 8192];
            // SAFETY: `m` holds 8192 f32 on this rank's device.
            unsafe {
                nccl_safe::cudarc::driver::result::memcpy_htod_async(
                    m.device_ptr(),
                    &host,
                    r.stream().cu_stream(),
                )
            }?;
            r.stream().synchronize()?;
        }
        each_rank!(ranks, mems, |on, r, m| {
            let _ = r;
            on.all_reduce_in_place(m, ReduceOp::Sum)
        })?;
        let want = (world * (world + 1) / 2) as f32;
        for (r, m) in ranks.iter().zip(&mems) {
            r.stream().synchronize()?;
            let mut host = vec![0.0f32; 8192];
            // SAFETY: reads the 8192 f32 `m` holds.
            unsafe {
                nccl_safe::cudarc::driver::result::memcpy_dtoh_async(
                    &mut host,
                    m.device_ptr(),
                    r.stream().cu_stream(),
                )
            }?;
            r.stream().synchronize()?;
            if host.iter().any(|v| *v != want) {
                return Err(format!("NcclMemory all_reduce: {} != {want}", host[0]).into());
            }
        }
        // Registered cudarc buffers: the registration owns each buffer and
        // is itself what the collective takes.
        let bufs: Vec<_> = ranks
            .iter()
            .map(|r| r.stream().clone_htod(&vec![1.0f32; 4096]))
            .collect::<Result<_, _>>()?;
        let mut regs: Vec<Registration<'_, _>> = ranks
            .iter()
            .zip(bufs)
            .map(|(r, b)| Registration::new(&r.comm, b))
            .collect::<nccl_safe::Result<_>>()?;
        each_rank!(ranks, regs, |on, r, reg| {
            let _ = r;
            on.all_reduce_in_place(reg, ReduceOp::Sum)
        })?;
        for reg in regs {
            let b = reg.into_inner()?;
            if b.stream()
                .clone_dtoh(&b)?
                .iter()
                .any(|v| *v != world as f32)
            {
                return Err("registered all_reduce gave the wrong sum".into());
            }
            let _ = DeviceSlice::len(&b);
        }
        Ok(())
    });
}

pub fn nonblocking_communicators_work_and_abort_from_another_thread() {
    run(
        Config::new()
            .blocking(false)
            .timeout(std::time::Duration::from_secs(60)),
        |ranks| {
            let world = ranks[0].world;
            let mut bufs: Vec<_> = ranks
                .iter()
                .map(|r| r.stream().clone_htod(&vec![2.0f64; 1000]))
                .collect::<Result<_, _>>()?;
            each_rank!(ranks, bufs, |on, r, b| {
                let _ = r;
                on.all_reduce_in_place(b, ReduceOp::Sum)
            })?;
            for b in &bufs {
                if b.stream()
                    .clone_dtoh(b)?
                    .iter()
                    .any(|v| *v != 2.0 * world as f64)
                {
                    return Err("nonblocking all_reduce gave the wrong sum".into());
                }
            }
            // Abort every communicator from another thread; afterwards each
            // call says Aborted.
            let handles: Vec<_> = ranks.iter().map(|r| r.comm.abort_handle()).collect();
            std::thread::spawn(move || {
                handles
                    .iter()
                    .map(|h| h.abort())
                    .collect::<nccl_safe::Result<Vec<()>>>()
            })
            .join()
            .map_err(|_| "abort thread panicked")??;
            for (r, b) in ranks.iter().zip(bufs.iter_mut()) {
                expect(
                    "use after abort",
                    r.comm.all_reduce_in_place(b, ReduceOp::Sum),
                    |e| matches!(e, Error::Aborted { .. }),
                )?;
            }
            Ok(())
        },
    );
}

pub fn library_and_devices_report_themselves() {
    let lib = nccl_safe::Library::get().expect("libnccl");
    println!(
        "NCCL {} from {} ({:?})",
        lib.version(),
        lib.raw().path().display(),
        lib.raw().source()
    );
    println!("features: {:?}", lib.capabilities().features());
    run(Config::new(), |ranks| {
        for r in ranks.iter() {
            println!(
                "rank {} of {} on device {}, compute capability {:?}",
                r.rank,
                r.world,
                r.comm.device(),
                r.comm.compute_capability()
            );
        }
        Ok(())
    });
}

pub fn collectives_run_on_a_stream_the_caller_chooses() {
    run(Config::new(), |ranks| {
        let world = ranks[0].world;
        let streams: Vec<_> = ranks
            .iter()
            .map(|r| r.stream().context().new_stream())
            .collect::<Result<_, _>>()?;
        let mut bufs: Vec<_> = ranks
            .iter()
            .zip(&streams)
            .map(|(r, s)| s.clone_htod(&vec![(r.rank + 1) as u32; 999]))
            .collect::<Result<_, _>>()?;
        if ranks.len() == 1 {
            ranks[0]
                .comm
                .on(&streams[0])
                .all_reduce_in_place(&mut bufs[0], ReduceOp::Max)?;
        } else {
            group(|g| {
                for ((r, s), b) in ranks.iter().zip(&streams).zip(bufs.iter_mut()) {
                    g.on_stream(&r.comm, s)
                        .all_reduce_in_place(b, ReduceOp::Max)?;
                }
                Ok(())
            })?;
        }
        for (s, b) in streams.iter().zip(&bufs) {
            if s.clone_dtoh(b)?.iter().any(|v| *v != world as u32) {
                return Err("all_reduce on a caller's stream gave the wrong max".into());
            }
        }
        // Memory owned by one stream, written there, reduced on another:
        // the streams are joined both ways.
        let mut owned: Vec<_> = ranks
            .iter()
            .zip(&streams)
            .map(|(r, s)| s.clone_htod(&vec![(r.rank + 2) as u32; 4096]))
            .collect::<Result<_, _>>()?;
        if ranks.len() == 1 {
            ranks[0]
                .comm
                .all_reduce_in_place(&mut owned[0], ReduceOp::Sum)?;
        } else {
            group(|g| {
                for (r, b) in ranks.iter().zip(owned.iter_mut()) {
                    g.on(&r.comm).all_reduce_in_place(b, ReduceOp::Sum)?;
                }
                Ok(())
            })?;
        }
        let want: u32 = (0..world).map(|r| (r + 2) as u32).sum();
        for (s, b) in streams.iter().zip(&owned) {
            if s.clone_dtoh(b)?.iter().any(|v| *v != want) {
                return Err("cross-stream all_reduce gave the wrong sum".into());
            }
        }
        // A stream of another GPU is refused.
        if ranks.len() > 1 {
            let b = &mut owned[0];
            match ranks[0]
                .comm
                .on(&streams[1])
                .all_reduce_in_place(b, ReduceOp::Sum)
            {
                Err(Error::WrongDevice {
                    role: nccl_safe::Role::Stream,
                    ..
                }) => {}
                other => return Err(format!("a stream of another GPU gave {other:?}").into()),
            }
        }
        Ok(())
    });
}

/// Copies `n` f32 from the host into NCCL memory and back.
pub fn fill(
    mem: &NcclMemory<f32>,
    stream: &nccl_safe::cudarc::driver::CudaStream,
    host: &[f32],
) -> TestResult {
    // SAFETY: `mem` holds at least `host.len()` f32 on the stream's device;
    // the copy finishes before `host` goes (synchronize).
    unsafe {
        nccl_safe::cudarc::driver::result::memcpy_htod_async(
            mem.device_ptr(),
            host,
            stream.cu_stream(),
        )
    }?;
    stream.synchronize()?;
    Ok(())
}

pub fn symmetric_windows_register_reduce_and_deregister() {
    run(Config::new(), |ranks| {
        let world = ranks[0].world;
        if !ranks[0].comm.capabilities().has(Feature::Windows) {
            return Ok(());
        }
        const LEN: usize = 1 << 16;
        let mems: Vec<NcclMemory<f32>> = ranks
            .iter()
            .map(|r| NcclMemory::alloc(&r.comm, LEN))
            .collect::<nccl_safe::Result<_>>()?;
        for (r, m) in ranks.iter().zip(&mems) {
            fill(m, r.stream(), &vec![(r.rank + 1) as f32; LEN])?;
        }
        // Registration is collective: grouped when one thread drives all.
        let mut wins = if ranks.len() == 1 {
            let m = mems.into_iter().next().ok_or("no memory")?;
            vec![nccl_safe::Window::register(
                &ranks[0].comm,
                m,
                nccl_safe::nccl_sys::NCCL_WIN_COLL_SYMMETRIC,
            )?]
        } else {
            let comms: Vec<&Comm> = ranks.iter().map(|r| &r.comm).collect();
            nccl_safe::Window::register_all(
                &comms,
                mems,
                nccl_safe::nccl_sys::NCCL_WIN_COLL_SYMMETRIC,
            )?
        };
        if wins.iter().any(|w| w.raw().is_null()) {
            return Err("a window handle is null after the group".into());
        }
        each_rank!(ranks, wins, |on, r, w| {
            let _ = r;
            on.all_reduce_in_place(w, ReduceOp::Sum)
        })?;
        let want = (world * (world + 1) / 2) as f32;
        for (r, w) in ranks.iter().zip(&wins) {
            let (ptr, _) = w.read(r.stream());
            let mut host = vec![0.0f32; LEN];
            r.stream().synchronize()?;
            // SAFETY: the window's memory holds LEN f32.
            unsafe {
                nccl_safe::cudarc::driver::result::memcpy_dtoh_async(
                    &mut host,
                    ptr,
                    r.stream().cu_stream(),
                )
            }?;
            r.stream().synchronize()?;
            if host.iter().any(|v| *v != want) {
                return Err(format!("window all_reduce: {} != {want}", host[0]).into());
            }
        }
        // Deregistration is collective too.
        if ranks.len() == 1 {
            drop(wins);
        } else {
            nccl_safe::Window::deregister_all(wins);
        }
        // And inside a group a fresh registration is refused, typed.
        let g = nccl_safe::GroupGuard::start()?;
        let spare = NcclMemory::<f32>::alloc(&ranks[0].comm, 1024)?;
        let refused = nccl_safe::Window::register(&ranks[0].comm, spare, 0);
        g.end()?;
        if !matches!(refused, Err(Error::InvalidArgument { .. })) {
            return Err(format!("window registration inside a group gave {refused:?}").into());
        }
        Ok(())
    });
}

pub fn shrink_drops_the_last_rank_and_the_rest_still_reduce() {
    let threads = if mode() == Mode::Threads { world() } else { 1 };
    let barrier = std::sync::Barrier::new(threads);
    run(Config::new(), |ranks| {
        let world = ranks[0].world;
        if !ranks[0].comm.capabilities().has(Feature::Shrink) {
            return Ok(());
        }
        // On one rank there is no one to drop, and an empty exclusion list
        // is refused before NCCL sees it.
        if world == 1 {
            return match ranks[0].comm.shrink(&[], false, None) {
                Err(Error::InvalidArgument { .. }) => Ok(()),
                other => Err(format!("shrink with nothing to exclude gave {other:?}").into()),
            };
        }
        let exclude = vec![world - 1];
        let survivors: Vec<&Rank> = ranks
            .iter()
            .filter(|r| !exclude.contains(&r.rank))
            .collect();
        let result = (|| -> TestResult {
            if survivors.is_empty() {
                return Ok(());
            }
            let parents: Vec<&Comm> = survivors.iter().map(|r| &r.comm).collect();
            let children: Vec<Comm> = Comm::shrink_all(&parents, &exclude, false, None)?
                .into_iter()
                .map(|c| c.ok_or("no child"))
                .collect::<Result<_, _>>()?;
            for (r, c) in survivors.iter().zip(&children) {
                if c.size() != world - exclude.len() || c.rank() != r.rank {
                    return Err(format!(
                        "rank {} shrank to rank {} of {}",
                        r.rank,
                        c.rank(),
                        c.size()
                    )
                    .into());
                }
            }
            let mut bufs: Vec<_> = survivors
                .iter()
                .map(|r| r.stream().clone_htod(&vec![(r.rank + 1) as i32; 500]))
                .collect::<Result<_, _>>()?;
            all_reduce_sum_each(&children.iter().collect::<Vec<_>>(), &mut bufs)?;
            let want: i32 = (0..world)
                .filter(|r| !exclude.contains(r))
                .map(|r| (r + 1) as i32)
                .sum();
            for b in &bufs {
                if b.stream().clone_dtoh(b)?.iter().any(|v| *v != want) {
                    return Err("all_reduce on the shrunk communicator gave the wrong sum".into());
                }
            }
            Ok(())
        })();
        // The dropped rank leaves only after the others are done with the
        // parent, as a failed peer would be replaced.
        barrier.wait();
        result
    });
}
