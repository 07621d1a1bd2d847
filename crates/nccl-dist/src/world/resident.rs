//! How many [`super::World`]s live in this process: where another does,
//! its threads may be issuing NCCL calls, and
//! [`super::World::release_retired`] tears nothing down.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The worlds of this process that have not dropped yet.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// A world's place in the count: made with the world, given back when it
/// drops.
#[derive(Debug)]
pub(super) struct Resident(());

impl Resident {
    pub(super) fn new() -> Resident {
        LIVE.fetch_add(1, Ordering::AcqRel);
        Resident(())
    }

    /// Whether the world holding this is the only one in the process.
    pub(super) fn alone(&self) -> bool {
        LIVE.load(Ordering::Acquire) == 1
    }

    /// How many worlds live in the process, the one holding this included.
    pub(super) fn live(&self) -> usize {
        LIVE.load(Ordering::Acquire)
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // No other test makes a `World` (that needs GPUs): the count is
    // this test's alone.
    #[test]
    fn a_world_is_alone_until_another_lives_beside_it() {
        let first = Resident::new();
        assert!(first.alone());
        let second = Resident::new();
        assert!(!first.alone() && !second.alone());
        drop(second);
        assert!(first.alone());
    }
}
