//! `cargo xtask ci`'s publishing checks.
//!
//! - [`package`]: `cargo package` of every published crate (those without
//!   `publish = false`, read from `cargo metadata`), which builds each from
//!   its packaged form against the others' packaged forms; before that, the
//!   metadata crates.io shows and the file list of each package.
//! - [`msrv`]: the workspace's declared `rust-version`, installed with
//!   rustup, checks the whole workspace.

use std::process::Command;

use serde_json::Value;

use crate::{Result, cargo, run};

/// Files every published package must contain.
const REQUIRED_FILES: &[&str] = &["Cargo.toml", "README.md", "LICENSE-MIT", "LICENSE-APACHE"];

/// Metadata crates.io and docs.rs show, which every published crate sets.
const REQUIRED_FIELDS: &[&str] = &[
    "description",
    "license",
    "readme",
    "repository",
    "documentation",
    "keywords",
    "categories",
    "rust_version",
];

/// The workspace's packages as `cargo metadata` describes them.
fn metadata() -> Result<Vec<Value>> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let meta: Value = serde_json::from_slice(&out.stdout)?;
    match meta.get("packages").and_then(Value::as_array) {
        Some(packages) => Ok(packages.clone()),
        None => Err("cargo metadata has no packages".into()),
    }
}

/// Whether a package may be published: `publish` is absent (null) or lists
/// a registry (`publish = false` is an empty list).
fn publishable(package: &Value) -> bool {
    match package.get("publish") {
        None | Some(Value::Null) => true,
        Some(Value::Array(registries)) => !registries.is_empty(),
        Some(_) => false,
    }
}

fn name(package: &Value) -> &str {
    package
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The [`REQUIRED_FIELDS`] a package leaves empty.
fn missing_fields(package: &Value) -> Vec<&'static str> {
    REQUIRED_FIELDS
        .iter()
        .copied()
        .filter(|field| match package.get(*field) {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            Some(_) => false,
        })
        .collect()
}

/// What is wrong with one package's file list (`cargo package --list`):
/// a required file missing, or anything from `tests/` or `target/`.
fn bad_files(list: &str) -> Vec<String> {
    let files: Vec<&str> = list.lines().map(str::trim).collect();
    let mut bad: Vec<String> = REQUIRED_FILES
        .iter()
        .filter(|f| !files.contains(f))
        .map(|f| format!("{f} is missing"))
        .collect();
    bad.extend(
        files
            .iter()
            .filter(|f| f.starts_with("tests/") || f.starts_with("target/"))
            .map(|f| format!("{f} should not be published")),
    );
    bad
}

/// Metadata and file list of every published crate, then `cargo package`
/// of all of them together (each built from its packaged form).
pub fn package() -> Result<()> {
    let packages = metadata()?;
    let published: Vec<&Value> = packages.iter().filter(|p| publishable(p)).collect();
    if published.is_empty() {
        return Err("no publishable crate in the workspace".into());
    }
    let mut problems = Vec::new();
    for package in &published {
        let crate_name = name(package);
        for field in missing_fields(package) {
            problems.push(format!("{crate_name}: `{field}` is not set in Cargo.toml"));
        }
        let out = cargo()
            .args(["package", "--list", "--locked", "--allow-dirty", "-p"])
            .arg(crate_name)
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "cargo package --list -p {crate_name} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let list = String::from_utf8_lossy(&out.stdout);
        eprintln!(
            "xtask: {crate_name}: {} files in the package",
            list.lines().count()
        );
        for bad in bad_files(&list) {
            problems.push(format!("{crate_name}: {bad}"));
        }
    }
    if !problems.is_empty() {
        return Err(format!(
            "the published crates are not ready:\n  {}",
            problems.join("\n  ")
        )
        .into());
    }
    forget_packaged_sources(&published)?;
    // Its own build folder, emptied first: cargo takes a registry crate of
    // the same name and version as unchanged, so builds left by an earlier
    // packaging (in any folder it would reuse) would stand in for the
    // crates as they are now.
    let verify_dir = crate::target_dir().join("package-verify");
    if verify_dir.exists() {
        std::fs::remove_dir_all(&verify_dir)?;
    }
    let mut cmd = cargo();
    // `--allow-dirty`: CI checks the tree it has, committed or not.
    cmd.args(["package", "--locked", "--allow-dirty", "--target-dir"])
        .arg(&verify_dir);
    for package in &published {
        cmd.args(["-p", name(package)]);
    }
    run(&mut cmd)
}

