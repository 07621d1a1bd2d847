//! Rank order: which world rank sits at each mesh position so that
//! neighbours share an NVLink island, from the probed topology of each
//! machine.

use nccl_safe::Comm;
use nccl_safe::cudarc::driver::CudaContext;

use crate::error::{Error, Result, cuda};
use crate::host::HostCollectives;
use crate::placement::topology::Topology;

/// The GPUs of `topology` in placement order: islands largest first (ties:
/// smallest ordinal first), each in its [`Topology::ring_order`].
pub fn device_order(topology: &Topology) -> Vec<usize> {
    let mut islands = topology.islands();
    islands.sort_by_key(|i| {
        (
            std::cmp::Reverse(i.devices.len()),
            i.devices.first().copied(),
        )
    });
    islands
        .iter()
        .flat_map(|i| topology.ring_order(i))
        .collect()
}

/// For ranks on one machine using `devices` (in rank order), each rank's
/// index on that machine when placed by `order`; devices missing from
/// `order` come last, in rank order.
pub fn positions_on_host(order: &[usize], devices: &[usize]) -> Vec<usize> {
    let mut by_place: Vec<usize> = (0..devices.len()).collect();
    by_place.sort_by_key(|&i| {
        (
            order
                .iter()
                .position(|&d| d == devices[i])
                .unwrap_or(usize::MAX),
            i,
        )
    });
    let mut out = vec![0; devices.len()];
    for (place, &i) in by_place.iter().enumerate() {
        out[i] = place;
    }
    out
}

