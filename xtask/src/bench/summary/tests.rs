//! The summary's figures from hand-made results.

use super::*;

#[test]
fn excess_is_paired_by_round_and_falls_back_to_medians() {
    // Round 2 ran on a slow machine for both layers: pairing removes it.
    let a = json!({"time_us": 6.0, "rounds_us": [4.3, 6.3, 4.2]});
    let b = json!({"time_us": 6.0, "rounds_us": [4.0, 6.0, 4.0]});
    let d = paired_excess(&a, &b);
    assert!((d - 0.3).abs() < 1e-9, "{d}");
    let even = json!({"time_us": 5.0, "rounds_us": [5.0, 5.4]});
    let base = json!({"time_us": 5.0, "rounds_us": [5.0, 5.0]});
    assert!((paired_excess(&even, &base) - 0.2).abs() < 1e-9);
    // Older records, or rounds that do not line up: medians.
    let old = json!({"time_us": 5.5});
    assert!((paired_excess(&old, &b) + 0.5).abs() < 1e-9);
    let short = json!({"time_us": 7.0, "rounds_us": [7.0]});
    assert!((paired_excess(&short, &b) - 1.0).abs() < 1e-9);
}

fn setup_doc(world: [f64; 3], mesh: [f64; 3]) -> Value {
    let rows: Vec<Value> = (0..3)
        .map(|i| {
            json!({
                "rep": i,
                "state": if i == 0 { "cold" } else { "warm" },
                "world_ms": world[i],
                "mesh_and_first_all_reduces_ms": mesh[i],
            })
        })
        .collect();
    json!({"setup": rows})
}

/// The graph difference pairs the safe 8 B all_reduce of both graph
/// jobs; a job without it (a failed capture) is a miss, not a hit.
#[test]
fn graph_single_minus_threads_pairs_the_two_jobs() {
    let job = |us: f64| {
        json!({"results": [
            {"layer": "raw", "coll": "all_reduce", "bytes": 8, "in_place": false, "time_us": 1.0},
            {"layer": "safe", "coll": "all_reduce", "bytes": 8, "in_place": false, "time_us": us},
        ]})
    };
    let mut docs = BTreeMap::new();
    docs.insert("graph-threads".to_string(), job(5.5));
    docs.insert("graph-single".to_string(), job(5.75));
    let (flat, _) = summary(&docs);
    assert_eq!(flat["graph_single_minus_threads_us"], json!(0.25));
    assert_eq!(flat["graph_single_minus_threads_us_met"], json!(true));
    docs.remove("graph-single");
    let (flat, _) = summary(&docs);
    assert!(flat["graph_single_minus_threads_us"].is_null());
    assert_eq!(flat["graph_single_minus_threads_us_met"], json!(false));
}

/// The ratios over PyTorch divide warm medians (the cold rep left
/// out) and the step medians of the same run; without PyTorch's
/// results they are not measured, not missed.
#[test]
fn ratios_over_torch_use_warm_medians_of_the_same_run() {
    let mut docs = BTreeMap::new();
    docs.insert(
        "setup-processes".to_string(),
        setup_doc([900.0, 200.0, 220.0], [500.0, 100.0, 120.0]),
    );
    docs.insert(
        "step-processes".to_string(),
        json!({"step": {"default_us": 300.0, "raw_us": 290.0, "default_over_raw": 1.0}}),
    );
    let (flat, _) = summary(&docs);
    assert!(flat["mesh_over_torch"].is_null(), "{flat}");
    assert_eq!(flat["mesh_over_torch_met"], json!(false));
    docs.insert(
        "setup-torch".to_string(),
        setup_doc([3000.0, 110.0, 100.0], [40.0, 60.0, 40.0]),
    );
    docs.insert(
        "torch-step".to_string(),
        json!({"step": {"torch_us": 1000.0}}),
    );
    let (flat, _) = summary(&docs);
    // Warm medians: ours 220 (of 200, 220) over 110 (of 110, 100).
    assert_eq!(flat["world_over_torch"], json!(2.0));
    assert_eq!(flat["mesh_over_torch"], json!(2.0));
    assert_eq!(flat["step_over_torch"], json!(0.3));
    assert_eq!(flat["step_over_torch_met"], json!(true));
    assert_eq!(flat["world_over_torch_met"], json!(false));
}