/// Removes what an earlier `cargo package` of these crates left unpacked
/// in cargo's registry cache: cargo verifies each crate against the others'
/// packages through a local registry, and unpacks a `name-version` there
/// only once, so a second run after a change would build against the first
/// run's sources. crates.io's own caches (`index.crates.io-*`) are left.
fn forget_packaged_sources(published: &[&Value]) -> Result<()> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
    let Some(home) = home else {
        return Ok(());
    };
    let stale: Vec<String> = published
        .iter()
        .filter_map(|p| Some(format!("{}-{}", name(p), p.get("version")?.as_str()?)))
        .collect();
    for kind in ["src", "cache"] {
        let Ok(registries) = std::fs::read_dir(home.join("registry").join(kind)) else {
            continue;
        };
        for registry in registries.flatten() {
            if registry
                .file_name()
                .to_string_lossy()
                .starts_with("index.crates.io-")
            {
                continue;
            }
            for entry in stale.iter() {
                for candidate in [entry.clone(), format!("{entry}.crate")] {
                    let path = registry.path().join(&candidate);
                    if path.is_dir() {
                        std::fs::remove_dir_all(&path)?;
                    } else if path.is_file() {
                        std::fs::remove_file(&path)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The toolchain rustup names for a `rust-version` (`1.88` is `1.88.0`).
fn toolchain(rust_version: &str) -> String {
    if rust_version.split('.').count() == 2 {
        format!("{rust_version}.0")
    } else {
        rust_version.to_string()
    }
}

/// The one `rust-version` the workspace's crates declare (those that
/// declare one).
fn declared_rust_version(packages: &[Value]) -> Result<String> {
    let mut versions: Vec<&str> = packages
        .iter()
        .filter_map(|p| p.get("rust_version").and_then(Value::as_str))
        .collect();
    versions.sort_unstable();
    versions.dedup();
    match versions.as_slice() {
        [one] => Ok((*one).to_string()),
        [] => Err("no crate declares a rust-version".into()),
        many => Err(format!("the crates declare different rust-versions: {many:?}").into()),
    }
}

/// Installs the declared minimum Rust (rustup, minimal profile; a no-op
/// once installed) and checks every crate and target with it.
pub fn msrv() -> Result<()> {
    let declared = declared_rust_version(&metadata()?)?;
    let toolchain = toolchain(&declared);
    eprintln!("xtask: rust-version {declared}: installing {toolchain} with rustup if needed");
    run(Command::new("rustup").args([
        "toolchain",
        "install",
        &toolchain,
        "--profile",
        "minimal",
        "--no-self-update",
    ]))
    .map_err(|e| format!("{e} (the minimum Rust version check needs rustup)"))?;
    let mut check = Command::new("rustup");
    check
        .args(["run", &toolchain, "cargo", "check"])
        .args(["--workspace", "--all-targets", "--locked"])
        .current_dir(crate::workspace_root())
        // Ours (`cargo xtask`'s toolchain) would win over the one asked for.
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("RUSTUP_TOOLCHAIN");
    run(&mut check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn publish_false_is_an_empty_list_and_absent_means_crates_io() {
        assert!(publishable(&json!({"name": "a", "publish": null})));
        assert!(publishable(&json!({"name": "a"})));
        assert!(publishable(&json!({"name": "a", "publish": ["crates-io"]})));
        assert!(!publishable(&json!({"name": "a", "publish": []})));
    }

    #[test]
    fn empty_metadata_is_named() {
        let package = json!({
            "description": "x", "license": "MIT", "readme": null,
            "repository": "https://example.org", "documentation": "",
            "keywords": [], "categories": ["a"], "rust_version": "1.88",
        });
        assert_eq!(
            missing_fields(&package),
            ["readme", "documentation", "keywords"]
        );
    }

    #[test]
    fn a_package_needs_its_licenses_and_readme_and_no_tests() {
        let good = "Cargo.toml\nLICENSE-APACHE\nLICENSE-MIT\nREADME.md\nsrc/lib.rs\n";
        assert!(bad_files(good).is_empty());
        let bad = "Cargo.toml\nLICENSE-MIT\nsrc/lib.rs\ntests/gpu.rs\n";
        assert_eq!(
            bad_files(bad),
            [
                "README.md is missing",
                "LICENSE-APACHE is missing",
                "tests/gpu.rs should not be published"
            ]
        );
    }

    #[test]
    fn the_toolchain_of_a_rust_version() {
        assert_eq!(toolchain("1.88"), "1.88.0");
        assert_eq!(toolchain("1.88.1"), "1.88.1");
        let packages = [
            json!({"rust_version": "1.88"}),
            json!({"rust_version": null}),
        ];
        assert_eq!(
            declared_rust_version(&packages).ok().as_deref(),
            Some("1.88")
        );
        let mixed = [
            json!({"rust_version": "1.88"}),
            json!({"rust_version": "1.90"}),
        ];
        assert!(declared_rust_version(&mixed).is_err());
    }

    #[test]
    fn the_workspace_publishes_four_crates_with_their_metadata() {
        let packages = metadata().expect("cargo metadata");
        let mut published: Vec<&str> = packages
            .iter()
            .filter(|p| publishable(p))
            .map(name)
            .collect();
        published.sort_unstable();
        assert_eq!(
            published,
            ["nccl-control", "nccl-dist", "nccl-safe", "nccl-sys"]
        );
        for package in packages.iter().filter(|p| publishable(p)) {
            assert!(missing_fields(package).is_empty(), "{}", name(package));
        }
        assert_eq!(
            declared_rust_version(&packages).ok().as_deref(),
            Some("1.88")
        );
    }
}
