//! Reductions: all_reduce, reduce and reduce_scatter, every type and
//! operator, in and out of place.

use super::*;

pub fn all_reduce_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
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
        let mut pairs: Vec<Pair<T>> = pairs(ranks, N, N, reduce_input)?;
        let mut views: Vec<_> = pairs.iter_mut().map(Pair::in_out).collect();
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

pub fn all_reduce_every_type_and_op_in_and_out_of_place() {
    run(Config::new(), |ranks| each_type!(all_reduce_case(ranks)));
}

pub fn reduce_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
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
                let mut pairs: Vec<Pair<T>> = pairs(ranks, N, N, reduce_input)?;
                let mut views: Vec<_> = pairs.iter_mut().map(Pair::both_mut).collect();
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

pub fn reduce_every_type_op_and_root() {
    run(Config::new(), |ranks| each_type!(reduce_case(ranks)));
}

pub fn reduce_scatter_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
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
            let mut pairs: Vec<Pair<T>> = pairs(ranks, world * N, N, reduce_input)?;
            let mut views: Vec<_> = pairs.iter_mut().map(Pair::both_mut).collect();
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

pub fn reduce_scatter_every_type_and_op_in_and_out_of_place() {
    run(Config::new(), |ranks| {
        each_type!(reduce_scatter_case(ranks))
    });
}
