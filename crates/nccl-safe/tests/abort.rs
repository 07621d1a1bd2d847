//! GPU regression tests of the abort and teardown paths: each would crash,
//! hang or free memory under NCCL before the fix it guards. `#[ignore]`d:
//! `cargo xtask gpu-test` runs them (target `nccl-safe-abort`, once per
//! world size; those that need two GPUs pass at once on one).
//!
//! Each test makes its own communicators in this process and leaves a
//! kernel stuck on purpose (a collective that the other rank never joins),
//! so every test ends by aborting what it made.

use std::time::{Duration, Instant};

use nccl_safe::cudarc::driver::{CudaContext, CudaSlice};
use nccl_safe::{
    AbortCause, AbortSignal, Comm, Config, Error, GroupGuard, NcclMemory, ReduceOp, UniqueId, group,
};
use nccl_testkit::{TestResult, check, within, world};

/// Two blocking communicators (devices 0 and 1) driven by this thread.
///
/// Connected: both ranks ran one all-reduce together. NCCL connects the
/// ranks at their first collective, and a blocking communicator's
/// `ncclGroupEnd` would wait in that connection for a rank that never
/// comes (NCCL's own wait, which only a nonblocking communicator bounds);
/// once connected, a call that only rank 0 joins launches a kernel that
/// waits, which is what these tests need.
fn pair(timeout: Duration) -> TestResult<Vec<Comm>> {
    let comms = Comm::init_all(&[0, 1], &Config::new().timeout(timeout))?;
    let mut bufs = comms
        .iter()
        .map(|c| c.stream().alloc_zeros::<f32>(1024))
        .collect::<Result<Vec<_>, _>>()?;
    group(|g| {
        for (c, b) in comms.iter().zip(bufs.iter_mut()) {
            g.on(c).all_reduce_in_place(b, ReduceOp::Sum)?;
        }
        Ok(())
    })?;
    for c in &comms {
        c.stream().synchronize()?;
    }
    Ok(comms)
}

/// An all-reduce that only `comm` (rank 0 of a [`pair`]) joins: its
/// kernel waits for the other rank until aborted. Gives its buffer.
fn stuck_all_reduce(comm: &Comm) -> TestResult<CudaSlice<f32>> {
    let mut buf = comm.stream().alloc_zeros::<f32>(1 << 16)?;
    let group = GroupGuard::start()?;
    group
        .on(comm)
        .all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
    group.end()?;
    Ok(buf)
}

/// Aborts every communicator (the end of each test: a kernel is stuck).
fn abort_all(comms: Vec<Comm>) {
    for c in comms {
        let _ = c.abort();
    }
}

/// Aborting from another thread while this thread has a group open that
/// holds a call on the communicator used to free it under `ncclGroupEnd`
/// (SIGSEGV). Now the abort is deferred to the group's end: `abort`
/// returns at once, the group ends without a crash, and the communicator
/// is aborted after it with the cause given.
#[test]
#[ignore = "needs 2 GPUs: cargo xtask gpu-test"]
fn abort_from_another_thread_while_a_group_is_open_waits_for_its_end() {
    if world() < 2 {
        eprintln!("needs 2 GPUs; nothing to do on one");
        return;
    }
    check((|| {
        let comms = pair(Duration::from_secs(20))?;
        let mut buf = comms[0].stream().alloc_zeros::<f32>(1 << 16)?;
        let handle = comms[0].abort_handle();
        let group = GroupGuard::start()?;
        // Only rank 0 joins: its kernel will wait for rank 1 forever.
        group
            .on(&comms[0])
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        let aborter = std::thread::spawn(move || {
            let started = Instant::now();
            let now = handle.request_abort(AbortCause::Other("test abort".into()));
            let blocking = handle.abort();
            (
                now,
                blocking.is_ok(),
                handle.is_aborted(),
                started.elapsed(),
            )
        });
        let (done_at_once, abort_ok, flagged, took) =
            aborter.join().map_err(|_| "the aborting thread panicked")?;
        if done_at_once {
            return Err("the abort happened while the group still referred to the comm".into());
        }
        if !abort_ok || !flagged || took > Duration::from_secs(1) {
            return Err(format!(
                "abort from the other thread: ok {abort_ok}, flagged {flagged}, took {took:?}"
            )
            .into());
        }
        // The group ends (launching the work) and the abort follows.
        let ended = group.end();
        eprintln!("group end after a deferred abort: {ended:?}");
        match comms[0].status() {
            Err(Error::Aborted {
                cause: AbortCause::Other(why),
                ..
            }) if why == "test abort" => {}
            other => return Err(format!("after the group: {other:?}").into()),
        }
        // The aborted kernel stopped: the stream drains.
        comms[0].stream().synchronize()?;
        drop(buf);
        abort_all(comms);
        Ok(())
    })());
}

