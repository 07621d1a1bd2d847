//! GPU tests of `nccl-dist`: worlds, meshes, the `Communicator` trait, host
//! helpers and the communication stream, in every launch mode.
//!
//! Ignored by default; `cargo xtask gpu-test` runs each one per world size
//! and launch mode (`NCCL_SAFE_TEST_WORLD`, `NCCL_SAFE_TEST_MODE`):
//!
//! - `single`: one thread drives every GPU ([`World::local`]);
//! - `threads`: a thread per GPU ([`World::spawn_local`]);
//! - `processes`: xtask starts a process per rank with the torchrun
//!   variables and a fresh `NCCL_RS_SECRET`; each calls [`World::init`].
//!
//! Values are small integers, exact in every type used, so every check is
//! bit-exact.

use nccl_dist::nccl_safe::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use nccl_dist::nccl_safe::{Comm, ReduceOp, group};
use nccl_dist::{
    CommStream, Communicator, DType, DeviceMesh, Error, HostCollectives, MeshError, Placement,
    World,
};
use nccl_testkit::{Mode, TestResult, TestType, mode, world};

/// Runs `body` with the worlds this thread drives: all of them in `single`
/// mode, its own in the other two.
fn run(body: impl Fn(&mut [World]) -> TestResult + Sync) {
    run_owned(|mut worlds| body(&mut worlds));
}

/// As [`run`], handing the worlds over (for calls that keep them).
fn run_owned(body: impl Fn(Vec<World>) -> TestResult + Sync) {
    let n = world();
    let m = mode();
    let outcome: TestResult = match m {
        Mode::Single => World::local(n).map_err(Into::into).and_then(&body),
        Mode::Threads => World::spawn_local(n, |w| {
            let rank = w.rank();
            body(vec![w]).map_err(|e| {
                // Said at once: the other ranks may now wait for this one
                // until the cell's deadline.
                eprintln!("rank {rank} failed: {e}");
                Error::InvalidArgument {
                    op: "test",
                    reason: e.to_string(),
                }
            })
        })
        .map(drop)
        .map_err(Into::into),
        Mode::Processes => World::init().map_err(Into::into).and_then(|w| {
            assert_eq!(w.size(), n, "WORLD_SIZE");
            body(vec![w])
        }),
    };
    if let Err(e) = outcome {
        panic!("{m:?} mode, world {n}: {e}");
    }
}

/// Runs `f` once per world, on a thread each when this thread drives
/// several: for the blocking, per-communicator APIs (host helpers, the
/// `Communicator` trait), which NCCL lets other threads use one at a time.
fn per_world(worlds: &mut [World], f: impl Fn(&World) -> TestResult + Sync) -> TestResult {
    if worlds.len() == 1 {
        return f(&worlds[0]);
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = worlds.iter_mut().map(|w| s.spawn(move || f(w))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a rank's thread panicked".into()))
            })
            .collect::<TestResult<Vec<()>>>()
            .map(drop)
    })
}

/// Rank `r`'s test value at index `i`: `(r + 1) * (i % 3 + 1)`.
fn value(r: usize, i: usize) -> f64 {
    ((r + 1) * (i % 3 + 1)) as f64
}

fn values<T: TestType>(r: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| T::from_f64(value(r, i))).collect()
}

/// The sum over `ranks` of their values.
fn sum_of<T: TestType>(ranks: &[usize], len: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f64(ranks.iter().map(|&r| value(r, i)).sum()))
        .collect()
}

fn upload<T: TestType>(comm: &Comm, data: &[T]) -> TestResult<CudaSlice<T>> {
    Ok(comm.stream().clone_htod(data)?)
}

fn download<T: TestType>(comm: &Comm, buf: &CudaSlice<T>) -> TestResult<Vec<T>> {
    comm.synchronize(comm.stream())?;
    Ok(comm.stream().clone_dtoh(buf)?)
}

