//! Tests of the watchdog's observer (`watchdog.rs`).

use super::*;

/// Stands in for `Watch` (which needs a GPU to exist): the type an
/// owner looks for behind `Comm::observer`.
struct Genuine(u64);

impl OpObserver for Genuine {
    fn issued(&self, _: &OpInfo, _: ObservedStream<'_>) {}

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn into_any(self: Arc<Self>) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Some(self)
    }
}

/// A user's observer that forges both hooks: `as_any` answers with a
/// real `Genuine` (as a forger could with the reply of a real watch,
/// reachable through `Comm::observer`), `into_any` with whatever
/// allocation it likes.
struct Forger {
    real: Arc<Genuine>,
    hand_back: Arc<dyn std::any::Any + Send + Sync>,
}

impl OpObserver for Forger {
    fn issued(&self, _: &OpInfo, _: ObservedStream<'_>) {}

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(&*self.real)
    }

    fn into_any(self: Arc<Self>) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Some(Arc::clone(&self.hand_back))
    }
}

#[test]
fn a_forged_observer_cannot_pass_for_a_watch() {
    let real = Arc::new(Genuine(7));
    // Before the fix, `Watched::of` checked `as_any` and then rebuilt
    // an `Arc<Watch>` from the observer's own allocation (here a
    // `Forger`) with `Arc::from_raw`: undefined behaviour from safe
    // code. Now only the allocation `into_any` hands back counts, and
    // `Arc::downcast` checks its type.
    let liar: Arc<dyn OpObserver> = Arc::new(Forger {
        real: Arc::clone(&real),
        hand_back: Arc::new(42u64),
    });
    assert!(liar.as_any().unwrap().downcast_ref::<Genuine>().is_some());
    assert!(observer_as::<Genuine>(liar).is_none());

    // Handing back a real `Genuine` gets that very one: some real
    // watch, never a made-up one.
    let liar: Arc<dyn OpObserver> = Arc::new(Forger {
        real: Arc::clone(&real),
        hand_back: real.clone(),
    });
    let found = observer_as::<Genuine>(liar).unwrap();
    assert!(Arc::ptr_eq(&found, &real));
    assert_eq!(found.0, 7);

    // The genuine observer finds itself; one with the default hooks
    // is nobody's.
    let genuine: Arc<dyn OpObserver> = real.clone();
    assert!(Arc::ptr_eq(
        &observer_as::<Genuine>(genuine).unwrap(),
        &real
    ));
    struct Plain;
    impl OpObserver for Plain {
        fn issued(&self, _: &OpInfo, _: ObservedStream<'_>) {}
    }
    assert!(observer_as::<Genuine>(Arc::new(Plain)).is_none());
}
