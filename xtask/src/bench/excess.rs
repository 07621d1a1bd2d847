//! The split of the typed path's per-call excess over raw NCCL: the
//! driver calls it adds (the `raw_probe` layer, costed inside the loop)
//! and its own code, per collective of the latency jobs; the summary's
//! medians of it and the report's table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::Result;
use crate::bench::json::{f, results, s, same};
use crate::bench::summary::{
    TARGET_MODES, human, paired_excess, point_label, small_points, smallest, upper_median, worst,
};

/// Where one collective's per-call excess goes, at its smallest size, out
/// of place (a latency job with the `raw_probe` layer): the driver calls the
/// typed path adds (`raw_probe − raw`, measured inside the loop) and the
/// rest, the typed path's own code (`safe − raw_probe`); `raw_issue_us` is
/// raw's issuing loop alone, which equals `raw_us` when the loop is bound
/// by the host.
pub struct ExcessSplit<'d> {
    pub coll: &'d str,
    pub bytes: u64,
    pub raw_us: f64,
    pub raw_issue_us: f64,
    pub probe_minus_raw: f64,
    pub safe_minus_probe: f64,
    pub safe_minus_raw: f64,
}

/// [`ExcessSplit`] of every collective in `doc` that has the three layers.
pub fn excess_split(doc: &Value) -> Vec<ExcessSplit<'_>> {
    let all: Vec<&Value> = results(doc).collect();
    let at = |layer: &str, of: &Value| -> Option<&Value> {
        all.iter()
            .find(|r| s(r, "layer") == layer && same(r, of))
            .copied()
    };
    smallest(doc, "raw")
        .into_iter()
        .filter_map(|(coll, raw)| {
            let (probe, safe) = (at("raw_probe", raw)?, at("safe", raw)?);
            Some(ExcessSplit {
                coll,
                bytes: raw["bytes"].as_u64().unwrap_or(0),
                raw_us: f(raw, "time_us"),
                raw_issue_us: raw["issue_us"].as_f64().unwrap_or(f64::NAN),
                probe_minus_raw: paired_excess(probe, raw),
                safe_minus_probe: paired_excess(safe, probe),
                safe_minus_raw: paired_excess(safe, raw),
            })
        })
        .collect()
}

/// How the per-call differences spread over every point (mode,
/// collective, size up to 1 KiB, placement) of the latency jobs in
/// threads and processes mode: dist − raw at the median point and at the
/// largest (the latter is `default_minus_raw_small_us_max`, NaN winning
/// as there), and the same for `raw_probe` − raw, whose own cost is two
/// driver calls: its largest less its median is how far above a layer's
/// typical excess the largest of that many noisy paired medians lands.
/// Medians leave NaN points out. `None` without both layers' points.
pub struct Spread {
    pub points: usize,
    pub dist_median: f64,
    pub dist_max: f64,
    pub probe_median: f64,
    pub probe_max: f64,
    pub probe_max_at: String,
}

pub fn spread(docs: &BTreeMap<String, Value>) -> Option<Spread> {
    let points = |layer: &str| -> Vec<(f64, String)> {
        TARGET_MODES
            .iter()
            .filter_map(|m| docs.get(&format!("latency-{m}")).map(|d| (*m, d)))
            .flat_map(|(m, d)| {
                small_points(d, layer)
                    .into_iter()
                    .map(move |(v, r)| (v, point_label(m, r)))
            })
            .collect()
    };
    let median = |v: &[(f64, String)]| {
        upper_median(v.iter().map(|(x, _)| *x).filter(|x| !x.is_nan()).collect())
    };
    let (dist, probe) = (points("dist"), points("raw_probe"));
    let (dist_max, _) = worst(dist.iter().cloned())?;
    let (probe_max, probe_max_at) = worst(probe.iter().cloned())?;
    Some(Spread {
        points: dist.len(),
        dist_median: median(&dist)?,
        dist_max,
        probe_median: median(&probe)?,
        probe_max,
        probe_max_at,
    })
}

