//! Prints the peer-to-peer matrix of every visible GPU in the style of
//! `nvidia-smi topo -m`, then its NVLink islands and a ring order for each.
//!
//! ```text
//! cargo run --release -p nccl-dist --example topology
//! ```

use std::process::ExitCode;

use nccl_dist::nccl_safe;
use nccl_dist::placement::Topology;

fn main() -> ExitCode {
    // cudarc panics on any call without the driver: ask first.
    let count = match nccl_safe::require_gpus() {
        Ok(n) => n,
        Err(e) => {
            eprintln!(
                "topology needs an NVIDIA GPU and its driver, and found none: {e}. \
                 Without a GPU, `cargo run -p nccl-sys --example nccl_info` still shows \
                 which libnccl loads; docs/troubleshooting.md says more."
            );
            return ExitCode::FAILURE;
        }
    };
    let devices: Vec<usize> = (0..count).collect();
    let topo = match Topology::probe(&devices) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", topo.render());
    println!();
    for (i, island) in topo.islands().iter().enumerate() {
        println!(
            "island {i}: {island}; ring order {:?}",
            topo.ring_order(island)
        );
    }
    ExitCode::SUCCESS
}
