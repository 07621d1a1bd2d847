//! Placement: where each rank goes. The probe of a machine's GPUs and
//! their links ([`Topology`]) and the rank order
//! built on it, which [`DeviceMesh`](crate::DeviceMesh) uses under
//! [`Placement::NvlinkIslands`] and [`World::nvlink_order`](crate::World::nvlink_order)
//! hands out.

mod order;
mod topology;

pub use order::{device_order, positions_on_host};
pub(crate) use order::{nvlink_order, nvlink_ranks, ranks_on_one_host};
pub use topology::{Gpu, Island, Link, NvmlStatus, PcieLevel, Topology};

/// How world ranks are placed on the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// Mesh position i is world rank i.
    #[default]
    RankOrder,
    /// Ranks are ordered by machine (in order of their lowest rank), and
    /// on each machine by [`device_order`], so consecutive positions (the
    /// innermost axis) share an NVLink island and sit on its strongest
    /// links. Each machine probes its own GPUs; a machine whose processes
    /// cannot see all of its GPUs keeps rank order there.
    NvlinkIslands,
}
