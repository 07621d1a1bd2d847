//! GPU tests of the topology probe and peer copies, run by
//! `cargo xtask gpu-test` (once per world size: no communicator, so no
//! launch mode).

use std::time::Duration;

use nccl_dist::nccl_safe::cudarc::driver::CudaContext;
use nccl_dist::placement::{NvmlStatus, Topology};
use nccl_safe::copy_peer;

fn world() -> usize {
    let visible = CudaContext::device_count().unwrap_or(0) as usize;
    let wanted = std::env::var("NCCL_SAFE_TEST_WORLD")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(visible);
    assert!(
        wanted >= 1 && wanted <= visible,
        "asked for {wanted} GPUs, {visible} visible"
    );
    wanted
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn topology_is_symmetric_complete_and_one_nvlink_island() {
    let devices: Vec<usize> = (0..world()).collect();
    let topo = Topology::probe(&devices).expect("probe");
    print!("{}", topo.render());
    assert_eq!(
        topo.nvml(),
        &NvmlStatus::Available,
        "NVML should load on the GPU host"
    );
    for i in 0..devices.len() {
        for j in 0..devices.len() {
            if i == j {
                continue;
            }
            let (a, b) = (
                topo.link(i, j).expect("link"),
                topo.link(j, i).expect("link"),
            );
            assert!(
                a.peer_access && b.peer_access,
                "GPU{i}<->GPU{j} peer access"
            );
            assert!(
                a.performance_rank.is_some(),
                "GPU{i}->GPU{j} performance rank"
            );
            assert_eq!(
                a.nvlinks, b.nvlinks,
                "NVLink count GPU{i}<->GPU{j} must be symmetric"
            );
            assert!(a.nvlinks.unwrap_or(0) > 0, "GPU{i}->GPU{j} has no NVLink");
            assert_eq!(
                a.pcie, b.pcie,
                "PCIe level GPU{i}<->GPU{j} must be symmetric"
            );
        }
    }
    let islands = topo.islands();
    for island in &islands {
        println!("island: {island}; ring order {:?}", topo.ring_order(island));
    }
    assert_eq!(islands.len(), 1, "{islands:?}");
    assert_eq!(islands[0].devices, devices);
    assert_eq!(topo.ring_order(&islands[0]).len(), devices.len());
    // Enabling twice is fine.
    for &i in &devices {
        for &j in &devices {
            topo.enable_peer_access(i, j).expect("enable");
            topo.enable_peer_access(i, j).expect("enable again");
        }
    }
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn topology_peer_copies_of_1_gib_are_bit_exact_between_every_ordered_pair() {
    const WORDS: usize = (1 << 30) / 4;
    let devices: Vec<usize> = (0..world()).collect();
    let topo = Topology::probe(&devices).expect("probe");
    let streams: Vec<_> = devices
        .iter()
        .map(|&d| {
            CudaContext::new(d)
                .and_then(|c| c.new_stream())
                .expect("stream")
        })
        .collect();
    // A pattern that differs per source GPU and per word.
    let pattern = |src: usize| -> Vec<u32> {
        (0..WORDS as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ ((src as u32) << 28))
            .collect()
    };
    let mut sources = Vec::new();
    for (i, s) in streams.iter().enumerate() {
        sources.push(s.clone_htod(&pattern(i)).expect("1 GiB source"));
    }
    let mut dests: Vec<_> = streams
        .iter()
        .map(|s| s.alloc_zeros::<u32>(WORDS).expect("1 GiB destination"))
        .collect();
    for &i in &devices {
        for &j in &devices {
            topo.enable_peer_access(j, i).expect("peer access");
        }
    }
    println!("1 GiB peer copies (link figure where NVML reports it: n x 26.6 GB/s per direction)");
    for i in 0..devices.len() {
        let want = pattern(i);
        for j in 0..devices.len() {
            if i == j {
                continue;
            }
            // Warm up, then time one copy with events on the destination stream.
            copy_peer(&sources[i], &streams[i], &mut dests[j], &streams[j]).expect("copy");
            let start = streams[j]
                .record_event(Some(
                    nccl_safe::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT,
                ))
                .expect("event");
            copy_peer(&sources[i], &streams[i], &mut dests[j], &streams[j]).expect("copy");
            let end = streams[j]
                .record_event(Some(
                    nccl_safe::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT,
                ))
                .expect("event");
            end.synchronize().expect("sync");
            let ms = start.elapsed_ms(&end).expect("elapsed");
            let gbps = (1u64 << 30) as f64 / (f64::from(ms) / 1e3) / 1e9;
            let links = topo.link(i, j).and_then(|l| l.nvlinks).unwrap_or(0);
            println!(
                "GPU{i} -> GPU{j}: {gbps:7.1} GB/s in {:?}; NVLinks {links} (link figure {:.1} GB/s)",
                Duration::from_secs_f64(f64::from(ms) / 1e3),
                f64::from(links) * 26.6
            );
            let got = streams[j].clone_dtoh(&dests[j]).expect("read back");
            assert!(
                got == want,
                "GPU{i} -> GPU{j}: copy differs from the source"
            );
            streams[j].memset_zeros(&mut dests[j]).expect("clear");
        }
    }
}