/// `setup-torch.json` as `python/examples/torch_setup.py` writes it:
/// three launches (`--rep 0`, `1`, `2`), rep 0 making the file and
/// each later one adding its row. The summary divides by its warm
/// reps and the report lists every row under mode `torch`.
#[test]
fn setup_torch_of_three_launches_parses() {
    let torch: Value = serde_json::from_str(
        r#"{
  "meta": {
"setup": true,
"mode": "torch",
"ranks": 2,
"mesh": [
  1,
  2
],
"torch": "2.11.0+cu130",
"nccl": "2.28.9"
  },
  "setup": [
{
  "rep": 0,
  "state": "cold",
  "world_ms": 3494.7,
  "mesh_ms": 65.9,
  "first_all_reduce_dp_ms": 27.0,
  "first_all_reduce_tp_ms": 144.8,
  "mesh_and_first_all_reduces_ms": 237.70000000000002
},
{
  "rep": 1,
  "state": "warm",
  "world_ms": 250.0,
  "mesh_ms": 20.0,
  "first_all_reduce_dp_ms": 5.0,
  "first_all_reduce_tp_ms": 5.0,
  "mesh_and_first_all_reduces_ms": 30.0
},
{
  "rep": 2,
  "state": "warm",
  "world_ms": 150.0,
  "mesh_ms": 10.0,
  "first_all_reduce_dp_ms": 5.0,
  "first_all_reduce_tp_ms": 5.0,
  "mesh_and_first_all_reduces_ms": 20.0
}
  ]
}"#,
    )
    .unwrap();
    let mut docs = BTreeMap::new();
    docs.insert(
        "setup-processes".to_string(),
        setup_doc([900.0, 500.0, 300.0], [500.0, 60.0, 45.0]),
    );
    docs.insert("setup-torch".to_string(), torch);
    let (flat, _) = summary(&docs);
    // Warm medians: ours 500 (of 300, 500) over 250 (of 250, 150);
    // 60 (of 45, 60) over 30 (of 30, 20).
    assert_eq!(flat["world_over_torch"], json!(2.0), "{flat}");
    assert_eq!(flat["mesh_over_torch"], json!(2.0), "{flat}");
    let mut md = String::new();
    let mut misses = Vec::new();
    crate::bench::report::setup_section(&mut md, &docs, &mut misses).unwrap();
    for row in [
        "| torch | 0 | cold | 3494.7 | 65.9 | 27.0 | 144.8 | 237.7 |",
        "| torch | 1 | warm | 250.0 | 20.0 | 5.0 | 5.0 | 30.0 |",
        "| torch | 2 | warm | 150.0 | 10.0 | 5.0 | 5.0 | 20.0 |",
    ] {
        assert!(md.contains(row), "{row} not in\n{md}");
    }
    assert!(misses.is_empty(), "{misses:?}");
}

/// `setup_ms` is the slowest rank's own total, not the sum of the
/// phases' maxima (which the report shows in brackets beside it).
#[test]
fn setup_ms_takes_the_slowest_ranks_total_not_the_sum_of_maxima() {
    let row = |rep: u64, state: &str, total: f64, maxima: f64| {
        json!({
            "rep": rep, "state": state, "world_ms": 100.0, "mesh_ms": 30.0,
            "first_all_reduce_dp_ms": 0.1, "first_all_reduce_tp_ms": maxima - 30.1,
            "mesh_and_first_all_reduces_ms": total, "phase_maxima_sum_ms": maxima,
        })
    };
    let doc = json!({
        "meta": {"setup": true, "mode": "processes", "ranks": 2},
        "setup": [
            row(0, "cold", 40.0, 45.0),
            row(1, "warm", 31.0, 58.0),
            row(2, "warm", 33.0, 70.0),
            row(3, "warm", 35.0, 36.0),
        ],
    });
    let mut docs = BTreeMap::new();
    docs.insert("setup-processes".to_string(), doc);
    let (flat, _) = summary(&docs);
    assert_eq!(flat["setup_ms"], json!(33.0), "{flat}");
    let mut md = String::new();
    let mut misses = Vec::new();
    crate::bench::report::setup_section(&mut md, &docs, &mut misses).unwrap();
    assert!(
        md.contains("| processes | 2 | warm | 100.0 | 30.0 | 0.1 | 39.9 | 33.0 (70.0) |"),
        "{md}"
    );
}

