//! Where to look for `libnccl`, in order.
//!
//! 1. `NCCL_LIBRARY`: one file. When set it is the only candidate, so a
//!    wrong value is an error instead of a silent fallback to another copy.
//! 2. `NCCL_HOME`: `$NCCL_HOME/lib/libnccl.so.2`, then `libnccl.so`.
//! 3. The system's dynamic loader: `libnccl.so.2`, then `libnccl.so`
//!    (honours `LD_LIBRARY_PATH`, the ld.so cache and `RUNPATH`).
//! 4. The layout of NVIDIA's pip wheels, `site-packages/nvidia/nccl/lib`,
//!    under the active virtualenv (`VIRTUAL_ENV`), the active conda
//!    environment (`CONDA_PREFIX`), the user's Python prefix
//!    (`PYTHONUSERBASE`, else `~/.local`) and the system's: the prefix of
//!    the `python3` on `PATH` (found without running it), `/usr/local` and
//!    `/usr`.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// Which rule of the search order produced a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The `NCCL_LIBRARY` variable.
    NcclLibrary,
    /// `NCCL_HOME/lib`.
    NcclHome,
    /// The dynamic loader's own search, by file name.
    SystemLoader,
    /// A pip wheel in the virtualenv of `VIRTUAL_ENV`.
    Virtualenv,
    /// A pip wheel in the conda environment of `CONDA_PREFIX`.
    Conda,
    /// A pip wheel in the user's Python prefix.
    PythonUser,
    /// A pip wheel in a system Python prefix.
    PythonSystem,
    /// A path given to [`crate::Nccl::open`] in code.
    Explicit,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::NcclLibrary => "NCCL_LIBRARY",
            Source::NcclHome => "NCCL_HOME",
            Source::SystemLoader => "system loader",
            Source::Virtualenv => "VIRTUAL_ENV",
            Source::Conda => "CONDA_PREFIX",
            Source::PythonUser => "Python user prefix",
            Source::PythonSystem => "system Python prefix",
            Source::Explicit => "explicit path",
        })
    }
}

/// One place to try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The rule that produced it.
    pub source: Source,
    /// What to hand to `dlopen`: a path, or a bare file name for the
    /// system loader's own search.
    pub target: PathBuf,
}

/// The inputs of the search, captured once so that a search never races
/// with a change of the environment and tests can build one by hand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchPaths {
    /// `NCCL_LIBRARY`: when set, the only candidate.
    pub nccl_library: Option<PathBuf>,
    /// `NCCL_HOME`.
    pub nccl_home: Option<PathBuf>,
    /// Whether to ask the system's dynamic loader.
    pub system_loader: bool,
    /// Python prefixes to search for the pip layout, in order.
    pub python_prefixes: Vec<(Source, PathBuf)>,
}

/// File names to try inside a directory and with the system loader.
pub const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

impl SearchPaths {
    /// The search order as the process environment sets it.
    pub fn from_env() -> Self {
        Self::from_lookup(|key| std::env::var_os(key))
    }

    /// The search order from any variable lookup (for tests, or to resolve
    /// as another process would).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Self {
        let non_empty = |key: &str| lookup(key).filter(|v| !v.is_empty()).map(PathBuf::from);
        let mut python_prefixes = Vec::new();
        if let Some(venv) = non_empty("VIRTUAL_ENV") {
            python_prefixes.push((Source::Virtualenv, venv));
        }
        if let Some(conda) = non_empty("CONDA_PREFIX") {
            python_prefixes.push((Source::Conda, conda));
        }
        let user_base = non_empty("PYTHONUSERBASE")
            .or_else(|| non_empty("HOME").map(|home| home.join(".local")));
        if let Some(user) = user_base {
            python_prefixes.push((Source::PythonUser, user));
        }
        // The prefix of the `python3` on PATH (a pyenv or a toolchain
        // install), then the distribution's own prefixes.
        let mut system = Vec::new();
        if let Some(path) = lookup("PATH") {
            system.extend(python_prefix_on_path(&path));
        }
        for prefix in ["/usr/local", "/usr"] {
            let prefix = PathBuf::from(prefix);
            if !system.contains(&prefix) {
                system.push(prefix);
            }
        }
        python_prefixes.extend(system.into_iter().map(|p| (Source::PythonSystem, p)));
        SearchPaths {
            nccl_library: non_empty("NCCL_LIBRARY"),
            nccl_home: non_empty("NCCL_HOME"),
            system_loader: true,
            python_prefixes,
        }
    }

    /// Only the one file `path`.
    pub fn only(path: impl Into<PathBuf>) -> Self {
        SearchPaths {
            nccl_library: Some(path.into()),
            ..SearchPaths::default()
        }
    }

    /// Every candidate, in order. Python prefixes contribute one candidate
    /// per `site-packages`/`dist-packages` directory that exists under
    /// them, newest Python first.
    pub fn candidates(&self) -> Vec<Candidate> {
        if let Some(file) = &self.nccl_library {
            return vec![Candidate {
                source: Source::NcclLibrary,
                target: file.clone(),
            }];
        }
        let mut out = Vec::new();
        if let Some(home) = &self.nccl_home {
            for name in LIBRARY_NAMES {
                out.push(Candidate {
                    source: Source::NcclHome,
                    target: home.join("lib").join(name),
                });
            }
        }
        if self.system_loader {
            for name in LIBRARY_NAMES {
                out.push(Candidate {
                    source: Source::SystemLoader,
                    target: PathBuf::from(name),
                });
            }
        }
        for (source, prefix) in &self.python_prefixes {
            for site in site_package_dirs(prefix) {
                out.push(Candidate {
                    source: *source,
                    target: site
                        .join("nvidia")
                        .join("nccl")
                        .join("lib")
                        .join(LIBRARY_NAMES[0]),
                });
            }
        }
        out
    }
}

