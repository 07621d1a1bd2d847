//! GPU tests of nccl-safe. Each is `#[ignore]`d: `cargo xtask gpu-test`
//! runs them for world sizes 1, 2 and 4 in both launch modes
//! (`NCCL_SAFE_TEST_WORLD`, `NCCL_SAFE_TEST_MODE=single|threads`).
//!
//! Every result is compared bit for bit with values computed on the host;
//! inputs are chosen so every float result is exact (see `harness`), and
//! every output has guard regions that must come back untouched.

use nccl_safe::cudarc::driver::{CudaContext, CudaView, CudaViewMut, DeviceSlice};

use nccl_safe::{
    Comm, Config, DeviceBuffer, Error, Feature, NcclMemory, PreMulSum, ReduceOp, Registration,
    Role, group,
};

use nccl_testkit::*;

const N: usize = 1027;

/// A reduction under test.
#[derive(Debug, Clone, Copy)]
enum OpCase {
    Builtin(ReduceOp),
    PreMulHost,
    PreMulDevice,
}

const OP_CASES: [OpCase; 7] = [
    OpCase::Builtin(ReduceOp::Sum),
    OpCase::Builtin(ReduceOp::Prod),
    OpCase::Builtin(ReduceOp::Max),
    OpCase::Builtin(ReduceOp::Min),
    OpCase::Builtin(ReduceOp::Avg),
    OpCase::PreMulHost,
    OpCase::PreMulDevice,
];

/// The PreMulSum scalar.
const SCALAR: f64 = 2.0;

/// What reducing `reduce_input(r, i)` over `world` ranks gives.
fn expected_reduction<T: TestType>(op: OpCase, world: usize, i: usize) -> f64 {
    let values: Vec<f64> = (0..world).map(|r| reduce_input(r, i)).collect();
    let sum: f64 = values.iter().sum();
    match op {
        OpCase::Builtin(ReduceOp::Sum) => sum,
        OpCase::Builtin(ReduceOp::Prod) => values.iter().product(),
        OpCase::Builtin(ReduceOp::Max) => values.iter().copied().fold(f64::MIN, f64::max),
        OpCase::Builtin(ReduceOp::Min) => values.iter().copied().fold(f64::MAX, f64::min),
        OpCase::Builtin(ReduceOp::Avg) if T::IS_INT => (sum as i64 / world as i64) as f64,
        OpCase::Builtin(ReduceOp::Avg) => sum / world as f64,
        OpCase::PreMulHost | OpCase::PreMulDevice => SCALAR * sum,
    }
}

/// Per-rank operator: a built-in, or a PreMulSum made on that rank's comm.
enum RankOp<'c, T: TestType> {
    Builtin(ReduceOp),
    PreMul(PreMulSum<'c, T>),
}

fn make_ops<'c, T: TestType>(
    ranks: &'c [Rank],
    scalars: &'c [nccl_safe::cudarc::driver::CudaSlice<T>],
    op: OpCase,
) -> TestResult<Vec<RankOp<'c, T>>> {
    ranks
        .iter()
        .zip(scalars)
        .map(|(r, s)| {
            Ok(match op {
                OpCase::Builtin(b) => RankOp::Builtin(b),
                OpCase::PreMulHost => {
                    RankOp::PreMul(PreMulSum::host(&r.comm, T::from_f64(SCALAR))?)
                }
                OpCase::PreMulDevice => RankOp::PreMul(PreMulSum::device(&r.comm, s)?),
            })
        })
        .collect()
}

/// Calls `$call` with the rank's operator as `$op`, whichever kind it is.
macro_rules! with_op {
    ($rank_op:expr, |$op:ident| $call:expr) => {
        match $rank_op {
            RankOp::Builtin(b) => {
                let $op = *b;
                $call
            }
            RankOp::PreMul(p) => {
                let $op = p;
                $call
            }
        }
    };
}

fn scalars<T: TestType>(
    ranks: &[Rank],
) -> TestResult<Vec<nccl_safe::cudarc::driver::CudaSlice<T>>> {
    ranks
        .iter()
        .map(|r| Ok(r.stream().clone_htod(&[T::from_f64(SCALAR)])?))
        .collect()
}

/// fp8 reductions need compute capability 9.0: where they are refused, the
/// refusal must be the typed error.
fn fp8_reduction_refused<T: TestType>(ranks: &[Rank]) -> TestResult<bool> {
    if !T::IS_FP8 || ranks[0].comm.fp8_reductions() {
        return Ok(false);
    }
    let mut buf = ranks[0].stream().alloc_zeros::<T>(4)?;
    match ranks[0].comm.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
        Err(Error::Unsupported { .. }) => Ok(true),
        other => Err(format!("fp8 reduction below cc 9.0 gave {other:?}").into()),
    }
}

/// fp8 Avg and PreMulSum on a one-rank communicator: NCCL's one-rank path
/// has no fp8 kernel, so the call must be refused with `Unsupported`.
fn fp8_scaled_on_one_rank_refused<T: TestType>(
    ranks: &[Rank],
    scalars: &[nccl_safe::cudarc::driver::CudaSlice<T>],
    op: OpCase,
) -> TestResult<bool> {
    let scaled = matches!(
        op,
        OpCase::Builtin(ReduceOp::Avg) | OpCase::PreMulHost | OpCase::PreMulDevice
    );
    if !(T::IS_FP8 && ranks[0].world == 1 && scaled) {
        return Ok(false);
    }
    let ops = make_ops::<T>(ranks, scalars, op)?;
    let mut buf = ranks[0].stream().alloc_zeros::<T>(4)?;
    match with_op!(&ops[0], |o| ranks[0].comm.all_reduce_in_place(&mut buf, o)) {
        Err(Error::Unsupported { .. }) => Ok(true),
        other => Err(format!("fp8 {op:?} on one rank gave {other:?}").into()),
    }
}