/// Meshes over the worlds this thread drives.
fn meshes(
    worlds: &[World],
    axes: &[(&str, usize)],
    placement: Placement,
) -> TestResult<Vec<DeviceMesh>> {
    if worlds.len() == 1 {
        Ok(vec![DeviceMesh::new_with(&worlds[0], axes, placement)?])
    } else {
        Ok(DeviceMesh::new_all(worlds, axes, placement)?)
    }
}

/// In-place all-reduce of every mesh's buffer along `axis`, grouped when
/// this thread drives several.
fn all_reduce_along(meshes: &[DeviceMesh], bufs: &mut [CudaSlice<f32>], axis: &str) -> TestResult {
    if meshes.len() == 1 {
        meshes[0].all_reduce_in_place(axis, &mut bufs[0], ReduceOp::Sum)?;
        return Ok(());
    }
    group(|g| {
        for (m, b) in meshes.iter().zip(bufs.iter_mut()) {
            let comm = m
                .axis(axis)
                .map_err(|_| nccl_dist::nccl_safe::Error::InvalidArgument {
                    op: "test",
                    reason: "axis missing",
                })?;
            g.on(comm).all_reduce_in_place(b, ReduceOp::Sum)?;
        }
        Ok(())
    })?;
    Ok(())
}

/// Checks that every mesh's buffer holds the sum over the world ranks of
/// its group along `axes`.
fn check_groups(
    meshes: &[DeviceMesh],
    bufs: &[CudaSlice<f32>],
    name: &str,
    axes: &[&str],
    len: usize,
) -> TestResult {
    for (m, b) in meshes.iter().zip(bufs) {
        let members: Vec<usize> = m
            .shape()
            .group_members(m.position(), axes)?
            .into_iter()
            .map(|p| {
                let coord = m.shape().coordinate(p).expect("in mesh");
                m.world_rank_of(&coord).expect("in mesh")
            })
            .collect();
        let comm = m.axis(name)?;
        let got = download(comm, b)?;
        let want = sum_of::<f32>(&members, len);
        assert_eq!(
            got,
            want,
            "mesh position {} along {axes:?} (members {members:?})",
            m.position()
        );
    }
    Ok(())
}

/// On every mesh, its world rank's values, on the stream of `axis`.
fn upload_along(meshes: &[DeviceMesh], axis: &str, len: usize) -> TestResult<Vec<CudaSlice<f32>>> {
    meshes
        .iter()
        .map(|m| upload(m.axis(axis)?, &values::<f32>(world_rank(m), len)))
        .collect()
}

