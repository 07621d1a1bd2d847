//! Who am I in this job: rank, world size, local rank and the rendezvous
//! address, read from the launch conventions people already use.
//!
//! | launcher | rank | world | local rank | local world | rendezvous |
//! |---|---|---|---|---|---|
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `LOCAL_WORLD_SIZE` | `MASTER_ADDR`:`MASTER_PORT` |
//! | Slurm | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | `SLURM_NTASKS_PER_NODE` (or `SLURM_TASKS_PER_NODE`) | first host of `SLURM_STEP_NODELIST` (else `SLURM_JOB_NODELIST`), `MASTER_PORT` or a port derived from `SLURM_JOB_ID` |
//! | Open MPI | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_SIZE` | `MASTER_ADDR`:`MASTER_PORT` (MPI has no convention) |
//!
//! torchrun is recognised by `RANK` and `WORLD_SIZE`, Slurm by
//! `SLURM_PROCID`, Open MPI by `OMPI_COMM_WORLD_RANK`, in that order. A
//! missing or inconsistent variable is a [`LaunchError`] that names it.

use std::ffi::OsString;
use std::fmt;

/// Which convention the launch information came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// Given in code.
    Explicit,
    /// `torchrun` / `torch.distributed.run`.
    Torchrun,
    /// `srun` under Slurm.
    Slurm,
    /// `mpirun` of Open MPI.
    OpenMpi,
    /// One process running every rank ([`crate::World::local`],
    /// [`crate::World::spawn_local`]).
    Local,
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// Global rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank on this node; also the GPU it uses.
    pub local_rank: usize,
    /// Ranks on this node.
    pub local_world_size: usize,
    /// Host of rank 0's rendezvous listener.
    pub master_addr: String,
    /// Port of rank 0's rendezvous listener.
    pub master_port: u16,
    /// Where this came from.
    pub launcher: Launcher,
}

/// A launch environment that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// No launcher's variables are set.
    #[error(
        "no launch environment found: set RANK and WORLD_SIZE (torchrun), run under srun (SLURM_PROCID) or mpirun (OMPI_COMM_WORLD_RANK), or give the launch in code"
    )]
    NoLauncher,
    /// A variable the launcher needs is not set.
    #[error("{launcher:?} launch: {var} is not set")]
    Missing {
        /// The launcher.
        launcher: Launcher,
        /// The variable.
        var: &'static str,
    },
    /// A variable has a value that cannot be parsed.
    #[error("{var}={value:?} is not valid: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// Values that contradict each other.
    #[error("inconsistent launch: {var}={value} but {limit_var}={limit}")]
    Inconsistent {
        /// The variable out of range.
        var: &'static str,
        /// Its value.
        value: usize,
        /// The variable that bounds it.
        limit_var: &'static str,
        /// That bound.
        limit: usize,
    },
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

type Lookup<'a> = dyn Fn(&str) -> Option<OsString> + 'a;

fn get(lookup: &Lookup<'_>, var: &'static str) -> Option<String> {
    lookup(var)
        .map(|v| v.to_string_lossy().trim().to_string())
        .filter(|v| !v.is_empty())
}

fn need(lookup: &Lookup<'_>, launcher: Launcher, var: &'static str) -> Result<String, LaunchError> {
    get(lookup, var).ok_or(LaunchError::Missing { launcher, var })
}

fn number(var: &'static str, value: &str) -> Result<usize, LaunchError> {
    value.parse::<usize>().map_err(|_| LaunchError::Invalid {
        var,
        value: value.to_string(),
        reason: "expected a non-negative integer",
    })
}

/// A TCP port in 1..=65535, or an error naming `var`.
pub(crate) fn port(var: &'static str, value: &str) -> Result<u16, LaunchError> {
    match value.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(LaunchError::Invalid {
            var,
            value: value.to_string(),
            reason: "expected a port in 1..=65535",
        }),
    }
}

impl Launch {
    /// Reads the process environment.
    pub fn detect() -> Result<Launch, LaunchError> {
        Launch::from_lookup(&|k| std::env::var_os(k))
    }

