//! `gpu-test --nodes N`: several "hosts" on one machine, so that the code
//! paths of a multi-node job run for real on one.
//!
//! Each rank process of a job is placed on one of `N` emulated hosts,
//! `ranks / N` per host, and gets what it would get on a real node:
//!
//! - `NCCL_HOSTID=nccl-rs-host-<h>`: NCCL (and nccl-dist's placement)
//!   take each host for a machine of its own, so between hosts NCCL uses
//!   neither NVLink/PCIe peer access nor shared memory but its network
//!   transport (sockets here, over `lo` unless `NCCL_SOCKET_IFNAME` is
//!   set), and ranks on different hosts may share a GPU;
//! - `CUDA_VISIBLE_DEVICES`: the host's own GPUs, so local ordinals start
//!   at 0 on every host as they would on a node;
//! - the launcher's variables as Slurm (`srun`) or Open MPI (`mpirun`)
//!   set them for a job over `N` nodes: global and local rank and size,
//!   node id, the node list (`127.0.0.[1-N]`: the first node is the
//!   rendezvous address, as on a cluster) and, for Slurm, the job id the
//!   rendezvous port is derived from. torchrun's variables are removed.
//!
//! NCCL writes its set-up log (`NCCL_DEBUG=INFO`, subsystems `INIT,NET`)
//! to a file per process; [`transports`] reads which transport carried
//! each connection (`via NET/Socket/0`, `via P2P/CUMEM`, ...), and with
//! one rank per host every connection must be a network one.
//!
//! Hosts get disjoint GPUs when the machine has enough (`ranks` GPUs);
//! with fewer, `--share-gpus` lets each host use the first `ranks / N`
//! GPUs, so two hosts of one rank each run on a single GPU. NCCL refuses
//! two ranks on one GPU of one host, never across hosts. Kernels of two
//! processes on one GPU take turns (time slices), so collectives are
//! slow there but correct.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use crate::Result;

/// The launcher whose variables the emulated hosts get.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Launcher {
    /// `srun`: `SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_STEP_NODELIST`, ...
    Slurm,
    /// `mpirun`: `OMPI_COMM_WORLD_*` with `MASTER_ADDR`/`MASTER_PORT`.
    OpenMpi,
}

impl Launcher {
    pub fn parse(name: &str) -> Result<Launcher> {
        match name {
            "slurm" => Ok(Launcher::Slurm),
            "openmpi" => Ok(Launcher::OpenMpi),
            _ => Err(format!("unknown launcher {name:?} (slurm or openmpi)").into()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Launcher::Slurm => "slurm",
            Launcher::OpenMpi => "openmpi",
        }
    }
}

/// Every launcher variable a rank could inherit from the shell that runs
/// xtask: removed, so that each rank sees only its emulated launcher.
const LAUNCH_VARS: &[&str] = &[
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
    "SLURM_NNODES",
    "SLURM_NODEID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_NODE_RANK",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_HOSTID",
];

/// How the ranks of one job are spread over emulated hosts.
#[derive(Clone, Copy, Debug)]
pub struct Hosts {
    /// Emulated hosts.
    pub nodes: usize,
    /// Whose variables the ranks get.
    pub launcher: Launcher,
    /// Whether hosts may share GPUs (the machine has fewer than `ranks`).
    pub share_gpus: bool,
}

impl Hosts {
    /// Ranks per host for a job of `ranks`, checked against the machine's
    /// `gpus`: every host gets the same number of ranks, each rank of a
    /// host its own GPU, and hosts their own GPUs unless sharing is asked.
    pub fn per_host(&self, ranks: usize, gpus: usize) -> Result<usize> {
        if self.nodes < 2 {
            return Err("--nodes needs at least 2 hosts".into());
        }
        if !ranks.is_multiple_of(self.nodes) || ranks < self.nodes {
            return Err(format!(
                "{ranks} ranks do not spread evenly over {} hosts",
                self.nodes
            )
            .into());
        }
        let per_host = ranks / self.nodes;
        if per_host > gpus {
            return Err(format!(
                "{per_host} ranks per host need {per_host} GPUs; this machine has {gpus}"
            )
            .into());
        }
        if ranks > gpus && !self.share_gpus {
            return Err(format!(
                "{ranks} ranks on {} hosts need {ranks} GPUs and this machine has {gpus}: \
                 add --share-gpus to let the hosts share them",
                self.nodes
            )
            .into());
        }
        Ok(per_host)
    }

