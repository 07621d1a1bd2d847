//! House rules the compiler does not check, as tests that `cargo xtask test`
//! runs (they read the sources as text):
//!
//! - no hand-written source file over [`MAX_LINES`] lines (generated
//!   reference bindings are not hand-written);
//! - no module (a folder or a top-level file of `src/`) of a crate
//!   importing one above it: the top-level modules' import graph has no
//!   cycle, names re-exported by the crate root resolved;
//! - `NCCL_RS_*` names spelled out only in each crate's `env.rs` (nccl-safe:
//!   `secrecy.rs`; nccl-bench has its own), outside tests;
//! - no cycle of `use crate::…` imports between the files of a crate
//!   (grouped `use crate::{…}` trees and names the crate root re-exports
//!   are followed to their module; `use super::…` and a parent declaring
//!   its children are not edges);
//! - the lints that keep two more rules stay on: `SAFETY:` comments on
//!   `unsafe` blocks (clippy's `undocumented_unsafe_blocks`) and no
//!   `unwrap` outside tests (`unwrap_used`, with `allow-unwrap-in-tests`
//!   in `clippy.toml`), both denied for the workspace, whose lints every
//!   crate takes ([`lint_gaps`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a hand-written source file may be.
pub const MAX_LINES: usize = 800;

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

/// Files over [`MAX_LINES`], with their length.
pub fn too_long(root: &Path) -> Vec<(String, usize)> {
    sources(root)
        .into_iter()
        .filter_map(|rel| {
            let text = std::fs::read_to_string(root.join(&rel)).ok()?;
            let lines = text.lines().count();
            (lines > MAX_LINES).then(|| (rel.to_string_lossy().into_owned(), lines))
        })
        .collect()
}