/// A nonblocking init that a peer never joins is cut short by the job's
/// signal, with the cause (a lost peer) in the error. Neither the trigger
/// nor the init waits for NCCL's abort (which first joins NCCL's init
/// thread, deaf to the abort flag while it loads the kernels): the handle's
/// drop makes it on a teardown thread, which the signal's settled wait
/// then waits for. One GPU suffices.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn a_signal_aborts_a_nonblocking_init_that_a_peer_never_joins() {
    world();
    check((|| {
        let signal = AbortSignal::new();
        let config = Config::new()
            .blocking(false)
            .timeout(Duration::from_secs(60))
            .abort_signal(&signal);
        let trigger = signal.clone();
        let fired = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let at = Instant::now();
            trigger.trigger(AbortCause::PeerLost {
                rank: 1,
                detail: "test".into(),
            });
            (at, at.elapsed())
        });
        let id = UniqueId::new()?;
        let result = Comm::init_rank(&id, 0, 2, 0, &config);
        let returned = Instant::now();
        let (fired_at, trigger_took) = fired.join().map_err(|_| "trigger thread panicked")?;
        let after = returned.saturating_duration_since(fired_at);
        eprintln!("init answered {after:?} after the signal; the trigger took {trigger_took:?}");
        match result {
            Err(Error::Aborted {
                cause: AbortCause::PeerLost { rank: 1, .. },
                ..
            }) if after < Duration::from_millis(500)
                && trigger_took < Duration::from_millis(500) => {}
            other => {
                return Err(format!(
                    "init returned {other:?}, {after:?} after the signal (trigger took {trigger_took:?})"
                )
                .into());
            }
        }
        let waited = Instant::now();
        if !signal.wait_settled(waited + Duration::from_secs(30)) {
            return Err("NCCL's abort of the cut-short init did not end within 30 s".into());
        }
        eprintln!("NCCL's abort ended {:?} later", waited.elapsed());
        Ok(())
    })());
}

/// Dropping a blocking communicator with a collective that never finishes
/// used to finalize with no deadline (90 s seen). Now the drop waits at
/// most the communicator's timeout for the work, then aborts.
#[test]
#[ignore = "needs 2 GPUs: cargo xtask gpu-test"]
fn drop_of_a_blocking_comm_with_unfinished_work_is_bounded() {
    if world() < 2 {
        eprintln!("needs 2 GPUs; nothing to do on one");
        return;
    }
    check((|| {
        let timeout = Duration::from_secs(3);
        let comms = pair(timeout)?;
        let buf = stuck_all_reduce(&comms[0])?;
        let started = Instant::now();
        drop(comms);
        let took = started.elapsed();
        eprintln!("drop took {took:?} (timeout {timeout:?})");
        if took > timeout + Duration::from_secs(3) {
            return Err(format!("drop took {took:?}").into());
        }
        // The stuck kernel was aborted: the buffer's stream drains.
        buf.stream().synchronize()?;
        drop(buf);
        Ok(())
    })());
}

/// A communicator kept ([`nccl_safe::WeakAbortHandle::keep`], as a world
/// keeps its meshes' past a loss) outlives its last handle: that handle's
/// drop tears nothing down and returns at once, even behind a stuck
/// kernel; the keeper's drop ends it. Communicators made together
/// (`Comm::init_all`) are torn down together, once the last of them is
/// handed in: here the other rank's drop, which the stuck kernel's abort
/// then bounds.
#[test]
#[ignore = "needs 2 GPUs: cargo xtask gpu-test"]
fn a_kept_communicator_is_torn_down_by_its_keeper_not_its_last_handle() {
    if world() < 2 {
        eprintln!("needs 2 GPUs; nothing to do on one");
        return;
    }
    check((|| {
        let timeout = Duration::from_secs(3);
        let mut comms = pair(timeout)?;
        let buf = stuck_all_reduce(&comms[0])?;
        let rank1 = comms.pop().ok_or("two communicators")?;
        let rank0 = comms.pop().ok_or("two communicators")?;
        let weak = rank0.abort_handle().downgrade();
        let kept = weak.keep().ok_or("rank 0's communicator exists")?;
        let started = Instant::now();
        drop(rank0);
        let handle_drop = started.elapsed();
        if !weak.is_alive() {
            return Err("the last handle's drop tore a kept communicator down".into());
        }
        if handle_drop > Duration::from_secs(1) {
            return Err(format!("the last handle's drop took {handle_drop:?}").into());
        }
        drop(kept);
        if weak.is_alive() || weak.keep().is_some() {
            return Err("the keeper's drop left the communicator alive".into());
        }
        let started = Instant::now();
        drop(rank1);
        let took = started.elapsed();
        eprintln!(
            "handle drop {handle_drop:?}, the pair's teardown {took:?} (timeout {timeout:?})"
        );
        if took > timeout + Duration::from_secs(3) {
            return Err(format!("the pair's teardown took {took:?}").into());
        }
        // The stuck kernel was aborted: the buffer's stream drains.
        buf.stream().synchronize()?;
        drop(buf);
        Ok(())
    })());
}