    /// The GPUs host `host` sees, as `CUDA_VISIBLE_DEVICES`.
    fn visible(&self, host: usize, per_host: usize, gpus: usize) -> String {
        let first = if per_host * self.nodes <= gpus {
            host * per_host
        } else {
            0
        };
        (first..first + per_host)
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The environment of `rank` of `ranks` (to set), with the launcher
    /// variables to remove first ([`LAUNCH_VARS`]). `ports` are the
    /// rendezvous port and nccl-dist's own; `nccl_log` the file pattern
    /// for NCCL's set-up log.
    pub fn rank_env(
        &self,
        rank: usize,
        ranks: usize,
        gpus: usize,
        ports: (u16, u16),
        secret: &str,
        nccl_log: &Path,
    ) -> Result<Vec<(String, String)>> {
        let per_host = self.per_host(ranks, gpus)?;
        let host = rank / per_host;
        let local = rank % per_host;
        let nodes = self.nodes;
        let mut env: Vec<(&str, String)> = vec![
            ("NCCL_HOSTID", format!("nccl-rs-host-{host}")),
            ("CUDA_VISIBLE_DEVICES", self.visible(host, per_host, gpus)),
            ("NCCL_RS_PORT", ports.1.to_string()),
            ("NCCL_RS_SECRET", secret.to_string()),
            ("NCCL_DEBUG", "INFO".to_string()),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET".to_string()),
            ("NCCL_DEBUG_FILE", nccl_log.display().to_string()),
        ];
        if std::env::var_os("NCCL_SOCKET_IFNAME").is_none() {
            env.push(("NCCL_SOCKET_IFNAME", "lo".to_string()));
        }
        match self.launcher {
            Launcher::Slurm => {
                // No MASTER_ADDR/MASTER_PORT: nccl-dist derives them from
                // the node list and the job id, as under srun.
                let job = u32::from(ports.0) - 20_000;
                env.extend([
                    ("SLURM_PROCID", rank.to_string()),
                    ("SLURM_NTASKS", ranks.to_string()),
                    ("SLURM_LOCALID", local.to_string()),
                    ("SLURM_NTASKS_PER_NODE", per_host.to_string()),
                    ("SLURM_TASKS_PER_NODE", format!("{per_host}(x{nodes})")),
                    ("SLURM_NNODES", nodes.to_string()),
                    ("SLURM_NODEID", host.to_string()),
                    ("SLURM_STEP_NODELIST", format!("127.0.0.[1-{nodes}]")),
                    ("SLURM_JOB_ID", job.to_string()),
                ]);
            }
            Launcher::OpenMpi => env.extend([
                ("OMPI_COMM_WORLD_RANK", rank.to_string()),
                ("OMPI_COMM_WORLD_SIZE", ranks.to_string()),
                ("OMPI_COMM_WORLD_LOCAL_RANK", local.to_string()),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", per_host.to_string()),
                ("OMPI_COMM_WORLD_NODE_RANK", host.to_string()),
                ("MASTER_ADDR", "127.0.0.1".to_string()),
                ("MASTER_PORT", ports.0.to_string()),
            ]),
        }
        Ok(env.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// Sets `rank`'s environment on `cmd` ([`Hosts::rank_env`]) after
    /// removing every launcher variable it would otherwise inherit.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &self,
        cmd: &mut Command,
        rank: usize,
        ranks: usize,
        gpus: usize,
        ports: (u16, u16),
        secret: &str,
        nccl_log: &Path,
    ) -> Result<()> {
        for var in LAUNCH_VARS {
            cmd.env_remove(var);
        }
        cmd.envs(self.rank_env(rank, ranks, gpus, ports, secret, nccl_log)?);
        Ok(())
    }

    /// Words for a report: "2 hosts (slurm), 1 rank each, sharing 1 GPU".
    pub fn describe(&self, ranks: usize, gpus: usize) -> String {
        let per_host = ranks / self.nodes.max(1);
        let sharing = if ranks > gpus {
            format!(", sharing {gpus} GPU(s)")
        } else {
            String::new()
        };
        format!(
            "{} hosts ({}), {per_host} rank(s) each{sharing}",
            self.nodes,
            self.launcher.name()
        )
    }
}

/// Fresh ports for a job on emulated hosts: the rendezvous port in
/// 20000..30000 (Slurm's job id is derived from it, and nccl-dist derives
/// it back), and a free one for nccl-dist's liveness.
pub fn ports() -> Result<(u16, u16)> {
    let mut seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let mut rendezvous = None;
    for _ in 0..200 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let port = 20_000 + (seed % 10_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            rendezvous = Some(port);
            break;
        }
    }
    let rendezvous = rendezvous.ok_or("no free port in 20000..30000")?;
    let mut other = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    while other == rendezvous {
        other = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    }
    Ok((rendezvous, other))
}

/// Removes the logs an earlier run left at `pattern` (a path whose file
/// name ends in `%p`, NCCL's pid).
pub fn remove_logs(pattern: &Path) -> Result<()> {
    let (Some(dir), Some(name)) = (pattern.parent(), pattern.file_name()) else {
        return Ok(());
    };
    let prefix = name.to_string_lossy().trim_end_matches("%p").to_string();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// The transports NCCL's set-up logs under `dir` whose names start with
/// `prefix` report, by name (`NET/Socket`, `P2P/CUMEM`, `SHM/direct`) with
/// how many connections each carried.
pub fn transports(dir: &Path, prefix: &str) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return seen;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with(prefix) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            if let Some(t) = transport_of(line) {
                *seen.entry(t).or_insert(0) += 1;
            }
        }
    }
    seen
}

