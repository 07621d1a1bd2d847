//! The mismatch cases with the call check on (`NCCL_RS_CHECK_CALLS=1`,
//! set by xtask for these cases): the ranks compare each call over the
//! liveness channel before launch, so every rank's call is refused
//! together with the same report naming the victim and the field, the
//! mismatches that NCCL would run to the end with meaningless data (f32
//! against i32 of the same width) included; nothing was launched, so the
//! communicator then works.

use std::time::Instant;

use nccl_dist::nccl_safe::ReduceOp;
use nccl_dist::{CheckFailure, Error, Field, World};

use crate::stuck::{N, leaked_all_reduce, leaked_broadcast, names};
use crate::{OP_TIMEOUT, Rank, TestResult, checked_all_reduce, cuda, kernel_runs, kind, run};

/// Every rank runs `op` (the victim differs): it must be refused before
/// launch with a verdict naming the victim and `field`, well within the
/// timeout, and a checked all-reduce must pass after it.
fn refused(
    r: &mut Rank,
    world: World,
    field: Field,
    op: impl FnOnce(&World, bool) -> Result<(), Error>,
) -> TestResult {
    checked_all_reduce(&world, 1024)?;
    let since = Instant::now();
    let outcome = op(&world, r.is_victim());
    let after = since.elapsed();
    r.note("error_after_ms", after.as_millis())?;
    r.note("deadline_ms", OP_TIMEOUT.as_millis())?;
    let e = match outcome {
        Ok(()) => return Err("the mismatched call was launched".into()),
        Err(e) => e,
    };
    r.note("outcome", format!("refused before launch: {}", kind(&e)))?;
    r.note("error", &e)?;
    let failure = match &e {
        Error::Nccl(inner) => CheckFailure::of(inner),
        _ => None,
    }
    .ok_or_else(|| format!("not the call check's refusal: {e}"))?;
    let divergence = failure
        .divergence()
        .ok_or_else(|| format!("the check names no divergence: {failure}"))?;
    names(r, divergence, field)?;
    if after >= OP_TIMEOUT {
        return Err(format!("refused after {after:?}, not before the timeout").into());
    }
    // Nothing was launched: the communicator works, and its calls are
    // still checked.
    checked_all_reduce(&world, 1024)?;
    r.note("recovered", "the communicator works after the refusal")?;
    drop(world);
    kernel_runs(r.device)?;
    r.note("kernel", "ok")
}

/// An all-reduce of N f32 zeros with `op`, its buffer leaked.
fn all_reduce_with(world: &World, op: ReduceOp) -> Result<(), Error> {
    let mut buf = world.comm().stream().alloc_zeros::<f32>(N).map_err(cuda)?;
    let issued = world.comm().all_reduce_in_place(&mut buf, op);
    std::mem::forget(buf);
    issued.map_err(|e| crate::explained(world, e))
}

/// (k1) The victim all-reduces N elements, the others 2N.
#[test]
#[ignore]
fn k1_checked_count() {
    run("k1_checked_count", |r, world| {
        refused(r, world, Field::Count, |w, odd| {
            leaked_all_reduce::<f32>(w, if odd { N } else { 2 * N })
        })
    });
}

/// (k2) The victim all-reduces f32, the others i32 of the same width: a
/// mismatch NCCL never notices.
#[test]
#[ignore]
fn k2_checked_dtype_same_width() {
    run("k2_checked_dtype_same_width", |r, world| {
        refused(r, world, Field::Dtype, |w, odd| match odd {
            true => leaked_all_reduce::<f32>(w, N),
            false => leaked_all_reduce::<i32>(w, N),
        })
    });
}

/// (k3) The victim runs an all-reduce first, the others a broadcast.
#[test]
#[ignore]
fn k3_checked_order() {
    run("k3_checked_order", |r, world| {
        refused(r, world, Field::Op, |w, odd| match odd {
            true => leaked_all_reduce::<f32>(w, N).and_then(|()| leaked_broadcast(w, 0)),
            false => leaked_broadcast(w, 0).and_then(|()| leaked_all_reduce::<f32>(w, N)),
        })
    });
}

/// (k4) The victim broadcasts from its own rank, the others from rank 0.
#[test]
#[ignore]
fn k4_checked_root() {
    run("k4_checked_root", |r, world| {
        let me = world.rank();
        refused(r, world, Field::Root, |w, odd| {
            leaked_broadcast(w, if odd { me } else { 0 })
        })
    });
}

/// (k5) The victim reduces with Max, the others with Sum.
#[test]
#[ignore]
fn k5_checked_reduction() {
    run("k5_checked_reduction", |r, world| {
        refused(r, world, Field::Reduction, |w, odd| {
            all_reduce_with(w, if odd { ReduceOp::Max } else { ReduceOp::Sum })
        })
    });
}
