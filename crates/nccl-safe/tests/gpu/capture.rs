//! One thread capturing one NCCL group over every GPU it drives into one
//! CUDA graph (`nccl_safe::capture_group`). In single mode that is every
//! GPU of the world; with a thread or a process per rank each captures
//! its own rank, so the capture is collective in every mode.

use nccl_safe::cudarc::driver::CudaSlice;
use nccl_safe::cudarc::driver::sys::{
    CUgraphInstantiate_flags, CUstreamCaptureMode, CUstreamCaptureStatus,
};
use nccl_safe::{CapturedGroup, CapturingGroup, GroupGuard, capture_group};

use super::*;

const N: usize = 4096;

/// A send and a receive buffer per rank.
type Sets = Vec<(CudaSlice<f32>, CudaSlice<f32>)>;

/// Rank `rank`'s input in `round`: small integers, exact in f32, whose
/// sum over the world is exact too.
fn input(round: u32, rank: usize) -> f32 {
    (round * (rank as u32 + 1)) as f32
}

fn sets(ranks: &[Rank], round: u32, step: &str) -> TestResult<Sets> {
    ranks
        .iter()
        .map(|r| {
            let send = r.stream().clone_htod(&vec![input(round, r.rank); N]);
            let recv = r.stream().alloc_zeros::<f32>(N);
            Ok((
                send.map_err(at(format!("{step}: rank {}'s send buffer", r.rank)))?,
                recv.map_err(at(format!("{step}: rank {}'s receive buffer", r.rank)))?,
            ))
        })
        .collect()
}

/// Names the step an error came from. A fault on the GPU (an illegal
/// address) is asynchronous: it shows at some later call on that GPU, so
/// the steps are also closed by [`checkpoint`].
fn at<E: std::fmt::Display>(
    step: impl std::fmt::Display,
) -> impl FnOnce(E) -> Box<dyn std::error::Error + Send + Sync> {
    move |e| format!("{step}: {e}").into()
}

/// `1`: [`checkpoint`] waits for all the work on each GPU.
const SETTLE_ENV: &str = "NCCL_SAFE_TEST_SETTLE";

/// Fails, naming the step `after`, when a rank's GPU has faulted. By
/// default it asks without waiting (one event recorded and queried, which
/// orders nothing), so it finds a fault that has happened by now; with
/// [`SETTLE_ENV`] set to `1` it waits for all the work on the GPU first,
/// which places a fault in the step that queued it but may hide a missing
/// order (a launch that does not wait for work queued before it).
fn checkpoint(ranks: &[Rank], after: &str) -> TestResult {
    let settle = std::env::var(SETTLE_ENV).as_deref() == Ok("1");
    for r in ranks {
        let probed = if settle {
            r.stream().context().synchronize()
        } else {
            r.stream()
                .record_event(None)
                .and_then(|e| e.try_is_complete().map(drop))
        };
        probed.map_err(at(format!("rank {}'s GPU after {after}", r.rank)))?;
    }
    Ok(())
}

/// Captures an all-reduce of every rank this thread drives.
fn capture_all_reduce(
    ranks: &[Rank],
    sets: Sets,
) -> nccl_safe::Result<CapturedGroup<'_, (CudaSlice<f32>, CudaSlice<f32>)>> {
    let lanes: Vec<_> = ranks.iter().map(|r| (&r.comm, r.stream())).collect();
    capture_group(&lanes, sets, |cap, bufs| {
        for (r, (send, recv)) in ranks.iter().zip(bufs) {
            cap.on(&r.comm)?.all_reduce(send, recv, ReduceOp::Sum)?;
        }
        Ok(())
    })
}

/// A buffer set that holds no device memory: refusals drop it without a
/// free on any stream (one of them may be capturing).
type NoMemory = Vec<CudaSlice<f32>>;

fn no_memory(n: usize) -> Vec<NoMemory> {
    (0..n).map(|_| Vec::new()).collect()
}

/// Issues nothing.
fn nothing(_: &CapturingGroup<'_>, _: &mut [NoMemory]) -> nccl_safe::Result<()> {
    Ok(())
}

fn invalid(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { .. })
}

/// Configurations that cannot be captured are refused before the capture
/// begins (nothing is enqueued, no stream is left capturing), and a call
/// on a communicator outside the capture is refused before NCCL sees it.
fn refusals(ranks: &[Rank]) -> TestResult {
    let lanes: Vec<_> = ranks.iter().map(|r| (&r.comm, r.stream())).collect();
    let n = lanes.len();
    let none: &[(
        &Comm,
        &std::sync::Arc<nccl_safe::cudarc::driver::CudaStream>,
    )] = &[];
    let refused = capture_group(none, no_memory(0), nothing);
    expect("no communicator", refused.map(drop), invalid)?;
    let refused = capture_group(&lanes, no_memory(n + 1), nothing);
    expect("a buffer set too many", refused.map(drop), invalid)?;
    let twice = [lanes[0], lanes[0]];
    let refused = capture_group(&twice, no_memory(2), nothing);
    expect("a communicator given twice", refused.map(drop), invalid)?;
    let open = GroupGuard::start().map_err(at("refusals: opening a group"))?;
    let nested = capture_group(&lanes, no_memory(n), nothing);
    open.end().map_err(at("refusals: ending the open group"))?;
    expect("a group open on the thread", nested.map(drop), invalid)?;
    let home = ranks[0].stream();
    home.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(at("refusals: beginning a capture on rank 0's stream"))?;
    let captured = capture_group(&lanes, no_memory(n), nothing).map(drop);
    let ended = home.end_capture(CUgraphInstantiate_flags(0));
    drop(ended.map_err(at("refusals: ending the capture on rank 0's stream"))?);
    expect("a stream captured already", captured, invalid)?;
    if ranks.len() >= 2 {
        // Rank 0's communicator with rank 1's stream.
        let crossed = [(&ranks[0].comm, ranks[1].stream())];
        let refused = capture_group(&crossed, no_memory(1), nothing);
        expect("a stream on another GPU", refused.map(drop), |e| {
            matches!(
                e,
                Error::WrongDevice {
                    expected: 0,
                    found: 1,
                    ..
                }
            )
        })?;
        // Rank 1 is not in the capture: refused at `on`, no NCCL call.
        let outside = capture_group(&lanes[..1], no_memory(1), |cap, _| {
            cap.on(&ranks[1].comm).map(drop)
        });
        expect(
            "a communicator outside the capture",
            outside.map(drop),
            invalid,
        )?;
    }
    Ok(())
}

