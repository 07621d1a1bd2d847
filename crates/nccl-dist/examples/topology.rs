//! Prints the peer-to-peer matrix of every visible GPU in the style of
//! `nvidia-smi topo -m`, then its NVLink islands and a ring order for each.
//!
//! ```text
//! cargo run --release -p nccl-dist --example topology
//! ```

use std::process::ExitCode;

use nccl_dist::nccl_safe;
use nccl_dist::placement::Topology;
use nccl_safe::cudarc::driver::CudaContext;

fn main() -> ExitCode {
    // SAFETY: only tries to load libcuda and reports whether it could.
    if !unsafe { nccl_safe::cudarc::driver::sys::is_culib_present() } {
        eprintln!("error: no CUDA driver (libcuda.so) on this machine");
        return ExitCode::FAILURE;
    }
    let count = match CudaContext::device_count() {
        Ok(n) => n as usize,
        Err(e) => {
            eprintln!("error: {e}");
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
