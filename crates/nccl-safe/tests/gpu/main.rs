//! GPU tests of nccl-safe. Each is `#[ignore]`d: `cargo xtask gpu-test`
//! runs them for world sizes 1, 2 and 4 in both launch modes
//! (`NCCL_SAFE_TEST_WORLD`, `NCCL_SAFE_TEST_MODE=single|threads`).
//!
//! Every result is compared bit for bit with values computed on the host;
//! inputs are chosen so every float result is exact (see `harness`), and
//! every output has guard regions that must come back untouched.

use nccl_safe::cudarc::driver::{CudaContext, DeviceSlice};
use nccl_safe::{
    Comm, Config, DeviceBuffer, DeviceBufferMut, Error, Feature, NcclMemory, PreMulSum, ReduceOp,
    Registration, Role, group,
};
use nccl_testkit::*;

const N: usize = 1027;

/// A reduction under test.
#[derive(Debug, Clone, Copy)]
enum OpCase {
    Builtin(ReduceOp),
    PreMulHost,
    PreMulDevice,
}

const OP_CASES: [OpCase; 7] = [
    OpCase::Builtin(ReduceOp::Sum),
    OpCase::Builtin(ReduceOp::Prod),
    OpCase::Builtin(ReduceOp::Max),
    OpCase::Builtin(ReduceOp::Min),
    OpCase::Builtin(ReduceOp::Avg),
    OpCase::PreMulHost,
    OpCase::PreMulDevice,
];

/// The PreMulSum scalar.
const SCALAR: f64 = 2.0;

/// What reducing `reduce_input(r, i)` over `world` ranks gives.
fn expected_reduction<T: TestType>(op: OpCase, world: usize, i: usize) -> f64 {
    let values: Vec<f64> = (0..world).map(|r| reduce_input(r, i)).collect();
    let sum: f64 = values.iter().sum();
    match op {
        OpCase::Builtin(ReduceOp::Sum) => sum,
        OpCase::Builtin(ReduceOp::Prod) => values.iter().product(),
        OpCase::Builtin(ReduceOp::Max) => values.iter().copied().fold(f64::MIN, f64::max),
        OpCase::Builtin(ReduceOp::Min) => values.iter().copied().fold(f64::MAX, f64::min),
        OpCase::Builtin(ReduceOp::Avg) if T::IS_INT => (sum as i64 / world as i64) as f64,
        OpCase::Builtin(ReduceOp::Avg) => sum / world as f64,
        OpCase::PreMulHost | OpCase::PreMulDevice => SCALAR * sum,
    }
}

/// Per-rank operator: a built-in, or a PreMulSum made on that rank's comm.
enum RankOp<'c, T: TestType> {
    Builtin(ReduceOp),
    PreMul(PreMulSum<'c, T>),
}

fn make_ops<'c, T: TestType>(
    ranks: &'c [Rank],
    scalars: &'c [nccl_safe::cudarc::driver::CudaSlice<T>],
    op: OpCase,
) -> TestResult<Vec<RankOp<'c, T>>> {
    ranks
        .iter()
        .zip(scalars)
        .map(|(r, s)| {
            Ok(match op {
                OpCase::Builtin(b) => RankOp::Builtin(b),
                OpCase::PreMulHost => {
                    RankOp::PreMul(PreMulSum::host(&r.comm, T::from_f64(SCALAR))?)
                }
                OpCase::PreMulDevice => RankOp::PreMul(PreMulSum::device(&r.comm, s)?),
            })
        })
        .collect()
}

/// Calls `$call` with the rank's operator as `$op`, whichever kind it is.
macro_rules! with_op {
    ($rank_op:expr, |$op:ident| $call:expr) => {
        match $rank_op {
            RankOp::Builtin(b) => {
                let $op = *b;
                $call
            }
            RankOp::PreMul(p) => {
                let $op = p;
                $call
            }
        }
    };
}

fn scalars<T: TestType>(
    ranks: &[Rank],
) -> TestResult<Vec<nccl_safe::cudarc::driver::CudaSlice<T>>> {
    ranks
        .iter()
        .map(|r| Ok(r.stream().clone_htod(&[T::from_f64(SCALAR)])?))
        .collect()
}

/// fp8 reductions need compute capability 9.0: where they are refused, the
/// refusal must be the typed error.
fn fp8_reduction_refused<T: TestType>(ranks: &[Rank]) -> TestResult<bool> {
    if !T::IS_FP8 || ranks[0].comm.fp8_reductions() {
        return Ok(false);
    }
    let mut buf = ranks[0].stream().alloc_zeros::<T>(4)?;
    match ranks[0].comm.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
        Err(Error::Unsupported { .. }) => Ok(true),
        other => Err(format!("fp8 reduction below cc 9.0 gave {other:?}").into()),
    }
}

