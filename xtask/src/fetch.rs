//! Fetching pinned wheels with pip into `target/` and unpacking the parts
//! we use. Every step is idempotent: a finished unpack leaves a marker and
//! is not repeated.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::pins::{self, NcclPin};
use crate::{Result, run, workspace_root};

/// `target/nccl`: one directory per pinned release, each with
/// `include/nccl.h` and `lib/libnccl.so.2`.
pub fn nccl_root() -> PathBuf {
    workspace_root().join("target").join("nccl")
}

/// The directory of one pinned release.
pub fn nccl_dir(version: &str) -> PathBuf {
    nccl_root().join(version)
}

/// The Python interpreter to run pip with (`PYTHON`, else `python3`).
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Makes sure `target/nccl/<version>` holds the header and the library.
pub fn nccl(pin: &NcclPin) -> Result<PathBuf> {
    let dir = nccl_dir(pin.version);
    let marker = dir.join(".complete");
    if marker.exists() {
        return Ok(dir);
    }
    eprintln!(
        "xtask: fetching {}=={} ({})",
        pin.package, pin.version, pin.why
    );
    let downloads = nccl_root().join("wheels");
    let wheel = download(pin.package, pin.version, &downloads)?;
    eprintln!("xtask: unpacking {}", wheel.display());
    unpack(
        &wheel,
        &[
            (
                "nvidia/nccl/include/nccl.h",
                &dir.join("include").join("nccl.h"),
            ),
            (
                "nvidia/nccl/lib/libnccl.so.2",
                &dir.join("lib").join("libnccl.so.2"),
            ),
        ],
    )?;
    std::fs::remove_file(&wheel)?;
    std::fs::write(&marker, format!("{}=={}\n", pin.package, pin.version))?;
    Ok(dir)
}

/// Fetches every pinned NCCL release.
pub fn all_nccl() -> Result<()> {
    for pin in pins::NCCL {
        nccl(pin)?;
    }
    Ok(())
}

/// Fetches only the newest pinned NCCL (the README's quick start) and
/// prints the `NCCL_LIBRARY` setting that loads it (a shell `export`).
pub fn newest() -> Result<()> {
    let pin = pins::NCCL
        .iter()
        .find(|p| p.version == pins::NEWEST)
        .ok_or("pins::NEWEST is not one of pins::NCCL")?;
    let lib = nccl(pin)?.join("lib").join("libnccl.so.2");
    eprintln!("xtask: NCCL {} is in {}", pin.version, lib.display());
    // On stdout alone, for `eval "$(cargo xtask fetch --newest)"`.
    println!("export NCCL_LIBRARY={}", lib.display());
    Ok(())
}

/// Makes sure the pinned libclang is in `target/libclang` and returns the
/// directory that holds `libclang.so`.
pub fn libclang() -> Result<PathBuf> {
    let (package, version) = pins::LIBCLANG;
    let dir = workspace_root()
        .join("target")
        .join("libclang")
        .join(version);
    let marker = dir.join(".complete");
    if marker.exists() {
        return Ok(dir);
    }
    eprintln!("xtask: fetching {package}=={version} for bindgen");
    let downloads = workspace_root()
        .join("target")
        .join("libclang")
        .join("wheels");
    let wheel = download(package, version, &downloads)?;
    unpack(
        &wheel,
        &[("clang/native/libclang.so", &dir.join("libclang.so"))],
    )?;
    std::fs::remove_file(&wheel)?;
    std::fs::write(&marker, format!("{package}=={version}\n"))?;
    Ok(dir)
}

/// Makes sure `target/nvrtc/<version>/libnvrtc.so.12` (and its builtins)
/// exist; returns the library's path.
pub fn nvrtc() -> Result<PathBuf> {
    let (package, version) = pins::NVRTC;
    let dir = workspace_root().join("target").join("nvrtc").join(version);
    let lib = dir.join("libnvrtc.so.12");
    let marker = dir.join(".complete");
    if marker.exists() {
        return Ok(lib);
    }
    eprintln!("xtask: fetching {package}=={version} for the kernels");
    let downloads = dir.join("wheels");
    let wheel = download(package, version, &downloads)?;
    unpack(
        &wheel,
        &[
            ("nvidia/cuda_nvrtc/lib/libnvrtc.so.12", &lib),
            (
                "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.4",
                &dir.join("libnvrtc-builtins.so.12.4"),
            ),
        ],
    )?;
    std::fs::remove_file(&wheel)?;
    std::fs::write(&marker, format!("{package}=={version}\n"))?;
    Ok(lib)
}

/// `pip download` of one wheel; returns its path.
fn download(package: &str, version: &str, into: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(into)?;
    let spec = format!("{package}=={version}");
    // pip's progress goes to stderr: stdout is kept for what a command
    // prints on purpose (`fetch --newest`'s `export` line).
    run(Command::new(python())
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["--disable-pip-version-check", "--progress-bar", "off", "-d"])
        .arg(into)
        .arg(&spec)
        .stdout(std::io::stderr()))?;
    let prefix = format!("{}-{version}-", package.replace('-', "_"));
    for entry in std::fs::read_dir(into)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(path);
        }
    }
    Err(format!(
        "pip reported success but no {prefix}*.whl is in {}",
        into.display()
    )
    .into())
}

/// Extracts single members of a wheel (a zip file) to the given paths,
/// through Python's zipfile so that no unzip tool is needed.
fn unpack(wheel: &Path, members: &[(&str, &Path)]) -> Result<()> {
    // Members are matched by path suffix: wheels may nest them under
    // `<name>.data/platlib/`.
    const SCRIPT: &str = "import shutil, sys, zipfile\n\
        z = zipfile.ZipFile(sys.argv[1])\n\
        names = z.namelist()\n\
        args = sys.argv[2:]\n\
        for member, dest in zip(args[0::2], args[1::2]):\n\
        \x20   found = [n for n in names if n == member or n.endswith('/' + member)]\n\
        \x20   if len(found) != 1: sys.exit('%s: %d members match %s' % (sys.argv[1], len(found), member))\n\
        \x20   with z.open(found[0]) as src, open(dest, 'wb') as out:\n\
        \x20       shutil.copyfileobj(src, out, 1 << 20)\n";
    let mut cmd = Command::new(python());
    cmd.args(["-c", SCRIPT]).arg(wheel);
    for (member, dest) in members {
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        cmd.arg(member).arg(dest);
    }
    run(cmd.stdout(std::io::stderr()))
}
