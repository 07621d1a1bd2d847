//! The runner's own tests: the case table against the sources, world
//! sizes, report names, the table, and the harness against a stand-in
//! binary.

use super::cases::*;
use super::*;

#[test]
fn victims_and_modes_fit_how_the_victim_ends() {
    for c in CASES {
        match c.end {
            End::KillsItself | End::Stops => {
                assert_eq!(c.modes, PROCESSES, "{}: a process is killed", c.name);
                assert_ne!(c.victim, Pick::Nobody, "{}", c.name);
            }
            End::Panics => assert_eq!(c.modes, THREADS, "{}", c.name),
            End::Passes => {}
        }
    }
    assert_eq!(Pick::First.rank(4), Some(0));
    assert_eq!(Pick::Last.rank(2), Some(1));
    assert_eq!(Pick::Nobody.rank(2), None);
    // Both ends of the world are victims somewhere.
    assert!(
        CASES
            .iter()
            .any(|c| c.victim == Pick::First && c.end == End::KillsItself)
    );
    assert!(
        CASES
            .iter()
            .any(|c| c.victim == Pick::Last && c.end == End::KillsItself)
    );
}

#[test]
fn the_table_matches_the_test_sources() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/nccl-dist/tests/faults");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let mut ignored = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with("#[ignore") {
                ignored = true;
            } else if let Some(rest) = line.strip_prefix("fn ")
                && ignored
            {
                names.push(rest.split('(').next().unwrap().to_string());
                ignored = false;
            }
        }
    }
    names.sort();
    let mut table: Vec<String> = CASES.iter().map(|c| c.name.to_string()).collect();
    table.sort();
    assert_eq!(names, table);
    // libtest lists them with their module.
    let listed: Vec<String> = names.iter().map(|n| format!("loss::{n}")).collect();
    let picked = select(&listed, Some("a0_,i_")).unwrap();
    assert_eq!(picked.len(), 2);
    assert_eq!(picked[0].1, "loss::a0_sigkill_rank0_mid_all_reduce");
    assert!(
        select(&listed[1..], None).is_err(),
        "a missing case is an error"
    );
    let mut extra = listed.clone();
    extra.push("loss::z_new_case".into());
    assert!(
        select(&extra, None).is_err(),
        "a case without a row is an error"
    );
}

/// Stands in for the faults binary (`$3` is the test, after
/// `--ignored --exact`): victims of `a` cases SIGKILL themselves, of
/// `b_` cases stop; rank 1 of `c1_` fails; in threads mode the victim
/// "panics" and the job reports it.
#[cfg(unix)]
const FAKE: &str = r#"#!/bin/sh
case="${3##*::}"
out="$NCCL_RS_FAULT_OUT"
v="$NCCL_RS_FAULT_VICTIM"
if [ "$NCCL_RS_FAULT_MODE" = threads ]; then
  r=0
  while [ "$r" -lt "$NCCL_RS_FAULT_WORLD" ]; do
if [ "$r" = "$v" ]; then
  echo "123 panic on purpose" > "$out/$case.$r.death"
else
  printf 'since_death_ms=%s\npass=yes\n' "$((r * 100))" > "$out/$case.$r"
fi
r=$((r + 1))
  done
  printf 'spawn=RankPanicked(rank %s)\npass=yes\n' "$v" > "$out/$case.job"
  exit 0
fi
if [ "$RANK" = "$v" ]; then
  case "$case" in
a_*|a0_*) echo "123 SIGKILL mid all-reduce" > "$out/$case.$RANK.death"; kill -9 $$ ;;
b_*) kill -STOP $$ ;;
  esac
fi
if [ "$case" = c1_mismatched_count ] && [ "$RANK" = 1 ]; then
  printf 'failed=wrong\n' > "$out/$case.$RANK"
  exit 101
fi
printf 'error_after_ms=%s\npass=yes\n' "$((RANK * 10))" > "$out/$case.$RANK"
"#;

