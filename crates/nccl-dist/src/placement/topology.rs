//! Which GPUs reach which, and how: the peer-access matrix from the CUDA
//! driver, NVLink counts and the PCIe relationship from NVML when it is
//! there, NVLink islands. Copies between peers are nccl-safe's
//! ([`nccl_safe::copy_peer`]).
//!
//! ```no_run
//! use nccl_dist::placement::Topology;
//!
//! let topo = Topology::probe(&[0, 1, 2, 3])?;
//! print!("{}", topo.render());
//! for island in topo.islands() {
//!     println!("{island}; ring order {:?}", topo.ring_order(&island));
//! }
//! # Ok::<(), nccl_safe::Error>(())
//! ```

use std::fmt;
use std::sync::Arc;

use nccl_safe::cudarc;
use nccl_safe::cudarc::driver::{CudaContext, sys};

use nccl_safe::{Error, Result};

/// How two GPUs hang off the PCIe tree (NVML's common-ancestor levels, in
/// `nvidia-smi topo -m` terms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PcieLevel {
    /// The same board (multi-GPU cards).
    Board,
    /// One PCIe switch apart (`PIX`).
    SingleSwitch,
    /// Several PCIe switches, no host bridge (`PXB`).
    MultipleSwitches,
    /// The same host bridge (`PHB`).
    HostBridge,
    /// The same NUMA node, across host bridges (`NODE`).
    Numa,
    /// Across NUMA nodes (`SYS`).
    System,
}

impl PcieLevel {
    /// The `nvidia-smi topo -m` abbreviation.
    pub fn abbreviation(self) -> &'static str {
        match self {
            PcieLevel::Board => "BRD",
            PcieLevel::SingleSwitch => "PIX",
            PcieLevel::MultipleSwitches => "PXB",
            PcieLevel::HostBridge => "PHB",
            PcieLevel::Numa => "NODE",
            PcieLevel::System => "SYS",
        }
    }
}