/// Lines of library code (before a file's first `#[cfg(test)]`) that spell
/// out an `NCCL_RS_` name outside the files that own the names.
pub fn stray_env_names(root: &Path) -> Vec<String> {
    let owners = [
        "crates/nccl-dist/src/env.rs",
        "crates/nccl-safe/src/secrecy.rs",
        "crates/nccl-bench/src/env.rs",
        "crates/nccl-control/src/env.rs",
        "crates/nccl-py/src/env.rs",
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

/// The workspace lints every crate must take, denied.
pub const DENIED_LINTS: &[&str] = &["undocumented_unsafe_blocks", "unwrap_used"];

/// What is missing from the lint set-up: a lint of [`DENIED_LINTS`] not
/// denied in the root `Cargo.toml`, `allow-unwrap-in-tests` not set in
/// `clippy.toml`, or a crate that does not take the workspace's lints.
pub fn lint_gaps(root: &Path) -> Vec<String> {
    let mut gaps = Vec::new();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    let clippy = manifest
        .split("[workspace.lints.clippy]")
        .nth(1)
        .map(|rest| rest.split("\n[").next().unwrap_or(rest))
        .unwrap_or("");
    for lint in DENIED_LINTS {
        if !clippy.contains(&format!("{lint} = \"deny\"")) {
            gaps.push(format!("Cargo.toml: {lint} is not denied"));
        }
    }
    let config = std::fs::read_to_string(root.join("clippy.toml")).unwrap_or_default();
    if !config.contains("allow-unwrap-in-tests = true") {
        gaps.push("clippy.toml: allow-unwrap-in-tests is not set".to_string());
    }
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("Cargo.toml"))
        .collect();
    manifests.push(root.join("xtask/Cargo.toml"));
    for path in manifests {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if !text.contains("[lints]\nworkspace = true") {
            gaps.push(format!("{}: no `[lints] workspace = true`", path.display()));
        }
    }
    gaps
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

/// One crate's import graph: its modules (path from the crate root, to
/// file) and, per module, the modules it imports (`use crate::…` and
/// `crate::…` paths in code, a name the root re-exports resolved to the
/// module that defines it).
struct Graph {
    modules: BTreeMap<String, String>,
    edges: BTreeMap<String, BTreeSet<String>>,
}

/// The import graph of every crate under `root`, by crate folder.
fn graphs(root: &Path) -> BTreeMap<String, Graph> {
    let mut by_crate: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for rel in sources(root) {
        let s = rel.to_string_lossy().into_owned();
        if let Some(i) = s.find("/src/") {
            by_crate.entry(s[..i].to_string()).or_default().push(rel);
        }
    }
    by_crate
        .into_iter()
        .map(|(krate, files)| {
            let graph = crate_graph(root, &krate, &files);
            (krate, graph)
        })
        .collect()
}

fn crate_graph(root: &Path, krate: &str, files: &[PathBuf]) -> Graph {
    let src = PathBuf::from(format!("{krate}/src"));
    let modules: BTreeMap<String, String> = files
        .iter()
        .filter_map(|f| {
            let m = module_of(f.strip_prefix(&src).ok()?)?;
            Some((m, f.to_string_lossy().into_owned()))
        })
        .collect();
    // Names the crate root re-exports (`pub use a::b::X;` in lib.rs or
    // main.rs) resolve to the module that defines them: `crate::X`
    // imports `a::b`.
    let root_file = ["lib.rs", "main.rs"]
        .iter()
        .find_map(|f| std::fs::read_to_string(root.join(&src).join(f)).ok())
        .unwrap_or_default();
    let mut root_names: BTreeMap<String, String> = BTreeMap::new();
    let root_code = code_of(&root_file);
    for keyword in ["pub use ", "pub(crate) use "] {
        let mut rest = root_code.as_str();
        while let Some(i) = rest.find(keyword) {
            rest = &rest[i + keyword.len()..];
            let stmt = rest.split(';').next().unwrap_or("");
            for path in expand_use(stmt.strip_prefix("crate::").unwrap_or(stmt)) {
                let segs: Vec<&str> = path.split("::").collect();
                if let Some((name, prefix)) = segs.split_last()
                    && let Some(m) = longest_module(prefix, &modules)
                {
                    root_names.insert((*name).to_string(), m);
                }
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        let code = code_of(&text);
        let mut rest = code.as_str();
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            // One path or a `{…}` group (nested groups and several lines
            // included), up to where the path ends.
            let end = if rest.starts_with('{') {
                matching_brace(rest).map_or(rest.len(), |e| e + 1)
            } else {
                rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{'))
                    .map_or(rest.len(), |e| {
                        if rest[..e].ends_with('{') {
                            matching_brace(&rest[e - 1..]).map_or(rest.len(), |b| e + b)
                        } else {
                            e
                        }
                    })
            };
            for path in expand_use(&rest[..end]) {
                let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
                let target = longest_module(&segs, &modules)
                    .or_else(|| segs.first().and_then(|n| root_names.get(*n).cloned()));
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
    Graph { modules, edges }
}

/// Cycles of `use crate::…` imports between the files of each crate's
/// `src/` (each as its sorted files), found as strongly connected
/// components of the import graph.
pub fn import_cycles(root: &Path) -> Vec<Vec<String>> {
    let mut cycles = Vec::new();
    for graph in graphs(root).into_values() {
        let nodes: Vec<String> = graph.modules.keys().cloned().collect();
        for scc in strongly_connected(&nodes, &graph.edges) {
            if scc.len() > 1 {
                let mut files: Vec<String> = scc.iter().map(|m| graph.modules[m].clone()).collect();
                files.sort();
                cycles.push(files);
            }
        }
    }
    cycles
}

/// Cycles between the top-level modules of each crate (a folder or a
/// top-level file of `src/`, everything inside it counted as the module):
/// every crate's modules must have an order in which none imports one
/// above it. Each cycle is `crate folder: module, module, …`.
pub fn module_cycles(root: &Path) -> Vec<String> {
    let top = |m: &str| m.split("::").next().unwrap_or("").to_string();
    let mut cycles = Vec::new();
    for (krate, graph) in graphs(root) {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, targets) in &graph.edges {
            for to in targets {
                let (a, b) = (top(from), top(to));
                if !a.is_empty() && !b.is_empty() && a != b {
                    edges.entry(a).or_default().insert(b);
                }
            }
        }
        let nodes: BTreeSet<String> = graph
            .modules
            .keys()
            .map(|m| top(m))
            .filter(|m| !m.is_empty())
            .collect();
        let nodes: Vec<String> = nodes.into_iter().collect();
        for mut scc in strongly_connected(&nodes, &edges) {
            if scc.len() > 1 {
                scc.sort();
                cycles.push(format!("{krate}: {}", scc.join(", ")));
            }
        }
    }
    cycles
}

/// A file's code without its tests, comments cut, lines joined (a doc
/// link is not an import; a `use` may span lines). A `#[cfg(test)]` item
/// of one line (`mod vectors;`, a `use`) is left out alone; one that opens
/// a block (the `tests` module, by convention last) ends the code.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            match lines.next() {
                Some(item) if item.trim_end().ends_with(';') => continue,
                _ => break,
            }
        }
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push(' ');
    }
    out
}

/// The index of the `}` that closes the `{` at the start of `s`.
fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Every path a `use` tree names: `a::{b, c::{d, e}}` is `a::b`, `a::c::d`,
/// `a::c::e` (an `as` rename and `self` are dropped).
fn expand_use(tree: &str) -> Vec<String> {
    // Drop every ` as name` rename first, while spaces still mark words.
    let mut plain = String::new();
    let mut rest = tree;
    while let Some(i) = rest.find(" as ") {
        plain.push_str(&rest[..i]);
        rest = rest[i + 4..].trim_start();
        let name_end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        rest = &rest[name_end..];
    }
    plain.push_str(rest);
    let tree: String = plain.chars().filter(|c| !c.is_whitespace()).collect();
    let tree = tree.replace("::self", "");
    let Some(open) = tree.find('{') else {
        return vec![tree.trim_end_matches(':').to_string()];
    };
    let prefix = &tree[..open];
    let Some(close) = matching_brace(&tree[open..]) else {
        return vec![prefix.trim_end_matches(':').to_string()];
    };
    let inner = &tree[open + 1..open + close];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty() && *p != "self")
        .flat_map(expand_use)
        .map(|p| format!("{prefix}{p}"))
        .collect()
}

/// The longest prefix of `segs` that names a module of the crate.
fn longest_module(segs: &[&str], modules: &BTreeMap<String, String>) -> Option<String> {
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|m| modules.contains_key(m))
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
    fn no_source_file_is_over_the_limit() {
        let long = too_long(&root());
        assert!(
            long.is_empty(),
            "over {MAX_LINES} lines: split along a seam: {long:?}"
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
    fn safety_comments_and_no_unwrap_stay_lints() {
        let gaps = lint_gaps(&root());
        assert!(gaps.is_empty(), "house lints switched off: {gaps:#?}");
    }

    #[test]
    fn no_import_cycle_between_files() {
        let cycles = import_cycles(&root());
        assert!(
            cycles.is_empty(),
            "files tied by import cycles (each group imports itself round): {cycles:#?}"
        );
    }

    #[test]
    fn no_module_imports_one_above_it() {
        let cycles = module_cycles(&root());
        assert!(
            cycles.is_empty(),
            "modules tied by import cycles (docs/architecture.md gives each crate's order): {cycles:#?}"
        );
    }

    /// A module that imports one above it is found, though no two files
    /// import each other: `a` imports `b` through the root's re-export,
    /// and `b`'s inner file imports `a`.
    #[test]
    fn a_module_importing_one_above_it_is_found() {
        let dir = std::env::temp_dir().join(format!("xtask-tidy-{}", std::process::id()));
        let src = dir.join("crates/demo/src");
        std::fs::create_dir_all(src.join("b")).unwrap();
        let files = [
            ("lib.rs", "mod a;\nmod b;\npub use b::Thing;\n"),
            ("a.rs", "use crate::Thing;\npub(crate) fn helper() {}\n"),
            ("b/mod.rs", "mod inner;\npub use inner::Thing;\n"),
            ("b/inner.rs", "use crate::a::helper;\npub struct Thing;\n"),
        ];
        for (name, text) in files {
            std::fs::write(src.join(name), text).unwrap();
        }
        let by_module = module_cycles(&dir);
        let by_file = import_cycles(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(by_module, ["crates/demo: a, b"]);
        assert!(by_file.is_empty(), "{by_file:?}");
    }

    #[test]
    fn use_trees_expand_to_their_paths() {
        assert_eq!(
            expand_use("{error::{Error, Result}, launch::Launch as L, self}"),
            ["error::Error", "error::Result", "launch::Launch"]
        );
        assert_eq!(expand_use("watchdog::inherit"), ["watchdog::inherit"]);
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
