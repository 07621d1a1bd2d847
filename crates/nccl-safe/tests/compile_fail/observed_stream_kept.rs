//! An observer's stream is live only during `issued`: it cannot be kept
//! for later.

use std::cell::Cell;

use nccl_safe::{ObservedStream, OpInfo, OpObserver};

thread_local! {
    static KEPT: Cell<Option<ObservedStream<'static>>> = const { Cell::new(None) };
}

struct Keeper;

impl OpObserver for Keeper {
    fn issued(&self, _info: &OpInfo, stream: ObservedStream<'_>) {
        KEPT.with(|kept| kept.set(Some(stream)));
    }
}

fn main() {
    let _ = Keeper;
}