    /// Reads any variable lookup (for tests, or another process's
    /// environment).
    pub fn from_lookup(lookup: &Lookup<'_>) -> Result<Launch, LaunchError> {
        let launch = if get(lookup, "RANK").is_some() && get(lookup, "WORLD_SIZE").is_some() {
            Self::torchrun(lookup)?
        } else if get(lookup, "SLURM_PROCID").is_some() {
            Self::slurm(lookup)?
        } else if get(lookup, "OMPI_COMM_WORLD_RANK").is_some() {
            Self::open_mpi(lookup)?
        } else {
            return Err(LaunchError::NoLauncher);
        };
        launch.validate()
    }

    /// A launch given in code.
    pub fn explicit(
        rank: usize,
        world_size: usize,
        local_rank: usize,
        local_world_size: usize,
        master_addr: impl Into<String>,
        master_port: u16,
    ) -> Result<Launch, LaunchError> {
        Launch {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr: master_addr.into(),
            master_port,
            launcher: Launcher::Explicit,
        }
        .validate()
    }

    fn validate(self) -> Result<Launch, LaunchError> {
        let check = |var, value, limit_var, limit| {
            if value < limit {
                Ok(())
            } else {
                Err(LaunchError::Inconsistent {
                    var,
                    value,
                    limit_var,
                    limit,
                })
            }
        };
        let (rank_var, world_var, local_var, local_world_var) = match self.launcher {
            Launcher::Slurm => (
                "SLURM_PROCID",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
                "SLURM_NTASKS_PER_NODE",
            ),
            Launcher::OpenMpi => (
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            ),
            _ => ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        };
        if self.world_size == 0 {
            return Err(LaunchError::Invalid {
                var: world_var,
                value: "0".into(),
                reason: "a job has at least one rank",
            });
        }
        check(rank_var, self.rank, world_var, self.world_size)?;
        check(
            local_var,
            self.local_rank,
            local_world_var,
            self.local_world_size,
        )?;
        if self.local_world_size > self.world_size {
            return Err(LaunchError::Inconsistent {
                var: local_world_var,
                value: self.local_world_size,
                limit_var: world_var,
                limit: self.world_size,
            });
        }
        if self.master_addr.is_empty() {
            return Err(LaunchError::Invalid {
                var: "MASTER_ADDR",
                value: String::new(),
                reason: "empty host",
            });
        }
        Ok(self)
    }

    fn torchrun(lookup: &Lookup<'_>) -> Result<Launch, LaunchError> {
        let l = Launcher::Torchrun;
        let rank = number("RANK", &need(lookup, l, "RANK")?)?;
        let world_size = number("WORLD_SIZE", &need(lookup, l, "WORLD_SIZE")?)?;
        let local_rank = number("LOCAL_RANK", &need(lookup, l, "LOCAL_RANK")?)?;
        let local_world_size = number("LOCAL_WORLD_SIZE", &need(lookup, l, "LOCAL_WORLD_SIZE")?)?;
        let master_addr = need(lookup, l, "MASTER_ADDR")?;
        let master_port = port("MASTER_PORT", &need(lookup, l, "MASTER_PORT")?)?;
        Ok(Launch {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher: l,
        })
    }