#[test]
fn recover_ms_is_the_median_rep_of_the_slowest_survivor() {
    let doc = json!({
        "meta": {"recover": true, "mode": "threads", "ranks": 4, "lost": 3},
        "recover": [
            {"rep": 0, "recover_ms": 300.0, "recover_and_first_all_reduce_ms": 340.0},
            {"rep": 1, "recover_ms": 100.0, "recover_and_first_all_reduce_ms": 120.0},
            {"rep": 2, "recover_ms": 110.0, "recover_and_first_all_reduce_ms": 130.0},
        ],
    });
    let mut docs = BTreeMap::new();
    docs.insert("recover-threads".to_string(), doc);
    let (flat, _) = summary(&docs);
    assert_eq!(flat["recover_ms"], json!(130.0), "{flat}");
    assert_eq!(flat["recover_ms_met"], json!(true), "{flat}");
    let mut md = String::new();
    crate::bench::report::recover_section(&mut md, &docs).unwrap();
    assert!(md.contains("| threads | 1 | 100.0 | 120.0 |"), "{md}");
    assert!(flat.get("recover_by_shrink_ms").is_none(), "{flat}");
    // The opt-in shrink run beside it: its own key, not the target's.
    let shrink = json!({
        "meta": {"recover": true, "mode": "threads", "ranks": 4, "lost": 3, "recover_by_shrink": true},
        "recover": [
            {"rep": 0, "recover_ms": 40.0, "recover_and_first_all_reduce_ms": 45.0},
            {"rep": 1, "recover_ms": 50.0, "recover_and_first_all_reduce_ms": 56.0},
        ],
    });
    docs.insert("recover-threads-shrink".to_string(), shrink);
    let (flat, _) = summary(&docs);
    assert_eq!(flat["recover_ms"], json!(130.0), "{flat}");
    assert_eq!(flat["recover_by_shrink_ms"], json!(56.0), "{flat}");
    let mut md = String::new();
    crate::bench::report::recover_section(&mut md, &docs).unwrap();
    assert!(md.contains("| threads-shrink | 0 | 40.0 | 45.0 |"), "{md}");
    // Since recovery by shrink is the default: the give-up job beside it.
    let give_up = json!({
        "meta": {"recover": true, "mode": "threads", "ranks": 4, "lost": 3, "recover_by_shrink": false},
        "recover": [
            {"rep": 0, "recover_ms": 900.0, "recover_and_first_all_reduce_ms": 910.0},
        ],
    });
    docs.insert("recover-threads-give-up".to_string(), give_up);
    let (flat, _) = summary(&docs);
    assert_eq!(flat["recover_without_shrink_ms"], json!(910.0), "{flat}");
    assert_eq!(flat["recover_ms"], json!(130.0), "{flat}");
}

#[test]
fn world_over_torch_compares_fresh_processes_where_they_ran() {
    let torch = json!({
        "meta": {"setup": true, "mode": "torch", "ranks": 2},
        "setup": [
            {"rep": 0, "state": "cold", "world_ms": 3000.0, "mesh_and_first_all_reduces_ms": 200.0},
            {"rep": 1, "state": "warm", "world_ms": 250.0, "mesh_and_first_all_reduces_ms": 30.0},
            {"rep": 2, "state": "warm", "world_ms": 150.0, "mesh_and_first_all_reduces_ms": 20.0},
        ],
    });
    let mut docs = BTreeMap::new();
    docs.insert("setup-torch".to_string(), torch);
    docs.insert(
        "setup-processes".to_string(),
        setup_doc([900.0, 50.0, 60.0], [500.0, 60.0, 45.0]),
    );
    for (i, ms) in [500.0, 300.0, 400.0].into_iter().enumerate() {
        docs.insert(
            format!("setup-processes-fresh-{i}"),
            json!({
                "meta": {"setup": true, "mode": "processes", "ranks": 2},
                "setup": [{"rep": 0, "state": "fresh", "world_ms": ms, "mesh_and_first_all_reduces_ms": 99.0}],
            }),
        );
    }
    let (flat, _) = summary(&docs);
    // 400 (the median of 300, 400, 500) over 250 (of 150, 250); the
    // warm reps in one process (50, 60) are not used.
    assert_eq!(flat["world_over_torch"], json!(1.6), "{flat}");
    assert!(
        flat["world_over_torch_at"]
            .as_str()
            .is_some_and(|a| a.contains("3 fresh processes")),
        "{flat}"
    );
}