/// An identifier of this machine: the hash of its host name and boot id,
/// or of `NCCL_HOSTID` when set, so that the ranks NCCL takes for one
/// host are the ones placement takes for one host (`NCCL_HOSTID` is how
/// NCCL's own host hash is overridden: containers, emulated hosts).
fn host_id() -> u64 {
    let text = match std::env::var("NCCL_HOSTID") {
        Ok(id) if !id.is_empty() => format!("NCCL_HOSTID={id}"),
        _ => {
            let mut text = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            text.push_str(
                &std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
            );
            text
        }
    };
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The placement order on one machine: `devices[i]` is rank i's GPU.
///
/// The device order is probed once per process and kept: threads of one
/// process (a thread per GPU) must all see the same order, and NVML queried
/// from several threads at once can answer differently.
fn host_order(devices: &[usize]) -> Vec<usize> {
    static ORDERS: std::sync::Mutex<Vec<(Vec<usize>, Vec<usize>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut seen: Vec<usize> = devices.to_vec();
    seen.sort_unstable();
    seen.dedup();
    let mut cache = ORDERS.lock().unwrap_or_else(|p| p.into_inner());
    let order = match cache.iter().find(|(key, _)| *key == seen) {
        Some((_, order)) => order.clone(),
        None => {
            let order = match Topology::probe(&seen) {
                Ok(topology) => device_order(&topology),
                Err(error) => {
                    tracing::warn!(%error, "topology probe failed; keeping rank order");
                    seen.clone()
                }
            };
            cache.push((seen, order.clone()));
            order
        }
    };
    positions_on_host(&order, devices)
}

/// Which world rank sits at each mesh position, agreed by every rank
/// through two small all-gathers on the world communicator.
pub(crate) fn nvlink_ranks(comm: &Comm) -> Result<Vec<usize>> {
    let me = comm.rank();
    let info = comm.all_gather_host(&[host_id(), comm.device() as u64])?;
    let (hosts, devices): (Vec<u64>, Vec<usize>) =
        info.chunks(2).map(|c| (c[0], c[1] as usize)).unzip();
    let mut host_list: Vec<u64> = Vec::new();
    for h in &hosts {
        if !host_list.contains(h) {
            host_list.push(*h);
        }
    }
    let mine = hosts[me];
    let offset: usize = host_list
        .iter()
        .take_while(|&&h| h != mine)
        .map(|h| hosts.iter().filter(|x| *x == h).count())
        .sum();
    let local: Vec<usize> = (0..hosts.len()).filter(|&r| hosts[r] == mine).collect();
    let local_devices: Vec<usize> = local.iter().map(|&r| devices[r]).collect();
    let places = host_order(&local_devices);
    let index = local.iter().position(|&r| r == me).unwrap_or(0);
    let position = offset + places[index];
    let positions = comm.all_gather_host(&[position as u64])?;
    ranks_from_positions(&positions)
}

/// Which rank sits at each mesh position when every rank is a thread of
/// this process, `devices[i]` being rank i's GPU.
pub(crate) fn ranks_on_one_host(devices: &[usize]) -> Result<Vec<usize>> {
    let places = host_order(devices);
    ranks_from_positions(&places.iter().map(|&p| p as u64).collect::<Vec<_>>())
}

/// Inverts rank → position into position → rank, checking that it is a
/// permutation.
fn ranks_from_positions(positions: &[u64]) -> Result<Vec<usize>> {
    let n = positions.len();
    let mut ranks = vec![usize::MAX; n];
    for (rank, &p) in positions.iter().enumerate() {
        let p = p as usize;
        if p >= n || ranks[p] != usize::MAX {
            return Err(Error::InvalidArgument {
                op: "DeviceMesh placement",
                reason: format!("ranks disagree on the placement: positions {positions:?}"),
            });
        }
        ranks[p] = rank;
    }
    Ok(ranks)
}

/// The first `n` GPUs of this machine in [`device_order`]; see
/// [`crate::World::nvlink_order`].
pub(crate) fn nvlink_order(n: usize) -> Result<Vec<usize>> {
    nccl_safe::require_cuda_driver()?;
    let count = CudaContext::device_count().map_err(cuda("nvlink_order"))?;
    let all: Vec<usize> = (0..count as usize).collect();
    let topology = Topology::probe(&all)?;
    let order = device_order(&topology);
    if order.len() < n {
        return Err(Error::InvalidArgument {
            op: "World::nvlink_order",
            reason: format!("{n} GPUs asked for, this machine has {}", order.len()),
        });
    }
    Ok(order[..n].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::MeshShape;
    use crate::placement::topology::{Gpu, Link, NvmlStatus};

    fn two_islands() -> Topology {
        // GPUs 0 and 2 share NVLink, 1 and 3 share NVLink; PCIe between.
        let gpus: Vec<Gpu> = (0..4)
            .map(|i| Gpu {
                ordinal: i,
                pci_bus_id: format!("0000:{i:02x}:00.0"),
            })
            .collect();
        let links = (0..4)
            .map(|a| {
                (0..4)
                    .map(|b| Link {
                        peer_access: a != b,
                        performance_rank: Some(0),
                        native_atomics: false,
                        nvlinks: Some(if a != b && a % 2 == b % 2 { 4 } else { 0 }),
                        pcie: None,
                    })
                    .collect()
            })
            .collect();
        Topology::from_links(gpus, links, NvmlStatus::Available).expect("topology")
    }

    #[test]
    fn device_order_keeps_islands_together() {
        assert_eq!(device_order(&two_islands()), vec![0, 2, 1, 3]);
    }

    #[test]
    fn ranks_are_placed_by_device_order() {
        // Rank i on GPU i: positions follow [0, 2, 1, 3].
        assert_eq!(
            positions_on_host(&[0, 2, 1, 3], &[0, 1, 2, 3]),
            vec![0, 2, 1, 3]
        );
        // A device outside the order goes last.
        assert_eq!(positions_on_host(&[1, 0], &[5, 0, 1]), vec![2, 1, 0]);
        let ranks = ranks_from_positions(&[0, 2, 1, 3]).expect("permutation");
        assert_eq!(ranks, vec![0, 2, 1, 3]);
        assert!(ranks_from_positions(&[0, 0]).is_err());
        assert!(ranks_from_positions(&[0, 5]).is_err());
    }

    #[test]
    fn a_2x2_mesh_on_two_islands_keeps_tp_on_nvlink() {
        let topology = two_islands();
        let places = positions_on_host(&device_order(&topology), &[0, 1, 2, 3]);
        let ranks = ranks_from_positions(&places.iter().map(|&p| p as u64).collect::<Vec<_>>())
            .expect("permutation");
        let shape = MeshShape::new(&[("dp", 2), ("tp", 2)], 4).expect("shape");
        for p in 0..4 {
            let members = shape.group_members(p, &["tp"]).expect("members");
            let devices: Vec<usize> = members.iter().map(|&m| ranks[m]).collect();
            // Rank r uses GPU r, so the tp pair must share an island.
            assert_eq!(devices[0] % 2, devices[1] % 2, "tp group {devices:?}");
        }
    }
}