    fn slurm(lookup: &Lookup<'_>) -> Result<Launch, LaunchError> {
        let l = Launcher::Slurm;
        let rank = number("SLURM_PROCID", &need(lookup, l, "SLURM_PROCID")?)?;
        let world_size = number("SLURM_NTASKS", &need(lookup, l, "SLURM_NTASKS")?)?;
        let local_rank = number("SLURM_LOCALID", &need(lookup, l, "SLURM_LOCALID")?)?;
        let local_world_size = match get(lookup, "SLURM_NTASKS_PER_NODE") {
            Some(v) => number("SLURM_NTASKS_PER_NODE", &v)?,
            None => {
                let v = need(lookup, l, "SLURM_TASKS_PER_NODE")?;
                first_tasks_per_node(&v)?
            }
        };
        let nodes = get(lookup, "SLURM_STEP_NODELIST")
            .map(|v| ("SLURM_STEP_NODELIST", v))
            .or_else(|| get(lookup, "SLURM_JOB_NODELIST").map(|v| ("SLURM_JOB_NODELIST", v)))
            .ok_or(LaunchError::Missing {
                launcher: l,
                var: "SLURM_STEP_NODELIST",
            })?;
        let master_addr = match get(lookup, "MASTER_ADDR") {
            Some(addr) => addr,
            None => first_host(&nodes.1).ok_or(LaunchError::Invalid {
                var: nodes.0,
                value: nodes.1.clone(),
                reason: "not a Slurm host list",
            })?,
        };
        let master_port = match get(lookup, "MASTER_PORT") {
            Some(p) => port("MASTER_PORT", &p)?,
            None => {
                let job = number("SLURM_JOB_ID", &need(lookup, l, "SLURM_JOB_ID")?)?;
                // A port every task of the job derives alike, away from the
                // well-known and the usual ephemeral ranges.
                20_000 + (job % 10_000) as u16
            }
        };
        Ok(Launch {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher: l,
        })
    }

    fn open_mpi(lookup: &Lookup<'_>) -> Result<Launch, LaunchError> {
        let l = Launcher::OpenMpi;
        let rank = number(
            "OMPI_COMM_WORLD_RANK",
            &need(lookup, l, "OMPI_COMM_WORLD_RANK")?,
        )?;
        let world_size = number(
            "OMPI_COMM_WORLD_SIZE",
            &need(lookup, l, "OMPI_COMM_WORLD_SIZE")?,
        )?;
        let local_rank = number(
            "OMPI_COMM_WORLD_LOCAL_RANK",
            &need(lookup, l, "OMPI_COMM_WORLD_LOCAL_RANK")?,
        )?;
        let local_world_size = number(
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            &need(lookup, l, "OMPI_COMM_WORLD_LOCAL_SIZE")?,
        )?;
        let master_addr = need(lookup, l, "MASTER_ADDR")?;
        let master_port = port("MASTER_PORT", &need(lookup, l, "MASTER_PORT")?)?;
        Ok(Launch {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher: l,
        })
    }
}

/// The first count of `SLURM_TASKS_PER_NODE`, e.g. `4(x2),3` gives 4.
fn first_tasks_per_node(value: &str) -> Result<usize, LaunchError> {
    let first = value.split(',').next().unwrap_or_default();
    let count = first.split('(').next().unwrap_or_default();
    number("SLURM_TASKS_PER_NODE", count)
}