/// `NcclMemory`'s drop used to synchronize the whole context, so it hung
/// behind a stuck kernel. Now it waits for its communicator's stream only,
/// for at most the communicator's timeout, and leaks the memory when the
/// work does not finish.
#[test]
#[ignore = "needs 2 GPUs: cargo xtask gpu-test"]
fn nccl_memory_drop_behind_a_stuck_kernel_is_bounded() {
    if world() < 2 {
        eprintln!("needs 2 GPUs; nothing to do on one");
        return;
    }
    check((|| {
        let timeout = Duration::from_secs(2);
        let comms = pair(timeout)?;
        let mut memory = match NcclMemory::<f32>::alloc(&comms[0], 1 << 16) {
            Ok(m) => m,
            Err(Error::Unsupported { .. }) => {
                abort_all(comms);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        let group = GroupGuard::start()?;
        group
            .on(&comms[0])
            .all_reduce_in_place(&mut memory, ReduceOp::Sum)?;
        group.end()?;
        let started = Instant::now();
        drop(memory);
        let took = started.elapsed();
        eprintln!("NcclMemory drop took {took:?} (timeout {timeout:?})");
        abort_all(comms);
        if took > timeout + Duration::from_secs(2) {
            return Err(format!("NcclMemory drop took {took:?}").into());
        }
        Ok(())
    })());
}

/// H1 and L4: `init_all` used to prepare each device inside the group, so
/// a device that could not be prepared (here one that does not exist) left
/// the ranks before it queued in a group whose end then waited for the
/// missing ranks forever. Now every device is prepared before the group
/// opens: a typed error at once, and the thread's group state is clean
/// (a new `init_all` on the real device works).
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn init_all_with_a_device_that_is_missing_fails_at_once() {
    world();
    check((|| {
        let missing = CudaContext::device_count()? as usize + 3;
        let started = Instant::now();
        let result = within(Duration::from_secs(30), move || {
            Comm::init_all(&[0, missing], &Config::new()).map(|c| c.len())
        })?;
        if result.is_ok() {
            return Err(format!("device {missing} was accepted").into());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err(format!("refused only after {:?}", started.elapsed()).into());
        }
        let comms = within(Duration::from_secs(60), || {
            Comm::init_all(&[0], &Config::new()).map(|c| c.len())
        })??;
        if comms != 1 {
            return Err("no communicator after the failed init_all".into());
        }
        Ok(())
    })());
}

/// The process's thread count (NCCL keeps service threads per live
/// communicator, so communicators that leak leave threads behind).
fn threads() -> TestResult<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| "no Threads: line in /proc/self/status".into())
}