#[test]
fn small_message_keys_divide_the_2_mib_bf16_rows_and_count_every_wrong() {
    let row = |dtype: &str, bytes: u64, layer: &str, us: f64, wrong: u64| json!({"dtype": dtype, "bytes": bytes, "layer": layer, "coll": "all_reduce", "time_us": us, "wrong": wrong});
    let doc = json!({
        "meta": {"small": true, "mode": "threads", "ranks": 2},
        "small": [
            row("bf16", 2 << 20, "raw", 27.0, 0),
            row("bf16", 2 << 20, "plain", 27.5, 0),
            row("bf16", 2 << 20, "symmetric", 13.5, 0),
            row("f32", 8, "raw", 5.0, 0),
            row("f32", 8, "symmetric", 4.0, 2),
        ],
    });
    let mut docs = BTreeMap::new();
    docs.insert("small-threads".to_string(), doc);
    let (flat, _) = summary(&docs);
    assert_eq!(flat["small_allreduce_over_nccl_2mib"], json!(0.5), "{flat}");
    assert_eq!(
        flat["small_allreduce_over_nccl_2mib_met"],
        json!(true),
        "{flat}"
    );
    assert_eq!(flat["small_wrong"], json!(2.0), "{flat}");
    assert_eq!(flat["small_wrong_met"], json!(false), "{flat}");
    let mut md = String::new();
    crate::bench::report::small_section(&mut md, &docs).unwrap();
    assert!(
        md.contains("| threads | bf16 | 2097152 | 27.00 | 27.50 | 13.50 | - | 0.500 | 0 |"),
        "{md}"
    );
}

#[test]
fn small_over_torch_is_the_worst_bf16_size_up_to_4_mib() {
    let row = |dtype: &str, bytes: u64, layer: &str, us: Option<f64>| json!({"dtype": dtype, "bytes": bytes, "layer": layer, "time_us": us, "wrong": 0});
    let ours = json!({"small": [
        row("bf16", 8, "symmetric", Some(6.0)),
        row("bf16", 1 << 20, "symmetric", Some(12.0)),
        row("bf16", 8 << 20, "symmetric", Some(100.0)),
        row("f32", 8, "symmetric", Some(60.0)),
    ]});
    let torch = json!({"small": [
        row("bf16", 8, "torch_one_shot", Some(8.0)),
        row("bf16", 8, "torch_two_shot", Some(9.0)),
        row("bf16", 1 << 20, "torch_one_shot", Some(20.0)),
        row("bf16", 1 << 20, "torch_two_shot", Some(10.0)),
        row("bf16", 8 << 20, "torch_two_shot", Some(10.0)),
    ]});
    let mut docs = BTreeMap::new();
    docs.insert("small-threads".to_string(), ours);
    docs.insert("small-torch".to_string(), torch);
    // The figure, then each mode's own (`None`: that mode did not run, or
    // missed: a NaN is written as null).
    let ratios = |docs: &BTreeMap<String, Value>| {
        let (flat, _) = summary(docs);
        let key = "small_allreduce_over_torch_symm_max";
        let get = |k: String| flat[&k].as_f64();
        (
            get(key.into()),
            get(format!("{key}_threads")),
            get(format!("{key}_processes")),
        )
    };
    // 8 B: 6/8; 1 MiB: 12/10 (the better of 20 and 10); 8 MiB is past
    // the range and f32 not counted.
    assert_eq!(ratios(&docs), (Some(1.2), Some(1.2), None));
    // A process per GPU: the worse mode is the figure, each mode its own.
    let processes = json!({"small": [
        row("bf16", 8, "symmetric", Some(4.0)),
        row("bf16", 1 << 20, "symmetric", Some(15.0)),
    ]});
    docs.insert("small-processes".to_string(), processes);
    assert_eq!(ratios(&docs), (Some(1.5), Some(1.2), Some(1.5)));
    let (flat, _) = summary(&docs);
    assert!(
        flat["small_allreduce_over_torch_symm_max_at"]
            .as_str()
            .is_some_and(|at| at.starts_with("small-processes bf16 1048576 B")),
        "{flat}"
    );
    docs.remove("small-processes");
    // A size PyTorch gave no time for is a miss.
    docs.insert(
        "small-torch".to_string(),
        json!({"small": [row("bf16", 8, "torch_one_shot", None)]}),
    );
    let (flat, _) = summary(&docs);
    assert_eq!(
        flat["small_allreduce_over_torch_symm_max_met"],
        json!(false),
        "{flat}"
    );
}