/// The first host of a Slurm host list: `gpu[07-09,12],cpu1` gives `gpu07`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    if list.is_empty() {
        return None;
    }
    // The first entry ends at a comma outside brackets.
    let mut depth = 0usize;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let entry = &list[..end];
    // Several bracket groups in one name (`rack[1-2]-n[5]`) are not supported.
    if entry.matches('[').count() > 1 {
        return None;
    }
    let Some(open) = entry.find('[') else {
        return Some(entry.to_string());
    };
    let close = entry.rfind(']')?;
    let (prefix, ranges, suffix) = (&entry[..open], &entry[open + 1..close], &entry[close + 1..]);
    let first = ranges.split(',').next()?.split('-').next()?;
    if first.is_empty() || !first.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(format!("{prefix}{first}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn torchrun_variables_are_read() {
        let l = Launch::from_lookup(&env(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!(
            l,
            Launch {
                rank: 5,
                world_size: 8,
                local_rank: 1,
                local_world_size: 4,
                master_addr: "node0".into(),
                master_port: 29500,
                launcher: Launcher::Torchrun
            }
        );
    }

    #[test]
    fn a_missing_torchrun_variable_is_named() {
        let err = Launch::from_lookup(&env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap_err();
        assert_eq!(
            err,
            LaunchError::Missing {
                launcher: Launcher::Torchrun,
                var: "MASTER_ADDR"
            }
        );
        assert_eq!(err.to_string(), "Torchrun launch: MASTER_ADDR is not set");
    }

    #[test]
    fn inconsistent_and_invalid_values_are_named() {
        let base = [
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ];
        let mut vars = base.to_vec();
        vars.push(("RANK", "2"));
        let err = Launch::from_lookup(&env(&vars)).unwrap_err();
        assert_eq!(
            err,
            LaunchError::Inconsistent {
                var: "RANK",
                value: 2,
                limit_var: "WORLD_SIZE",
                limit: 2
            }
        );
        let mut vars = base.to_vec();
        vars.push(("RANK", "one"));
        assert!(matches!(
            Launch::from_lookup(&env(&vars)).unwrap_err(),
            LaunchError::Invalid { var: "RANK", .. }
        ));
        let mut vars: Vec<_> = base
            .iter()
            .copied()
            .filter(|(k, _)| *k != "MASTER_PORT")
            .collect();
        vars.push(("RANK", "0"));
        vars.push(("MASTER_PORT", "70000"));
        assert!(matches!(
            Launch::from_lookup(&env(&vars)).unwrap_err(),
            LaunchError::Invalid {
                var: "MASTER_PORT",
                ..
            }
        ));
    }

    #[test]
    fn slurm_takes_the_first_node_and_derives_a_port() {
        let l = Launch::from_lookup(&env(&[
            ("SLURM_PROCID", "6"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_STEP_NODELIST", "gpu[07-08]"),
            ("SLURM_JOB_ID", "123456"),
        ]))
        .unwrap();
        assert_eq!(
            (l.rank, l.world_size, l.local_rank, l.local_world_size),
            (6, 8, 2, 4)
        );
        assert_eq!(l.master_addr, "gpu07");
        assert_eq!(l.master_port, 20_000 + 3456);
        assert_eq!(l.launcher, Launcher::Slurm);
    }

    #[test]
    fn slurm_without_a_node_list_names_it() {
        let err = Launch::from_lookup(&env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "1"),
        ]))
        .unwrap_err();
        assert_eq!(
            err,
            LaunchError::Missing {
                launcher: Launcher::Slurm,
                var: "SLURM_STEP_NODELIST"
            }
        );
    }

    #[test]
    fn open_mpi_needs_a_master_address() {
        let vars = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ];
        let err = Launch::from_lookup(&env(&vars)).unwrap_err();
        assert_eq!(
            err,
            LaunchError::Missing {
                launcher: Launcher::OpenMpi,
                var: "MASTER_ADDR"
            }
        );
        let mut vars = vars.to_vec();
        vars.extend([("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "4000")]);
        let l = Launch::from_lookup(&env(&vars)).unwrap();
        assert_eq!(
            (l.rank, l.world_size, l.launcher),
            (3, 4, Launcher::OpenMpi)
        );
    }

    #[test]
    fn no_launcher_is_its_own_error_and_explicit_launches_are_checked() {
        assert_eq!(
            Launch::from_lookup(&env(&[])).unwrap_err(),
            LaunchError::NoLauncher
        );
        assert!(Launch::explicit(0, 1, 0, 1, "127.0.0.1", 1234).is_ok());
        assert!(matches!(
            Launch::explicit(1, 1, 0, 1, "h", 1).unwrap_err(),
            LaunchError::Inconsistent { .. }
        ));
        assert!(matches!(
            Launch::explicit(0, 0, 0, 0, "h", 1).unwrap_err(),
            LaunchError::Invalid { .. }
        ));
    }

    #[test]
    fn slurm_host_lists_yield_their_first_host() {
        assert_eq!(first_host("node1").as_deref(), Some("node1"));
        assert_eq!(first_host("gpu[07-09,12],cpu1").as_deref(), Some("gpu07"));
        assert_eq!(first_host("a[3],b[1-2]").as_deref(), Some("a3"));
        assert_eq!(first_host("rack[1-2]-n[5]").as_deref(), None);
        assert_eq!(first_host("").as_deref(), None);
        assert_eq!(first_host("bad]").as_deref(), None);
    }
}
