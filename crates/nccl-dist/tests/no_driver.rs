//! On a machine without the CUDA driver, every public entry point that
//! could make a program's first cudarc call answers with an error value
//! (cudarc itself panics there). Runs on any machine; where the driver
//! loads there is nothing to prove and the test says so and returns.

use std::panic::{AssertUnwindSafe, catch_unwind};

use nccl_dist::nccl_safe::{self, Comm, Config, UniqueId};
use nccl_dist::placement::{Gpu, Link, NvmlStatus, Topology};
use nccl_dist::{Launch, World, WorldOptions};

/// Runs `call`, which must return an error and must not panic.
fn refused<T, E: std::fmt::Display>(name: &str, call: impl FnOnce() -> Result<T, E>) {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Err(e)) => println!("{name}: {e}"),
        Ok(Ok(_)) => panic!("{name} succeeded without a CUDA driver"),
        Err(_) => panic!("{name} panicked without a CUDA driver"),
    }
}

fn two_linked_gpus() -> Topology {
    let gpus = (0..2)
        .map(|ordinal| Gpu {
            ordinal,
            pci_bus_id: format!("0000:{ordinal:02x}:00.0"),
        })
        .collect();
    let link = Link {
        peer_access: true,
        performance_rank: Some(0),
        native_atomics: false,
        nvlinks: None,
        pcie: None,
    };
    let links = vec![vec![link; 2]; 2];
    Topology::from_links(gpus, links, NvmlStatus::Missing("test".into())).expect("2 x 2 links")
}

#[test]
fn without_a_cuda_driver_every_entry_point_is_an_error_not_a_panic() {
    if nccl_safe::require_cuda_driver().is_ok() {
        println!("the CUDA driver loads here: nothing to prove");
        return;
    }
    let id = UniqueId::from_bytes([7; 128]);
    refused("Comm::init_rank", || {
        Comm::init_rank(&id, 0, 1, 0, &Config::new())
    });
    refused("Comm::init_rank_scalable", || {
        Comm::init_rank_scalable(std::slice::from_ref(&id), 0, 1, 0, &Config::new())
    });
    refused("Comm::init_all", || Comm::init_all(&[0], &Config::new()));
    refused("World::local", || World::local(1));
    refused("World::local_with", || {
        World::local_with(&[0], &Config::new())
    });
    refused("World::spawn_local", || {
        World::spawn_local(1, |_| Ok::<_, nccl_dist::Error>(()))
    });
    // The caller's own error type: ours converts into it.
    refused("World::spawn_local (boxed error)", || {
        World::spawn_local(
            1,
            |_| -> Result<(), Box<dyn std::error::Error + Send + Sync>> { Ok(()) },
        )
    });
    refused("World::spawn_local_with", || {
        World::spawn_local_with(&[0], &Config::new(), |_| Ok::<_, nccl_dist::Error>(()))
    });
    refused("World::spawn_local_with_options", || {
        World::spawn_local_with_options(&[0], &WorldOptions::new(), |_| {
            Ok::<_, nccl_dist::Error>(())
        })
    });
    refused("World::init_with", || {
        let launch = Launch::explicit(0, 1, 0, 1, "127.0.0.1", 29500).expect("launch");
        World::init_with(launch, &WorldOptions::new())
    });
    refused("World::nvlink_order", || World::nvlink_order(1));
    refused("Topology::probe", || Topology::probe(&[0]));
    refused("Topology::enable_peer_access", || {
        two_linked_gpus().enable_peer_access(0, 1)
    });
}