/// The busbw floor: the least safe or dist ratio over raw from 128 MiB
/// up, over every collective; smaller sizes do not count, a ratio below
/// 0.99 is a miss (shown with the sign of a floor), and a sweep without
/// such sizes is a miss, not a hit.
#[test]
fn busbw_large_over_raw_is_a_floor_over_large_sizes() {
    let row = |coll: &str, layer: &str, mib: u64, bw: f64| {
        json!({"coll": coll, "layer": layer, "bytes": mib << 20, "in_place": false,
               "dtype": "f32", "redop": "sum", "root": -1, "busbw_gbs": bw})
    };
    let sweep = |rows: Vec<Value>| {
        let mut docs = BTreeMap::new();
        docs.insert("sweep-threads".to_string(), json!({ "results": rows }));
        summary(&docs)
    };
    let (flat, targets) = sweep(vec![
        row("all_reduce", "raw", 64, 100.0),
        row("all_reduce", "safe", 64, 50.0),
        row("all_reduce", "raw", 128, 100.0),
        row("all_reduce", "safe", 128, 99.5),
        row("all_reduce", "dist", 128, 99.2),
        row("all_gather", "raw", 256, 200.0),
        row("all_gather", "safe", 256, 199.0),
    ]);
    let min = flat["busbw_large_over_raw_min"].as_f64().unwrap();
    assert!((min - 0.992).abs() < 1e-12, "{min}");
    assert_eq!(flat["busbw_large_over_raw_min_met"], json!(true));
    assert_eq!(
        flat["busbw_large_over_raw_min_at"],
        json!("all_reduce dist 128 MiB out of place")
    );
    let mut md = String::new();
    targets_section(&mut md, &targets, &mut Vec::new()).unwrap();
    assert!(
        md.contains("| `busbw_large_over_raw_min` | 0.992  | ≥ 0.99  | met |"),
        "{md}"
    );

    let (flat, targets) = sweep(vec![
        row("all_reduce", "raw", 128, 100.0),
        row("all_reduce", "safe", 128, 98.99),
    ]);
    assert_eq!(flat["busbw_large_over_raw_min_met"], json!(false));
    let mut misses = Vec::new();
    targets_section(&mut String::new(), &targets, &mut misses).unwrap();
    assert!(
        misses
            .iter()
            .any(|m| m == "busbw_large_over_raw_min = 0.9899 < 0.99"),
        "{misses:?}"
    );

    assert_eq!(flat["busbw_large_over_raw_min_floor"], json!(true));
    assert_eq!(flat["busbw_large_over_raw_min_target"], json!(0.99));

    // A large record without its busbw, or without raw's beside it, is a
    // miss, never passed over for a good ratio.
    let mut no_bw = row("all_reduce", "safe", 256, 0.0);
    no_bw.as_object_mut().unwrap().remove("busbw_gbs");
    for odd in [no_bw, row("all_gather", "dist", 128, 100.0)] {
        let (flat, _) = sweep(vec![
            row("all_reduce", "raw", 128, 100.0),
            row("all_reduce", "safe", 128, 100.0),
            odd,
        ]);
        assert!(flat["busbw_large_over_raw_min"].is_null(), "{flat}");
        assert_eq!(flat["busbw_large_over_raw_min_met"], json!(false));
    }

    let (flat, _) = sweep(vec![row("all_reduce", "raw", 8, 1.0)]);
    assert!(flat["busbw_large_over_raw_min"].is_null());
    assert_eq!(flat["busbw_large_over_raw_min_met"], json!(false));
    let (flat, _) = summary(&BTreeMap::new());
    assert!(flat["busbw_large_over_raw_min"].is_null());
}