/// The transport of one NCCL connection line (`Channel 00/0 : 1[0] ->
/// 0[0] [receive] via NET/Socket/0`), without the device index.
fn transport_of(line: &str) -> Option<String> {
    if !line.contains("Channel") {
        return None;
    }
    let via = line.split(" via ").nth(1)?.split_whitespace().next()?;
    let parts: Vec<&str> = via.split('/').collect();
    let keep = match parts.last() {
        Some(p) if parts.len() > 1 && p.chars().all(|c| c.is_ascii_digit()) => parts.len() - 1,
        _ => parts.len(),
    };
    Some(parts[..keep].join("/"))
}

/// "NET/Socket x8, P2P/CUMEM x2", or "none reported".
pub fn summary(seen: &BTreeMap<String, usize>) -> String {
    if seen.is_empty() {
        return "none reported".to_string();
    }
    seen.iter()
        .map(|(t, n)| format!("{t} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// With one rank per host every connection runs between hosts and must
/// be a network one: the transports that are not.
pub fn local_transports(seen: &BTreeMap<String, usize>) -> Vec<String> {
    seen.keys()
        .filter(|t| !t.starts_with("NET/") && !t.starts_with("COLLNET"))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(nodes: usize, share: bool) -> Hosts {
        Hosts {
            nodes,
            launcher: Launcher::Slurm,
            share_gpus: share,
        }
    }

    #[test]
    fn spreads_ranks_over_hosts_and_gpus() {
        assert_eq!(hosts(2, false).per_host(4, 4).unwrap(), 2);
        assert!(hosts(2, false).per_host(3, 4).is_err());
        assert!(hosts(1, false).per_host(2, 2).is_err());
        // Two single-rank hosts on one GPU only when sharing is asked.
        assert!(hosts(2, false).per_host(2, 1).is_err());
        assert_eq!(hosts(2, true).per_host(2, 1).unwrap(), 1);
        // A host never has two ranks on one GPU.
        assert!(hosts(2, true).per_host(4, 1).is_err());
        assert_eq!(hosts(2, false).visible(1, 2, 4), "2,3");
        assert_eq!(hosts(2, true).visible(1, 1, 1), "0");
    }

    #[test]
    fn slurm_and_open_mpi_variables_name_host_and_local_rank() {
        let log = Path::new("/tmp/nccl.%h.%p");
        let env: BTreeMap<String, String> = hosts(2, false)
            .rank_env(3, 4, 4, (21_234, 40_000), "s", log)
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(env["SLURM_PROCID"], "3");
        assert_eq!(env["SLURM_LOCALID"], "1");
        assert_eq!(env["SLURM_NODEID"], "1");
        assert_eq!(env["SLURM_JOB_ID"], "1234");
        assert_eq!(env["SLURM_STEP_NODELIST"], "127.0.0.[1-2]");
        assert_eq!(env["NCCL_HOSTID"], "nccl-rs-host-1");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "2,3");
        assert!(!env.contains_key("MASTER_ADDR"));
        let mpi = Hosts {
            launcher: Launcher::OpenMpi,
            ..hosts(2, true)
        };
        let env: BTreeMap<String, String> = mpi
            .rank_env(1, 2, 1, (21_000, 40_000), "s", log)
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(env["OMPI_COMM_WORLD_LOCAL_RANK"], "0");
        assert_eq!(env["OMPI_COMM_WORLD_NODE_RANK"], "1");
        assert_eq!(env["MASTER_PORT"], "21000");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "0");
    }

    #[test]
    fn reads_transports_from_nccl_lines() {
        let line =
            "vm:446:446 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0";
        assert_eq!(transport_of(line).as_deref(), Some("NET/Socket"));
        let p2p = "x NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read";
        assert_eq!(transport_of(p2p).as_deref(), Some("P2P/CUMEM/read"));
        assert_eq!(transport_of("NCCL INFO Init COMPLETE"), None);
        let mut seen = BTreeMap::new();
        seen.insert("NET/Socket".to_string(), 4);
        assert!(local_transports(&seen).is_empty());
        seen.insert("SHM/direct/direct".to_string(), 1);
        assert_eq!(local_transports(&seen), vec!["SHM/direct/direct"]);
        assert_eq!(summary(&seen), "NET/Socket x4, SHM/direct/direct x1");
    }
}
