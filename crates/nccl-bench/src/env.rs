//! The environment variables the bench reads, in one place (the house rule:
//! `NCCL_RS_*` names are spelled out only in a crate's `env.rs`).
//!
//! | variable | effect |
//! |---|---|
//! | `NCCL_RS_BENCH_ALLOC_TRACE` | set: name (thread, size) the first allocations made inside timed windows on stderr; `bt`: with a backtrace each |

/// Names allocations inside timed windows (see [`alloc`](crate::alloc)).
pub const ALLOC_TRACE: &str = "NCCL_RS_BENCH_ALLOC_TRACE";
