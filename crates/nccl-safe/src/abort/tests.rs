//! The signal's tests, with fake members.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// A member that logs what the signal asks of it.
struct Logged {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    /// Set when this member learns of the cause.
    noted: AtomicBool,
    /// Another member whose cause this one's abort waits for, as
    /// `ncclCommAbort` of an idle communicator waits behind a stuck
    /// kernel that only the other's abort ends.
    waits_for: Option<Arc<Logged>>,
}

impl Abortable for Logged {
    fn note_cause(&self, cause: AbortCause) {
        self.noted.store(true, Ordering::SeqCst);
        self.log
            .lock()
            .unwrap()
            .push(format!("note {} {cause}", self.name));
    }

    fn request_abort(&self, _cause: AbortCause) -> bool {
        if let Some(other) = &self.waits_for {
            // What a thread polling the other would do at its next look.
            assert!(
                other.noted.load(Ordering::SeqCst),
                "{}'s abort would wait for {}, which has not learned of the cause",
                self.name,
                other.name
            );
        }
        self.log
            .lock()
            .unwrap()
            .push(format!("abort {}", self.name));
        true
    }

    fn is_settled(&self) -> bool {
        self.noted.load(Ordering::SeqCst)
    }
}

fn member(
    name: &'static str,
    log: &Arc<Mutex<Vec<String>>>,
    waits_for: Option<Arc<Logged>>,
) -> Arc<Logged> {
    Arc::new(Logged {
        name,
        log: Arc::clone(log),
        noted: AtomicBool::new(false),
        waits_for,
    })
}

#[test]
fn every_member_learns_the_cause_before_any_abort_and_the_newest_aborts_first() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let data = member("data", &log, None);
    // Enrolled first, as a world's control communicator is (its split
    // makes the data one), and its abort waits for the data one.
    let control = member("control", &log, Some(Arc::clone(&data)));
    let signal = AbortSignal::new();
    signal.enroll(
        Arc::downgrade(&(Arc::clone(&control) as Arc<dyn Abortable>)),
        &Enrolment::new(),
    );
    signal.enroll(
        Arc::downgrade(&(Arc::clone(&data) as Arc<dyn Abortable>)),
        &Enrolment::new(),
    );
    signal.trigger(AbortCause::Other("test".into()));
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "note control test",
            "note data test",
            "abort data",
            "abort control"
        ]
    );
    assert!(signal.is_triggered());
}

#[test]
fn a_member_enrolled_after_the_signal_fired_is_asked_to_abort_by_the_next_trigger_only() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let signal = AbortSignal::new();
    signal.trigger(AbortCause::Requested);
    let late = member("late", &log, None);
    signal.enroll(
        Arc::downgrade(&(Arc::clone(&late) as Arc<dyn Abortable>)),
        &Enrolment::new(),
    );
    // The communicator itself reads the signal at its next call
    // (`Shared::abort_due`); a second trigger reaches it too.
    assert!(log.lock().unwrap().is_empty());
    signal.trigger(AbortCause::Other("again".into()));
    assert_eq!(
        *log.lock().unwrap(),
        ["note late abort requested", "abort late"],
        "the first cause wins"
    );
}

/// A member whose `ncclCommAbort` runs on another thread until `done`.
struct Aborting {
    done: AtomicBool,
}

impl Abortable for Aborting {
    fn note_cause(&self, _cause: AbortCause) {}

    fn request_abort(&self, _cause: AbortCause) -> bool {
        false
    }

    fn is_settled(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }
}

#[test]
fn wait_settled_waits_for_every_member_still_there_and_ends_at_its_deadline() {
    let signal = AbortSignal::new();
    let slow = Arc::new(Aborting {
        done: AtomicBool::new(false),
    });
    signal.enroll(
        Arc::downgrade(&(Arc::clone(&slow) as Arc<dyn Abortable>)),
        &Enrolment::new(),
    );
    // A member already dropped does not count.
    let gone: Arc<dyn Abortable> = Arc::new(Aborting {
        done: AtomicBool::new(false),
    });
    signal.enroll(Arc::downgrade(&gone), &Enrolment::new());
    drop(gone);
    let started = Instant::now();
    assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(30)));
    assert!(started.elapsed() >= Duration::from_millis(30));
    let other = Arc::clone(&slow);
    let finisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        other.done.store(true, Ordering::SeqCst);
    });
    let started = Instant::now();
    assert!(signal.wait_settled(Instant::now() + Duration::from_secs(10)));
    assert!(started.elapsed() >= Duration::from_millis(15));
    finisher.join().unwrap();
    // A teardown of a member dropped live is waited for too.
    let pending = signal.pending_teardown(false);
    assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(20)));
    let ender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        drop(pending);
    });
    assert!(signal.wait_settled(Instant::now() + Duration::from_secs(10)));
    ender.join().unwrap();
}