/// fp8 Avg and PreMulSum on a one-rank communicator: NCCL's one-rank path
/// has no fp8 kernel, so the call must be refused with `Unsupported`.
fn fp8_scaled_on_one_rank_refused<T: TestType>(
    ranks: &[Rank],
    scalars: &[nccl_safe::cudarc::driver::CudaSlice<T>],
    op: OpCase,
) -> TestResult<bool> {
    let scaled = matches!(
        op,
        OpCase::Builtin(ReduceOp::Avg) | OpCase::PreMulHost | OpCase::PreMulDevice
    );
    if !(T::IS_FP8 && ranks[0].world == 1 && scaled) {
        return Ok(false);
    }
    let ops = make_ops::<T>(ranks, scalars, op)?;
    let mut buf = ranks[0].stream().alloc_zeros::<T>(4)?;
    match with_op!(&ops[0], |o| ranks[0].comm.all_reduce_in_place(&mut buf, o)) {
        Err(Error::Unsupported { .. }) => Ok(true),
        other => Err(format!("fp8 {op:?} on one rank gave {other:?}").into()),
    }
}

/// Adds the case to an error.
fn label<T>(
    what: impl std::fmt::Display,
) -> impl FnOnce(nccl_safe::Error) -> Box<dyn std::error::Error + Send + Sync> {
    move |e| format!("{what} {}: {e}", type_name::<T>()).into()
}

struct Pair<T: TestType> {
    send: Guarded<T>,
    recv: Guarded<T>,
}

