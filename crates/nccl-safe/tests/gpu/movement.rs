//! Data movement: broadcast, all_gather, all_to_all(v), gather, scatter
//! and send/recv, every type.

use super::*;

pub fn broadcast_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    for root in [0, world - 1] {
        for in_place in [false, true] {
            let mut pairs: Vec<Pair<T>> = pairs(ranks, N, N, move_input)?;
            let mut views: Vec<_> = pairs.iter_mut().map(Pair::both_mut).collect();
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

pub fn broadcast_every_type_and_root() {
    run(Config::new(), |ranks| each_type!(broadcast_case(ranks)));
}

pub fn all_gather_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
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
        let mut views: Vec<_> = pairs.iter_mut().map(Pair::both_mut).collect();
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

pub fn all_gather_every_type_in_and_out_of_place() {
    run(Config::new(), |ranks| each_type!(all_gather_case(ranks)));
}

pub fn all_to_all_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    // Element i of block j on rank r is what r sends to j.
    let sent = |r: usize, j: usize, i: usize| move_input(r + j * 3, i);
    for force_p2p in [false, true] {
        for r in ranks.iter() {
            r.comm.force_send_recv_collectives(force_p2p);
        }
        let mut pairs: Vec<Pair<T>> = pairs(ranks, world * N, world * N, |rank, i| {
            sent(rank, i / N, i % N)
        })?;
        let mut views: Vec<_> = pairs.iter_mut().map(Pair::in_out).collect();
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

pub fn all_to_all_every_type_native_and_send_recv() {
    run(Config::new(), |ranks| each_type!(all_to_all_case(ranks)));
}

pub fn all_to_all_v_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
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

pub fn all_to_all_v_every_type_with_uneven_counts() {
    run(Config::new(), |ranks| each_type!(all_to_all_v_case(ranks)));
}

pub fn gather_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    for force_p2p in [false, true] {
        for r in ranks.iter() {
            r.comm.force_send_recv_collectives(force_p2p);
        }
        for root in [0, world - 1] {
            let mut pairs: Vec<Pair<T>> = pairs(ranks, N, world * N, move_input)?;
            let mut views: Vec<_> = pairs.iter_mut().map(Pair::in_out).collect();
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

pub fn gather_every_type_root_and_placement_native_and_send_recv() {
    run(Config::new(), |ranks| each_type!(gather_case(ranks)));
}

pub fn scatter_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    for force_p2p in [false, true] {
        for r in ranks.iter() {
            r.comm.force_send_recv_collectives(force_p2p);
        }
        for root in [0, world - 1] {
            let mut pairs: Vec<Pair<T>> = pairs(ranks, world * N, N, |rank, i| {
                move_input(rank * 11 + i / N, i % N)
            })?;
            let mut views: Vec<_> = pairs.iter_mut().map(Pair::in_out).collect();
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

pub fn scatter_every_type_root_and_placement_native_and_send_recv() {
    run(Config::new(), |ranks| each_type!(scatter_case(ranks)));
}

pub fn send_recv_case<T: TestType>(ranks: &mut [Rank]) -> TestResult {
    let world = ranks[0].world;
    let mut pairs: Vec<Pair<T>> = pairs(ranks, N, N, move_input)?;
    // A ring: send to the next rank, receive from the previous one. Both
    // must progress together, so they share a group in every mode.
    let mut views: Vec<_> = pairs.iter_mut().map(Pair::in_out).collect();
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

pub fn send_recv_ring_every_type() {
    run(Config::new(), |ranks| each_type!(send_recv_case(ranks)));
}
