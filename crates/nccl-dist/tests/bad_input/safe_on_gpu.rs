//! nccl-safe's rows on a communicator of one rank on GPU 0 (and a second
//! GPU where there is one): lengths, aliasing, devices, group misuse,
//! split/shrink/grow, use after abort and after finalize.

use super::*;

/// Every nccl-safe row that needs a GPU; `n` of the `gpus` visible
/// may be used (1 or 2).
pub fn rows(n: usize, gpus: usize) {
    let comms = Comm::init_all(&[0], &Config::new()).expect("init_all");
    let c = &comms[0];
    let s = c.stream();
    let send = s.alloc_zeros::<f32>(16).unwrap();
    let mut short: CudaSlice<f32> = s.alloc_zeros::<f32>(8).unwrap();
    let mut out = s.alloc_zeros::<f32>(16).unwrap();
    let is_len = |e: &SafeError| matches!(e, SafeError::Length { .. });
    let is_rank = |e: &SafeError| matches!(e, SafeError::RankOutOfRange { .. });
    let is_alias = |e: &SafeError| matches!(e, SafeError::PartialAlias { .. });
    case(
        "OnStream::all_reduce",
        "length",
        c.all_reduce(&send, &mut short, ReduceOp::Sum),
        is_len,
    );
    case(
        "OnStream::reduce",
        "length",
        c.reduce(&send, Some(&mut short), ReduceOp::Sum, 0),
        is_len,
    );
    case(
        "OnStream::reduce",
        "root",
        c.reduce(&send, Some(&mut out), ReduceOp::Sum, 1),
        is_rank,
    );
    case(
        "OnStream::reduce_in_place",
        "root",
        c.reduce_in_place(&mut out, ReduceOp::Sum, 1),
        is_rank,
    );
    case(
        "OnStream::reduce_scatter",
        "length",
        c.reduce_scatter(&short, &mut s.alloc_zeros::<f32>(9).unwrap(), ReduceOp::Sum),
        |e| {
            matches!(
                e,
                SafeError::Length { .. } | SafeError::InvalidArgument { .. }
            )
        },
    );
    case(
        "OnStream::broadcast",
        "root",
        c.broadcast(Some(&send), &mut out, 1),
        is_rank,
    );
    case(
        "OnStream::broadcast",
        "length",
        c.broadcast(Some(&short), &mut out, 0),
        is_len,
    );
    case(
        "OnStream::broadcast_in_place",
        "root",
        c.broadcast_in_place(&mut out, 1),
        is_rank,
    );
    case(
        "OnStream::all_gather",
        "length",
        c.all_gather(&send, &mut short),
        is_len,
    );
    case(
        "OnStream::all_to_all",
        "length",
        c.all_to_all(&send, &mut short),
        is_len,
    );
    case(
        "OnStream::all_to_all_v",
        "length (counts per rank)",
        c.all_to_all_v(&send, &[1, 1], &[0, 1], &mut out, &[1], &[0]),
        |e| {
            matches!(
                e,
                SafeError::InvalidArgument { .. } | SafeError::Length { .. }
            )
        },
    );
    case(
        "OnStream::all_to_all_v",
        "length (segment outside)",
        c.all_to_all_v(&send, &[4], &[14], &mut out, &[4], &[0]),
        |e| {
            matches!(
                e,
                SafeError::Length { .. } | SafeError::InvalidArgument { .. }
            )
        },
    );
    case(
        "OnStream::gather",
        "root",
        c.gather(&send, Some(&mut out), 1),
        is_rank,
    );
    case(
        "OnStream::gather",
        "length",
        c.gather(&send, Some(&mut short), 0),
        is_len,
    );
    case(
        "OnStream::gather_in_place",
        "root",
        c.gather_in_place(&mut out, 1),
        is_rank,
    );
    case(
        "OnStream::scatter",
        "root",
        c.scatter(Some(&send), &mut out, 1),
        is_rank,
    );
    case(
        "OnStream::scatter",
        "length",
        c.scatter(Some(&short), &mut out, 0),
        is_len,
    );
    case(
        "OnStream::scatter_in_place",
        "root",
        c.scatter_in_place(&mut out, 1),
        is_rank,
    );
    case("OnStream::send", "peer", c.send(&send, 1), is_rank);
    case("OnStream::recv", "peer", c.recv(&mut out, 1), is_rank);
    case(
        "OnStream::all_reduce_in_place",
        "dtype (fp8 Avg on one rank)",
        {
            let mut f8 = s.alloc_zeros::<float8::F8E4M3>(4).unwrap();
            c.all_reduce_in_place(&mut f8, ReduceOp::Avg)
        },
        |e| matches!(e, SafeError::Unsupported { .. }),
    );
    // Aliasing: send is recv shifted by one element.
    {
        let (base, _sync) = send.device_ptr(s);
        let a = unsafe_view(base, 8, 0);
        let mut b = unsafe_view(base + 4, 8, 0);
        case(
            "OnStream::all_reduce",
            "aliasing",
            c.all_reduce(&a, &mut b, ReduceOp::Sum),
            is_alias,
        );
        // A length whose size in bytes overflows: refused before
        // ncclCommRegister sees the pointer.
        case(
            "Registration::new",
            "length (size in bytes overflows)",
            Registration::new(c, unsafe_view(base, usize::MAX / 2, 0)).map(|_| ()),
            |e| {
                matches!(
                    e,
                    SafeError::Overflow { .. } | SafeError::Unsupported { .. }
                )
            },
        );
    }
    // Device: a stream or buffer of another GPU.
    if n > 1 {
        let other = CudaContext::new(1).unwrap();
        let foreign = other.default_stream().alloc_zeros::<f32>(16).unwrap();
        case(
            "OnStream::all_reduce",
            "device (buffer)",
            c.all_reduce(&foreign, &mut out, ReduceOp::Sum),
            |e| {
                matches!(
                    e,
                    SafeError::WrongDevice {
                        role: Role::Send,
                        ..
                    }
                )
            },
        );
        let stream1 = other.new_stream().unwrap();
        let mut foreign_mut = other.default_stream().alloc_zeros::<f32>(16).unwrap();
        case(
            "OnStream::reduce_scatter_in_place",
            "device (buffer)",
            c.reduce_scatter_in_place(&mut foreign_mut, ReduceOp::Sum),
            |e| matches!(e, SafeError::WrongDevice { .. }),
        );
        case(
            "OnStream::all_gather_in_place",
            "device (buffer)",
            c.all_gather_in_place(&mut foreign_mut),
            |e| matches!(e, SafeError::WrongDevice { .. }),
        );
        case(
            "Comm::on",
            "device (stream)",
            c.on(&stream1).all_reduce_in_place(&mut out, ReduceOp::Sum),
            |e| {
                matches!(
                    e,
                    SafeError::WrongDevice {
                        role: Role::Stream,
                        ..
                    }
                )
            },
        );
        case(
            "Comm::synchronize",
            "device (stream)",
            c.synchronize(&stream1),
            |e| matches!(e, SafeError::WrongDevice { .. }),
        );
        case(
            "nccl_dist::synchronize",
            "device (stream)",
            nccl_dist::synchronize(c, &stream1),
            |e| matches!(e, Error::Nccl(SafeError::WrongDevice { .. })),
        );
        case(
            "nccl_safe::copy_peer_async",
            "length",
            nccl_safe::copy_peer_async(
                &send,
                s,
                &mut other.default_stream().alloc_zeros::<f32>(4).unwrap(),
                &other.default_stream(),
            ),
            |e| {
                matches!(
                    e,
                    SafeError::Length { .. } | SafeError::InvalidArgument { .. }
                )
            },
        );
        case(
            "nccl_safe::copy_peer",
            "length",
            nccl_safe::copy_peer(
                &send,
                s,
                &mut other.default_stream().alloc_zeros::<f32>(4).unwrap(),
                &other.default_stream(),
            ),
            |e| {
                matches!(
                    e,
                    SafeError::Length { .. } | SafeError::InvalidArgument { .. }
                )
            },
        );
    }
    // Group misuse and the closure form.
    let g = GroupGuard::start().unwrap();
    let direct = c.all_reduce_in_place(&mut out, ReduceOp::Sum);
    let abort_in_group = c.abort_handle().abort();
    let split_in_group = c.split(Some(0), 0, None);
    let share_in_group = c.share().map(drop);
    // SAFETY: the closure does nothing; the call is refused (open group).
    let raw_in_group = unsafe { c.with_raw(|_| ()) };
    g.end().unwrap();
    case(
        "OnStream::all_reduce_in_place",
        "group (direct call inside a group)",
        direct,
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "AbortHandle::abort",
        "group (inside a group)",
        abort_in_group,
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::split",
        "group (inside a group)",
        split_in_group,
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::share",
        "group (inside a group)",
        share_in_group,
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::with_raw",
        "group (inside a group)",
        raw_in_group,
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "GroupGuard::end",
        "group (an error inside is returned by end)",
        {
            let g = GroupGuard::start().unwrap();
            let r = g.on(c).send(&send, 5);
            g.end().and(r)
        },
        is_rank,
    );
    case(
        "NestedGroup::end",
        "group (an error inside)",
        {
            let g = GroupGuard::start().unwrap();
            let inner = g.nest().unwrap();
            let r = inner.on(c).recv(&mut out, 5);
            let e = inner.end();
            g.end().and(e).and(r)
        },
        is_rank,
    );
    // Split, shrink, grow, PreMulSum, memory.
    case(
        "Comm::split_all",
        "length (keys)",
        Comm::split_all(&[c], &[Some(0)], &[], None),
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::shrink",
        "rank (excluded rank out of range)",
        c.shrink(&[3], false, None),
        |e| {
            matches!(
                e,
                SafeError::RankOutOfRange { .. } | SafeError::Unsupported { .. }
            )
        },
    );
    case(
        "Comm::shrink",
        "rank (nothing excluded)",
        c.shrink(&[], false, None),
        |e| {
            matches!(
                e,
                SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
            )
        },
    );
    case(
        "Comm::shrink_parked",
        "state (blocking, and never parked)",
        c.shrink_parked(&[1], &Config::new()),
        |e| matches!(e, SafeError::InvalidArgument { .. }),
    );
    case(
        "Comm::grow",
        "length (not larger)",
        c.grow(1, None, None),
        |e| {
            matches!(
                e,
                SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
            )
        },
    );
    case(
        "PreMulSum::device",
        "length (scalar buffer empty)",
        PreMulSum::device(c, &s.alloc_zeros::<f32>(0).unwrap()).map(|_| ()),
        |e| {
            matches!(
                e,
                SafeError::Length { .. } | SafeError::InvalidArgument { .. }
            )
        },
    );
    if n > 1 {
        let other = Comm::init_all(&[1], &Config::new()).unwrap();
        let p = PreMulSum::host(&other[0], 2.0f32).unwrap();
        case(
            "PreMulSum::host",
            "device (op of another communicator)",
            c.all_reduce_in_place(&mut out, &p),
            |e| matches!(e, SafeError::InvalidArgument { .. }),
        );
        let foreign = CudaContext::new(1)
            .unwrap()
            .default_stream()
            .alloc_zeros::<f32>(1)
            .unwrap();
        case(
            "PreMulSum::device",
            "device (scalar on another GPU)",
            PreMulSum::device(c, &foreign).map(|_| ()),
            |e| {
                matches!(
                    e,
                    SafeError::WrongDevice { .. } | SafeError::InvalidArgument { .. }
                )
            },
        );
        case(
            "Registration::new",
            "device (buffer on another GPU)",
            Registration::new(c, foreign.clone()).map(|_| ()),
            |e| matches!(e, SafeError::WrongDevice { .. }),
        );
        case(
            "Window::register",
            "device (buffer on another GPU)",
            Window::register(c, foreign.clone(), 0).map(|_| ()),
            |e| {
                matches!(
                    e,
                    SafeError::WrongDevice { .. } | SafeError::Unsupported { .. }
                )
            },
        );
        case(
            "Window::register_all",
            "length (buffers vs comms)",
            Window::register_all(&[c], Vec::<CudaSlice<f32>>::new(), 0).map(|_| ()),
            |e| {
                matches!(
                    e,
                    SafeError::InvalidArgument { .. } | SafeError::Unsupported { .. }
                )
            },
        );
        let topo = Topology::probe(&[0, 1]).unwrap();
        case(
            "Topology::enable_peer_access",
            "device (unknown)",
            topo.enable_peer_access(0, 7),
            |e| {
                matches!(
                    e,
                    SafeError::InvalidArgument { .. }
                        | SafeError::RankOutOfRange { .. }
                        | SafeError::Cuda { .. }
                )
            },
        );
    }
    case(
        "Topology::probe",
        "device (does not exist)",
        Topology::probe(&[gpus + 3]),
        |e| {
            matches!(
                e,
                SafeError::Cuda { .. } | SafeError::InvalidArgument { .. }
            )
        },
    );
    case(
        "NcclMemory::alloc",
        "length (overflow)",
        NcclMemory::<f32>::alloc(c, usize::MAX / 2).map(|_| ()),
        |e| {
            matches!(
                e,
                SafeError::Overflow { .. }
                    | SafeError::InvalidArgument { .. }
                    | SafeError::Nccl { .. }
            )
        },
    );
    // Use after abort: every later call is Aborted, the handle too.
    let handle = c.abort_handle();
    handle.abort().unwrap();
    case(
        "Comm::status",
        "use after abort",
        c.status().map(|_| ()),
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    case(
        "AbortHandle::status",
        "use after abort",
        handle.status().map(|_| ()),
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    case(
        "OnStream::all_reduce_in_place",
        "use after abort",
        c.all_reduce_in_place(&mut out, ReduceOp::Sum),
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    case(
        "Comm::with_raw",
        "use after abort",
        // SAFETY: the closure does nothing; the call is refused (aborted).
        unsafe { c.with_raw(|_| ()) },
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    case(
        "Comm::split",
        "use after abort",
        c.split(Some(0), 0, None),
        |e| matches!(e, SafeError::Aborted { .. }),
    );
    case("Comm::share", "use after abort", c.share().map(drop), |e| {
        matches!(e, SafeError::Aborted { .. })
    });
    // Unsupported on a library without them (2.28 lacks grow), else
    // refused as aborted.
    let aborted_or_missing =
        |e: &SafeError| matches!(e, SafeError::Aborted { .. } | SafeError::Unsupported { .. });
    case(
        "Comm::grow_id",
        "use after abort / version",
        c.grow_id().map(|_| ()),
        aborted_or_missing,
    );
    case(
        "Comm::revoke",
        "use after abort / version",
        c.revoke(),
        aborted_or_missing,
    );
    if !c.capabilities().has(nccl_safe::Feature::Encryption) {
        case(
            "nccl_safe::set_encryption",
            "version",
            nccl_safe::set_encryption(&Encryption::Plaintext),
            |e| matches!(e, SafeError::Unsupported { .. }),
        );
    }
    drop(comms);
    // Use after finalize: the handle outlives its communicator.
    // (A communicator of its own: one made with others by init_all is
    // torn down with them, when the last goes.)
    let alone = Comm::init_rank(&UniqueId::new().unwrap(), 0, 1, 0, &Config::new()).unwrap();
    let handle = alone.abort_handle();
    alone.destroy().unwrap();
    case(
        "AbortHandle::status",
        "use after finalize",
        handle.status().map(|_| ()),
        |e| matches!(e, SafeError::Finalized { .. }),
    );
    // finalize/destroy/abort take self: a second call does not compile.
    SEEN.lock().unwrap().insert((
        "Comm::finalize".into(),
        "use after finalize (compile time)".into(),
    ));
    SEEN.lock().unwrap().insert((
        "Comm::destroy".into(),
        "use after finalize (compile time)".into(),
    ));
    SEEN.lock().unwrap().insert((
        "Comm::abort".into(),
        "use after abort (compile time)".into(),
    ));
}
