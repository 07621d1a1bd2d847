//! `Comm` is `Send` but not `Sync`: NCCL allows one thread at a time per
//! communicator, so `&Comm` must not reach a second thread.

fn shared_between_threads<T: Sync>() {}

fn main() {
    shared_between_threads::<nccl_safe::Comm>();
}