/// No stream of these ranks is being captured.
fn none_capturing(ranks: &[Rank], after: &str) -> TestResult {
    for r in ranks {
        let status = r.stream().capture_status().map_err(at(format!(
            "rank {}'s capture status after {after}",
            r.rank
        )))?;
        if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(
                format!("rank {}'s stream is still capturing after {after}", r.rank).into(),
            );
        }
    }
    Ok(())
}

pub fn one_thread_captures_one_graph_over_its_gpus_and_replays_bit_exact() {
    run(Config::new(), |ranks| {
        let ranks: &[Rank] = ranks;
        let world = ranks[0].world;
        checkpoint(ranks, "the communicators' init")?;
        refusals(ranks)?;
        none_capturing(ranks, "the refusals")?;
        checkpoint(ranks, "the refusals")?;
        let mut graph =
            capture_all_reduce(ranks, sets(ranks, 1, "the capture")?).map_err(at("the capture"))?;
        none_capturing(ranks, "the capture")?;
        checkpoint(ranks, "the capture")?;
        for round in 1..=3u32 {
            // New inputs, then one launch runs the group on every GPU.
            let bufs = graph.buffers().ok_or("no buffers")?;
            for (r, (send, _)) in ranks.iter().zip(bufs.iter_mut()) {
                r.stream()
                    .memcpy_htod(&vec![input(round, r.rank); N], send)
                    .map_err(at(format!("round {round}: rank {}'s input", r.rank)))?;
            }
            graph
                .launch()
                .map_err(at(format!("round {round}: the launch")))?;
            let want: f32 = (0..world).map(|rank| input(round, rank)).sum();
            let bufs = graph.buffers().ok_or("no buffers")?;
            for (r, (_, recv)) in ranks.iter().zip(bufs.iter()) {
                let got = r.stream().clone_dtoh(recv).map_err(at(format!(
                    "round {round}: reading rank {}'s result",
                    r.rank
                )))?;
                if let Some(v) = got.iter().find(|v| v.to_bits() != want.to_bits()) {
                    return Err(format!("replay {round} on rank {}: {v} != {want}", r.rank).into());
                }
            }
            checkpoint(ranks, &format!("round {round}"))?;
        }
        // A buffer replaced between launches: the next launch refuses.
        let bufs = graph.buffers().ok_or("no buffers")?;
        bufs[0].1 = ranks[0]
            .stream()
            .alloc_zeros::<f32>(N)
            .map_err(at("replacing a buffer"))?;
        expect(
            "a launch after a buffer was replaced",
            graph.launch(),
            invalid,
        )?;
        checkpoint(ranks, "the refused launch")?;
        let back = graph
            .into_buffers()
            .map_err(at("taking the buffers back"))?;
        if back.len() != ranks.len() || back.iter().any(|(s, r)| s.len() != N || r.len() != N) {
            return Err("the buffers did not come back".into());
        }
        drop(back);
        checkpoint(ranks, "the graph's drop")?;
        // A closure that fails after its calls: the capture is ended, the
        // graph dropped unlaunched (on every rank alike), and, since NCCL
        // may have made connections inside the capture that only a launch
        // completes, every communicator in it is aborted: later calls get
        // a typed error instead of running on a broken state.
        let lanes: Vec<_> = ranks.iter().map(|r| (&r.comm, r.stream())).collect();
        let failed = capture_group(
            &lanes,
            sets(ranks, 1, "the failing capture")?,
            |cap, bufs| {
                for (r, (send, recv)) in ranks.iter().zip(bufs) {
                    cap.on(&r.comm)?.all_reduce(send, recv, ReduceOp::Sum)?;
                }
                Err(Error::InvalidArgument {
                    op: "test",
                    reason: "the closure fails on purpose",
                })
            },
        );
        expect("a failing closure", failed.map(drop), |e| {
            matches!(e, Error::InvalidArgument { op: "test", .. })
        })?;
        none_capturing(ranks, "a failed capture")?;
        for r in ranks {
            if !r.comm.abort_handle().is_aborted() {
                return Err(format!(
                    "rank {}: a capture dropped unlaunched left its communicator unaborted",
                    r.rank
                )
                .into());
            }
        }
        Ok(())
    });
}