/// The installation prefix of the first `python3` on `path`: the parent of
/// the `bin` directory its real file lives in. Found without running it.
fn python_prefix_on_path(path: &std::ffi::OsStr) -> Option<PathBuf> {
    for dir in std::env::split_paths(path) {
        let candidate = dir.join("python3");
        if !candidate.is_file() {
            continue;
        }
        let real = std::fs::canonicalize(&candidate).ok()?;
        let bin = real.parent()?;
        if bin.file_name()? != "bin" {
            return None;
        }
        return bin.parent().map(Path::to_path_buf);
    }
    None
}

/// `site-packages` and `dist-packages` directories under a Python prefix:
/// `lib/pythonX.Y/…`, `lib64/pythonX.Y/…` and Debian's `lib/python3/…`.
fn site_package_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut pythons: Vec<(Vec<u32>, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let rest = name.strip_prefix("python")?;
                let key = rest
                    .split('.')
                    .map(|p| p.parse::<u32>().ok())
                    .collect::<Option<Vec<_>>>()?;
                Some((key, e.path()))
            })
            .collect();
        // Newest interpreter first: it is the likeliest to be the active one.
        pythons.sort_by(|a, b| b.0.cmp(&a.0));
        for (_, dir) in pythons {
            for kind in ["site-packages", "dist-packages"] {
                let site = dir.join(kind);
                if site.is_dir() && !found.contains(&site) {
                    found.push(site);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn nccl_library_is_the_only_candidate_when_set() {
        let paths = SearchPaths::from_lookup(lookup(&[
            ("NCCL_LIBRARY", "/opt/x/libnccl.so.2"),
            ("NCCL_HOME", "/opt/nccl"),
        ]));
        assert_eq!(
            paths.candidates(),
            vec![Candidate {
                source: Source::NcclLibrary,
                target: "/opt/x/libnccl.so.2".into()
            }]
        );
    }

    #[test]
    fn order_is_home_then_loader_then_python() {
        let dir = std::env::temp_dir().join(format!("nccl-sys-search-{}", std::process::id()));
        let site = dir.join("venv/lib/python3.12/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        let venv = dir.join("venv");
        let paths = SearchPaths::from_lookup(lookup(&[
            ("NCCL_HOME", "/opt/nccl"),
            ("VIRTUAL_ENV", venv.to_str().unwrap()),
            ("HOME", "/nonexistent-home"),
        ]));
        let got = paths.candidates();
        let targets: Vec<_> = got.iter().map(|c| (c.source, c.target.clone())).collect();
        assert_eq!(
            targets[0],
            (Source::NcclHome, "/opt/nccl/lib/libnccl.so.2".into())
        );
        assert_eq!(
            targets[1],
            (Source::NcclHome, "/opt/nccl/lib/libnccl.so".into())
        );
        assert_eq!(targets[2], (Source::SystemLoader, "libnccl.so.2".into()));
        assert_eq!(targets[3], (Source::SystemLoader, "libnccl.so".into()));
        assert_eq!(
            targets[4],
            (
                Source::Virtualenv,
                site.join("nvidia/nccl/lib/libnccl.so.2")
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn empty_variables_count_as_unset() {
        let paths = SearchPaths::from_lookup(lookup(&[("NCCL_LIBRARY", ""), ("NCCL_HOME", "")]));
        assert_eq!(paths.nccl_library, None);
        assert_eq!(paths.nccl_home, None);
        assert!(paths.system_loader);
    }

    #[test]
    fn python_prefixes_follow_the_documented_order() {
        let paths = SearchPaths::from_lookup(lookup(&[
            ("VIRTUAL_ENV", "/v"),
            ("CONDA_PREFIX", "/c"),
            ("PYTHONUSERBASE", "/u"),
            ("HOME", "/h"),
        ]));
        let sources: Vec<_> = paths
            .python_prefixes
            .iter()
            .map(|(s, p)| (*s, p.clone()))
            .collect();
        assert_eq!(
            sources,
            vec![
                (Source::Virtualenv, "/v".into()),
                (Source::Conda, "/c".into()),
                (Source::PythonUser, "/u".into()),
                (Source::PythonSystem, "/usr/local".into()),
                (Source::PythonSystem, "/usr".into()),
            ]
        );
    }
}
