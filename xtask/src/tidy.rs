//! House rules the compiler does not check, as tests that `cargo xtask test`
//! runs (they read the sources as text):
//!
//! - no hand-written source file over [`MAX_LINES`] lines, except the ones
//!   listed in [`LONG_FILES`], which may only shrink (generated reference
//!   bindings are not hand-written);
//! - `NCCL_RS_*` names spelled out only in each crate's `env.rs` (nccl-safe:
//!   `secrecy.rs`), outside tests;
//! - no new cycle of `use crate::…` imports between the files of a crate
//!   ([`KNOWN_CYCLES`] lists the ones the redesign still has to break;
//!   `use super::…` is not followed).
//!
//! `SAFETY:` comments on `unsafe` blocks are clippy's
//! (`undocumented_unsafe_blocks`, denied for the workspace).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a hand-written source file may be.
pub const MAX_LINES: usize = 800;

/// Files over [`MAX_LINES`] today, each with the most lines it may have:
/// the redesign splits them; a file here may shrink, never grow.
pub const LONG_FILES: &[(&str, usize)] = &[
    ("crates/nccl-dist/src/liveness/wire.rs", 849),
    ("crates/nccl-dist/src/rendezvous/mod.rs", 1151),
    ("crates/nccl-dist/src/watchdog.rs", 947),
    ("crates/nccl-dist/src/world.rs", 979),
    ("crates/nccl-dist/tests/bad_input.rs", 1798),
    ("crates/nccl-safe/tests/gpu/main.rs", 1660),
    ("xtask/src/bench.rs", 1325),
];

/// The groups of files tied by import cycles today (strongly connected
/// components of the `use crate::…` graph); the redesign breaks them. A
/// group found that is not inside one of these fails the test, so they may
/// shrink or split, never grow or appear.
pub const KNOWN_CYCLES: &[&[&str]] = &[&[
    "crates/nccl-dist/src/device_mesh.rs",
    "crates/nccl-dist/src/env.rs",
    "crates/nccl-dist/src/error.rs",
    "crates/nccl-dist/src/host.rs",
    "crates/nccl-dist/src/liveness/wire.rs",
    "crates/nccl-dist/src/rendezvous/mod.rs",
    "crates/nccl-dist/src/secret.rs",
    "crates/nccl-dist/src/watchdog.rs",
    "crates/nccl-dist/src/world.rs",
]];