#[cfg(unix)]
#[test]
fn the_harness_tells_how_each_rank_ended() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("xtask-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("fake");
    std::fs::write(&fake, FAKE).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let find = |name: &str| CASES.iter().find(|c| c.name == name).unwrap();
    let limit = Duration::from_secs(30);
    let run = |name: &str, n: usize, mode: Mode| {
        let test = format!("m::{name}");
        run_case(&fake, find(name), &test, n, mode, None, limit, &dir).unwrap()
    };

    let a = run("a_sigkill_mid_all_reduce", 3, Mode::Processes);
    assert!(a.passed, "{:?}", a.problems);
    assert_eq!(a.verdicts, ["pass", "pass", "SIGKILL"]);
    assert_eq!(a.victim_end, "SIGKILL mid all-reduce");

    let a0 = run("a0_sigkill_rank0_mid_all_reduce", 2, Mode::Processes);
    assert!(a0.passed, "{:?}", a0.problems);
    assert_eq!(a0.verdicts, ["SIGKILL", "pass"]);

    let b = run("b_sigstop_then_rebuild", 2, Mode::Processes);
    assert!(b.passed, "{:?}", b.problems);
    assert_eq!(b.verdicts, ["pass", "stopped"]);
    assert!(b.took < limit, "the harness waited for the stopped victim");

    let c1 = run("c1_mismatched_count", 2, Mode::Processes);
    assert!(!c1.passed);
    assert_eq!(c1.verdicts, ["pass", "FAIL"]);
    assert!(
        c1.problems.iter().any(|p| p.contains("wrong")),
        "{:?}",
        c1.problems
    );

    // `f1`'s victim does not kill itself here: a failure, not a hang.
    let f1 = run("f1_kill_before_mesh", 2, Mode::Processes);
    assert!(!f1.passed);
    assert_eq!(f1.verdicts, ["pass", "FAIL"]);

    let h = run("h_thread_panics_mid_collective", 2, Mode::Threads);
    assert!(h.passed, "{:?}", h.problems);
    assert_eq!(h.verdicts, ["panicked", "pass"]);
    assert!(
        h.victim_end.contains("RankPanicked(rank 0)"),
        "{}",
        h.victim_end
    );
    let table = render(&[a, b, c1, h], "test");
    assert!(
        table.contains("| 0 panicked, 1 pass | pass | - | - | 100 |"),
        "the time after the death: {table}"
    );
    assert!(
        table.contains("c1_mismatched_count (2 GPUs, processes): "),
        "{table}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn world_sizes_need_the_gpus_asked_for() {
    assert_eq!(world_sizes(None, 2, None).unwrap(), vec![2]);
    assert_eq!(world_sizes(None, 8, None).unwrap(), vec![2, 4]);
    assert_eq!(world_sizes(Some(&[4]), 4, None).unwrap(), vec![4]);
    assert!(world_sizes(Some(&[4]), 2, None).is_err());
    assert!(world_sizes(Some(&[1]), 2, None).is_err());
    assert!(world_sizes(None, 1, None).is_err());
    let shared = crate::hosts::Hosts {
        nodes: 2,
        launcher: crate::hosts::Launcher::Slurm,
        share_gpus: true,
    };
    assert_eq!(world_sizes(None, 1, Some(&shared)).unwrap(), vec![2]);
    assert!(world_sizes(Some(&[4]), 1, Some(&shared)).is_err());
}

#[test]
fn device_kinds_name_report_files() {
    assert_eq!(device_kind("NVIDIA H200", 2), "nvidia-h200-x2");
    assert_eq!(
        device_kind("NVIDIA H100 80GB HBM3", 1),
        "nvidia-h100-80gb-hbm3-x1"
    );
    assert_eq!(
        report_path(Path::new("docs/faults/"), "nvidia-h200-x2"),
        PathBuf::from("docs/faults/nvidia-h200-x2.md")
    );
    assert_eq!(
        report_path(Path::new("x/f.md"), "k"),
        PathBuf::from("x/f.md")
    );
}

#[test]
fn the_table_lists_verdicts_and_the_slowest_error() {
    let mut a = BTreeMap::new();
    a.insert(
        "outcome".to_string(),
        "PeerLost(rank 1, connection closed)".to_string(),
    );
    a.insert("error_after_ms".to_string(), "310".to_string());
    a.insert("since_death_ms".to_string(), "120".to_string());
    a.insert("deadline_ms".to_string(), "10000".to_string());
    a.insert("kernel".to_string(), "ok".to_string());
    a.insert("pass".to_string(), "yes".to_string());
    let mut b = a.clone();
    b.insert("error_after_ms".to_string(), "350".to_string());
    b.insert("since_death_ms".to_string(), "140".to_string());
    let r = CaseResult {
        name: "a_sigkill_mid_all_reduce".into(),
        mode: Mode::Processes,
        n: 3,
        victim: Some(2),
        passed: true,
        took: Duration::from_secs(9),
        ranks: vec![a, b, BTreeMap::new()],
        verdicts: vec!["pass".into(), "pass".into(), "SIGKILL".into()],
        victim_end: "SIGKILL after enqueueing".into(),
        held: Some("GPU 0 +12, GPU 1 +10 MiB".into()),
        problems: vec![],
    };
    let table = render(&[r], "2 x NVIDIA H200");
    assert!(
        table.contains("held after the job: GPU 0 +12, GPU 1 +10 MiB"),
        "{table}"
    );
    assert!(
        table.contains(
            "| 3 | a_sigkill_mid_all_reduce | processes | rank 2: SIGKILL after enqueueing \
             | 0 pass, 1 pass, 2 SIGKILL | pass | PeerLost(rank 1, connection closed) \
             | 350 | 140 | 10000 | ok |"
        ),
        "{table}"
    );
}
