//! Communicators: split, refusal of bad input with typed errors, and
//! dropping in every order.

use super::*;

/// Splits by `color(rank)` and checks an all-reduce on each child sums
/// exactly the ranks of its color.
pub fn check_split(ranks: &[Rank], color: impl Fn(usize) -> u32, label: &str) -> TestResult {
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
    all_reduce_sum_each(&children.iter().collect::<Vec<_>>(), &mut bufs)?;
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

pub fn split_into_rows_and_columns_and_no_color() {
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
fn raw_view(ptr: u64, len: usize, device: usize) -> nccl_safe::RawBuffer<f32> {
    // SAFETY: only used for calls that validation refuses; nothing reads or
    // writes through the pointer.
    unsafe { nccl_safe::RawBuffer::from_raw_parts(ptr, len, device) }
}

pub fn bad_input_is_refused_with_typed_errors_and_the_comm_still_works() {
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
            let a = raw_view(base, 8, r.rank);
            let mut b = raw_view(base + 4, 8, r.rank);
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

pub fn communicators_drop_cleanly_in_every_order() {
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
