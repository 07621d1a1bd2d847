//! The GPU test harness the GPU test binaries of nccl-safe and nccl-dist
//! share (`publish = false`): the launch mode and world size `cargo xtask
//! gpu-test` asks for, communicators made per rank in that mode, test
//! values exact in every NCCL type with guarded, bit-exact checks, random
//! unique ids and deadlines.
//!
//! ```text
//! env.rs       the environment xtask sets: mode, world size, id file; random ids
//! ranks.rs     Rank and run(config, body): a communicator per rank in each mode
//! values.rs    TestType, exact inputs, Guarded buffers, each_type!
//! deadline.rs  within(limit, f): a call that must return in time
//! trace.rs     NCCL_SAFE_TEST_TRACE=1: the crates' tracing to stderr, unbuffered
//! ```
//!
//! Import direction: `ranks` and `values` use `env`, `env` uses `trace`;
//! nothing uses `ranks`.

mod deadline;
mod env;
mod ranks;
mod trace;
mod values;

pub use deadline::within;
pub use env::{Mode, TRACE_ENV, env_number, exchange_id, mode, random_id, trace_if_asked, world};
pub use ranks::{Rank, all_reduce_sum_each, run};
pub use values::{GUARD, GUARD_VALUE, Guarded, TestType, move_input, reduce_input, type_name};

// For the macros, which run in the test crate.
pub use {float8, half, nccl_safe};

/// What a test body returns: any error, sendable between rank threads.
pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Fails the test with the error's message.
pub fn check(result: TestResult) {
    if let Err(e) = result {
        panic!("{e}");
    }
}