/// Where the step's excess over raw goes, for step jobs run with
/// `--step-raw-mesh`: the raw calls on the mesh's own communicators and
/// stream against raw's (NCCL's part) and the default side against them
/// (what our layers add per step); each side's issuing loop beside its
/// time says whether the host is the bound.
pub fn step_split_section(md: &mut String, found: &[(&str, &Value)]) -> Result<()> {
    let with: Vec<&(&str, &Value)> = found
        .iter()
        .filter(|(_, d)| d["step"]["raw_mesh_us"].is_f64())
        .collect();
    if with.is_empty() {
        return Ok(());
    }
    writeln!(
        md,
        "Where the default side's excess goes: `raw_mesh` is the raw side's calls on the mesh's own communicators and stream (what NCCL does there, nothing of ours per call). Differences are paired medians over rounds; issue is the issuing loop alone, per step (equal to the step's time where the host is the bound).\n"
    )?;
    writeln!(
        md,
        "| mode | default (issue) | raw (issue) | raw_mesh (issue) | raw_mesh − raw | default − raw_mesh | per call |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|")?;
    for (mode, doc) in with {
        let st = &doc["step"];
        let calls = doc["meta"]["calls_per_step"].as_f64().unwrap_or(f64::NAN);
        writeln!(
            md,
            "| {mode} | {:.2} ({:.2}) | {:.2} ({:.2}) | {:.2} ({:.2}) | {:+.2} | {:+.2} | {:+.2} |",
            f(st, "default_us"),
            f(st, "default_issue_us"),
            f(st, "raw_us"),
            f(st, "raw_issue_us"),
            f(st, "raw_mesh_us"),
            f(st, "raw_mesh_issue_us"),
            f(st, "raw_mesh_minus_raw_us"),
            f(st, "default_minus_raw_mesh_us"),
            f(st, "default_minus_raw_mesh_us") / calls,
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// Where the safe layer's excess over raw goes, per mode with the
/// `raw_probe` layer: the driver calls it adds, costed inside the loop,
/// and its own code; then what each of those calls and a few primitives
/// cost alone (the bench's `host_costs_ns`).
pub fn excess_section(md: &mut String, docs: &BTreeMap<String, Value>) -> Result<()> {
    let found: Vec<(&str, &Value, Vec<ExcessSplit<'_>>)> = TARGET_MODES
        .iter()
        .filter_map(|m| {
            let doc = docs.get(&format!("latency-{m}"))?;
            Some((*m, doc, excess_split(doc)))
        })
        .filter(|(_, _, v)| !v.is_empty())
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    writeln!(
        md,
        "### Where the per-call excess goes

At each collective's smallest size, out of place, µs per call. raw and raw issue are medians over rounds; the differences are paired medians over rounds (each round's difference), so they need not add up. raw issue: raw's issuing loop alone, per call; where it equals raw's time the loop is bound by the host, and every cost on the issuing thread shows in full. probe − raw: `raw_probe` (raw plus one capture-status query and one context binding before each call, the driver calls a typed collective makes) over raw. safe − probe: the rest of the safe layer's excess, its own code. The typed send_recv and the send/recv forms make more driver calls than the probe (a capture check per part and one at the group's end), so on their rows probe − raw counts too few and safe − probe too many.\n"
    )?;
    writeln!(
        md,
        "| mode | collective | size | raw | raw issue | probe − raw | safe − probe | safe − raw |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|")?;
    for (mode, _, splits) in &found {
        for x in splits {
            writeln!(
                md,
                "| {mode} | {} | {} | {:.2} | {:.2} | {:+.2} | {:+.2} | {:+.2} |",
                x.coll,
                human(x.bytes),
                x.raw_us,
                x.raw_issue_us,
                x.probe_minus_raw,
                x.safe_minus_probe,
                x.safe_minus_raw
            )?;
        }
    }
    writeln!(md)?;
    writeln!(
        md,
        "Each piece alone, ns per call (the leader's thread before the sweep, the GPU idle):\n"
    )?;
    for (mode, doc, _) in &found {
        if let Some(costs) = doc["meta"]["host_costs_ns"].as_object() {
            let cells: Vec<String> = costs
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{k} {}",
                        v.as_f64().map_or("-".into(), |x| format!("{x:.0}"))
                    )
                })
                .collect();
            writeln!(md, "- {mode}: {}", cells.join(", "))?;
        }
    }
    writeln!(md)?;
    if let Some(x) = spread(docs) {
        writeln!(
            md,
            "Over every point of the latency jobs in threads and processes mode ({} points: each mode, collective, size ≤ 1 KiB and placement): dist − raw {:+.2} µs at the median point and {:+.2} at the largest (`default_minus_raw_small_us_max`). `raw_probe` − raw, whose own cost is two driver calls, {:+.2} at the median point and {:+.2} at the largest ({}): on this machine the largest of that many paired medians lands about {:.2} µs above a layer's typical excess (`default_minus_raw_small_us_median`, `probe_minus_raw_small_us_max`, `probe_spread_small_us` in `summary`, not targets).\n",
            x.points,
            x.dist_median,
            x.dist_max,
            x.probe_median,
            x.probe_max,
            x.probe_max_at,
            x.probe_max - x.probe_median
        )?;
    }
    Ok(())
}

