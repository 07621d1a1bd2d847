//! Tests of the abort and parking decisions.

use nccl_sys::Version;

use super::aborts_together;
use crate::AbortCause;
use crate::comm::park::would_park;

#[test]
fn only_a_loss_parks_and_only_where_a_shrink_can_follow() {
    let lost = AbortCause::PeerLost {
        rank: 1,
        detail: "gone".into(),
    };
    let park = |may, cause: &AbortCause, ended, shrink, graphs, healthy| {
        would_park(may, Some(cause), ended, shrink, graphs, || healthy)
    };
    assert!(park(true, &lost, false, true, false, true));
    assert!(
        !park(false, &lost, false, true, false, true),
        "not made to park, or unparked"
    );
    assert!(
        !park(true, &AbortCause::Requested, false, true, false, true),
        "not a loss"
    );
    let timeout = AbortCause::Timeout { op: "x", seq: None };
    assert!(
        !park(true, &timeout, false, true, false, true),
        "a timeout aborts"
    );
    assert!(
        !park(true, &lost, true, true, false, true),
        "the signal ended parking"
    );
    assert!(
        !park(true, &lost, false, false, false, true),
        "no ncclCommShrink"
    );
    assert!(
        !park(true, &lost, false, true, true, true),
        "a graph may refer to it"
    );
    assert!(
        !park(true, &lost, false, true, false, false),
        "NCCL reports an error"
    );
    assert!(
        !would_park(true, None, false, true, false, || true),
        "nothing due"
    );
    // The NCCL call is not made where something else already says no.
    assert!(!would_park(
        false,
        Some(&lost),
        false,
        true,
        false,
        || unreachable!()
    ));
}

#[test]
fn aborts_go_together_only_from_nccl_2_24_outside_groups_and_without_graphs() {
    let v = |minor| Version::new(2, minor, 0);
    assert!(aborts_together(v(24), false, false));
    assert!(aborts_together(v(28), false, false));
    assert!(
        !aborts_together(v(23), false, false),
        "2.22 and 2.23: unsafe group cleanup"
    );
    assert!(
        !aborts_together(v(21), false, false),
        "reclaims inside each abort"
    );
    assert!(
        !aborts_together(v(28), true, false),
        "a group of the thread is open"
    );
    assert!(
        !aborts_together(v(28), false, true),
        "a graph may refer to one"
    );
}