/// Every hand-written `.rs` file of the workspace, relative to the root.
fn sources(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if p.is_dir() {
                if name != "target" && name != "reference" && !name.starts_with('.') {
                    walk(&p, out);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for top in ["crates", "xtask", "fuzz/fuzz_targets"] {
        walk(&root.join(top), &mut out);
    }
    out.sort();
    out.into_iter()
        .filter_map(|p| p.strip_prefix(root).ok().map(Path::to_path_buf))
        .collect()
}

/// Files over [`MAX_LINES`] that are not allowed to be, with their length.
pub fn too_long(root: &Path) -> Vec<(String, usize)> {
    sources(root)
        .into_iter()
        .filter_map(|rel| {
            let text = std::fs::read_to_string(root.join(&rel)).ok()?;
            let lines = text.lines().count();
            let name = rel.to_string_lossy().into_owned();
            let limit = LONG_FILES
                .iter()
                .find(|(f, _)| *f == name)
                .map_or(MAX_LINES, |(_, n)| *n);
            (lines > limit).then_some((name, lines))
        })
        .collect()
}

/// Lines of library code (before a file's first `#[cfg(test)]`) that spell
/// out an `NCCL_RS_` name outside the files that own the names.
pub fn stray_env_names(root: &Path) -> Vec<String> {
    let owners = [
        "crates/nccl-dist/src/env.rs",
        "crates/nccl-safe/src/secrecy.rs",
    ];
    let mut out = Vec::new();
    for rel in sources(root) {
        let name = rel.to_string_lossy().into_owned();
        let library = name.starts_with("crates/") && name.contains("/src/");
        if !library || owners.contains(&name.as_str()) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&rel)) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            let code = line.split("//").next().unwrap_or("");
            if code.contains("\"NCCL_RS_") {
                out.push(format!("{name}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    out
}

/// The module a `src/` file is, as a path from the crate root
/// (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`).
fn module_of(src_rel: &Path) -> Option<String> {
    let mut parts: Vec<String> = src_rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_string());
    }
    Some(parts.join("::"))
}

/// Cycles of `use crate::…` imports between the files of each crate's
/// `src/` (each as its sorted files), found as strongly connected
/// components of the import graph.
pub fn import_cycles(root: &Path) -> Vec<Vec<String>> {
    let mut by_crate: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for rel in sources(root) {
        let s = rel.to_string_lossy().into_owned();
        if let Some(i) = s.find("/src/") {
            by_crate.entry(s[..i].to_string()).or_default().push(rel);
        }
    }
    let mut cycles = Vec::new();
    for (krate, files) in by_crate {
        let src = PathBuf::from(format!("{krate}/src"));
        let modules: BTreeMap<String, String> = files
            .iter()
            .filter_map(|f| {
                let m = module_of(f.strip_prefix(&src).ok()?)?;
                Some((m, f.to_string_lossy().into_owned()))
            })
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, file) in &modules {
            let Ok(text) = std::fs::read_to_string(root.join(file)) else {
                continue;
            };
            for line in text.lines() {
                if line.trim_start().starts_with("#[cfg(test)]") {
                    break;
                }
                // Code only: a doc link is not an import.
                let mut rest = line.split("//").next().unwrap_or("");
                while let Some(i) = rest.find("crate::") {
                    rest = &rest[i + "crate::".len()..];
                    let path: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    // The longest module prefix of the path.
                    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
                    let target = (1..=segs.len())
                        .rev()
                        .map(|n| segs[..n].join("::"))
                        .find(|m| modules.contains_key(m));
                    if let Some(t) = target
                        && t != *module
                        && !module.starts_with(&format!("{t}::"))
                        && !t.starts_with(&format!("{module}::"))
                    {
                        edges.entry(module.clone()).or_default().insert(t);
                    }
                }
            }
        }
        for scc in strongly_connected(&modules.keys().cloned().collect::<Vec<_>>(), &edges) {
            if scc.len() > 1 {
                let mut files: Vec<String> = scc.iter().map(|m| modules[m].clone()).collect();
                files.sort();
                cycles.push(files);
            }
        }
    }
    cycles
}

/// Tarjan's strongly connected components.
fn strongly_connected(
    nodes: &[String],
    edges: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit(v: &str, st: &mut State<'_>) {
        st.index.insert(v.to_string(), st.next);
        st.low.insert(v.to_string(), st.next);
        st.next += 1;
        st.stack.push(v.to_string());
        st.on_stack.insert(v.to_string());
        let targets: Vec<String> = st
            .edges
            .get(v)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        for w in targets {
            if !st.index.contains_key(&w) {
                visit(&w, st);
                let lw = st.low[&w];
                let lv = st.low[v];
                st.low.insert(v.to_string(), lv.min(lw));
            } else if st.on_stack.contains(&w) {
                let iw = st.index[&w];
                let lv = st.low[v];
                st.low.insert(v.to_string(), lv.min(iw));
            }
        }
        if st.low[v] == st.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(&w);
                let done = w == v;
                scc.push(w);
                if done {
                    break;
                }
            }
            st.out.push(scc);
        }
    }
    let mut st = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for n in nodes {
        if !st.index.contains_key(n) {
            visit(n, &mut st);
        }
    }
    st.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        crate::workspace_root()
    }

    #[test]
    fn no_source_file_grows_past_its_limit() {
        let long = too_long(&root());
        assert!(
            long.is_empty(),
            "over {MAX_LINES} lines (or past their entry in LONG_FILES): {long:?}"
        );
    }

    #[test]
    fn nccl_rs_names_are_spelled_out_only_in_env_rs() {
        let stray = stray_env_names(&root());
        assert!(
            stray.is_empty(),
            "use the constants of env.rs instead: {stray:#?}"
        );
    }

    #[test]
    fn no_new_import_cycle_between_files() {
        let new: Vec<Vec<String>> = import_cycles(&root())
            .into_iter()
            .filter(|c| {
                !KNOWN_CYCLES
                    .iter()
                    .any(|known| c.iter().all(|f| known.contains(&f.as_str())))
            })
            .collect();
        assert!(
            new.is_empty(),
            "files tied by import cycles, new or grown (see KNOWN_CYCLES): {new:#?}"
        );
    }

    #[test]
    fn cycles_are_found() {
        let mut edges = BTreeMap::new();
        edges.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
        edges.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
        edges.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
        let nodes = ["a", "b", "c"].map(String::from);
        let sccs = strongly_connected(&nodes, &edges);
        assert!(sccs.iter().any(|s| s.len() == 2));
        assert_eq!(sccs.iter().filter(|s| s.len() == 1).count(), 1);
    }
}
