//! The fault suite's case table: each case of `tests/faults/` with its
//! victim, how the victim ends, the modes it runs in, and what its
//! processes get.

use std::time::Duration;

use super::Mode;

/// Which rank is the victim.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Pick {
    /// Rank 0 (also the rendezvous and liveness hub).
    First,
    /// The last rank.
    Last,
    /// No victim: every rank does the same.
    Nobody,
}

impl Pick {
    pub(super) fn rank(self, n: usize) -> Option<usize> {
        match self {
            Pick::First => Some(0),
            Pick::Last => Some(n - 1),
            Pick::Nobody => None,
        }
    }
}

/// How the victim of a case must end.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum End {
    /// It takes part and must pass like the others.
    Passes,
    /// Its process dies of SIGKILL (processes only).
    KillsItself,
    /// It stops itself; the harness kills it after the others finish
    /// (processes only).
    Stops,
    /// Its thread panics; the job must report `RankPanicked` naming it
    /// (threads only).
    Panics,
}

/// One case of the suite: the test's name, its victim, how the victim
/// ends, the modes it runs in, a longer limit where it needs one.
pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) victim: Pick,
    pub(super) end: End,
    pub(super) modes: &'static [Mode],
    pub(super) limit: Option<Duration>,
    /// The smallest world it runs in (smaller ones skip it).
    pub(super) min_world: usize,
    /// Variables the case's processes get.
    pub(super) env: &'static [(&'static str, &'static str)],
}

pub(super) const PROCESSES: &[Mode] = &[Mode::Processes];
pub(super) const THREADS: &[Mode] = &[Mode::Threads];
pub(super) const BOTH: &[Mode] = &[Mode::Processes, Mode::Threads];

const fn case(name: &'static str, victim: Pick, end: End, modes: &'static [Mode]) -> Case {
    Case {
        name,
        victim,
        end,
        modes,
        limit: None,
        min_world: 2,
        env: &[],
    }
}

/// The bound on naming a lost peer when emulated hosts share GPUs (the
/// suite's own is 2 s): their kernels take turns, and an abort waits for
/// them. The table's "deadline" column shows it.
pub(super) const SHARED_LOSS_BOUND_MS: &str = "5000";

/// The call check on (`WorldOptions::check_calls`).
const CHECK_CALLS: &[(&str, &str)] = &[("NCCL_RS_CHECK_CALLS", "1")];

/// A mismatch case with the call check on: a process per rank (a world of
/// threads has no channel to compare calls over).
const fn checked(name: &'static str, victim: Pick) -> Case {
    Case {
        env: CHECK_CALLS,
        ..case(name, victim, End::Passes, PROCESSES)
    }
}

/// Every case of `tests/faults/`, in the order they run. A case in the
/// binary and not here (or the other way round) is an error, so the two
/// cannot drift apart.
pub(super) const CASES: &[Case] = &[
    case(
        "a_sigkill_mid_all_reduce",
        Pick::Last,
        End::KillsItself,
        PROCESSES,
    ),
    case(
        "a0_sigkill_rank0_mid_all_reduce",
        Pick::First,
        End::KillsItself,
        PROCESSES,
    ),
    case("b_sigstop_then_rebuild", Pick::Last, End::Stops, PROCESSES),
    case(
        "n_recover_and_rejoin",
        Pick::Last,
        End::KillsItself,
        PROCESSES,
    ),
    Case {
        min_world: 4,
        ..case(
            "m_mesh_drops_the_replica_that_lost_a_rank",
            Pick::Last,
            End::KillsItself,
            PROCESSES,
        )
    },
    case(
        "n0_recover_and_rejoin_after_rank0",
        Pick::First,
        End::KillsItself,
        PROCESSES,
    ),
    case(
        "s1_silent_before_the_first_collective",
        Pick::Last,
        End::Passes,
        BOTH,
    ),
    case(
        "s2_silent_before_the_first_call_on_an_axis",
        Pick::Last,
        End::Passes,
        BOTH,
    ),
    case(
        "s3_silent_at_the_first_send_recv",
        Pick::Last,
        End::Passes,
        BOTH,
    ),
    case(
        "s4_silent_while_the_others_are_in_a_group",
        Pick::Last,
        End::Passes,
        BOTH,
    ),
    case("c1_mismatched_count", Pick::First, End::Passes, BOTH),
    case("c2_mismatched_dtype", Pick::Last, End::Passes, BOTH),
    case("c3_mismatched_order", Pick::First, End::Passes, BOTH),
    case("c4_mismatched_root", Pick::Last, End::Passes, BOTH),
    checked("k1_checked_count", Pick::First),
    checked("k2_checked_dtype_same_width", Pick::Last),
    checked("k3_checked_order", Pick::First),
    checked("k4_checked_root", Pick::Last),
    checked("k5_checked_reduction", Pick::Last),
    case("d_abort_from_another_thread", Pick::Last, End::Passes, BOTH),
    case("e_drop_with_work_in_flight", Pick::First, End::Passes, BOTH),
    case(
        "f1_kill_before_mesh",
        Pick::Last,
        End::KillsItself,
        PROCESSES,
    ),
    case(
        "f2_kill_during_mesh",
        Pick::First,
        End::KillsItself,
        PROCESSES,
    ),
    // The victim watches for libnccl to be loaded, which rank 0 does
    // before the rendezvous: it must be another rank.
    case(
        "g_kill_during_init",
        Pick::Last,
        End::KillsItself,
        PROCESSES,
    ),
    case(
        "h_thread_panics_mid_collective",
        Pick::First,
        End::Panics,
        THREADS,
    ),
    case("i_abort_while_group_open", Pick::Nobody, End::Passes, BOTH),
    Case {
        // 50 worlds made and aborted, with resource samples.
        limit: Some(Duration::from_secs(480)),
        ..case(
            "r_fifty_abort_rebuild_cycles",
            Pick::Nobody,
            End::Passes,
            PROCESSES,
        )
    },
];