/// A member whose last handle went but whose drop has not yet counted its
/// teardown (still on the roll) is not settled: the waits hold until it
/// leaves the roll, then go by the count.
#[test]
fn a_member_mid_drop_is_waited_for_until_its_enrolment_goes() {
    let signal = AbortSignal::new();
    let enrolment = Enrolment::new();
    let member: Arc<dyn Abortable> = Arc::new(Aborting {
        done: AtomicBool::new(true),
    });
    signal.enroll(Arc::downgrade(&member), &enrolment);
    assert!(signal.wait_settled(Instant::now() + Duration::from_secs(1)));
    // Gone from the roll's view, its drop still under way.
    drop(member);
    assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(20)));
    assert!(!signal.wait_quiet(Instant::now() + Duration::from_millis(20)));
    // The drop counts its teardown (a parked one's), then leaves the roll
    // while the teardown still runs: the quiet wait passes (it does not
    // wait for parked teardowns), the settled one waits for the count.
    let pending = signal.pending_teardown(true);
    enrolment.leave();
    assert!(signal.wait_quiet(Instant::now() + Duration::from_secs(1)));
    assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(20)));
    drop(pending);
    assert!(signal.wait_settled(Instant::now() + Duration::from_secs(1)));
    drop(enrolment);
    assert!(signal.wait_settled(Instant::now() + Duration::from_secs(1)));
}

#[test]
fn wait_settled_asks_again_for_the_abort_of_a_member_still_live() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let signal = AbortSignal::new();
    let m = member("m", &log, None);
    signal.enroll(
        Arc::downgrade(&(Arc::clone(&m) as Arc<dyn Abortable>)),
        &Enrolment::new(),
    );
    // Not triggered: nothing is asked, and a live member is waited for.
    assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(10)));
    assert!(log.lock().unwrap().is_empty());
    signal.trigger(AbortCause::Requested);
    assert!(signal.wait_settled(Instant::now() + Duration::from_secs(10)));
}

thread_local! {
    /// What the holdable members and their fake group calls did, on
    /// this test's thread.
    static HELD_LOG: std::cell::RefCell<Vec<String>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn say(what: String) {
    HELD_LOG.with(|l| l.borrow_mut().push(what));
}

fn said() -> Vec<String> {
    HELD_LOG.with(|l| l.borrow().clone())
}

/// What was said from the fake group's start to its end.
fn group_said() -> Vec<String> {
    let log = said();
    let start = log.iter().position(|l| l == "group start").unwrap();
    let end = log.iter().position(|l| l == "group end").unwrap();
    log[start..=end].to_vec()
}

/// Stands for `ncclGroupStart`/`ncclGroupEnd` around the calls.
fn fake_group(calls: &mut dyn FnMut()) -> GroupEnd {
    say("group start".into());
    calls();
    say("group end".into());
    GroupEnd::Ended
}

/// As [`fake_group`], for a group whose `ncclGroupEnd` fails.
fn failing_group(calls: &mut dyn FnMut()) -> GroupEnd {
    fake_group(calls);
    GroupEnd::Failed
}

/// A member that can be held for an abort with others, as a live
/// communicator whose lock is free can; `group`: what its holds offer
/// to bracket the aborts with.
struct Holdable {
    name: &'static str,
    lock: Mutex<()>,
    aborted: AtomicBool,
    group: Option<GroupCalls>,
}

impl Abortable for Holdable {
    fn note_cause(&self, _cause: AbortCause) {
        say(format!("note {}", self.name));
    }

    fn request_abort(&self, _cause: AbortCause) -> bool {
        match self.lock.try_lock() {
            Ok(_) if !self.aborted.swap(true, Ordering::SeqCst) => {
                say(format!("abort alone {}", self.name));
            }
            Ok(_) => {}
            // The thread in a call on it aborts it when it lets go.
            Err(_) => say(format!("asked {}", self.name)),
        }
        self.aborted.load(Ordering::SeqCst)
    }

    fn is_settled(&self) -> bool {
        self.aborted.load(Ordering::SeqCst) && self.lock.try_lock().is_ok()
    }

    fn aborts_together(&self) -> bool {
        true
    }

    fn hold_for_abort(&self) -> Option<Box<dyn HeldForAbort + '_>> {
        let guard = self.lock.try_lock().ok()?;
        if self.aborted.load(Ordering::SeqCst) {
            return None;
        }
        say(format!("hold {}", self.name));
        Some(Box::new(HeldHoldable {
            member: self,
            guard: Some(guard),
        }))
    }
}

struct HeldHoldable<'a> {
    member: &'a Holdable,
    guard: Option<std::sync::MutexGuard<'a, ()>>,
}

