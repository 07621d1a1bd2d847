//! Misuse that the types refuse at compile time, locked in with programs
//! that must not compile (`tests/compile_fail/*.rs`, each with the
//! compiler's message beside it in a `.stderr` file).
//!
//! - `Comm` is not `Sync` (one thread at a time per communicator).
//! - A `GroupGuard` stays on the thread that opened the group.
//! - A buffer given to a grouped call stays borrowed until the group ends:
//!   it can be neither dropped nor used again before NCCL launches the work.
//! - An `ObservedStream` cannot be made from a raw handle, nor kept past
//!   the `issued` call that got it.
//! - `Library::load_from` (it runs the file's initialisers) needs `unsafe`.
//! - A graph made by `nccl_safe::capture` owns its buffers (they are moved
//!   in; borrowed ones are refused) and borrows its communicators: none of
//!   them can go while the graph may still launch; so does a group captured
//!   over several GPUs with `nccl_safe::capture_group`.
//!
//! Regenerate the messages after a compiler or API change with
//! `TRYBUILD=overwrite cargo test -p nccl-safe --test compile_fail`, then
//! read the diff: each must still be the error its case is about.

#[test]
fn misuse_does_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}