fn world_rank(m: &DeviceMesh) -> usize {
    m.world_rank_of(&m.coordinate()).expect("own coordinate")
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn worlds_know_their_place_and_all_reduce_bit_exact() {
    run(|worlds| {
        let n = world();
        for w in worlds.iter() {
            assert_eq!(w.size(), n);
            assert!(w.rank() < n);
            if mode() != Mode::Processes {
                assert_eq!(w.device(), w.rank());
            }
            assert_eq!(w.device(), w.comm().device());
        }
        let len = 4099;
        let mut bufs = worlds
            .iter()
            .map(|w| upload(w.comm(), &values::<f32>(w.rank(), len)))
            .collect::<TestResult<Vec<_>>>()?;
        if worlds.len() == 1 {
            worlds[0]
                .comm()
                .all_reduce_in_place(&mut bufs[0], ReduceOp::Sum)?;
        } else {
            group(|g| {
                for (w, b) in worlds.iter().zip(bufs.iter_mut()) {
                    g.on(w.comm()).all_reduce_in_place(b, ReduceOp::Sum)?;
                }
                Ok(())
            })?;
        }
        let all: Vec<usize> = (0..n).collect();
        for (w, b) in worlds.iter().zip(&bufs) {
            assert_eq!(download(w.comm(), b)?, sum_of::<f32>(&all, len));
        }
        Ok(())
    });
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn host_helpers_and_barrier_are_exact() {
    run(|worlds| {
        per_world(worlds, |w| {
            let n = w.size();
            let comm = w.comm();
            let all: Vec<usize> = (0..n).collect();
            let mut data = values::<i32>(w.rank(), 1000);
            comm.all_reduce_host(&mut data, ReduceOp::Sum)?;
            assert_eq!(data, sum_of::<i32>(&all, 1000));
            let mut b = values::<f64>(w.rank(), 17);
            comm.broadcast_host(&mut b, n - 1)?;
            assert_eq!(b, values::<f64>(n - 1, 17));
            let gathered = comm.all_gather_host(&[w.rank() as u64, 7])?;
            let want: Vec<u64> = (0..n as u64).flat_map(|r| [r, 7]).collect();
            assert_eq!(gathered, want);
            for _ in 0..3 {
                Communicator::barrier(comm)?;
            }
            // A bad root is a typed error and the communicator still works.
            let e = comm.broadcast_host(&mut b, n).unwrap_err();
            assert!(matches!(
                e,
                Error::Nccl(nccl_dist::nccl_safe::Error::RankOutOfRange { .. })
            ));
            Communicator::barrier(comm)?;
            Ok(())
        })
    });
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn one_dimensional_mesh_reduces_bit_exact() {
    run(|worlds| {
        let n = world();
        for placement in [Placement::RankOrder, Placement::NvlinkIslands] {
            let ms = meshes(worlds, &[("dp", n)], placement)?;
            for m in &ms {
                assert_eq!(m.size("dp")?, n);
                assert_eq!(m.local_rank("dp")?, m.position());
                assert_eq!(m.coordinate(), vec![m.position()]);
                assert_eq!((m.comm().rank(), m.comm().size()), (m.position(), n));
            }
            if placement == Placement::RankOrder {
                // In the world's order the mesh shares the world's
                // communicator (and its connections), split from nothing.
                for (m, w) in ms.iter().zip(worlds.iter()) {
                    assert!(m.comm().same_communicator(w.comm()));
                    assert!(m.axis("dp")?.same_communicator(w.comm()));
                }
            }
            let len = 1 << 16;
            let mut bufs = upload_along(&ms, "dp", len)?;
            all_reduce_along(&ms, &mut bufs, "dp")?;
            check_groups(&ms, &bufs, "dp", &["dp"], len)?;
            // Typed errors for shapes and names, before any NCCL call.
            let e = DeviceMesh::new(&worlds[0], &[("dp", n + 1)]).unwrap_err();
            assert!(
                matches!(e, Error::Mesh(MeshError::ShapeMismatch { .. })),
                "{e}"
            );
            let e = DeviceMesh::new(&worlds[0], &[("dp", n), ("dp", 1)]).unwrap_err();
            assert!(matches!(e, Error::Mesh(MeshError::DuplicateAxis(_))), "{e}");
            let e = ms[0].axis("tp").unwrap_err();
            assert!(matches!(e, Error::Mesh(MeshError::UnknownAxis(_))), "{e}");
        }
        Ok(())
    });
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn two_dimensional_mesh_reduces_along_each_axis_bit_exact() {
    // With a thread per GPU, NCCL may free one rank's resources from
    // another rank's thread (device-synchronising calls): a rank that has
    // already launched its next collective would never let that finish.
    // The threads meet on the host after dropping their meshes.
    let threads = if mode() == Mode::Threads { world() } else { 1 };
    let dropped = std::sync::Barrier::new(threads);
    run(|worlds| {
        let n = world();
        // 4 GPUs: 2x2; 2 GPUs: 1x2 and 2x1; 1 GPU: 1x1.
        let shapes: Vec<(usize, usize)> = (1..=n)
            .filter(|a| n.is_multiple_of(*a))
            .map(|a| (a, n / a))
            .collect();
        for (dp, tp) in shapes {
            for placement in [Placement::RankOrder, Placement::NvlinkIslands] {
                eprintln!(
                    "rank {}: mesh dp={dp} tp={tp} {placement:?}",
                    worlds[0].rank()
                );
                let mut ms = meshes(worlds, &[("dp", dp), ("tp", tp)], placement)?;
                for m in &ms {
                    let c = m.coordinate();
                    assert_eq!((m.size("dp")?, m.size("tp")?), (dp, tp));
                    assert_eq!((m.local_rank("dp")?, m.local_rank("tp")?), (c[0], c[1]));
                    let sub = m.slice(&["tp"])?;
                    assert_eq!(sub.coordinate(), vec![c[1]]);
                    assert_eq!(sub.axis("tp")?.size(), tp);
                    assert!(sub.axis("dp").is_err());
                }
                let len = 3001;
                // tensor parallel, then data parallel: the sum over the world.
                let mut bufs = upload_along(&ms, "tp", len)?;
                all_reduce_along(&ms, &mut bufs, "tp")?;
                check_groups(&ms, &bufs, "tp", &["tp"], len)?;
                let mut bufs = upload_along(&ms, "dp", len)?;
                all_reduce_along(&ms, &mut bufs, "dp")?;
                check_groups(&ms, &bufs, "dp", &["dp"], len)?;
                // Flattened: one communicator over both axes.
                eprintln!("rank {}: flatten", worlds[0].rank());
                if ms.len() == 1 {
                    ms[0].flatten(&["dp", "tp"], "dp_tp")?;
                } else {
                    DeviceMesh::flatten_all(&mut ms, &["dp", "tp"], "dp_tp")?;
                }
                for m in &ms {
                    assert_eq!(m.size("dp_tp")?, n);
                    assert_eq!(m.axes_of("dp_tp")?, vec!["dp", "tp"]);
                }
                let mut bufs = upload_along(&ms, "dp_tp", len)?;
                all_reduce_along(&ms, &mut bufs, "dp_tp")?;
                check_groups(&ms, &bufs, "dp_tp", &["dp", "tp"], len)?;
                let e = ms[0].flatten(&["dp", "tp"], "dp_tp").unwrap_err();
                assert!(matches!(e, Error::Mesh(MeshError::DuplicateAxis(_))), "{e}");
                eprintln!("rank {}: dropping the meshes", worlds[0].rank());
                drop(ms);
                dropped.wait();
            }
        }
        Ok(())
    });
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn three_dimensional_mesh_reduces_along_each_axis_bit_exact() {
    // As in the 2-D test: with a thread per GPU the threads meet on the
    // host after dropping their meshes.
    let threads = if mode() == Mode::Threads { world() } else { 1 };
    let dropped = std::sync::Barrier::new(threads);
    run(|worlds| {
        let n = world();
        // 8 GPUs: 2x2x2; 4: 2x2x1; 2: 2x1x1; 1: 1x1x1 (pp x dp x tp).
        let mut dims = [1usize; 3];
        let mut left = n;
        for d in &mut dims {
            if left.is_multiple_of(2) && left > 1 {
                *d = 2;
                left /= 2;
            }
        }
        dims[0] *= left;
        let axes = [("pp", dims[0]), ("dp", dims[1]), ("tp", dims[2])];
        for placement in [Placement::RankOrder, Placement::NvlinkIslands] {
            eprintln!("rank {}: mesh {axes:?} {placement:?}", worlds[0].rank());
            let mut ms = meshes(worlds, &axes, placement)?;
            for m in &ms {
                let c = m.coordinate();
                for (i, (name, size)) in axes.iter().enumerate() {
                    assert_eq!(m.size(name)?, *size);
                    assert_eq!(m.local_rank(name)?, c[i]);
                }
                let sub = m.slice(&["dp", "tp"])?;
                assert_eq!(sub.coordinate(), vec![c[1], c[2]]);
                assert!(sub.axis("pp").is_err());
            }
            let len = 1025;
            for (name, _) in axes {
                let mut bufs = upload_along(&ms, name, len)?;
                all_reduce_along(&ms, &mut bufs, name)?;
                check_groups(&ms, &bufs, name, &[name], len)?;
            }
            // The two inner axes as one communicator.
            if ms.len() == 1 {
                ms[0].flatten(&["dp", "tp"], "dp_tp")?;
            } else {
                DeviceMesh::flatten_all(&mut ms, &["dp", "tp"], "dp_tp")?;
            }
            for m in &ms {
                assert_eq!(m.size("dp_tp")?, dims[1] * dims[2]);
            }
            let mut bufs = upload_along(&ms, "dp_tp", len)?;
            all_reduce_along(&ms, &mut bufs, "dp_tp")?;
            check_groups(&ms, &bufs, "dp_tp", &["dp", "tp"], len)?;
            drop(ms);
            dropped.wait();
        }
        Ok(())
    });
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn a_mesh_that_keeps_its_world_uses_the_worlds_communicator_bit_exact() {
    // A thread or a process per rank: one thread driving several worlds
    // makes its meshes together (`DeviceMesh::new_all`).
    let threads = if mode() == Mode::Threads { world() } else { 1 };
    let dropped = std::sync::Barrier::new(threads);
    run_owned(|worlds| {
        if worlds.len() > 1 {
            // One thread drives every world: refused before any NCCL call
            // (its splits would wait for the other ranks), the world back.
            let n = worlds.len();
            let first = worlds.into_iter().next().ok_or("no world")?;
            return match DeviceMesh::from_world(first, &[("dp", n)]) {
                Err(e) if matches!(e.error, Error::InvalidArgument { .. }) => {
                    drop(e.into_world());
                    Ok(())
                }
                other => Err(format!("from_world on a World::local world: {other:?}").into()),
            };
        }
        let n = world();
        // A shape that does not fit is refused before any NCCL call, and
        // the world comes back with the error.
        let w = worlds.into_iter().next().ok_or("no world")?;
        let w = match DeviceMesh::from_world(w, &[("dp", n + 1)]) {
            Err(e) if matches!(e.error, Error::Mesh(MeshError::ShapeMismatch { .. })) => {
                e.into_world()
            }
            other => return Err(format!("a shape of {} ranks on {n}: {other:?}", n + 1).into()),
        };
        let axes = [("dp", 1), ("tp", n)];
        let ms = vec![DeviceMesh::from_world(w, &axes)?];
        let m = &ms[0];
        let w = m.world().ok_or("the mesh keeps its world")?;
        assert_eq!((m.size("tp")?, m.local_rank("tp")?), (n, w.rank()));
        assert_eq!((m.size("dp")?, m.local_rank("dp")?), (1, 0));
        // The whole mesh and the axis over every rank are the world's
        // own communicator, not splits of it.
        assert!(std::ptr::eq(m.comm(), w.comm()));
        assert!(std::ptr::eq(m.axis("tp")?, w.comm()));
        assert!(!std::ptr::eq(m.axis("dp")?, w.comm()));
        let len = 1025;
        for (name, _) in axes {
            let mut bufs = upload_along(&ms, name, len)?;
            all_reduce_along(&ms, &mut bufs, name)?;
            check_groups(&ms, &bufs, name, &[name], len)?;
        }
        // The world comes back whole once the mesh's own communicators
        // are gone, and still all-reduces.
        let world = ms
            .into_iter()
            .next()
            .and_then(DeviceMesh::into_world)
            .ok_or("into_world gave no world")?;
        dropped.wait();
        let comm = world.comm();
        let mut x = upload(comm, &values::<f32>(world.rank(), len))?;
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        let all: Vec<usize> = (0..n).collect();
        if download(comm, &x)? != sum_of::<f32>(&all, len) {
            return Err("the world's all-reduce after into_world is wrong".into());
        }
        Ok(())
    });
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn symmetric_buffers_of_different_lengths_are_refused_before_nccl() {
    // A process per rank: the ranks meet over the liveness channel and
    // compare the lengths before NCCL's registration barrier (threads of
    // one process meet but do not compare yet; one thread driving every
    // rank registers in one group, with no meeting).
    run(|worlds| {
        if mode() != Mode::Processes {
            return Ok(());
        }
        let w = &worlds[0];
        let comm = w.comm();
        let started = std::time::Instant::now();
        // Rank 0 asks for twice the others' length.
        let len = if w.rank() == 0 { 2048 } else { 1024 };
        match nccl_dist::nccl_safe::SymmetricBuffer::<f32>::new(comm, len) {
            Err(nccl_dist::nccl_safe::Error::CheckFailed { .. }) => {}
            other => return Err(format!("lengths that differ across ranks: {other:?}").into()),
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            return Err(format!("refused only after {:?}", started.elapsed()).into());
        }
        // Refused before NCCL: the communicator still works, and a buffer
        // of one length on every rank is made and reduces.
        let mut x = upload(comm, &values::<f32>(w.rank(), 1025))?;
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        let all: Vec<usize> = (0..w.size()).collect();
        if download(comm, &x)? != sum_of::<f32>(&all, 1025) {
            return Err("the all-reduce after the refusal is wrong".into());
        }
        let sym = nccl_dist::nccl_safe::SymmetricBuffer::<f32>::new(comm, 1024)?;
        drop(sym);
        Ok(())
    });
}

/// Every collective of the trait on one type, against values computed on
/// the host.
fn trait_collectives<T: TestType>(w: &World) -> TestResult {
    let comm: &dyn Communicator = w.comm();
    let (n, r) = (comm.size(), comm.rank());
    let stream = w.comm().stream();
    let raw = Some(stream.cu_stream());
    let dtype = DType::of::<T>();
    let all: Vec<usize> = (0..n).collect();
    let len = 257;
    // all_reduce, out of place then in place.
    let send = stream.clone_htod(&values::<T>(r, len))?;
    let mut recv = stream.alloc_zeros::<T>(len)?;
    {
        let (s, _g1) = send.device_ptr(stream);
        let (d, _g2) = recv.device_ptr_mut(stream);
        // SAFETY: `len` elements each, on this device, used on `stream` only.
        unsafe { comm.all_reduce(s, d, len, dtype, ReduceOp::Sum, raw)? };
    }
    assert_eq!(download(w.comm(), &recv)?, sum_of::<T>(&all, len));
    let mut inplace = stream.clone_htod(&values::<T>(r, len))?;
    {
        let (p, _g) = inplace.device_ptr_mut(stream);
        // SAFETY: as above, in place.
        unsafe { comm.all_reduce(p, p, len, dtype, ReduceOp::Sum, None)? };
    }
    assert_eq!(download(w.comm(), &inplace)?, sum_of::<T>(&all, len));
    // all_gather in place: this rank's slot holds its values.
    let mut gathered = stream.alloc_zeros::<T>(len * n)?;
    stream.memcpy_htod(
        &values::<T>(r, len),
        &mut gathered.slice_mut(r * len..(r + 1) * len),
    )?;
    {
        let (p, _g) = gathered.device_ptr_mut(stream);
        let slot = p + (r * len * std::mem::size_of::<T>()) as u64;
        // SAFETY: `n * len` elements at `p`, this rank's block at `slot`.
        unsafe { comm.all_gather(slot, p, len, dtype, raw)? };
    }
    let want: Vec<T> = (0..n).flat_map(|q| values::<T>(q, len)).collect();
    assert_eq!(download(w.comm(), &gathered)?, want);
    // reduce_scatter out of place.
    let big = stream.clone_htod(&(0..n).flat_map(|_| values::<T>(r, len)).collect::<Vec<T>>())?;
    let mut part = stream.alloc_zeros::<T>(len)?;
    {
        let (s, _g1) = big.device_ptr(stream);
        let (d, _g2) = part.device_ptr_mut(stream);
        // SAFETY: `n * len` at `s`, `len` at `d`.
        unsafe { comm.reduce_scatter(s, d, len, dtype, ReduceOp::Sum, raw)? };
    }
    assert_eq!(download(w.comm(), &part)?, sum_of::<T>(&all, len));
    // broadcast from the last rank.
    let mut b = stream.clone_htod(&values::<T>(r, len))?;
    {
        let (p, _g) = b.device_ptr_mut(stream);
        // SAFETY: `len` elements, in place.
        unsafe { comm.broadcast(p, p, len, dtype, n - 1, raw)? };
    }
    assert_eq!(download(w.comm(), &b)?, values::<T>(n - 1, len));
    // A ring: send to the next rank, receive from the previous one.
    let mine = stream.clone_htod(&values::<T>(r, len))?;
    let mut from_prev = stream.alloc_zeros::<T>(len)?;
    {
        let (s, _g1) = mine.device_ptr(stream);
        let (d, _g2) = from_prev.device_ptr_mut(stream);
        // SAFETY: `len` elements each.
        unsafe { comm.send_recv(s, len, (r + 1) % n, d, len, (r + n - 1) % n, dtype, raw)? };
    }
    assert_eq!(
        download(w.comm(), &from_prev)?,
        values::<T>((r + n - 1) % n, len)
    );
    Ok(())
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn communicator_trait_runs_every_collective_bit_exact_and_refuses_bad_pointers() {
    run(|worlds| {
        per_world(worlds, |w| {
            trait_collectives::<f32>(w)?;
            trait_collectives::<half::bf16>(w)?;
            trait_collectives::<half::f16>(w)?;
            trait_collectives::<i8>(w)?;
            trait_collectives::<u8>(w)?;
            trait_collectives::<u64>(w)?;
            let comm: &dyn Communicator = w.comm();
            let host = [0f32; 4];
            // SAFETY: refused before NCCL: the pointer is host memory.
            let e = unsafe {
                comm.all_reduce(
                    host.as_ptr() as u64,
                    host.as_ptr() as u64,
                    4,
                    DType::F32,
                    ReduceOp::Sum,
                    None,
                )
            }
            .unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            let buf = w.comm().stream().alloc_zeros::<f32>(8)?;
            let (p, _g) = buf.device_ptr(w.comm().stream());
            // SAFETY: refused before NCCL: the root is out of range.
            let e = unsafe { comm.broadcast(p, p, 8, DType::F32, comm.size(), None) }.unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Nccl(nccl_dist::nccl_safe::Error::RankOutOfRange { .. })
                ),
                "{e}"
            );
            // Partial overlap (not the in-place layout) is refused.
            // SAFETY: refused before NCCL.
            let e = unsafe { comm.all_reduce(p, p + 4, 4, DType::F32, ReduceOp::Sum, None) }
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Nccl(nccl_dist::nccl_safe::Error::PartialAlias { .. })
                ),
                "{e}"
            );
            drop(_g);
            comm.barrier()?;
            Ok(())
        })
    });
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn comm_stream_overlaps_and_orders_with_compute() {
    run(|worlds| {
        per_world(worlds, |w| {
            let comm = w.comm();
            let n = comm.size();
            let compute = comm.stream().context().new_stream()?;
            let len = 1 << 20;
            let all: Vec<usize> = (0..n).collect();
            // The gradients are written on the compute stream...
            let mut grads = compute.alloc_zeros::<f32>(len)?;
            compute.memcpy_htod(&values::<f32>(w.rank(), len), &mut grads)?;
            let comms = CommStream::new(comm)?;
            comms.wait_for(&compute)?;
            // ...reduced on the communication stream...
            comm.on(comms.stream())
                .all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
            let done = comms.record()?;
            // ...and read back on the compute stream after the event.
            done.block(&compute)?;
            let mut host = vec![0f32; len];
            compute.memcpy_dtoh(&grads, &mut host)?;
            comm.synchronize(&compute)?;
            assert!(done.is_done()?);
            assert_eq!(host, sum_of::<f32>(&all, len));
            Ok(())
        })
    });
}

/// H4: with a thread per GPU, a rank that fails while another waits for it
/// in a collective used to leave the join waiting until that collective's
/// timeout. Now the first rank to fail aborts the others at once, and they
/// name it. The liveness channel and the watchdog are off, so nothing else
/// could end the wait; the operation timeout is long.
#[test]
#[ignore = "needs 2 GPUs: cargo xtask gpu-test"]
fn a_failing_rank_ends_the_others_at_once_with_a_thread_per_gpu() {
    use std::time::{Duration, Instant};
    // One cell is enough: this test makes its own world.
    if mode() != Mode::Single || world() < 2 {
        return;
    }
    let options = nccl_dist::WorldOptions::new()
        .op_timeout(Duration::from_secs(120))
        .no_watchdog()
        .liveness(nccl_dist::liveness::LivenessOptions::new().enabled(false));
    let started = Instant::now();
    let outcome = World::spawn_local_with_options(&[0, 1], &options, |w| {
        if w.rank() == 1 {
            return Err(Error::InvalidArgument {
                op: "test",
                reason: "rank 1 gives up before the all_reduce".into(),
            });
        }
        let comm = w.comm();
        let mut x =
            comm.stream()
                .clone_htod(&[1f32; 1024])
                .map_err(|e| Error::InvalidArgument {
                    op: "test",
                    reason: e.to_string(),
                })?;
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
        nccl_dist::synchronize(comm, comm.stream())
    });
    let took = started.elapsed();
    let err = outcome.expect_err("rank 1 failed");
    assert!(took < Duration::from_secs(30), "the join took {took:?}");
    assert!(
        err.to_string().contains("gives up"),
        "the first failure is the one reported: {err}"
    );
}

/// A fresh world's first calls inside one group: an all-reduce and a ring
/// of sends to the next rank and receives from the one before. With a
/// thread or a process per rank they are held back to the group's end,
/// where the ranks meet for them in one order on every rank (each rank's
/// own order would wait in a circle at three ranks or more), and then
/// issued in their order: the bytes are those of an ungated run.
#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn a_fresh_worlds_first_group_with_a_ring_is_exact() {
    run(|worlds| {
        let n = worlds[0].size();
        let len = 1024;
        let mut sums = Vec::new();
        let mut ins = Vec::new();
        let mut outs = Vec::new();
        for w in worlds.iter() {
            let c = w.comm();
            sums.push(upload(c, &values::<f32>(w.rank(), len))?);
            ins.push(upload(c, &values::<f32>(w.rank() + 7, len))?);
            outs.push(c.stream().alloc_zeros::<f32>(len)?);
        }
        group(|g| {
            let each = worlds
                .iter()
                .zip(sums.iter_mut())
                .zip(&ins)
                .zip(outs.iter_mut());
            for (((w, sum), input), out) in each {
                let (r, c) = (w.rank(), w.comm());
                g.on(c).all_reduce_in_place(sum, ReduceOp::Sum)?;
                if n > 1 {
                    g.on(c).send(input, (r + 1) % n)?;
                    g.on(c).recv(out, (r + n - 1) % n)?;
                }
            }
            Ok(())
        })?;
        let ranks: Vec<usize> = (0..n).collect();
        for (i, w) in worlds.iter().enumerate() {
            let r = w.rank();
            if download(w.comm(), &sums[i])? != sum_of::<f32>(&ranks, len) {
                return Err(format!("rank {r}: the all-reduce in the group is wrong").into());
            }
            if n > 1 && download(w.comm(), &outs[i])? != values::<f32>((r + n - 1) % n + 7, len) {
                return Err(format!("rank {r}: the ring's receive is wrong").into());
            }
        }
        Ok(())
    });
}