impl HeldForAbort for HeldHoldable<'_> {
    fn group(&self) -> Option<GroupCalls> {
        self.member.group
    }

    fn abort(&mut self) {
        if self.stops() {
            return;
        }
        self.member.aborted.store(true, Ordering::SeqCst);
        say(format!("abort {}", self.member.name));
    }

    /// A member named `parked…` stands for a parked blocking communicator
    /// held to stop its kernels.
    fn stops(&self) -> bool {
        self.member.name.starts_with("parked")
    }

    fn stop(&mut self) {
        say(format!("stop {}", self.member.name));
    }

    /// A member whose name holds `failing` stands for one whose call in
    /// the group returned an error.
    fn failed_in_group(&self) -> bool {
        self.member.name.contains("failing")
    }

    /// Again only for one aborted in the group (not one held to stop).
    fn abort_again(&mut self) {
        if !self.stops() {
            say(format!("abort again {}", self.member.name));
        }
    }

    fn unlock(&mut self) {
        self.guard = None;
        say(format!("unlock {}", self.member.name));
    }
}

/// Members named `names`, enrolled in that order (oldest first).
fn holdables(
    signal: &AbortSignal,
    names: &[&'static str],
    group: Option<GroupCalls>,
) -> Vec<Arc<Holdable>> {
    let members: Vec<Arc<Holdable>> = names
        .iter()
        .map(|&name| {
            Arc::new(Holdable {
                name,
                lock: Mutex::new(()),
                aborted: AtomicBool::new(false),
                group,
            })
        })
        .collect();
    for m in &members {
        signal.enroll(
            Arc::downgrade(&(Arc::clone(m) as Arc<dyn Abortable>)),
            &Enrolment::new(),
        );
    }
    members
}

#[test]
fn without_a_group_the_held_members_are_let_go_unaborted_and_abort_one_at_a_time() {
    let signal = AbortSignal::new();
    let members = holdables(&signal, &["control", "data", "busy"], None);
    // Another thread is in a call on `busy`.
    let in_call = members[2].lock.lock().unwrap();
    signal.trigger(AbortCause::Requested);
    assert_eq!(
        said(),
        [
            "note control",
            "note data",
            "note busy",
            "hold data",
            "hold control",
            // No group: let go unaborted, then one at a time, newest
            // first.
            "unlock data",
            "unlock control",
            "asked busy",
            "abort alone data",
            "abort alone control",
        ]
    );
    // Not settled while that thread holds it; once it let go without
    // aborting, `wait_settled` aborts it.
    assert!(!signal.wait_settled(Instant::now() + Duration::from_millis(10)));
    drop(in_call);
    assert!(signal.wait_settled(Instant::now() + Duration::from_secs(10)));
    let log = said();
    assert_eq!(
        log[log.len() - 3..],
        ["hold busy", "unlock busy", "abort alone busy"]
    );
}

#[test]
fn members_held_together_abort_inside_one_group_newest_first_and_are_let_go_after_its_end() {
    let signal = AbortSignal::new();
    let _members = holdables(&signal, &["a", "b", "c"], Some(fake_group));
    signal.trigger(AbortCause::Requested);
    assert_eq!(
        said()[3..],
        [
            "hold c",
            "hold b",
            "hold a",
            "group start",
            "abort c",
            "abort b",
            "abort a",
            "group end",
            "unlock c",
            "unlock b",
            "unlock a"
        ]
    );
    assert!(signal.wait_settled(Instant::now() + Duration::from_secs(1)));
}

#[test]
fn a_lone_member_that_could_group_aborts_without_a_group() {
    let signal = AbortSignal::new();
    let _members = holdables(&signal, &["a"], Some(fake_group));
    let other = member("other", &Arc::new(Mutex::new(Vec::new())), None);
    signal.enroll(
        Arc::downgrade(&(Arc::clone(&other) as Arc<dyn Abortable>)),
        &Enrolment::new(),
    );
    signal.trigger(AbortCause::Requested);
    // Only one member aborts together: the one-at-a-time path.
    assert_eq!(said(), ["note a", "abort alone a"]);
}

/// A member that parks on a loss, as a communicator made with
/// `Config::park_on_peer_loss` does.
#[derive(Default)]
struct Parking {
    parked: AtomicBool,
    unparked: AtomicBool,
    aborted: AtomicBool,
}

impl Abortable for Parking {
    fn note_cause(&self, _cause: AbortCause) {}

    fn request_abort(&self, cause: AbortCause) -> bool {
        if !self.unparked.load(Ordering::SeqCst) && matches!(cause, AbortCause::PeerLost { .. }) {
            self.parked.store(true, Ordering::SeqCst);
            return false;
        }
        self.aborted.store(true, Ordering::SeqCst);
        true
    }

    fn is_settled(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    fn is_parked(&self) -> bool {
        self.parked.load(Ordering::SeqCst) && !self.unparked.load(Ordering::SeqCst)
    }

    fn unpark(&self) {
        self.unparked.store(true, Ordering::SeqCst);
    }
}

#[test]
fn parked_members_are_quiet_but_not_settled_until_parking_ends() {
    let signal = AbortSignal::new();
    let parking = Arc::new(Parking::default());
    signal.enroll(
        Arc::downgrade(&parking) as Weak<dyn Abortable>,
        &Enrolment::new(),
    );
    signal.trigger(AbortCause::PeerLost {
        rank: 1,
        detail: "gone".into(),
    });
    assert!(parking.is_parked() && !parking.is_settled());
    let soon = || Instant::now() + Duration::from_millis(20);
    assert!(signal.wait_quiet(soon()), "a parked member is quiet");
    assert!(!signal.wait_settled(soon()), "but NCCL is not done with it");
    // The teardown of a parked member dropped since (a lost thread's) is
    // not waited for by the quiet wait; any other one is.
    let parked_teardown = signal.pending_teardown(true);
    assert!(signal.wait_quiet(soon()));
    let other = signal.pending_teardown(false);
    assert!(!signal.wait_quiet(soon()));
    drop(other);
    assert!(signal.wait_quiet(soon()));
    drop(parked_teardown);
    // Ending parking aborts it, and nothing parks from now on.
    assert!(!signal.parking_ended());
    signal.end_parking();
    assert!(signal.parking_ended());
    assert!(parking.aborted.load(Ordering::SeqCst) && !parking.is_parked());
    assert!(signal.wait_settled(soon()));
}

/// What one group of a mesh's abort and a parked world's stop says, in
/// the order the trigger and a group's end both keep: the stop last.
const PARKED_LAST: [&str; 4] = [
    "group start",
    "abort mesh",
    "stop parked world",
    "group end",
];

#[test]
fn a_parked_member_stops_its_kernels_in_the_group_after_every_abort() {
    // The parked one is the newest, so it is held first: its stop, which
    // waits for its kernels inside the call, still comes after the
    // others' aborts have set their flags.
    let signal = AbortSignal::new();
    let _members = holdables(&signal, &["mesh", "parked world"], Some(fake_group));
    signal.trigger(AbortCause::Requested);
    assert_eq!(group_said(), PARKED_LAST);
    assert_none_aborted_again();
}

/// Nobody was aborted a second time ([`HeldForAbort::abort_again`]).
fn assert_none_aborted_again() {
    let log = said();
    assert!(!log.iter().any(|l| l.starts_with("abort again")), "{log:?}");
}

#[test]
fn a_failed_call_in_the_group_has_every_aborted_member_aborted_again_before_any_lets_go() {
    // NCCL fails the end of a group in which a call failed and drops
    // every reclaim queued in it unrun: each aborted one is aborted again,
    // alone, while every lock is still held.
    let signal = AbortSignal::new();
    let _members = holdables(
        &signal,
        &["control", "mesh", "parked failing world"],
        Some(failing_group),
    );
    signal.trigger(AbortCause::Requested);
    let log = said();
    let end = log.iter().position(|l| l == "group end").unwrap();
    assert_eq!(
        log[end..end + 5],
        [
            "group end",
            "abort again mesh",
            "abort again control",
            "unlock parked failing world",
            "unlock mesh",
        ],
        "{log:?}"
    );
}

#[test]
fn nothing_is_aborted_again_unless_the_groups_end_failed_too() {
    // A failed call whose group still ended well, or a failed end with
    // no failed call: NCCL may have run the reclaims, so a second abort
    // could free a handle twice.
    for (names, group) in [
        (["mesh", "parked failing world"], fake_group as GroupCalls),
        (["mesh", "parked world"], failing_group as GroupCalls),
    ] {
        HELD_LOG.with(|l| l.borrow_mut().clear());
        let signal = AbortSignal::new();
        let _members = holdables(&signal, &names, Some(group));
        signal.trigger(AbortCause::Requested);
        assert!(said().iter().any(|l| l == "group end"), "{:?}", said());
        assert_none_aborted_again();
    }
}

#[test]
fn a_group_end_settles_a_parked_member_with_the_others_as_a_trigger_does() {
    // What the end of a user's group does when a loss came while it was
    // open and one of its communicators parks: the same order as the
    // trigger's, whatever order the group touched them in.
    let signal = AbortSignal::new();
    let members = holdables(&signal, &["parked world", "mesh"], Some(fake_group));
    let members: Vec<Arc<dyn Abortable>> = members
        .into_iter()
        .map(|m| m as Arc<dyn Abortable>)
        .collect();
    settle_together(&members);
    assert_eq!(group_said(), PARKED_LAST);
}
