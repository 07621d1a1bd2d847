//! Shared handles (`Comm::share`): one NCCL communicator, two owners.

use super::*;

/// Sums `(rank + 1)` over the world into a fresh buffer on each handle,
/// in one group when one thread holds several ranks, and checks it.
fn sum_through(ranks: &[Rank], handles: &[&Comm], label: &str) -> TestResult {
    let mut bufs = ranks
        .iter()
        .zip(handles)
        .map(|(r, h)| h.stream().clone_htod(&[(r.rank + 1) as i64; 16]))
        .collect::<Result<Vec<_>, _>>()?;
    all_reduce_sum_each(handles, &mut bufs)?;
    let world = ranks[0].world as i64;
    let want = world * (world + 1) / 2;
    for (h, b) in handles.iter().zip(&bufs) {
        h.synchronize(h.stream())?;
        let got = h.stream().clone_dtoh(b)?;
        if got.iter().any(|v| *v != want) {
            return Err(format!("{label}: got {:?}, expected {want}", got[0]).into());
        }
    }
    Ok(())
}

pub fn shared_handles_reduce_together_wait_for_other_threads_groups_and_outlive_the_first() {
    run(Config::new(), |ranks| {
        // A second handle: the same communicator, rank and stream.
        let shared = ranks
            .iter()
            .map(|r| r.comm.share())
            .collect::<Result<Vec<_>, _>>()?;
        for (r, s) in ranks.iter().zip(&shared) {
            if !s.same_communicator(&r.comm)
                || (s.rank(), s.size(), s.device())
                    != (r.comm.rank(), r.comm.size(), r.comm.device())
                || s.stream().cu_stream() != r.comm.stream().cu_stream()
            {
                return Err(format!("rank {}: the shared handle differs", r.rank).into());
            }
        }
        let refs: Vec<&Comm> = shared.iter().collect();
        sum_through(ranks, &refs, "through the shared handles")?;
        let refs: Vec<&Comm> = ranks.iter().map(|r| &r.comm).collect();
        sum_through(ranks, &refs, "through the first handles after")?;

        // Refused inside a group on this thread, before any NCCL call.
        group(|_| match ranks[0].comm.share() {
            Err(Error::InvalidArgument { .. }) => Ok(()),
            other => Err(Error::InvalidArgument {
                op: "test",
                reason: if other.is_ok() {
                    "share inside a group was not refused"
                } else {
                    "share inside a group failed with another error"
                },
            }),
        })?;

        // While this thread's group holds calls on the communicators,
        // another thread's call through the shared handles waits for the
        // group's end, then goes through (on every rank after the
        // group's, the order NCCL needs).
        let mut bufs = ranks
            .iter()
            .map(|r| r.stream().clone_htod(&[1i64; 16]))
            .collect::<Result<Vec<_>, _>>()?;
        let theirs = ranks
            .iter()
            .map(|r| r.stream().clone_htod(&[2i64; 16]))
            .collect::<Result<Vec<_>, _>>()?;
        let (go, started) = std::sync::mpsc::channel::<()>();
        let (shared, theirs, helper_done, group_ended) = std::thread::scope(|s| {
            let helper = s.spawn(move || {
                let mut theirs = theirs;
                started.recv().map_err(|e| e.to_string())?;
                all_reduce_sum_each(&shared.iter().collect::<Vec<_>>(), &mut theirs)
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>((shared, theirs, std::time::Instant::now()))
            });
            let ended = group(|g| {
                for (r, b) in ranks.iter().zip(bufs.iter_mut()) {
                    g.on(&r.comm).all_reduce_in_place(b, ReduceOp::Sum)?;
                }
                // The group holds the communicators now: let the other
                // thread call, and give it time to find them held.
                let _ = go.send(());
                std::thread::sleep(std::time::Duration::from_millis(50));
                Ok(())
            })
            .map(|()| std::time::Instant::now());
            // A group that failed before its signal must not leave the
            // other thread waiting for it.
            drop(go);
            let helped = helper
                .join()
                .map_err(|_| "the other thread panicked".to_string());
            match (ended, helped) {
                (Ok(end), Ok(Ok((h, t, done)))) => Ok((h, t, done, end)),
                (Err(e), _) => Err(format!("the group: {e}")),
                (_, Ok(Err(e)) | Err(e)) => Err(format!("the other thread: {e}")),
            }
        })?;
        if helper_done < group_ended {
            return Err("the other thread's call returned before this thread's group ended".into());
        }
        let world = ranks[0].world as i64;
        for ((r, b), t) in ranks.iter().zip(&bufs).zip(&theirs) {
            r.comm.synchronize(r.stream())?;
            let (got, got_theirs) = (r.stream().clone_dtoh(b)?, r.stream().clone_dtoh(t)?);
            if got.iter().any(|v| *v != world) || got_theirs.iter().any(|v| *v != 2 * world) {
                return Err(format!(
                    "rank {}: the group's sum {:?} (expected {world}), the other thread's {:?} (expected {})",
                    r.rank,
                    got[0],
                    got_theirs[0],
                    2 * world
                )
                .into());
            }
        }
        let refs: Vec<&Comm> = shared.iter().collect();
        sum_through(ranks, &refs, "through the shared handles after the group")?;

        // The shared handle outlives the first: it takes the rank's place
        // (the harness drops it last) after the first is dropped.
        for (r, s) in ranks.iter_mut().zip(shared) {
            let first = std::mem::replace(&mut r.comm, s);
            drop(first);
        }
        let refs: Vec<&Comm> = ranks.iter().map(|r| &r.comm).collect();
        sum_through(ranks, &refs, "after the first handles were dropped")?;

        // Finalize and destroy need the last handle: refused before any
        // NCCL call while another exists (the refused handle is dropped).
        for r in ranks.iter() {
            let (a, b) = (r.comm.share()?, r.comm.share()?);
            match (a.finalize(), b.destroy()) {
                (Err(Error::InvalidArgument { .. }), Err(Error::InvalidArgument { .. })) => {}
                other => {
                    return Err(format!(
                        "rank {}: finalize/destroy of a shared handle: {other:?}",
                        r.rank
                    )
                    .into());
                }
            }
        }
        let refs: Vec<&Comm> = ranks.iter().map(|r| &r.comm).collect();
        sum_through(ranks, &refs, "after the refused finalize and destroy")?;

        // An abort through one handle reaches the other (every rank
        // aborts its own: no collective follows).
        for r in ranks.iter() {
            let other = r.comm.share()?;
            r.comm.abort_handle().abort()?;
            let mut x = r.stream().clone_htod(&[1i64; 4])?;
            match other.all_reduce_in_place(&mut x, ReduceOp::Sum) {
                Err(Error::Aborted { .. }) => {}
                other => return Err(format!("rank {}: after the abort: {other:?}", r.rank).into()),
            }
        }
        Ok(())
    });
}
