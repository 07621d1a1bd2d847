//! `cargo xtask test`: everything a fresh machine needs, then every test.
//!
//! 1. fetches the pinned NCCL wheels into `target/nccl/<version>` (pip);
//! 2. runs `cargo test --workspace` with `NCCL_SYS_PINNED` pointing there
//!    and `NCCL_LIBRARY` at the newest pinned library (unless set);
//! 3. runs the GPU test matrix (`cargo xtask gpu-test`) when `nvidia-smi`
//!    sees GPUs.

use crate::{Result, cargo, fetch, gpu_count, pins, run};

pub fn run_tests() -> Result<()> {
    fetch::all_nccl()?;
    let pinned = fetch::nccl_root();
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--all-targets"])
        .env("NCCL_SYS_PINNED", &pinned);
    let mut doc = cargo();
    doc.args(["test", "--workspace", "--doc"])
        .env("NCCL_SYS_PINNED", &pinned);
    if std::env::var_os("NCCL_LIBRARY").is_none() {
        let newest = fetch::nccl_dir(pins::NEWEST).join("lib/libnccl.so.2");
        cmd.env("NCCL_LIBRARY", &newest);
        doc.env("NCCL_LIBRARY", &newest);
    }
    run(&mut cmd)?;
    run(&mut doc)?;
    match gpu_count() {
        0 => {
            eprintln!("xtask: no GPUs visible: CPU tests only (GPU tests: `cargo xtask gpu-test`)");
            Ok(())
        }
        n => {
            eprintln!("xtask: {n} GPU(s) visible: running the GPU test matrix");
            crate::gpu_test::run(&[])
        }
    }
}
