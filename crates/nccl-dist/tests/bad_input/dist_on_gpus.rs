//! nccl-dist's rows on worlds of `n` GPUs driven by one thread: worlds,
//! meshes, the `Communicator` trait's raw pointers, host helpers and the
//! communication stream.

use super::*;

/// Every nccl-dist row that needs a GPU, on `n` of the `gpus` visible
/// (1 or 2).
pub fn rows(n: usize, gpus: usize) {
    let worlds = World::local(n).expect("World::local");
    let w = &worlds[0];
    case(
        "World::local_with",
        "device (twice)",
        World::local_with(&[0, 0], &Config::new()),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::local",
        "device (more than exist)",
        World::local(gpus + 1),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::spawn_local_with",
        "device (does not exist)",
        World::spawn_local_with(&[gpus + 1], &Config::new(), |_| Ok(())),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::spawn_local",
        "device (more than exist)",
        World::spawn_local(gpus + 1, |_| Ok(())),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    // `World::local`'s worlds above live beside this thread-per-GPU
    // world, so its threads' collective release is refused before
    // anything is torn down.
    case(
        "World::release_retired",
        "world (another World lives beside a thread-per-GPU one)",
        World::spawn_local(1, |mut w| w.release_retired()),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    // Refused before the rendezvous (a one-rank world has none anyway).
    let launch = nccl_dist::Launch {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: 1,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        launcher: nccl_dist::Launcher::Explicit,
    };
    case(
        "World::init_with",
        "device (does not exist)",
        World::init_with(launch, &WorldOptions::new().device(gpus)),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    let fresh = UniqueId::new().expect("UniqueId::new");
    case(
        "World::from_unique_id",
        "device (does not exist)",
        World::from_unique_id(&fresh, 0, 1, &WorldOptions::new().device(gpus)),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    // And the way through: a one-rank world from an id made here, on the
    // GPU `rank % gpus` picks.
    let alone = World::from_unique_id(&fresh, 0, 1, &WorldOptions::new()).expect("from_unique_id");
    assert_eq!((alone.rank(), alone.size(), alone.device()), (0, 1, 0));
    assert_eq!(alone.launch().launcher, nccl_dist::Launcher::Explicit);
    assert!(alone.liveness().is_none());
    case(
        "World::newcomer_launch",
        "index (not below count)",
        alone.newcomer_launch(1, 1, &WorldOptions::new()),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    // Recovery needs a liveness channel and a loss; an admission a count.
    case(
        "World::recover",
        "state (no liveness channel)",
        alone.recover(&WorldOptions::new()),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    let keeper = UniqueId::new().expect("UniqueId::new");
    let alone = World::from_unique_id(&keeper, 0, 1, &WorldOptions::new()).expect("from_unique_id");
    case(
        "World::recover_keeping",
        "state (no liveness channel)",
        alone.recover_keeping(&[0], &WorldOptions::new()),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    let again = UniqueId::new().expect("UniqueId::new");
    let alone = World::from_unique_id(&again, 0, 1, &WorldOptions::new()).expect("from_unique_id");
    case(
        "World::admit",
        "count (0)",
        alone.admit(0, &WorldOptions::new()),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "World::nvlink_order",
        "device (more than exist)",
        World::nvlink_order(gpus + 1),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    case(
        "DeviceMesh::new",
        "length (shape vs world)",
        DeviceMesh::new(w, &[("dp", n + 1)]),
        |e| matches!(e, Error::Mesh(MeshError::ShapeMismatch { .. })),
    );
    case(
        "DeviceMesh::new_with",
        "length (shape vs world)",
        DeviceMesh::new_with(w, &[("dp", n * 2)], nccl_dist::Placement::RankOrder),
        |e| matches!(e, Error::Mesh(_)),
    );
    case(
        "DeviceMesh::new_all",
        "rank (worlds out of order)",
        DeviceMesh::new_all(&worlds[..0], &[("dp", 1)], nccl_dist::Placement::RankOrder),
        |e| matches!(e, Error::Mesh(_) | Error::InvalidArgument { .. }),
    );
    let mut meshes =
        DeviceMesh::new_all(&worlds, &[("dp", n)], nccl_dist::Placement::RankOrder).expect("mesh");
    let m = &meshes[0];
    let mbuf = m.comm().stream().alloc_zeros::<f32>(16).unwrap();
    let mut mout = m.comm().stream().alloc_zeros::<f32>(16).unwrap();
    let unknown = |e: &Error| matches!(e, Error::Mesh(MeshError::UnknownAxis(_)));
    case(
        "DeviceMesh::without_replicas",
        "name (no such axis)",
        m.without_replicas("tp", &[0]),
        unknown,
    );
    case(
        "DeviceMesh::without_replicas",
        "rank (outside the world)",
        m.without_replicas("dp", &[n]),
        |e| matches!(e, Error::Mesh(MeshError::RankOutOfRange { .. })),
    );
    case(
        "DeviceMesh::axis",
        "name",
        m.axis("tp").map(|_| ()),
        unknown,
    );
    case("DeviceMesh::size", "name", m.size("tp"), unknown);
    case(
        "DeviceMesh::local_rank",
        "name",
        m.local_rank("tp"),
        unknown,
    );
    case("DeviceMesh::axes_of", "name", m.axes_of("tp"), unknown);
    case(
        "DeviceMesh::slice",
        "name",
        m.slice(&["tp"]).map(|_| ()),
        unknown,
    );
    case(
        "DeviceMesh::all_reduce",
        "name",
        m.all_reduce("tp", &mbuf, &mut mout, ReduceOp::Sum),
        unknown,
    );
    case(
        "DeviceMesh::all_reduce_in_place",
        "name",
        m.all_reduce_in_place("tp", &mut mout, ReduceOp::Sum),
        unknown,
    );
    case(
        "DeviceMesh::broadcast_in_place",
        "name",
        m.broadcast_in_place("tp", &mut mout, 0),
        unknown,
    );
    case(
        "DeviceMesh::all_gather",
        "name",
        m.all_gather("tp", &mbuf, &mut mout),
        unknown,
    );
    case(
        "DeviceMesh::reduce_scatter",
        "name",
        m.reduce_scatter("tp", &mbuf, &mut mout, ReduceOp::Sum),
        unknown,
    );
    case(
        "DeviceMesh::all_to_all",
        "name",
        m.all_to_all("tp", &mbuf, &mut mout),
        unknown,
    );
    case(
        "DeviceMesh::all_gather",
        "length (through the axis)",
        m.all_gather(
            "dp",
            &mbuf,
            &mut m.comm().stream().alloc_zeros::<f32>(1).unwrap(),
        ),
        |e| matches!(e, Error::Nccl(SafeError::Length { .. })),
    );
    let sub = m.slice(&["dp"]).unwrap();
    case("SubMesh::axis", "name", sub.axis("tp").map(|_| ()), unknown);
    case("SubMesh::size", "name", sub.size("tp"), unknown);
    case("SubMesh::local_rank", "name", sub.local_rank("tp"), unknown);
    case(
        "DeviceMesh::flatten",
        "name (taken)",
        meshes[0].flatten(&["dp"], "dp").map(|_| ()),
        |e| matches!(e, Error::Mesh(MeshError::DuplicateAxis(_))),
    );
    case(
        "DeviceMesh::flatten_all",
        "name (unknown)",
        DeviceMesh::flatten_all(&mut meshes, &["tp"], "x"),
        unknown,
    );
    drop(meshes);
    // Communicator: raw pointers that are not device memory of this GPU.
    let host = vec![0f32; 16];
    let dev_buf = w.comm().stream().alloc_zeros::<f32>(16).unwrap();
    let dev_ptr = {
        let (p, _sync) = dev_buf.device_ptr(w.comm().stream());
        p
    };
    let comm: &dyn Communicator = w.comm();
    let not_device = |e: &Error| {
        matches!(
            e,
            Error::Nccl(
                SafeError::InvalidArgument { .. }
                    | SafeError::WrongDevice { .. }
                    | SafeError::Cuda { .. }
            ) | Error::InvalidArgument { .. }
        )
    };
    // SAFETY: each call below is refused before any pointer is used.
    unsafe {
        case(
            "Communicator::all_reduce",
            "device (host pointer)",
            comm.all_reduce(
                host_ptr(&host),
                host_ptr(&host),
                16,
                DType::F32,
                ReduceOp::Sum,
                None,
            ),
            not_device,
        );
        case(
            "Communicator::broadcast",
            "device (host pointer)",
            comm.broadcast(host_ptr(&host), host_ptr(&host), 16, DType::F32, 0, None),
            not_device,
        );
        case(
            "Communicator::reduce",
            "device (host pointer)",
            comm.reduce(
                host_ptr(&host),
                host_ptr(&host),
                16,
                DType::F32,
                ReduceOp::Sum,
                0,
                None,
            ),
            not_device,
        );
        case(
            "Communicator::all_gather",
            "device (host pointer)",
            comm.all_gather(host_ptr(&host), host_ptr(&host), 4, DType::F32, None),
            not_device,
        );
        case(
            "Communicator::reduce_scatter",
            "device (host pointer)",
            comm.reduce_scatter(
                host_ptr(&host),
                host_ptr(&host),
                4,
                DType::F32,
                ReduceOp::Sum,
                None,
            ),
            not_device,
        );
        case(
            "Communicator::all_to_all",
            "device (host pointer)",
            comm.all_to_all(host_ptr(&host), host_ptr(&host), 4, DType::F32, None),
            not_device,
        );
        case(
            "Communicator::send",
            "peer",
            comm.send(dev_ptr, 4, DType::F32, n + 2, None),
            |e| {
                matches!(
                    e,
                    Error::Nccl(SafeError::RankOutOfRange { .. }) | Error::InvalidArgument { .. }
                )
            },
        );
        case(
            "Communicator::recv",
            "peer",
            comm.recv(dev_ptr, 4, DType::F32, n + 2, None),
            |e| {
                matches!(
                    e,
                    Error::Nccl(SafeError::RankOutOfRange { .. }) | Error::InvalidArgument { .. }
                )
            },
        );
        case(
            "Communicator::send_recv",
            "peer",
            comm.send_recv(dev_ptr, 4, n + 2, dev_ptr, 4, 0, DType::F32, None),
            |e| {
                matches!(
                    e,
                    Error::Nccl(SafeError::RankOutOfRange { .. }) | Error::InvalidArgument { .. }
                )
            },
        );
    }
    case(
        "HostCollectives::broadcast_host",
        "root",
        w.comm().broadcast_host(&mut [0f32; 4], n + 1),
        |e| matches!(e, Error::Nccl(SafeError::RankOutOfRange { .. })),
    );
    case(
        "HostCollectives::all_gather_host",
        "group (inside a group)",
        {
            let g = GroupGuard::start().unwrap();
            let r = w.comm().all_gather_host(&[1u8; 4][..]);
            g.end().unwrap();
            r
        },
        |e| matches!(e, Error::Nccl(SafeError::InvalidArgument { .. })),
    );
    case(
        "HostCollectives::all_reduce_host",
        "group (inside a group)",
        {
            let g = GroupGuard::start().unwrap();
            let r = w.comm().all_reduce_host(&mut [1f32; 4], ReduceOp::Sum);
            g.end().unwrap();
            r
        },
        |e| matches!(e, Error::Nccl(SafeError::InvalidArgument { .. })),
    );
    case(
        "Communicator::barrier",
        "group (inside a group)",
        {
            let g = GroupGuard::start().unwrap();
            let r = Communicator::barrier(w.comm());
            g.end().unwrap();
            r
        },
        |e| matches!(e, Error::Nccl(SafeError::InvalidArgument { .. })),
    );
    let _ = CommStream::new(w.comm()).unwrap();
    case(
        "HostCollectives::all_reduce_host",
        "use after abort",
        {
            w.comm().abort_handle().abort().unwrap();
            w.comm().all_reduce_host(&mut [1f32; 4], ReduceOp::Sum)
        },
        |e| matches!(e, Error::Nccl(SafeError::Aborted { .. })),
    );
    drop(worlds);
}
