//! A communicator per rank, made in the launch mode asked for, and a
//! test body run over the ranks this thread drives.

use std::sync::Arc;

use nccl_safe::cudarc::driver::{CudaSlice, CudaStream};
use nccl_safe::{Comm, Config, NcclType, ReduceOp, UniqueId};

use crate::TestResult;
use crate::env::{Mode, env_number, exchange_id, mode, world};

/// One rank as a test body sees it.
pub struct Rank {
    /// This rank's communicator.
    pub comm: Comm,
    /// Its rank in the world.
    pub rank: usize,
    /// The world size.
    pub world: usize,
}

impl Rank {
    /// The communicator's own stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.comm.stream()
    }
}

/// Runs `body` over every rank: in `Single` mode once, with all ranks; in
/// `Threads` mode once per thread, with that thread's rank alone. A body
/// therefore loops over the ranks it is given and never assumes it has
/// them all.
pub fn run(config: Config, body: impl Fn(&mut [Rank]) -> TestResult + Sync) {
    let world = world();
    match mode() {
        Mode::Single => {
            let devices: Vec<usize> = (0..world).collect();
            let comms = Comm::init_all(&devices, &config).expect("init_all");
            let mut ranks: Vec<Rank> = comms
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| Rank { comm, rank, world })
                .collect();
            for r in &ranks {
                assert_eq!(
                    (r.comm.rank(), r.comm.size(), r.comm.device()),
                    (r.rank, world, r.rank)
                );
            }
            if let Err(e) = body(&mut ranks) {
                panic!("single-thread mode, world {world}: {e}");
            }
        }
        Mode::Threads => {
            let id = UniqueId::new().expect("unique id");
            let errors: Vec<String> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..world)
                    .map(|rank| {
                        let (body, config) = (&body, config.clone());
                        s.spawn(move || -> TestResult {
                            let comm = Comm::init_rank(&id, rank, world, rank, &config)?;
                            assert_eq!(
                                (comm.rank(), comm.size(), comm.device()),
                                (rank, world, rank)
                            );
                            let mut ranks = [Rank { comm, rank, world }];
                            body(&mut ranks)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .enumerate()
                    .filter_map(|(rank, h)| match h.join() {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(format!("rank {rank}: {e}")),
                        Err(_) => Some(format!("rank {rank}: panicked")),
                    })
                    .collect()
            });
            if !errors.is_empty() {
                panic!("thread-per-rank mode, world {world}: {}", errors.join("; "));
            }
        }
        Mode::Processes => {
            let rank = env_number("RANK");
            assert_eq!(env_number("WORLD_SIZE"), world, "WORLD_SIZE");
            let device = env_number("LOCAL_RANK");
            let id = exchange_id(rank);
            let comm = Comm::init_rank(&id, rank, world, device, &config).expect("init_rank");
            assert_eq!(
                (comm.rank(), comm.size(), comm.device()),
                (rank, world, rank)
            );
            let mut ranks = [Rank { comm, rank, world }];
            if let Err(e) = body(&mut ranks) {
                panic!("process-per-rank mode, world {world}, rank {rank}: {e}");
            }
        }
    }
}

/// An in-place sum of each buffer over its communicator: in one group
/// when there are several (one thread driving them all), directly when
/// there is one. `comms` and `bufs` pair up in order.
pub fn all_reduce_sum_each<T: NcclType>(
    comms: &[&Comm],
    bufs: &mut [CudaSlice<T>],
) -> nccl_safe::Result<()> {
    if let ([comm], [buf]) = (comms, &mut *bufs) {
        return comm.all_reduce_in_place(buf, ReduceOp::Sum);
    }
    nccl_safe::group(|g| {
        for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
            g.on(comm).all_reduce_in_place(buf, ReduceOp::Sum)?;
        }
        Ok(())
    })
}

/// Runs the same step on every rank given: in a group when there are
/// several (one thread driving them all), directly when there is one.
#[macro_export]
macro_rules! each_rank {
    ($ranks:expr, $states:expr, |$on:ident, $r:ident, $st:ident| $body:expr) => {{
        let ranks: &[$crate::Rank] = &*$ranks;
        if ranks.len() == 1 {
            let $r = &ranks[0];
            let $st = &mut $states[0];
            let $on = $r.comm.on($r.comm.stream());
            $body
        } else {
            $crate::nccl_safe::group(|g| {
                for ($r, $st) in ranks.iter().zip($states.iter_mut()) {
                    let $on = g.on(&$r.comm);
                    $body?;
                }
                Ok(())
            })
        }
    }};
}