/// What one GPU sees of another (an ordered pair).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Link {
    /// `cuDeviceCanAccessPeer`.
    pub peer_access: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`: lower is better.
    pub performance_rank: Option<i32>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: bool,
    /// NVLinks between the two, from NVML; `None` without NVML.
    pub nvlinks: Option<u32>,
    /// PCIe relationship, from NVML; `None` without NVML.
    pub pcie: Option<PcieLevel>,
}

/// One GPU of a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// CUDA device ordinal.
    pub ordinal: usize,
    /// PCI address as `domain:bus:device.0`.
    pub pci_bus_id: String,
}

/// Whether NVML answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlStatus {
    /// NVML was loaded and queried.
    Available,
    /// NVML could not be used; NVLink and PCIe fields are `None`.
    Missing(String),
}

/// A set of GPUs joined by NVLink (or, without NVLink, by peer access).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Island {
    /// CUDA ordinals, ascending.
    pub devices: Vec<usize>,
    /// Whether the island's edges are NVLinks (else peer access).
    pub nvlink: bool,
}

impl fmt::Display for Island {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.devices.iter().map(|d| format!("GPU{d}")).collect();
        write!(
            f,
            "{} ({})",
            names.join(", "),
            if self.nvlink { "NVLink" } else { "peer access" }
        )
    }
}

/// The peer-to-peer picture of a set of GPUs.
#[derive(Debug, Clone)]
pub struct Topology {
    gpus: Vec<Gpu>,
    links: Vec<Vec<Link>>,
    nvml: NvmlStatus,
}

fn cuda(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |source| Error::Cuda { op, source }
}

impl Topology {
    /// Builds a topology from known facts (tests, or a cached probe).
    /// `links[i][j]` is what `gpus[i]` sees of `gpus[j]`.
    pub fn from_links(gpus: Vec<Gpu>, links: Vec<Vec<Link>>, nvml: NvmlStatus) -> Result<Topology> {
        if links.len() != gpus.len() || links.iter().any(|row| row.len() != gpus.len()) {
            return Err(Error::InvalidArgument {
                op: "Topology::from_links",
                reason: "links must be an n x n matrix for n GPUs",
            });
        }
        Ok(Topology { gpus, links, nvml })
    }

    /// Asks the CUDA driver (and NVML, where it loads) about every ordered
    /// pair of `devices`.
    pub fn probe(devices: &[usize]) -> Result<Topology> {
        nccl_safe::require_cuda_driver()?;
        let _span = tracing::debug_span!("nccl.topology_probe", devices = devices.len()).entered();
        // Device handles and attributes only: no context is created here, so
        // a process per GPU can probe every GPU without holding memory on
        // each (contexts are made when peer access is enabled).
        cudarc::driver::result::init().map_err(cuda("cuInit"))?;
        let mut handles = Vec::with_capacity(devices.len());
        let mut gpus = Vec::with_capacity(devices.len());
        for &d in devices {
            let ordinal = i32::try_from(d).map_err(|_| Error::InvalidArgument {
                op: "Topology::probe",
                reason: "device ordinal exceeds i32",
            })?;
            let dev = cudarc::driver::result::device::get(ordinal).map_err(cuda("cuDeviceGet"))?;
            let attr = |a| {
                // SAFETY: a valid device handle.
                unsafe { cudarc::driver::result::device::get_attribute(dev, a) }
                    .map_err(cuda("cuDeviceGetAttribute"))
            };
            let domain = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
            let bus = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
            let device = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
            gpus.push(Gpu {
                ordinal: d,
                pci_bus_id: format!("{domain:08x}:{bus:02x}:{device:02x}.0"),
            });
            handles.push(dev);
        }
        let n = devices.len();
        let mut links = vec![vec![Link::default(); n]; n];
        for i in 0..n {
            for j in 0..n {
                if i == j {
                    continue;
                }
                let (a, b) = (handles[i], handles[j]);
                let mut can = 0;
                // SAFETY: two valid device handles and an out-int.
                unsafe { sys::cuDeviceCanAccessPeer(&mut can, a, b) }
                    .result()
                    .map_err(cuda("cuDeviceCanAccessPeer"))?;
                let p2p = |attr| -> Result<i32> {
                    let mut value = 0;
                    // SAFETY: two valid device handles and an out-int.
                    unsafe { sys::cuDeviceGetP2PAttribute(&mut value, attr, a, b) }
                        .result()
                        .map_err(cuda("cuDeviceGetP2PAttribute"))?;
                    Ok(value)
                };
                links[i][j].peer_access = can != 0;
                links[i][j].performance_rank = Some(p2p(
                    sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
                )?);
                links[i][j].native_atomics = p2p(
                    sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                )? != 0;
            }
        }
        let nvml = match nvml_links(&gpus, &mut links) {
            Ok(()) => NvmlStatus::Available,
            Err(reason) => NvmlStatus::Missing(reason),
        };
        Ok(Topology { gpus, links, nvml })
    }

    /// The GPUs, in the order given.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// What GPU `from` sees of GPU `to` (indices into [`Topology::gpus`]).
    pub fn link(&self, from: usize, to: usize) -> Option<&Link> {
        self.links.get(from)?.get(to)
    }

    /// Whether NVML answered.
    pub fn nvml(&self) -> &NvmlStatus {
        &self.nvml
    }

    fn index_of(&self, ordinal: usize) -> Option<usize> {
        self.gpus.iter().position(|g| g.ordinal == ordinal)
    }

    /// Whether any pair has an NVLink.
    pub fn has_nvlink(&self) -> bool {
        self.links
            .iter()
            .flatten()
            .any(|l| l.nvlinks.unwrap_or(0) > 0)
    }

    /// Edge weight between indices `i` and `j` for islands and rings:
    /// NVLinks when the topology has any, else 1 for peer access.
    fn weight(&self, i: usize, j: usize) -> u32 {
        let (a, b) = (&self.links[i][j], &self.links[j][i]);
        if self.has_nvlink() {
            a.nvlinks.unwrap_or(0).max(b.nvlinks.unwrap_or(0))
        } else {
            u32::from(a.peer_access || b.peer_access)
        }
    }

    /// Connected components of NVLink edges (of peer-access edges when no
    /// pair has NVLink), each listing CUDA ordinals ascending; islands are
    /// ordered by their smallest ordinal.
    pub fn islands(&self) -> Vec<Island> {
        let n = self.gpus.len();
        let nvlink = self.has_nvlink();
        let mut seen = vec![false; n];
        let mut out = Vec::new();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| self.gpus[i].ordinal);
        for &start in &order {
            if seen[start] {
                continue;
            }
            let mut stack = vec![start];
            seen[start] = true;
            let mut members = Vec::new();
            while let Some(i) = stack.pop() {
                members.push(self.gpus[i].ordinal);
                for (j, visited) in seen.iter_mut().enumerate() {
                    if !*visited && self.weight(i, j) > 0 {
                        *visited = true;
                        stack.push(j);
                    }
                }
            }
            members.sort_unstable();
            out.push(Island {
                devices: members,
                nvlink,
            });
        }
        out
    }

    /// A device order for a ring over `island`: from its smallest ordinal,
    /// always to the unvisited neighbour with the most links (ties: the
    /// smaller ordinal), so consecutive ranks sit on the strongest edges.
    pub fn ring_order(&self, island: &Island) -> Vec<usize> {
        let mut left: Vec<usize> = island
            .devices
            .iter()
            .filter_map(|d| self.index_of(*d))
            .collect();
        left.sort_by_key(|&i| self.gpus[i].ordinal);
        let mut order = Vec::with_capacity(left.len());
        if left.is_empty() {
            return order;
        }
        let mut current = left.remove(0);
        order.push(self.gpus[current].ordinal);
        while !left.is_empty() {
            let best = left
                .iter()
                .enumerate()
                .max_by_key(|(_, j)| {
                    (
                        self.weight(current, **j),
                        std::cmp::Reverse(self.gpus[**j].ordinal),
                    )
                })
                .map_or(0, |(pos, _)| pos);
            current = left.remove(best);
            order.push(self.gpus[current].ordinal);
        }
        order
    }

    /// The matrix in the style of `nvidia-smi topo -m`: `NV<n>` for n
    /// NVLinks, else the PCIe level, else `P2P`/`-` for peer access only;
    /// then the peer-access matrix with performance ranks and atomics.
    pub fn render(&self) -> String {
        let mut out = self.grid(|l| {
            if let Some(k) = l.nvlinks.filter(|k| *k > 0) {
                format!("NV{k}")
            } else if let Some(level) = l.pcie {
                level.abbreviation().to_string()
            } else if l.peer_access {
                "P2P".to_string()
            } else {
                "-".to_string()
            }
        });
        out.push_str("\npeer access (performance rank, A = native atomics):\n");
        out.push_str(&self.grid(|l| {
            if !l.peer_access {
                return "no".to_string();
            }
            let rank = l
                .performance_rank
                .map_or("?".to_string(), |r| r.to_string());
            format!("yes/{rank}{}", if l.native_atomics { " A" } else { "" })
        }));
        if let NvmlStatus::Missing(reason) = &self.nvml {
            out.push_str(&format!(
                "\nNVML unavailable ({reason}): no NVLink or PCIe details\n"
            ));
        }
        out
    }

    /// A GPU-by-GPU table: a header of GPU names, then a row per GPU with
    /// `cell(link)` for every other GPU and `X` on the diagonal.
    fn grid(&self, cell: impl Fn(&Link) -> String) -> String {
        let name = |g: &Gpu| format!("GPU{}", g.ordinal);
        let mut out = format!("{:8}", "");
        for g in &self.gpus {
            out.push_str(&format!("{:>8}", name(g)));
        }
        out.push('\n');
        for (i, row) in self.links.iter().enumerate() {
            out.push_str(&format!("{:8}", name(&self.gpus[i])));
            for (j, l) in row.iter().enumerate() {
                let text = if i == j { "X".to_string() } else { cell(l) };
                out.push_str(&format!("{text:>8}"));
            }
            out.push('\n');
        }
        out
    }

    /// The primary context of a probed device (retained here, on first
    /// use).
    fn context(&self, ordinal: usize) -> Result<Arc<CudaContext>> {
        if self.index_of(ordinal).is_none() {
            return Err(Error::InvalidArgument {
                op: "Topology",
                reason: "device not in this probed topology",
            });
        }
        // A topology built with `from_links` may reach here first.
        nccl_safe::require_cuda_driver()?;
        CudaContext::new(ordinal).map_err(cuda("CudaContext::new"))
    }

    /// Lets `from` access `to`'s memory (`cuCtxEnablePeerAccess`). Enabling
    /// an already enabled pair is success.
    pub fn enable_peer_access(&self, from: usize, to: usize) -> Result<()> {
        const OP: &str = "cuCtxEnablePeerAccess";
        if from == to {
            return Ok(());
        }
        let (a, b) = (self.context(from)?, self.context(to)?);
        let (i, j) = (self.index_of(from), self.index_of(to));
        if let (Some(i), Some(j)) = (i, j)
            && !self.links[i][j].peer_access
        {
            return Err(Error::Unsupported {
                what: "peer access",
                requires: format!("GPU{from} able to access GPU{to}"),
                found: "cuDeviceCanAccessPeer = 0".to_string(),
            });
        }
        a.bind_to_thread().map_err(cuda(OP))?;
        // SAFETY: `b` is a live primary context; the current context is `a`.
        let code = unsafe { sys::cuCtxEnablePeerAccess(b.cu_ctx(), 0) };
        match code {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            other => other.result().map_err(cuda(OP)),
        }
    }
}

/// `NVML_NVLINK_MAX_LINKS` of NVML's header: links per GPU NVML reports.
const NVLINK_MAX_LINKS: u32 = 18;

/// Fills NVLink counts and PCIe levels from NVML; the reason it could not.
fn nvml_links(gpus: &[Gpu], links: &mut [Vec<Link>]) -> std::result::Result<(), String> {
    use nvml_wrapper::Nvml;
    use nvml_wrapper::enum_wrappers::device::TopologyLevel;

    let nvml = Nvml::init().map_err(|e| format!("NVML did not load: {e}"))?;
    let count = nvml.device_count().map_err(|e| e.to_string())?;
    // NVML numbers devices its own way; match them to CUDA by PCI address.
    let mut by_gpu = Vec::with_capacity(gpus.len());
    let mut indices = Vec::with_capacity(gpus.len());
    for gpu in gpus {
        let mut found = None;
        for k in 0..count {
            let dev = nvml.device_by_index(k).map_err(|e| e.to_string())?;
            let pci = dev.pci_info().map_err(|e| e.to_string())?;
            let id = format!("{:08x}:{:02x}:{:02x}.0", pci.domain, pci.bus, pci.device);
            if id.eq_ignore_ascii_case(&gpu.pci_bus_id) {
                found = Some((k, dev));
                break;
            }
        }
        let (k, dev) = found.ok_or_else(|| format!("no NVML device at {}", gpu.pci_bus_id))?;
        indices.push(k);
        by_gpu.push(dev);
    }
    // Active NVLinks of each GPU: those to another GPU of the set, by PCI
    // address, and those to anything else (NVSwitch ports).
    let n = gpus.len();
    let mut direct = vec![vec![0u32; n]; n];
    let mut switched = vec![0u32; n];
    for (i, dev) in by_gpu.iter().enumerate() {
        for link in 0..NVLINK_MAX_LINKS {
            let l = dev.link_wrapper_for(link);
            if !l.is_active().unwrap_or(false) {
                continue;
            }
            let remote = l
                .remote_pci_info()
                .ok()
                .map(|p| format!("{:08x}:{:02x}:{:02x}.0", p.domain, p.bus, p.device));
            match remote.and_then(|r| {
                gpus.iter()
                    .position(|g| g.pci_bus_id.eq_ignore_ascii_case(&r))
            }) {
                Some(j) if j != i => direct[i][j] += 1,
                _ => switched[i] += 1,
            }
        }
    }
    for i in 0..n {
        for j in 0..n {
            if i == j {
                continue;
            }
            // Through a switch every GPU reaches every other over all its
            // switch links, as `nvidia-smi topo -m` counts them.
            links[i][j].nvlinks = Some(direct[i][j] + switched[i].min(switched[j]));
            let other = nvml
                .device_by_index(indices[j])
                .map_err(|e| e.to_string())?;
            links[i][j].pcie =
                by_gpu[i]
                    .topology_common_ancestor(other)
                    .ok()
                    .map(|level| match level {
                        TopologyLevel::Internal => PcieLevel::Board,
                        TopologyLevel::Single => PcieLevel::SingleSwitch,
                        TopologyLevel::Multiple => PcieLevel::MultipleSwitches,
                        TopologyLevel::HostBridge => PcieLevel::HostBridge,
                        TopologyLevel::Node => PcieLevel::Numa,
                        TopologyLevel::System => PcieLevel::System,
                    });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(n: usize) -> Vec<Gpu> {
        (0..n)
            .map(|i| Gpu {
                ordinal: i,
                pci_bus_id: format!("00000000:{:02x}:00.0", i + 1),
            })
            .collect()
    }

    /// A topology with `nvlinks(i, j)` links between i and j, peer access
    /// wherever there is a link.
    fn nvlinked(n: usize, nvlinks: impl Fn(usize, usize) -> u32) -> Topology {
        let links = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| {
                        let k = if i == j { 0 } else { nvlinks(i, j) };
                        Link {
                            peer_access: k > 0,
                            performance_rank: Some(0),
                            native_atomics: k > 0,
                            nvlinks: Some(k),
                            pcie: Some(PcieLevel::System),
                        }
                    })
                    .collect()
            })
            .collect();
        Topology::from_links(gpus(n), links, NvmlStatus::Available).unwrap()
    }

    #[test]
    fn a_full_mesh_is_one_island_in_ordinal_order() {
        let t = nvlinked(4, |_, _| 18);
        assert_eq!(
            t.islands(),
            vec![Island {
                devices: vec![0, 1, 2, 3],
                nvlink: true
            }]
        );
        assert_eq!(t.ring_order(&t.islands()[0]), vec![0, 1, 2, 3]);
        assert!(t.render().contains("NV18"), "{}", t.render());
    }

    #[test]
    fn a_ring_is_followed_around_not_across() {
        // 0-2-1-3-0: the ring order must walk the links.
        let ring = [(0, 2), (2, 1), (1, 3), (3, 0)];
        let t = nvlinked(4, |i, j| {
            u32::from(
                ring.iter()
                    .any(|&(a, b)| (a, b) == (i, j) || (b, a) == (i, j)),
            ) * 4
        });
        let islands = t.islands();
        assert_eq!(islands.len(), 1);
        assert_eq!(t.ring_order(&islands[0]), vec![0, 2, 1, 3]);
    }

    #[test]
    fn two_islands_are_found_and_ordered() {
        // {0,2} and {1,3}, no NVLink between them.
        let t = nvlinked(4, |i, j| if i % 2 == j % 2 { 6 } else { 0 });
        assert_eq!(
            t.islands(),
            vec![
                Island {
                    devices: vec![0, 2],
                    nvlink: true
                },
                Island {
                    devices: vec![1, 3],
                    nvlink: true
                }
            ]
        );
        assert_eq!(t.islands()[1].to_string(), "GPU1, GPU3 (NVLink)");
    }

    #[test]
    fn the_strongest_link_comes_next_in_the_ring() {
        // 0 has 2 links to 1 and 8 to 2; 2 has 8 to 3.
        let weights = |i: usize, j: usize| match (i.min(j), i.max(j)) {
            (0, 1) => 2,
            (0, 2) => 8,
            (2, 3) => 8,
            (1, 3) => 2,
            _ => 0,
        };
        let t = nvlinked(4, weights);
        assert_eq!(t.ring_order(&t.islands()[0]), vec![0, 2, 3, 1]);
    }

    #[test]
    fn without_nvlink_islands_follow_peer_access() {
        // PCIe only: 0<->1 can access each other, 2 can reach nobody.
        let n = 3;
        let links = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| Link {
                        peer_access: i != j && i < 2 && j < 2,
                        performance_rank: Some(1),
                        native_atomics: false,
                        nvlinks: Some(0),
                        pcie: Some(PcieLevel::HostBridge),
                    })
                    .collect()
            })
            .collect();
        let t = Topology::from_links(gpus(n), links, NvmlStatus::Available).unwrap();
        assert!(!t.has_nvlink());
        assert_eq!(
            t.islands(),
            vec![
                Island {
                    devices: vec![0, 1],
                    nvlink: false
                },
                Island {
                    devices: vec![2],
                    nvlink: false
                }
            ]
        );
        let text = t.render();
        assert!(text.contains("PHB"), "{text}");
        assert!(text.contains("yes/1"), "{text}");
    }

    #[test]
    fn missing_nvml_is_reported_not_an_error() {
        let links = vec![vec![Link::default(); 2]; 2];
        let t = Topology::from_links(
            gpus(2),
            links,
            NvmlStatus::Missing("no libnvidia-ml".into()),
        )
        .unwrap();
        assert!(t.render().contains("NVML unavailable (no libnvidia-ml)"));
        assert_eq!(t.islands().len(), 2);
    }

    #[test]
    fn a_matrix_of_the_wrong_shape_is_refused() {
        let err = Topology::from_links(
            gpus(2),
            vec![vec![Link::default(); 2]],
            NvmlStatus::Available,
        )
        .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }));
    }
}