/// L1 and L2: when wrapping the handles of `init_all` or `split_all`
/// failed for one of them, the handles after it were dropped raw (never
/// aborted or destroyed) and the clique waited for members that never
/// came. A signal triggered before the call makes every wrap fail; over
/// several rounds no communicator may be left behind (counted by NCCL's
/// threads, which end when their communicator is aborted).
#[test]
#[ignore = "needs 2 GPUs: cargo xtask gpu-test"]
fn init_all_and_split_all_leak_nothing_when_wrapping_fails() {
    if world() < 2 {
        return;
    }
    check((|| {
        // Warm up: contexts and NCCL's process-wide threads exist.
        drop(Comm::init_all(&[0, 1], &Config::new())?);
        std::thread::sleep(Duration::from_secs(2));
        let before = threads()?;
        for _ in 0..4 {
            let signal = AbortSignal::new();
            signal.trigger(AbortCause::Requested);
            let config = Config::new()
                .timeout(Duration::from_secs(20))
                .abort_signal(&signal);
            if Comm::init_all(&[0, 1], &config).is_ok() {
                return Err("init_all with a triggered signal succeeded".into());
            }
            let parents = Comm::init_all(&[0, 1], &Config::new())?;
            let refs: Vec<&Comm> = parents.iter().collect();
            if Comm::split_all(&refs, &[Some(0), Some(0)], &[0, 1], Some(&config)).is_ok() {
                return Err("split_all with a triggered signal succeeded".into());
            }
            drop(parents);
        }
        // Teardown runs on threads of its own: give it time.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = threads()?;
            if now <= before + 2 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(
                    format!("{before} threads before, {now} after: communicators leaked").into(),
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })());
}

/// U6: `NcclMemory` used on a stream other than its home stream was not
/// ordered after its earlier uses: a read on stream B could run before a
/// write queued just before on stream A. Two independent one-rank
/// communicators (so NCCL does not order them itself): the first writes
/// the memory on A behind a long copy, the second reads it on B at once.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn nccl_memory_used_on_two_streams_keeps_the_order_of_its_uses() {
    world();
    check((|| {
        let one = Comm::init_rank(&UniqueId::new()?, 0, 1, 0, &Config::new())?;
        let two = Comm::init_rank(&UniqueId::new()?, 0, 1, 0, &Config::new())?;
        if !one.capabilities().has(nccl_safe::Feature::MemAlloc) {
            return Ok(());
        }
        let ctx = one.stream().context().clone();
        let (a, b) = (ctx.new_stream()?, ctx.new_stream()?);
        const N: usize = 1 << 20;
        let input = a.clone_htod(&vec![7.0f32; N])?;
        let mut output = b.alloc_zeros::<f32>(N)?;
        let mut memory = NcclMemory::<f32>::alloc(&one, N)?;
        // Make the memory 0 first, on its home stream, and wait.
        let zeros = one.stream().alloc_zeros::<f32>(N)?;
        one.on(one.stream())
            .all_reduce(&zeros, &mut memory, ReduceOp::Sum)?;
        one.stream().synchronize()?;
        // A long copy on A, then the write of 7s into the memory on A.
        let big = a.alloc_zeros::<u8>(1 << 30)?;
        let mut big2 = a.alloc_zeros::<u8>(1 << 30)?;
        a.synchronize()?;
        for _ in 0..8 {
            a.memcpy_dtod(&big, &mut big2)?;
        }
        one.on(&a).all_reduce(&input, &mut memory, ReduceOp::Sum)?;
        // At once, the read on B by the other communicator.
        two.on(&b).all_reduce(&memory, &mut output, ReduceOp::Sum)?;
        b.synchronize()?;
        a.synchronize()?;
        let got = b.clone_dtoh(&output)?;
        if got.iter().any(|v| *v != 7.0) {
            return Err(format!("the read on B saw {} before the write on A", got[0]).into());
        }
        Ok(())
    })());
}

/// U4: a graph captured with `nccl_safe::capture` owns its buffers and
/// borrows its communicator (the compile-fail tests show neither can go
/// first); a call on memory it does not own, or with a PreMulSum, is
/// refused at capture; replays with new inputs are bit-exact; a replaced
/// buffer makes the next launch refuse.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn a_captured_graph_owns_its_buffers_and_replays_bit_exact() {
    world();
    check((|| {
        let comm = Comm::init_rank(&UniqueId::new()?, 0, 1, 0, &Config::new())?;
        let stream = comm.stream();
        // SAFETY: every buffer here is used on `stream` only.
        unsafe { stream.context().disable_event_tracking() };
        const N: usize = 4096;
        let mut stranger = stream.alloc_zeros::<f32>(N)?;
        let owned = (
            stream.clone_htod(&[1.0f32; N])?,
            stream.alloc_zeros::<f32>(N)?,
        );
        let refused = nccl_safe::capture(stream, owned, |cap, (send, _)| {
            cap.on(&comm).all_reduce(send, &mut stranger, ReduceOp::Sum)
        });
        if !matches!(refused, Err(Error::InvalidArgument { .. })) {
            return Err(format!("a call on memory the graph does not own: {refused:?}").into());
        }
        let owned = (
            stream.clone_htod(&[1.0f32; N])?,
            stream.alloc_zeros::<f32>(N)?,
        );
        let mut graph = nccl_safe::capture(stream, owned, |cap, (send, recv)| {
            cap.on(&comm).all_reduce(send, recv, ReduceOp::Sum)
        })?;
        for round in 1..=3u32 {
            let (send, _) = graph.buffers().ok_or("no buffers")?;
            stream.memcpy_htod(&vec![round as f32; N], send)?;
            graph.launch()?;
            let (_, recv) = graph.buffers().ok_or("no buffers")?;
            let got = stream.clone_dtoh(recv)?;
            if got.iter().any(|v| *v != round as f32) {
                return Err(format!("replay {round}: {} != {round}", got[0]).into());
            }
        }
        // A buffer replaced between launches: the next launch refuses.
        let (_, recv) = graph.buffers().ok_or("no buffers")?;
        *recv = stream.alloc_zeros::<f32>(N)?;
        if graph.launch().is_ok() {
            return Err("a launch after a buffer was replaced ran".into());
        }
        let (_, recv) = graph.into_buffers()?;
        if recv.len() != N {
            return Err("the buffers did not come back".into());
        }
        Ok(())
    })());
}