/// Adds the case to an error.
fn label<T>(
    what: impl std::fmt::Display,
) -> impl FnOnce(nccl_safe::Error) -> Box<dyn std::error::Error + Send + Sync> {
    move |e| format!("{what} {}: {e}", type_name::<T>()).into()
}

struct Pair<T: TestType> {
    send: Guarded<T>,
    recv: Guarded<T>,
}

impl<T: TestType> Pair<T> {
    /// The data of both buffers, for a call that may write either (in
    /// place or out of place).
    fn both_mut(&mut self) -> (CudaViewMut<'_, T>, CudaViewMut<'_, T>) {
        (self.send.data_mut(), self.recv.data_mut())
    }

    /// The send data to read and the receive data to write.
    fn in_out(&mut self) -> (CudaView<'_, T>, CudaViewMut<'_, T>) {
        (self.send.data(), self.recv.data_mut())
    }
}

/// Every rank's send buffer of `send` elements (rank `r`'s element `i` is
/// `input(r, i)`) and zeroed receive buffer of `recv` elements.
fn pairs<T: TestType>(
    ranks: &[Rank],
    send: usize,
    recv: usize,
    input: impl Fn(usize, usize) -> f64,
) -> TestResult<Vec<Pair<T>>> {
    ranks
        .iter()
        .map(|r| {
            Ok(Pair {
                send: Guarded::new(r.stream(), send, |i| input(r.rank, i))?,
                recv: Guarded::zeros(r.stream(), recv)?,
            })
        })
        .collect()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn all_reduce_every_type_and_op_in_and_out_of_place() {
    reductions::all_reduce_every_type_and_op_in_and_out_of_place()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn reduce_every_type_op_and_root() {
    reductions::reduce_every_type_op_and_root()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn reduce_scatter_every_type_and_op_in_and_out_of_place() {
    reductions::reduce_scatter_every_type_and_op_in_and_out_of_place()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn broadcast_every_type_and_root() {
    movement::broadcast_every_type_and_root()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn all_gather_every_type_in_and_out_of_place() {
    movement::all_gather_every_type_in_and_out_of_place()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn all_to_all_every_type_native_and_send_recv() {
    movement::all_to_all_every_type_native_and_send_recv()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn all_to_all_v_every_type_with_uneven_counts() {
    movement::all_to_all_v_every_type_with_uneven_counts()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn gather_every_type_root_and_placement_native_and_send_recv() {
    movement::gather_every_type_root_and_placement_native_and_send_recv()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn scatter_every_type_root_and_placement_native_and_send_recv() {
    movement::scatter_every_type_root_and_placement_native_and_send_recv()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn send_recv_ring_every_type() {
    movement::send_recv_ring_every_type()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn split_into_rows_and_columns_and_no_color() {
    comms::split_into_rows_and_columns_and_no_color()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn bad_input_is_refused_with_typed_errors_and_the_comm_still_works() {
    comms::bad_input_is_refused_with_typed_errors_and_the_comm_still_works()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn communicators_drop_cleanly_in_every_order() {
    comms::communicators_drop_cleanly_in_every_order()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn shared_handles_reduce_together_wait_for_other_threads_groups_and_outlive_the_first() {
    share::shared_handles_reduce_together_wait_for_other_threads_groups_and_outlive_the_first()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn graph_capture_replays_collectives() {
    features::graph_capture_replays_collectives()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn symmetric_buffers_reduce_bit_exact_and_drop_on_every_rank() {
    symmetric::symmetric_buffers_reduce_bit_exact_and_drop_on_every_rank()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn one_shot_all_reduce_is_bit_exact_eager_in_place_and_in_graphs() {
    symmetric::one_shot_all_reduce_is_bit_exact_eager_in_place_and_in_graphs()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn one_shot_kernel_stops_waiting_when_the_communicator_aborts() {
    symmetric::one_shot_kernel_stops_waiting_when_the_communicator_aborts()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn one_thread_captures_one_graph_over_its_gpus_and_replays_bit_exact() {
    capture::one_thread_captures_one_graph_over_its_gpus_and_replays_bit_exact()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn group_simulate_estimates_without_launching() {
    features::group_simulate_estimates_without_launching()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn nccl_memory_and_registered_buffers_reduce_correctly() {
    features::nccl_memory_and_registered_buffers_reduce_correctly()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn nonblocking_communicators_work_and_abort_from_another_thread() {
    features::nonblocking_communicators_work_and_abort_from_another_thread()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn library_and_devices_report_themselves() {
    features::library_and_devices_report_themselves()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn collectives_run_on_a_stream_the_caller_chooses() {
    features::collectives_run_on_a_stream_the_caller_chooses()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn symmetric_windows_register_reduce_and_deregister() {
    features::symmetric_windows_register_reduce_and_deregister()
}

#[test]
#[ignore = "needs GPUs: cargo xtask gpu-test"]
fn shrink_drops_the_last_rank_and_the_rest_still_reduce() {
    features::shrink_drops_the_last_rank_and_the_rest_still_reduce()
}

/// Ok when `got` is an error that `ok` accepts.
fn expect(label: &str, got: nccl_safe::Result<()>, ok: impl Fn(&Error) -> bool) -> TestResult {
    match got {
        Err(e) if ok(&e) => Ok(()),
        other => Err(format!("{label}: got {other:?}").into()),
    }
}

mod capture;
mod comms;
mod features;
mod movement;
mod reductions;
mod share;
mod symmetric;