fn all_reduce_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    if fp8_reduction_refused::<T>(ranks)? {
        return Ok(());
    }
    let world = ranks[0].world;
    let scalars = scalars::<T>(ranks)?;
    for op in OP_CASES {
        if fp8_scaled_on_one_rank_refused::<T>(ranks, &scalars, op)? {
            continue;
        }
        let ops = make_ops::<T>(ranks, &scalars, op)?;
        // Out of place.
        let mut pairs: Vec<Pair<T>> = ranks
            .iter()
            .map(|r| {
                Ok(Pair {
                    send: Guarded::new(r.stream(), N, |i| reduce_input(r.rank, i))?,
                    recv: Guarded::zeros(r.stream(), N)?,
                })
            })
            .collect::<TestResult<_>>()?;
        let mut views: Vec<_> = pairs
            .iter_mut()
            .map(|p| (p.send.data(), p.recv.data_mut()))
            .collect();
        each_rank!(ranks, views, |on, r, v| {
            let rank_op = &ops[r.rank - ranks[0].rank];
            with_op!(rank_op, |op| on.all_reduce(&v.0, &mut v.1, op))
        })
        .map_err(label::<T>(format!("all_reduce {op:?}")))?;
        drop(views);
        for (r, p) in ranks.iter().zip(&pairs) {
            let what = format!("all_reduce {op:?} {} rank {}", type_name::<T>(), r.rank);
            p.recv
                .check(&what, |i| expected_reduction::<T>(op, world, i))?;
            p.send
                .check(&format!("{what} (input)"), |i| reduce_input(r.rank, i))?;
        }
        // In place.
        let mut bufs: Vec<Guarded<T>> = ranks
            .iter()
            .map(|r| Guarded::new(r.stream(), N, |i| reduce_input(r.rank, i)))
            .collect::<TestResult<_>>()?;
        let mut views: Vec<_> = bufs.iter_mut().map(|b| b.data_mut()).collect();
        each_rank!(ranks, views, |on, r, v| {
            let rank_op = &ops[r.rank - ranks[0].rank];
            with_op!(rank_op, |op| on.all_reduce_in_place(v, op))
        })
        .map_err(label::<T>(format!("all_reduce in place {op:?}")))?;
        drop(views);
        for (r, b) in ranks.iter().zip(&bufs) {
            b.check(
                &format!(
                    "all_reduce in place {op:?} {} rank {}",
                    type_name::<T>(),
                    r.rank
                ),
                |i| expected_reduction::<T>(op, world, i),
            )?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn all_reduce_every_type_and_op_in_and_out_of_place() {
    run(Config::new(), |ranks| each_type!(all_reduce_case(ranks)));
}

fn reduce_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    if fp8_reduction_refused::<T>(ranks)? {
        return Ok(());
    }
    let world = ranks[0].world;
    let scalars = scalars::<T>(ranks)?;
    for root in [0, world - 1] {
        for op in OP_CASES {
            if fp8_scaled_on_one_rank_refused::<T>(ranks, &scalars, op)? {
                continue;
            }
            let ops = make_ops::<T>(ranks, &scalars, op)?;
            for in_place in [false, true] {
                let mut pairs: Vec<Pair<T>> = ranks
                    .iter()
                    .map(|r| {
                        Ok(Pair {
                            send: Guarded::new(r.stream(), N, |i| reduce_input(r.rank, i))?,
                            recv: Guarded::zeros(r.stream(), N)?,
                        })
                    })
                    .collect::<TestResult<_>>()?;
                let mut views: Vec<_> = pairs
                    .iter_mut()
                    .map(|p| (p.send.data_mut(), p.recv.data_mut()))
                    .collect();
                each_rank!(ranks, views, |on, r, v| {
                    let rank_op = &ops[r.rank - ranks[0].rank];
                    if in_place {
                        with_op!(rank_op, |op| on.reduce_in_place(&mut v.0, op, root))
                    } else {
                        let recv = (r.rank == root).then_some(&mut v.1);
                        with_op!(rank_op, |op| on.reduce(&v.0, recv, op, root))
                    }
                })
                .map_err(label::<T>(format!(
                    "reduce root {root} {op:?} in_place {in_place}"
                )))?;
                drop(views);
                for (r, p) in ranks.iter().zip(&pairs) {
                    let what = format!(
                        "reduce root {root} {op:?} {} in_place {in_place} rank {}",
                        type_name::<T>(),
                        r.rank
                    );
                    let out = if in_place { &p.send } else { &p.recv };
                    if r.rank == root {
                        out.check(&what, |i| expected_reduction::<T>(op, world, i))?;
                    } else if !in_place {
                        p.recv.check(&what, |_| 0.0)?;
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn reduce_every_type_op_and_root() {
    run(Config::new(), |ranks| each_type!(reduce_case(ranks)));
}

fn reduce_scatter_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    if fp8_reduction_refused::<T>(ranks)? {
        return Ok(());
    }
    let world = ranks[0].world;
    let scalars = scalars::<T>(ranks)?;
    for op in OP_CASES {
        if fp8_scaled_on_one_rank_refused::<T>(ranks, &scalars, op)? {
            continue;
        }
        let ops = make_ops::<T>(ranks, &scalars, op)?;
        for in_place in [false, true] {
            let mut pairs: Vec<Pair<T>> = ranks
                .iter()
                .map(|r| {
                    Ok(Pair {
                        send: Guarded::new(r.stream(), world * N, |i| reduce_input(r.rank, i))?,
                        recv: Guarded::zeros(r.stream(), N)?,
                    })
                })
                .collect::<TestResult<_>>()?;
            let mut views: Vec<_> = pairs
                .iter_mut()
                .map(|p| (p.send.data_mut(), p.recv.data_mut()))
                .collect();
            each_rank!(ranks, views, |on, r, v| {
                let rank_op = &ops[r.rank - ranks[0].rank];
                if in_place {
                    with_op!(rank_op, |op| on.reduce_scatter_in_place(&mut v.0, op))
                } else {
                    with_op!(rank_op, |op| on.reduce_scatter(&v.0, &mut v.1, op))
                }
            })
            .map_err(label::<T>(format!(
                "reduce_scatter {op:?} in_place {in_place}"
            )))?;
            drop(views);
            for (r, p) in ranks.iter().zip(&pairs) {
                let what = format!(
                    "reduce_scatter {op:?} {} in_place {in_place} rank {}",
                    type_name::<T>(),
                    r.rank
                );
                let block = r.rank * N;
                if in_place {
                    // This rank's block holds the result; the others keep
                    // their inputs.
                    p.send.check(&what, |i| {
                        if (block..block + N).contains(&i) {
                            expected_reduction::<T>(op, world, i)
                        } else {
                            reduce_input(r.rank, i)
                        }
                    })?;
                } else {
                    p.recv
                        .check(&what, |i| expected_reduction::<T>(op, world, block + i))?;
                }
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn reduce_scatter_every_type_and_op_in_and_out_of_place() {
    run(Config::new(), |ranks| {
        each_type!(reduce_scatter_case(ranks))
    });
}

fn broadcast_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    for root in [0, world - 1] {
        for in_place in [false, true] {
            let mut pairs: Vec<Pair<T>> = ranks
                .iter()
                .map(|r| {
                    Ok(Pair {
                        send: Guarded::new(r.stream(), N, |i| move_input(r.rank, i))?,
                        recv: Guarded::zeros(r.stream(), N)?,
                    })
                })
                .collect::<TestResult<_>>()?;
            let mut views: Vec<_> = pairs
                .iter_mut()
                .map(|p| (p.send.data_mut(), p.recv.data_mut()))
                .collect();
            each_rank!(ranks, views, |on, r, v| {
                if in_place {
                    on.broadcast_in_place(&mut v.0, root)
                } else {
                    on.broadcast((r.rank == root).then_some(&v.0), &mut v.1, root)
                }
            })
            .map_err(label::<T>(format!(
                "broadcast root {root} in_place {in_place}"
            )))?;
            drop(views);
            for (r, p) in ranks.iter().zip(&pairs) {
                let what = format!(
                    "broadcast root {root} {} in_place {in_place} rank {}",
                    type_name::<T>(),
                    r.rank
                );
                let out = if in_place { &p.send } else { &p.recv };
                out.check(&what, |i| move_input(root, i))?;
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn broadcast_every_type_and_root() {
    run(Config::new(), |ranks| each_type!(broadcast_case(ranks)));
}

fn all_gather_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    for in_place in [false, true] {
        // In place, the input sits in this rank's block of the output.
        let mut pairs: Vec<Pair<T>> = ranks
            .iter()
            .map(|r| {
                let rank = r.rank;
                let send = if in_place {
                    Guarded::new(r.stream(), world * N, |i| {
                        if i / N == rank {
                            move_input(rank, i % N)
                        } else {
                            0.0
                        }
                    })?
                } else {
                    Guarded::new(r.stream(), N, |i| move_input(rank, i))?
                };
                Ok(Pair {
                    send,
                    recv: Guarded::zeros(r.stream(), world * N)?,
                })
            })
            .collect::<TestResult<_>>()?;
        let mut views: Vec<_> = pairs
            .iter_mut()
            .map(|p| (p.send.data_mut(), p.recv.data_mut()))
            .collect();
        each_rank!(ranks, views, |on, r, v| {
            let _ = r;
            if in_place {
                on.all_gather_in_place(&mut v.0)
            } else {
                on.all_gather(&v.0, &mut v.1)
            }
        })
        .map_err(label::<T>(format!("all_gather in_place {in_place}")))?;
        drop(views);
        for (r, p) in ranks.iter().zip(&pairs) {
            let what = format!(
                "all_gather {} in_place {in_place} rank {}",
                type_name::<T>(),
                r.rank
            );
            let out = if in_place { &p.send } else { &p.recv };
            out.check(&what, |i| move_input(i / N, i % N))?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn all_gather_every_type_in_and_out_of_place() {
    run(Config::new(), |ranks| each_type!(all_gather_case(ranks)));
}

fn all_to_all_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    // Element i of block j on rank r is what r sends to j.
    let sent = |r: usize, j: usize, i: usize| move_input(r + j * 3, i);
    for force_p2p in [false, true] {
        for r in ranks.iter() {
            r.comm.force_send_recv_collectives(force_p2p);
        }
        let mut pairs: Vec<Pair<T>> = ranks
            .iter()
            .map(|r| {
                let rank = r.rank;
                Ok(Pair {
                    send: Guarded::new(r.stream(), world * N, |i| sent(rank, i / N, i % N))?,
                    recv: Guarded::zeros(r.stream(), world * N)?,
                })
            })
            .collect::<TestResult<_>>()?;
        let mut views: Vec<_> = pairs
            .iter_mut()
            .map(|p| (p.send.data(), p.recv.data_mut()))
            .collect();
        each_rank!(ranks, views, |on, r, v| {
            let _ = r;
            on.all_to_all(&v.0, &mut v.1)
        })
        .map_err(label::<T>(format!("all_to_all send_recv {force_p2p}")))?;
        drop(views);
        for (r, p) in ranks.iter().zip(&pairs) {
            let what = format!(
                "all_to_all {} send_recv {force_p2p} rank {}",
                type_name::<T>(),
                r.rank
            );
            // Block i of my output is what rank i sent to me.
            p.recv.check(&what, |i| sent(i / N, r.rank, i % N))?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn all_to_all_every_type_native_and_send_recv() {
    run(Config::new(), |ranks| each_type!(all_to_all_case(ranks)));
}

fn all_to_all_v_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    // Rank r sends count(r, j) elements to rank j.
    let count = |r: usize, j: usize| 100 + (r * 13 + j * 7) % 50;
    let layout = |counts: Vec<usize>| {
        let displs: Vec<usize> = counts
            .iter()
            .scan(0, |acc, c| {
                let d = *acc;
                *acc += c + 3;
                Some(d)
            })
            .collect();
        let total = displs.last().unwrap_or(&0) + counts.last().unwrap_or(&0);
        (counts, displs, total)
    };
    let value = |from: usize, to: usize, i: usize| move_input(from * 5 + to, i);
    struct Plan<T: TestType> {
        send: Guarded<T>,
        recv: Guarded<T>,
        sc: Vec<usize>,
        sd: Vec<usize>,
        rc: Vec<usize>,
        rd: Vec<usize>,
    }
    let mut plans: Vec<Plan<T>> = ranks
        .iter()
        .map(|r| {
            let me = r.rank;
            let (sc, sd, stotal) = layout((0..world).map(|j| count(me, j)).collect());
            let (rc, rd, rtotal) = layout((0..world).map(|j| count(j, me)).collect());
            let send = Guarded::new(r.stream(), stotal, |i| {
                (0..world)
                    .find(|&j| (sd[j]..sd[j] + sc[j]).contains(&i))
                    .map_or(0.0, |j| value(me, j, i - sd[j]))
            })?;
            Ok(Plan {
                send,
                recv: Guarded::zeros(r.stream(), rtotal)?,
                sc,
                sd,
                rc,
                rd,
            })
        })
        .collect::<TestResult<_>>()?;
    let mut views: Vec<_> = plans
        .iter_mut()
        .map(|p| (p.send.data(), p.recv.data_mut(), &p.sc, &p.sd, &p.rc, &p.rd))
        .collect();
    each_rank!(ranks, views, |on, r, v| {
        let _ = r;
        on.all_to_all_v(&v.0, v.2, v.3, &mut v.1, v.4, v.5)
    })?;
    drop(views);
    for (r, p) in ranks.iter().zip(&plans) {
        let what = format!("all_to_all_v {} rank {}", type_name::<T>(), r.rank);
        // Gaps between segments stay zero.
        p.recv.check(&what, |i| {
            (0..world)
                .find(|&j| (p.rd[j]..p.rd[j] + p.rc[j]).contains(&i))
                .map_or(0.0, |j| value(j, r.rank, i - p.rd[j]))
        })?;
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn all_to_all_v_every_type_with_uneven_counts() {
    run(Config::new(), |ranks| each_type!(all_to_all_v_case(ranks)));
}

fn gather_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    for force_p2p in [false, true] {
        for r in ranks.iter() {
            r.comm.force_send_recv_collectives(force_p2p);
        }
        for root in [0, world - 1] {
            let mut pairs: Vec<Pair<T>> = ranks
                .iter()
                .map(|r| {
                    Ok(Pair {
                        send: Guarded::new(r.stream(), N, |i| move_input(r.rank, i))?,
                        recv: Guarded::zeros(r.stream(), world * N)?,
                    })
                })
                .collect::<TestResult<_>>()?;
            let mut views: Vec<_> = pairs
                .iter_mut()
                .map(|p| (p.send.data(), p.recv.data_mut()))
                .collect();
            each_rank!(ranks, views, |on, r, v| on.gather(
                &v.0,
                (r.rank == root).then_some(&mut v.1),
                root
            ))?;
            drop(views);
            for (r, p) in ranks.iter().zip(&pairs) {
                let what = format!(
                    "gather root {root} {} send_recv {force_p2p} rank {}",
                    type_name::<T>(),
                    r.rank
                );
                if r.rank == root {
                    p.recv.check(&what, |i| move_input(i / N, i % N))?;
                } else {
                    p.recv.check(&what, |_| 0.0)?;
                }
            }
            // In place: the root's input already sits in its own block.
            let mut bufs: Vec<Guarded<T>> = ranks
                .iter()
                .map(|r| {
                    if r.rank == root {
                        Guarded::new(r.stream(), world * N, |i| {
                            if i / N == root {
                                move_input(root, i % N)
                            } else {
                                0.0
                            }
                        })
                    } else {
                        Guarded::new(r.stream(), N, |i| move_input(r.rank, i))
                    }
                })
                .collect::<TestResult<_>>()?;
            let mut views: Vec<_> = bufs.iter_mut().map(|b| b.data_mut()).collect();
            each_rank!(ranks, views, |on, r, v| {
                let _ = r;
                on.gather_in_place(v, root)
            })
            .map_err(label::<T>(format!(
                "gather in place root {root} send_recv {force_p2p}"
            )))?;
            drop(views);
            for (r, b) in ranks.iter().zip(&bufs) {
                let what = format!(
                    "gather in place root {root} {} send_recv {force_p2p} rank {}",
                    type_name::<T>(),
                    r.rank
                );
                if r.rank == root {
                    b.check(&what, |i| move_input(i / N, i % N))?;
                } else {
                    b.check(&what, |i| move_input(r.rank, i))?;
                }
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn gather_every_type_root_and_placement_native_and_send_recv() {
    run(Config::new(), |ranks| each_type!(gather_case(ranks)));
}

fn scatter_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    for force_p2p in [false, true] {
        for r in ranks.iter() {
            r.comm.force_send_recv_collectives(force_p2p);
        }
        for root in [0, world - 1] {
            let mut pairs: Vec<Pair<T>> = ranks
                .iter()
                .map(|r| {
                    Ok(Pair {
                        send: Guarded::new(r.stream(), world * N, |i| {
                            move_input(r.rank * 11 + i / N, i % N)
                        })?,
                        recv: Guarded::zeros(r.stream(), N)?,
                    })
                })
                .collect::<TestResult<_>>()?;
            let mut views: Vec<_> = pairs
                .iter_mut()
                .map(|p| (p.send.data(), p.recv.data_mut()))
                .collect();
            each_rank!(ranks, views, |on, r, v| on.scatter(
                (r.rank == root).then_some(&v.0),
                &mut v.1,
                root
            ))?;
            drop(views);
            for (r, p) in ranks.iter().zip(&pairs) {
                let what = format!(
                    "scatter root {root} {} send_recv {force_p2p} rank {}",
                    type_name::<T>(),
                    r.rank
                );
                p.recv.check(&what, |i| move_input(root * 11 + r.rank, i))?;
            }
            // In place: the root keeps its own block where it is.
            let mut bufs: Vec<Guarded<T>> = ranks
                .iter()
                .map(|r| {
                    if r.rank == root {
                        Guarded::new(r.stream(), world * N, |i| {
                            move_input(root * 11 + i / N, i % N)
                        })
                    } else {
                        Guarded::zeros(r.stream(), N)
                    }
                })
                .collect::<TestResult<_>>()?;
            let mut views: Vec<_> = bufs.iter_mut().map(|b| b.data_mut()).collect();
            each_rank!(ranks, views, |on, r, v| {
                let _ = r;
                on.scatter_in_place(v, root)
            })
            .map_err(label::<T>(format!(
                "scatter in place root {root} send_recv {force_p2p}"
            )))?;
            drop(views);
            for (r, b) in ranks.iter().zip(&bufs) {
                let what = format!(
                    "scatter in place root {root} {} send_recv {force_p2p} rank {}",
                    type_name::<T>(),
                    r.rank
                );
                if r.rank == root {
                    b.check(&what, |i| move_input(root * 11 + i / N, i % N))?;
                } else {
                    b.check(&what, |i| move_input(root * 11 + r.rank, i))?;
                }
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn scatter_every_type_root_and_placement_native_and_send_recv() {
    run(Config::new(), |ranks| each_type!(scatter_case(ranks)));
}

fn send_recv_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    let mut pairs: Vec<Pair<T>> = ranks
        .iter()
        .map(|r| {
            Ok(Pair {
                send: Guarded::new(r.stream(), N, |i| move_input(r.rank, i))?,
                recv: Guarded::zeros(r.stream(), N)?,
            })
        })
        .collect::<TestResult<_>>()?;
    // A ring: send to the next rank, receive from the previous one. Both
    // must progress together, so they share a group in every mode.
    let mut views: Vec<_> = pairs
        .iter_mut()
        .map(|p| (p.send.data(), p.recv.data_mut()))
        .collect();
    group(|g| {
        for (r, v) in ranks.iter().zip(views.iter_mut()) {
            let on = g.on(&r.comm);
            on.send(&v.0, (r.rank + 1) % world)?;
            on.recv(&mut v.1, (r.rank + world - 1) % world)?;
        }
        Ok(())
    })?;
    drop(views);
    for (r, p) in ranks.iter().zip(&pairs) {
        p.recv.check(
            &format!("send/recv ring {} rank {}", type_name::<T>(), r.rank),
            |i| move_input((r.rank + world - 1) % world, i),
        )?;
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn send_recv_ring_every_type() {
    run(Config::new(), |ranks| each_type!(send_recv_case(ranks)));
}

/// Splits by `color(rank)` and checks an all-reduce on each child sums
/// exactly the ranks of its color.
fn check_split(ranks: &[Rank], color: impl Fn(usize) -> u32, label: &str) -> TestResult {
    let world = ranks[0].world;
    let colors: Vec<Option<u32>> = ranks.iter().map(|r| Some(color(r.rank))).collect();
    let keys: Vec<i32> = ranks.iter().map(|r| r.rank as i32).collect();
    let comms: Vec<&Comm> = ranks.iter().map(|r| &r.comm).collect();
    let children: Vec<Comm> = if ranks.len() == 1 {
        vec![
            ranks[0]
                .comm
                .split(colors[0], keys[0], None)?
                .ok_or("no child")?,
        ]
    } else {
        Comm::split_all(&comms, &colors, &keys, None)?
            .into_iter()
            .map(|c| c.ok_or("no child"))
            .collect::<Result<_, _>>()?
    };
    let members = |c: u32| (0..world).filter(|r| color(*r) == c).collect::<Vec<_>>();
    let mut bufs = Vec::new();
    for (r, child) in ranks.iter().zip(&children) {
        let same = members(color(r.rank));
        if child.size() != same.len()
            || child.rank() != same.iter().position(|x| *x == r.rank).unwrap_or(usize::MAX)
        {
            return Err(format!(
                "{label}: rank {} got child rank {} of {}",
                r.rank,
                child.rank(),
                child.size()
            )
            .into());
        }
        bufs.push(child.stream().clone_htod(&vec![(r.rank + 1) as i64; 64])?);
    }
    if children.len() == 1 {
        children[0].all_reduce_in_place(&mut bufs[0], ReduceOp::Sum)?;
    } else {
        group(|g| {
            for (child, buf) in children.iter().zip(bufs.iter_mut()) {
                g.on(child).all_reduce_in_place(buf, ReduceOp::Sum)?;
            }
            Ok(())
        })?;
    }
    for (r, buf) in ranks.iter().zip(&bufs) {
        let want: i64 = members(color(r.rank)).iter().map(|m| (m + 1) as i64).sum();
        let got = buf.stream().clone_dtoh(buf)?;
        if got.iter().any(|v| *v != want) {
            return Err(format!(
                "{label}: rank {} child sum {:?}, expected {want}",
                r.rank, got[0]
            )
            .into());
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn split_into_rows_and_columns_and_no_color() {
    run(Config::new(), |ranks| {
        let world = ranks[0].world;
        let half = world.div_ceil(2);
        // On 4 ranks: a 2x2 grid, rows {0,1},{2,3} and columns {0,2},{1,3}.
        check_split(ranks, |r| (r / half) as u32, "rows")?;
        check_split(ranks, |r| (r % half) as u32, "columns")?;
        // No color: no communicator, on every rank.
        let comms: Vec<&Comm> = ranks.iter().map(|r| &r.comm).collect();
        let none = vec![None; ranks.len()];
        let keys = vec![0; ranks.len()];
        let children = if ranks.len() == 1 {
            vec![ranks[0].comm.split(None, 0, None)?]
        } else {
            Comm::split_all(&comms, &none, &keys, None)?
        };
        if children.iter().any(Option::is_some) {
            return Err("NCCL_SPLIT_NOCOLOR gave a communicator".into());
        }
        Ok(())
    });
}

/// A view into memory another buffer owns, to build aliasing cases cudarc's
/// borrow rules would not allow. Only used where validation must refuse
/// the call before NCCL sees it.
struct RawView {
    ptr: u64,
    len: usize,
    device: usize,
}

// SAFETY: only used for calls that validation refuses; nothing reads or
// writes through the pointer.
unsafe impl DeviceBuffer<f32> for RawView {
    fn len(&self) -> usize {
        self.len
    }
    fn device(&self) -> usize {
        self.device
    }
    fn read<'a>(
        &'a self,
        _stream: &'a nccl_safe::cudarc::driver::CudaStream,
    ) -> (u64, nccl_safe::Access<'a>) {
        (self.ptr, nccl_safe::Access::none())
    }
}
// SAFETY: as above.
unsafe impl DeviceBufferMut<f32> for RawView {
    fn write<'a>(
        &'a mut self,
        _stream: &'a nccl_safe::cudarc::driver::CudaStream,
    ) -> (u64, nccl_safe::Access<'a>) {
        (self.ptr, nccl_safe::Access::none())
    }
}

fn expect(label: &str, got: nccl_safe::Result<()>, ok: impl Fn(&Error) -> bool) -> TestResult {
    match got {
        Err(e) if ok(&e) => Ok(()),
        other => Err(format!("{label}: got {other:?}").into()),
    }
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn bad_input_is_refused_with_typed_errors_and_the_comm_still_works() {
    run(Config::new(), |ranks| {
        let world = ranks[0].world;
        for r in ranks.iter() {
            let c = &r.comm;
            let s = r.stream();
            let send = s.alloc_zeros::<f32>(16)?;
            let mut short = s.alloc_zeros::<f32>(8)?;
            expect(
                "short recv",
                c.all_reduce(&send, &mut short, ReduceOp::Sum),
                |e| {
                    matches!(
                        e,
                        Error::Length {
                            role: Role::Recv,
                            needed: 16,
                            given: 8,
                            ..
                        }
                    )
                },
            )?;
            let mut gathered = s.alloc_zeros::<f32>(16 * world - 1)?;
            expect(
                "short all_gather recv",
                c.all_gather(&send, &mut gathered),
                |e| {
                    matches!(
                        e,
                        Error::Length {
                            role: Role::Recv,
                            ..
                        }
                    )
                },
            )?;
            expect(
                "root out of range",
                c.broadcast_in_place(&mut short, world),
                |e| matches!(e, Error::RankOutOfRange { what: "root", .. }),
            )?;
            expect("peer out of range", c.send(&send, world + 3), |e| {
                matches!(e, Error::RankOutOfRange { what: "peer", .. })
            })?;
            expect(
                "reduce without a receive buffer on the root",
                c.reduce::<f32, nccl_safe::cudarc::driver::CudaSlice<f32>>(
                    &send,
                    None,
                    ReduceOp::Sum,
                    r.rank,
                ),
                |e| matches!(e, Error::InvalidArgument { .. }),
            )?;
            // Partial overlap: send is recv shifted by one element.
            let (base, _) = send.read(s);
            let a = RawView {
                ptr: base,
                len: 8,
                device: r.rank,
            };
            let mut b = RawView {
                ptr: base + 4,
                len: 8,
                device: r.rank,
            };
            expect(
                "partial alias",
                c.all_reduce(&a, &mut b, ReduceOp::Sum),
                |e| matches!(e, Error::PartialAlias { .. }),
            )?;
            if world > 1 {
                let other = CudaContext::new((r.rank + 1) % world)?;
                let foreign = other.default_stream().alloc_zeros::<f32>(16)?;
                let mut recv = s.alloc_zeros::<f32>(16)?;
                expect(
                    "buffer on another GPU",
                    c.all_reduce(&foreign, &mut recv, ReduceOp::Sum),
                    |e| {
                        matches!(
                            e,
                            Error::WrongDevice {
                                role: Role::Send,
                                ..
                            }
                        )
                    },
                )?;
                let odd = s.alloc_zeros::<f32>(world * 4 + 1)?;
                let mut out = s.alloc_zeros::<f32>(world * 4 + 1)?;
                expect(
                    "all_to_all length not a multiple of size",
                    c.all_to_all(&odd, &mut out),
                    |e| matches!(e, Error::InvalidArgument { .. }),
                )?;
            }
            // A direct call while a group is open on this thread.
            let g = nccl_safe::GroupGuard::start()?;
            let mut buf = s.alloc_zeros::<f32>(4)?;
            let refused = c.all_reduce_in_place(&mut buf, ReduceOp::Sum);
            g.end()?;
            expect("direct call inside a group", refused, |e| {
                matches!(e, Error::InvalidArgument { .. })
            })?;
            // Count 0 is a no-op, not an error.
            let empty = s.alloc_zeros::<f32>(0)?;
            let mut empty_out = s.alloc_zeros::<f32>(0)?;
            c.all_reduce(&empty, &mut empty_out, ReduceOp::Sum)?;
        }
        if ranks.len() > 1 {
            let p = PreMulSum::host(&ranks[1].comm, 2.0f32)?;
            let mut buf = ranks[0].stream().alloc_zeros::<f32>(4)?;
            expect(
                "PreMulSum of another communicator",
                ranks[0].comm.all_reduce_in_place(&mut buf, &p),
                |e| matches!(e, Error::InvalidArgument { .. }),
            )?;
        }
        // After all that, every communicator still works.
        let mut bufs: Vec<_> = ranks
            .iter()
            .map(|r| r.stream().clone_htod(&vec![1.0f32; 256]))
            .collect::<Result<_, _>>()?;
        each_rank!(ranks, bufs, |on, r, b| {
            let _ = r;
            on.all_reduce_in_place(b, ReduceOp::Sum)
        })?;
        for b in &bufs {
            let got = b.stream().clone_dtoh(b)?;
            if got.iter().any(|v| *v != world as f32) {
                return Err(format!("all_reduce after bad input gave {}", got[0]).into());
            }
        }
        Ok(())
    });
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn communicators_drop_cleanly_in_every_order() {
    let world = world();
    match mode() {
        Mode::Single => {
            let devices: Vec<usize> = (0..world).collect();
            let orders: Vec<Vec<usize>> = vec![
                (0..world).collect(),
                (0..world).rev().collect(),
                (0..world).map(|i| (i + world / 2) % world).collect(),
            ];
            for order in orders {
                let comms = Comm::init_all(&devices, &Config::new()).expect("init_all");
                let refs: Vec<&Comm> = comms.iter().collect();
                let colors = vec![Some(0); world];
                let keys: Vec<i32> = (0..world as i32).collect();
                // Children dropped after, and before, their parents.
                let children = Comm::split_all(&refs, &colors, &keys, None).expect("split");
                let mut slots: Vec<Option<Comm>> = comms.into_iter().map(Some).collect();
                for &i in &order {
                    drop(slots[i].take());
                }
                let mut children: Vec<Option<Comm>> = children;
                for &i in order.iter().rev() {
                    drop(children[i].take());
                }
            }
        }
        Mode::Threads => {
            for child_first in [true, false] {
                let id = nccl_safe::UniqueId::new().expect("id");
                std::thread::scope(|s| {
                    let handles: Vec<_> = (0..world)
                        .map(|rank| {
                            s.spawn(move || -> TestResult {
                                let parent =
                                    Comm::init_rank(&id, rank, world, rank, &Config::new())?;
                                let child = parent
                                    .split(Some(0), rank as i32, None)?
                                    .ok_or("no child")?;
                                if child_first {
                                    drop(child);
                                    drop(parent);
                                } else {
                                    drop(parent);
                                    drop(child);
                                }
                                Ok(())
                            })
                        })
                        .collect();
                    for (rank, h) in handles.into_iter().enumerate() {
                        match h.join() {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => panic!("rank {rank}: {e}"),
                            Err(_) => panic!("rank {rank} panicked"),
                        }
                    }
                });
            }
        }
        Mode::Processes => {
            // One child dropped before its parent, one after.
            let late = std::sync::Mutex::new(None);
            run(Config::new(), |ranks| {
                let r = &ranks[0];
                let child = r
                    .comm
                    .split(Some(0), r.rank as i32, None)?
                    .ok_or("no child")?;
                drop(child);
                let outliving = r
                    .comm
                    .split(Some(0), r.rank as i32, None)?
                    .ok_or("no child")?;
                *late.lock().map_err(|_| "poisoned")? = Some(outliving);
                Ok(())
            });
            drop(late);
        }
    }
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn graph_capture_replays_collectives() {
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

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn group_simulate_estimates_without_launching() {
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

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn nccl_memory_and_registered_buffers_reduce_correctly() {
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
            let b = reg.into_inner();
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

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn nonblocking_communicators_work_and_abort_from_another_thread() {
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

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn library_and_devices_report_themselves() {
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

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn collectives_run_on_a_stream_the_caller_chooses() {
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
fn fill(
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

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn symmetric_windows_register_reduce_and_deregister() {
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

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn shrink_drops_the_last_rank_and_the_rest_still_reduce() {
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
            if children.len() == 1 {
                children[0].all_reduce_in_place(&mut bufs[0], ReduceOp::Sum)?;
            } else {
                group(|g| {
                    for (c, b) in children.iter().zip(bufs.iter_mut()) {
                        g.on(c).all_reduce_in_place(b, ReduceOp::Sum)?;
                    }
                    Ok(())
                })?;
            }
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