/// The busbw ratio pairs the layers by round (raw's time over the
/// layer's, the median over rounds); rounds that do not line up give the
/// ratio of the busbw medians.
#[test]
fn busbw_ratio_is_paired_by_round() {
    let row = |layer: &str, bw: f64, rounds: &[f64]| {
        json!({"coll": "all_to_all", "layer": layer, "bytes": 128u64 << 20, "in_place": false,
               "dtype": "f32", "redop": "none", "root": -1, "busbw_gbs": bw, "rounds_us": rounds})
    };
    let sweep = |rows: Vec<Value>| {
        let mut docs = BTreeMap::new();
        docs.insert("sweep-threads".to_string(), json!({ "results": rows }));
        summary(&docs).0["busbw_large_over_raw_min"]
            .as_f64()
            .unwrap()
    };
    // Round ratios 263/265 = 0.9925, 270/270 = 1 and 265/263 = 1.0076:
    // the median is 1, where the medians' busbw (set apart on purpose)
    // would give 0.9.
    let paired = sweep(vec![
        row("raw", 100.0, &[263.0, 270.0, 265.0]),
        row("safe", 90.0, &[265.0, 270.0, 263.0]),
    ]);
    assert!((paired - 1.0).abs() < 1e-12, "{paired}");
    let unpaired = sweep(vec![
        row("raw", 100.0, &[263.0, 270.0, 265.0]),
        row("safe", 90.0, &[265.0, 270.0]),
    ]);
    assert!((unpaired - 0.9).abs() < 1e-12, "{unpaired}");
}

/// The step's ratio pairs the sides by round: a round in which the
/// machine ran slow for both sides moves nothing, while the ratio of the
/// medians can take one side's fast stretch against the other's slow
/// one. Without rounds, the medians' ratio; the worst mode counts.
#[test]
fn step_ratio_is_paired_by_round() {
    let step = json!({
        "default_us": 80.0, "raw_us": 64.0, "default_over_raw": 1.25,
        // Rounds of 1.10, 1.10, 1.30, 1.10 and 1.00.
        "default_rounds_us": [77.0, 88.0, 83.2, 70.4, 80.0],
        "raw_rounds_us": [70.0, 80.0, 64.0, 64.0, 80.0],
    });
    assert!((paired_step_ratio(&step) - 1.10).abs() < 1e-12);
    let even = json!({"default_rounds_us": [11.0, 12.0], "raw_rounds_us": [10.0, 10.0]});
    assert!((paired_step_ratio(&even) - 1.15).abs() < 1e-12);
    let old = json!({"default_us": 102.0, "raw_us": 100.0, "default_over_raw": 1.02});
    assert!((paired_step_ratio(&old) - 1.02).abs() < 1e-12);

    let mut docs = BTreeMap::new();
    docs.insert("step-processes".to_string(), json!({ "step": step }));
    docs.insert("step-threads".to_string(), json!({ "step": old }));
    let (flat, _) = summary(&docs);
    let paired = flat["default_step_over_raw"].as_f64().unwrap();
    assert!((paired - 1.10).abs() < 1e-12, "{flat}");
    assert_eq!(flat["default_step_over_raw_at"], json!("processes"));
    assert_eq!(flat["default_step_over_raw_met"], json!(false));
    assert_eq!(flat["default_step_over_raw_medians"], json!(1.25));
    // Raw's µs per step in the same job, beside the ratio.
    assert_eq!(flat["default_step_raw_us"], json!(64.0));
    assert_eq!(flat["default_step_raw_us_at"], json!("processes"));
    assert_eq!(flat["default_step_over_raw_floor"], json!(false));
}