/// The summary's keys of the split (not targets), put into `summary` (a
/// flat object): medians over the collectives of the latency jobs in
/// threads and processes mode (nothing without `raw_probe` rows), and the
/// keys of [`spread`].
pub fn add_keys(summary: &mut Value, docs: &BTreeMap<String, Value>) {
    let latency: Vec<(&str, &Value)> = TARGET_MODES
        .iter()
        .filter_map(|m| docs.get(&format!("latency-{m}")).map(|d| (*m, d)))
        .collect();
    let splits: Vec<ExcessSplit<'_>> = latency.iter().flat_map(|(_, d)| excess_split(d)).collect();
    let Some(flat) = summary.as_object_mut() else {
        return;
    };
    if let Some(x) = spread(docs) {
        flat.insert(
            "default_minus_raw_small_us_median".into(),
            json!(x.dist_median),
        );
        flat.insert("probe_minus_raw_small_us_max".into(), json!(x.probe_max));
        flat.insert(
            "probe_minus_raw_small_us_max_at".into(),
            json!(x.probe_max_at),
        );
        flat.insert(
            "probe_spread_small_us".into(),
            json!(x.probe_max - x.probe_median),
        );
    }
    if splits.is_empty() {
        return;
    }
    let median = |pick: &dyn Fn(&ExcessSplit<'_>) -> f64| {
        upper_median(splits.iter().map(pick).filter(|x| !x.is_nan()).collect())
    };
    let keys = [
        ("probe_minus_raw_small_us", median(&|x| x.probe_minus_raw)),
        ("safe_minus_probe_small_us", median(&|x| x.safe_minus_probe)),
        (
            "raw_issue_over_time_small",
            median(&|x| x.raw_issue_us / x.raw_us),
        ),
    ];
    for (key, v) in keys {
        flat.insert(key.into(), json!(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(layer: &str, bytes: u64, rounds: &[f64], issue: f64) -> Value {
        json!({
            "coll": "all_reduce", "bytes": bytes, "in_place": false, "mode": "threads",
            "graph": false, "layer": layer, "time_us": rounds[rounds.len() / 2],
            "rounds_us": rounds, "issue_us": issue,
        })
    }

    #[test]
    fn splits_the_smallest_size_by_paired_rounds_and_adds_the_medians() {
        let doc = json!({ "results": [
            row("raw", 8, &[10.0, 11.0, 12.0], 10.9),
            row("raw_probe", 8, &[10.1, 11.1, 12.2], 11.0),
            row("safe", 8, &[10.6, 11.5, 12.9], 11.4),
            // A larger size is not the collective's smallest: left out.
            row("raw", 64, &[20.0, 20.0, 20.0], 20.0),
            row("raw_probe", 64, &[25.0, 25.0, 25.0], 25.0),
            row("safe", 64, &[30.0, 30.0, 30.0], 30.0),
        ]});
        let splits = excess_split(&doc);
        assert_eq!(splits.len(), 1);
        let x = &splits[0];
        assert_eq!((x.coll, x.bytes), ("all_reduce", 8));
        assert!(
            (x.probe_minus_raw - 0.1).abs() < 1e-9,
            "{}",
            x.probe_minus_raw
        );
        assert!(
            (x.safe_minus_probe - 0.5).abs() < 1e-9,
            "{}",
            x.safe_minus_probe
        );
        assert!(
            (x.safe_minus_raw - 0.6).abs() < 1e-9,
            "{}",
            x.safe_minus_raw
        );
        assert!((x.raw_issue_us - 10.9).abs() < 1e-9);

        let mut docs = BTreeMap::new();
        docs.insert("latency-threads".to_string(), doc);
        let mut summary = json!({});
        add_keys(&mut summary, &docs);
        assert!((summary["probe_minus_raw_small_us"].as_f64().unwrap() - 0.1).abs() < 1e-9);
        assert!((summary["safe_minus_probe_small_us"].as_f64().unwrap() - 0.5).abs() < 1e-9);
        assert!(
            (summary["raw_issue_over_time_small"].as_f64().unwrap() - 10.9 / 11.0).abs() < 1e-9
        );
    }

    /// The spread over every point: medians leave NaN out, the largest
    /// lets it win (as the target does), and the probe's spread is its
    /// largest less its median.
    #[test]
    fn the_spread_takes_every_point_and_lets_a_missing_one_win_the_largest() {
        let doc = json!({ "results": [
            row("raw", 8, &[10.0, 10.0, 10.0], 10.0),
            row("dist", 8, &[10.5, 10.5, 10.5], 10.5),
            row("raw_probe", 8, &[10.1, 10.1, 10.1], 10.1),
            row("raw", 64, &[20.0, 20.0, 20.0], 20.0),
            row("dist", 64, &[22.0, 22.0, 22.0], 22.0),
            row("raw_probe", 64, &[20.7, 20.7, 20.7], 20.7),
            row("raw", 512, &[30.0, 30.0, 30.0], 30.0),
            row("dist", 512, &[30.7, 30.7, 30.7], 30.7),
            row("raw_probe", 512, &[30.0, 30.0, 30.0], 30.0),
        ]});
        let mut docs = BTreeMap::new();
        docs.insert("latency-threads".to_string(), doc);
        let x = spread(&docs).unwrap();
        assert_eq!(x.points, 3);
        assert!((x.dist_median - 0.7).abs() < 1e-9, "{}", x.dist_median);
        assert!((x.dist_max - 2.0).abs() < 1e-9, "{}", x.dist_max);
        assert!((x.probe_median - 0.1).abs() < 1e-9, "{}", x.probe_median);
        assert!((x.probe_max - 0.7).abs() < 1e-9, "{}", x.probe_max);
        assert_eq!(x.probe_max_at, "threads all_reduce 64 B out of place");
        let mut summary = json!({});
        add_keys(&mut summary, &docs);
        assert!((summary["probe_spread_small_us"].as_f64().unwrap() - 0.6).abs() < 1e-9);
        assert!(
            (summary["default_minus_raw_small_us_median"]
                .as_f64()
                .unwrap()
                - 0.7)
                .abs()
                < 1e-9
        );
        // The largest agrees with the target's figure.
        let (flat, _) = crate::bench::summary::summary(&docs);
        assert_eq!(
            flat["default_minus_raw_small_us_max"].as_f64(),
            Some(x.dist_max)
        );

        // A probe point without raw's record is NaN: it wins the largest.
        let mut docs = docs.clone();
        let doc = docs.get_mut("latency-threads").unwrap();
        doc["results"]
            .as_array_mut()
            .unwrap()
            .push(row("raw_probe", 1024, &[1.0, 1.0, 1.0], 1.0));
        let x = spread(&docs).unwrap();
        assert!(x.probe_max.is_nan());
        assert!((x.probe_median - 0.1).abs() < 1e-9);
    }

    #[test]
    fn no_probe_rows_add_no_keys() {
        let doc = json!({ "results": [row("raw", 8, &[1.0], 1.0), row("safe", 8, &[2.0], 2.0)] });
        assert!(excess_split(&doc).is_empty());
        let mut docs = BTreeMap::new();
        docs.insert("latency-processes".to_string(), doc);
        let mut summary = json!({});
        add_keys(&mut summary, &docs);
        assert_eq!(summary, json!({}));
    }

    #[test]
    fn the_step_split_has_a_row_per_job_with_raw_mesh_only() {
        let with = json!({
            "meta": {"calls_per_step": 9},
            "step": {
                "default_us": 90.0, "default_issue_us": 89.9, "raw_us": 80.0, "raw_issue_us": 79.9,
                "raw_mesh_us": 80.5, "raw_mesh_issue_us": 80.4,
                "raw_mesh_minus_raw_us": 0.5, "default_minus_raw_mesh_us": 9.0,
            },
        });
        let without = json!({"meta": {}, "step": {"default_us": 90.0, "raw_us": 80.0}});
        let mut md = String::new();
        step_split_section(&mut md, &[("processes", &without)]).unwrap();
        assert!(md.is_empty(), "no raw_mesh side, no table: {md}");
        step_split_section(&mut md, &[("threads", &with), ("processes", &without)]).unwrap();
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| threads")).collect();
        assert_eq!(
            rows,
            ["| threads | 90.00 (89.90) | 80.00 (79.90) | 80.50 (80.40) | +0.50 | +9.00 | +1.00 |"]
        );
        assert!(!md.contains("| processes"));
    }
}
