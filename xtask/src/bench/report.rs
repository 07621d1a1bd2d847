//! `report.md`, `bench.json` and `busbw.svg` from the jobs' JSON: a
//! section per phase, the targets table first.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde_json::{Value, json};

use crate::Result;
use crate::bench::NCCL_TESTS_2G;
use crate::bench::excess::excess_section;
use crate::bench::json::{f, load, results, s, same};
use crate::bench::summary::{
    TARGET_MODES, at_least, at_most, human, large_busbw_ratio, paired_excess, paired_step_ratio,
    signed, small_points, smallest, summary, targets_section, worst,
};

/// Writes report.md, bench.json and busbw.svg from the JSON in `dir`;
/// errors when a result is wrong or a target is missed.
pub fn report(dir: &Path) -> Result<()> {
    let docs = load(dir)?;
    if docs.is_empty() {
        return Err(format!("no bench JSON in {}", dir.display()).into());
    }
    let mut md = String::new();
    let mut misses: Vec<String> = Vec::new();
    // The first document that names the library (not every phase's does).
    let meta = docs
        .values()
        .find(|d| d["meta"]["nccl"].is_string())
        .or_else(|| docs.values().next())
        .map(|d| d["meta"].clone())
        .unwrap_or_default();
    writeln!(md, "# Bench report\n")?;
    writeln!(
        md,
        "NCCL {}, {} ranks. Every figure below comes from this one run; ratios compare layers measured back to back.\n",
        s(&meta, "nccl"),
        meta["ranks"]
    )?;
    let step_wrong: u64 = docs
        .values()
        .map(|d| {
            ["wrong_default", "wrong_raw", "differ"]
                .iter()
                .filter_map(|k| d["step"][*k].as_u64())
                .sum::<u64>()
        })
        .sum();
    let wrong: u64 = docs
        .values()
        .flat_map(results)
        .filter_map(|r| r["wrong"].as_u64())
        .sum::<u64>()
        + step_wrong;
    writeln!(md, "Wrong elements over every check: **{wrong}**.\n")?;
    if wrong > 0 {
        misses.push(format!("{wrong} wrong elements"));
    }

    if let Some(doc) = docs.get("sweep-threads") {
        sweep_section(&mut md, doc, &mut misses)?;
        plot(doc, &dir.join("busbw.svg"))?;
        writeln!(
            md,
            "Plot: `busbw.svg` (busbw against size, out of place, per layer).\n"
        )?;
    }
    watchdog_fired(&mut md, dir, &mut misses)?;
    let (mut summary, targets) = summary(&docs);
    crate::bench::excess::add_keys(&mut summary, &docs);
    targets_section(&mut md, &targets, &mut misses)?;
    latency_section(&mut md, &docs, &mut misses)?;
    watchdog_section(&mut md, &docs)?;
    step_section(&mut md, &docs)?;
    graph_section(&mut md, &docs, &mut misses)?;
    allocation_section(&mut md, &docs, &mut misses)?;
    setup_section(&mut md, &docs, &mut misses)?;
    recover_section(&mut md, &docs)?;
    small_section(&mut md, &docs)?;

    writeln!(md, "## Verdict\n")?;
    if misses.is_empty() {
        writeln!(md, "Every target met.")?;
    } else {
        for m in &misses {
            writeln!(md, "- MISSED: {m}")?;
        }
    }
    std::fs::write(dir.join("report.md"), &md)?;
    let mut all: BTreeMap<&str, &Value> = docs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    all.insert("summary", &summary);
    std::fs::write(
        dir.join("bench.json"),
        serde_json::to_string_pretty(&json!(all))?,
    )?;
    println!("{md}");
    eprintln!(
        "xtask: bench: wrote {}, bench.json and busbw.svg",
        dir.join("report.md").display()
    );
    if misses.is_empty() {
        Ok(())
    } else {
        Err(format!("bench: {} target(s) missed", misses.len()).into())
    }
}

/// Jobs whose stderr (`JOB.err`, the jobs run by this process rather than
/// the launcher) holds the watchdog's report: an operation timed out, or
/// a communicator was aborted with operations the watchdog still counted
/// as unfinished. Each is a miss, whatever the job's exit status.
pub fn watchdog_fired(md: &mut String, dir: &Path, misses: &mut Vec<String>) -> Result<()> {
    let mut fired = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "err") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let job = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The recover phase loses a rank on purpose: the watchdog naming
        // that loss is the phase working, any other report a miss.
        let expected = |l: &str| job.starts_with("recover-") && l.contains(" was lost (");
        if let Some(line) = text
            .lines()
            .find(|l| l.starts_with("nccl-dist watchdog:") && !expected(l))
        {
            fired.push((job, line.to_string()));
        }
    }
    if fired.is_empty() {
        return Ok(());
    }
    fired.sort();
    writeln!(
        md,
        "## The watchdog fired
"
    )?;
    writeln!(
        md,
        "Its first line in each job's stderr (the flight recorder follows it in `JOB.err`):
"
    )?;
    for (job, line) in &fired {
        writeln!(md, "- `{job}`: {line}")?;
        misses.push(format!("the watchdog fired in {job} (see {job}.err)"));
    }
    writeln!(md)?;
    Ok(())
}

/// The watchdog's cost: the safe layer with and without the watchdog's
/// observer on the same communicator, at each collective's smallest size.
pub fn watchdog_section(md: &mut String, docs: &BTreeMap<String, Value>) -> Result<()> {
    let mut rows = Vec::new();
    for mode in TARGET_MODES {
        let Some(doc) = docs.get(&format!("latency-{mode}")) else {
            continue;
        };
        for (coll, on) in smallest(doc, "safe_wd") {
            let off_rec = results(doc).find(|q| s(q, "layer") == "safe" && same(q, on));
            let off = off_rec.map_or(f64::NAN, |q| f(q, "time_us"));
            let over = off_rec.map_or(f64::NAN, |q| paired_excess(on, q));
            let t = f(on, "time_us");
            rows.push(format!(
                "| {mode} | {coll} | {} | {off:.2} | {t:.2} | {over:+.3} |",
                human(on["bytes"].as_u64().unwrap_or(0)),
            ));
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(
        md,
        "## Watchdog overhead
"
    )?;
    writeln!(
        md,
        "µs per call (median of rounds, slowest rank), out of place, at each collective's smallest size: the safe layer on one communicator, its watchdog observer removed (off) or set (on) between measurements, interleaved in every round. on − off is the median over rounds of each round's difference; `watchdog_overhead_us` is the largest.
"
    )?;
    writeln!(md, "| mode | collective | size | off | on | on − off |")?;
    writeln!(md, "|---|---|---|---|---|---|")?;
    for r in rows {
        writeln!(md, "{r}")?;
    }
    writeln!(md)?;
    Ok(())
}

/// The training-like step: default options against raw, per mode.
pub fn step_section(md: &mut String, docs: &BTreeMap<String, Value>) -> Result<()> {
    let heading = "## Training step (2-D DeviceMesh)

The step of `docs/bench/README.md` (broadcast, all_reduce, all_to_all, reduce_scatter + all_gather, a send/recv ring, a PreMulSum average and a loss all_reduce over the dp and tp axes, bf16 and f32, 8 B to 1 MiB): µs per step, median of interleaved rounds, slowest rank; checked bit for bit against the expected values and between the sides after the timing. default / raw is the median over rounds of each round's ratio (what `default_step_over_raw` takes); the ratio of the two medians is beside it.

| mode | mesh | default (µs) | raw (µs) | default / raw | ratio of medians | allocs per step (default) | wrong (default / raw) | differ |
|---|---|---|---|---|---|---|---|---|
";
    let found = phase(md, docs, "step-", heading);
    for &(mode, doc) in &found {
        let st = &doc["step"];
        let mesh = &doc["meta"]["mesh"];
        writeln!(
            md,
            "| {mode} | {}×{} | {:.2} | {:.2} | {:.4} | {:.4} | {:.3} | {} / {} | {} |",
            mesh["dp"],
            mesh["tp"],
            f(st, "default_us"),
            f(st, "raw_us"),
            paired_step_ratio(st),
            f(st, "default_over_raw"),
            f(st, "allocs_per_step_default"),
            st["wrong_default"],
            st["wrong_raw"],
            st["differ"],
        )?;
    }
    if !found.is_empty() {
        writeln!(md)?;
    }
    crate::bench::excess::step_split_section(md, &found)?;
    if let Some(torch) = docs.get("torch-step") {
        let mesh = &torch["meta"]["mesh"];
        writeln!(
            md,
            "PyTorch {} (NCCL {}), the same step on a {}×{} `DeviceMesh`, a process per GPU, same GPUs, same run (`python/examples/torch_step.py`; average by {}): {:.2} µs per step, median of {} rounds, slowest rank (values not checked).\n",
            s(&torch["meta"], "torch"),
            s(&torch["meta"], "nccl"),
            mesh["dp"],
            mesh["tp"],
            s(&torch["meta"], "average"),
            f(&torch["step"], "torch_us"),
            torch["step"]["torch_rounds_us"]
                .as_array()
                .map_or(0, Vec::len),
        )?;
    }
    Ok(())
}

/// busbw per layer at the largest size, and the least safe/raw and
/// dist/raw ratio at 128 MiB and above.
pub fn sweep_section(md: &mut String, doc: &Value, misses: &mut Vec<String>) -> Result<()> {
    writeln!(md, "## Bandwidth (a thread per GPU)\n")?;
    writeln!(
        md,
        "busbw in GB/s at the largest size, out of place (median of rounds); the ratios are the least over every size ≥ 128 MiB and both placements (target ≥ 0.99), each the median over rounds of the round's ratio (the layers take turns in every round, and each round starts with the next layer).\n"
    )?;
    writeln!(
        md,
        "| collective | size | raw | safe | dist | nccl-tests 2.19.6 (2 GiB, from the issue) | safe/raw min | dist/raw min |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|")?;
    let rs: Vec<&Value> = results(doc).collect();
    for (coll, reference) in NCCL_TESTS_2G {
        let of = |layer: &str| -> Vec<&Value> {
            rs.iter()
                .copied()
                .filter(|r| s(r, "coll") == *coll && s(r, "layer") == layer)
                .collect()
        };
        let raw = of("raw");
        let Some(largest) = raw
            .iter()
            .filter(|r| r["in_place"] == false)
            .max_by_key(|r| r["bytes"].as_u64())
        else {
            continue;
        };
        let bw = |layer: &str| {
            of(layer)
                .iter()
                .find(|r| same(r, largest))
                .map_or("-".to_string(), |r| format!("{:.1}", f(r, "busbw_gbs")))
        };
        let ratio = |layer: &str| large_busbw_ratio(&rs, coll, layer).map(|(x, _)| x);
        let mut cells = Vec::new();
        for layer in ["safe", "dist"] {
            match ratio(layer) {
                Some(x) => {
                    // Written so that a missing (NaN) ratio is a miss.
                    if !at_least(x, 0.99) {
                        misses.push(format!("{coll}: {layer}/raw busbw {x:.4} < 0.99"));
                    }
                    cells.push(format!("{x:.4}"));
                }
                None => cells.push("-".into()),
            }
        }
        writeln!(
            md,
            "| {coll} | {} | {} | {} | {} | {reference} | {} | {} |",
            human(largest["bytes"].as_u64().unwrap_or(0)),
            bw("raw"),
            bw("safe"),
            bw("dist"),
            cells[0],
            cells[1]
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// Time per call at the smallest size of each collective, per mode; the
/// target is at most 0.5 µs above raw.
pub fn latency_section(
    md: &mut String,
    docs: &BTreeMap<String, Value>,
    misses: &mut Vec<String>,
) -> Result<()> {
    let heading = "## Small messages\n\nµs per call (median of rounds, slowest rank), out of place, at each collective's smallest size; raw and safe on a blocking communicator without watchdog, dist on the world made with default options (watchdog on); target: safe and dist at most 0.5 µs above raw. Each difference is the median over rounds of the round's difference (the layers take turns in every round), so it is not always the difference of the medians shown. The last column is the largest dist − raw over every size up to 1 KiB and both placements (what `default_minus_raw_small_us_max` takes).\n\n";
    for (mode, doc) in phase(md, docs, "latency-", heading) {
        writeln!(md, "### {mode}\n")?;
        writeln!(
            md,
            "| collective | size | raw | safe | dist | safe − raw | dist − raw | dist − raw, most ≤ 1 KiB |"
        )?;
        writeln!(md, "|---|---|---|---|---|---|---|---|")?;
        // dist − raw at every point up to 1 KiB, for each collective's
        // largest below.
        let points = small_points(doc, "dist");
        let rs: Vec<&Value> = results(doc).filter(|r| r["in_place"] == false).collect();
        let mut colls: Vec<&str> = rs.iter().map(|r| s(r, "coll")).collect();
        colls.dedup();
        for coll in colls {
            let Some(smallest) = rs
                .iter()
                .filter(|r| s(r, "coll") == coll && s(r, "layer") == "raw")
                .min_by_key(|r| r["bytes"].as_u64())
            else {
                continue;
            };
            let rec = |layer: &str| {
                rs.iter()
                    .find(|r| s(r, "layer") == layer && same(r, smallest))
                    .copied()
            };
            let t = |layer: &str| rec(layer).map(|r| f(r, "time_us"));
            let raw = f(smallest, "time_us");
            let cell = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
            let mut deltas = Vec::new();
            for layer in ["safe", "dist"] {
                match rec(layer) {
                    Some(r) => {
                        let d = paired_excess(r, smallest);
                        if !at_most(d, 0.5) {
                            misses.push(format!(
                                "{mode} {coll} {}: {layer} {} µs over raw",
                                human(smallest["bytes"].as_u64().unwrap_or(0)),
                                signed(d, 0.5)
                            ));
                        }
                        deltas.push(signed(d, 0.5));
                    }
                    None => deltas.push("-".into()),
                }
            }
            let most = worst(points.iter().filter(|(_, r)| s(r, "coll") == coll).map(
                |&(over, r)| {
                    let place = if r["in_place"] == true {
                        " in place"
                    } else {
                        ""
                    };
                    (
                        over,
                        format!("{}{place}", human(r["bytes"].as_u64().unwrap_or(0))),
                    )
                },
            ))
            .map_or("-".to_string(), |(d, at)| {
                format!("{} ({at})", signed(d, 0.5))
            });
            writeln!(
                md,
                "| {coll} | {} | {raw:.2} | {} | {} | {} | {} | {most} |",
                human(smallest["bytes"].as_u64().unwrap_or(0)),
                cell(t("safe")),
                cell(t("dist")),
                deltas[0],
                deltas[1]
            )?;
        }
        writeln!(md)?;
    }
    excess_section(md, docs)?;
    if let Some(doc) = docs.get("events-threads") {
        writeln!(
            md,
            "### cudarc event tracking on (threads, 8 B all_reduce)\n"
        )?;
        writeln!(
            md,
            "With cudarc's default event tracking every buffer use adds a `cuStreamWaitEvent` and a `cuEventRecord`; the bench turns it off for its single-stream buffers. For comparison:\n"
        )?;
        writeln!(md, "| layer | µs per call |")?;
        writeln!(md, "|---|---|")?;
        for r in results(doc).filter(|r| r["in_place"] == false) {
            writeln!(md, "| {} | {:.2} |", s(r, "layer"), f(r, "time_us"))?;
        }
        writeln!(md)?;
    }
    Ok(())
}

pub fn graph_section(
    md: &mut String,
    docs: &BTreeMap<String, Value>,
    misses: &mut Vec<String>,
) -> Result<()> {
    let heading = "## CUDA graphs (8 B all_reduce)\n\nµs per all_reduce replayed from a graph of 100 captured calls; target ≤ 9 µs on 4 GPUs.\n\n| mode | layer | placement | µs per call |\n|---|---|---|---|\n";
    let found = phase(md, docs, "graph-", heading);
    for &(mode, doc) in &found {
        for r in results(doc) {
            let t = f(r, "time_us");
            let place = if r["in_place"] == true {
                "in place"
            } else {
                "out of place"
            };
            writeln!(md, "| {mode} | {} | {place} | {t:.2} |", s(r, "layer"))?;
            if r["ranks"].as_u64() == Some(4) && !at_most(t, 9.0) {
                misses.push(format!(
                    "graph {mode} {} {place}: {t:.2} µs > 9",
                    s(r, "layer")
                ));
            }
        }
    }
    if !found.is_empty() {
        writeln!(md)?;
    }
    Ok(())
}

pub fn allocation_section(
    md: &mut String,
    docs: &BTreeMap<String, Value>,
    misses: &mut Vec<String>,
) -> Result<()> {
    let mut worst: BTreeMap<String, (f64, String, f64)> = BTreeMap::new();
    for (name, doc) in docs {
        for r in results(doc) {
            let key = format!(
                "{} ({})",
                s(r, "layer"),
                name.split('-').next().unwrap_or("")
            );
            let a = f(r, "allocs_per_call");
            let own = f(r, "allocs_per_call_thread");
            let e = worst.entry(key).or_insert((0.0, String::new(), 0.0));
            // A missing count (NaN) wins, so it shows.
            if a.is_nan() || a > e.0 || e.1.is_empty() {
                *e = (
                    if a.is_nan() { a } else { a.max(e.0) },
                    format!("{} {} {}", name, s(r, "coll"), r["bytes"]),
                    e.2,
                );
            }
            if !at_most(own, e.2) {
                e.2 = own;
            }
        }
    }
    if worst.is_empty() {
        return Ok(());
    }
    writeln!(md, "## Heap allocations per call\n")?;
    writeln!(
        md,
        "The most seen in any measurement: allocations by every thread of the process (the watchdog's and liveness threads included) during the timed calls, per call the process issued, counted by the bench's global allocator; in brackets the issuing thread's own. Target: 0 (`allocs_per_call_max`); a miss for safe is also listed below.\n"
    )?;
    writeln!(
        md,
        "| layer (phase) | most allocations per call (thread's own) | where |"
    )?;
    writeln!(md, "|---|---|---|")?;
    for (key, (a, at, own)) in &worst {
        writeln!(md, "| {key} | {a:.3} ({own:.3}) | {at} |")?;
        if key.starts_with("safe") && !at_most(*a, 0.0) {
            misses.push(format!("{key}: {a:.3} allocations per call"));
        }
    }
    writeln!(md)?;
    Ok(())
}

pub fn setup_section(
    md: &mut String,
    docs: &BTreeMap<String, Value>,
    misses: &mut Vec<String>,
) -> Result<()> {
    let heading = "## Set-up\n\nms, slowest rank. world = communicator init (from process start in the first processes rep); mesh = `DeviceMesh::new` dp×tp; mesh + firsts = the slowest rank's own mesh and first all_reduce on each axis together (each rank's total, then the maximum; in brackets the sum of the three columns' maxima, which may be different ranks': a rank done with its mesh early waits in its first call for the others; runs before 4da859a recorded only that sum); target ≤ 200 ms on 4 GPUs (warm reps). The span columns break world and mesh down by the crates' `tracing` spans (summed per rank; in one process, the slowest thread's): libnccl load, rendezvous, communicator init, splits, topology probe, connection gates, the world's connection (a one-element all-reduce that ends `World::init` unless `WorldOptions::lazy_connect`; its gate is also in gates). A mesh in the world's order shares the world's communicator (`Comm::share`): no split for it, and its first call on an axis of every rank finds the connections made. The last column splits the first tp call (a thread or process per rank): making and filling its one-element buffer / the all_reduce call / the stream's synchronisation, each part the slowest rank's (so they need not add up to the first tp column). Rows `processes-keeps-world` make the mesh with `DeviceMesh::from_world` instead of `DeviceMesh::new`.\n\n| mode | rep | state | world | mesh | first dp | first tp | mesh + firsts | load | rendezvous | init | splits | probe | gates | connect | first tp: buffer / call / sync |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let found = phase(md, docs, "setup-", heading);
    for &(mode, doc) in &found {
        let ranks = doc["meta"]["ranks"].as_u64();
        for r in doc["setup"].as_array().into_iter().flatten() {
            let total = f(r, "mesh_and_first_all_reduces_ms");
            let maxima = match r.get("phase_maxima_sum_ms").and_then(Value::as_f64) {
                Some(v) => format!(" ({v:.1})"),
                None => String::new(),
            };
            let spans: Vec<String> = [
                "library_load_ms",
                "rendezvous_ms",
                "init_ms",
                "split_ms",
                "topology_probe_ms",
                "gate_ms",
                "connect_ms",
            ]
            .iter()
            .map(|k| match r.get(*k).and_then(Value::as_f64) {
                // `+ 0.0` prints a negative zero (a max over zeros) as 0.0.
                Some(v) => format!("{:.1}", v + 0.0),
                None => "-".to_string(),
            })
            .collect();
            let parts: Vec<String> = ["first_tp_alloc_ms", "first_tp_call_ms", "first_tp_sync_ms"]
                .iter()
                .filter_map(|k| r.get(*k).and_then(Value::as_f64))
                .map(|v| format!("{v:.2}"))
                .collect();
            let parts = if parts.len() == 3 {
                parts.join(" / ")
            } else {
                "-".to_string()
            };
            writeln!(
                md,
                "| {mode} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {total:.1}{maxima} | {} | {parts} |",
                r["rep"],
                s(r, "state"),
                f(r, "world_ms"),
                f(r, "mesh_ms"),
                f(r, "first_all_reduce_dp_ms"),
                f(r, "first_all_reduce_tp_ms"),
                spans.join(" | "),
            )?;
            // PyTorch's rows (`--python`) are beside ours, not held to our target.
            if mode != "torch"
                && ranks == Some(4)
                && s(r, "state") == "warm"
                && !at_most(total, 200.0)
            {
                misses.push(format!(
                    "setup {mode} rep {}: {total:.1} ms > 200",
                    r["rep"]
                ));
            }
        }
    }
    if !found.is_empty() {
        writeln!(md)?;
    }
    Ok(())
}

/// The small phase: per type and size, µs per all_reduce of each way
/// (slowest rank), symmetric over raw, and the wrong elements.
pub fn small_section(md: &mut String, docs: &BTreeMap<String, Value>) -> Result<()> {
    let heading = "## Small messages\n\nall_reduce (sum), µs per call back to back, median of interleaved rounds, slowest rank, a thread per GPU (mode threads) or a process per GPU (mode processes): raw NCCL on plain buffers (its default path), ours on plain buffers, ours on symmetric buffers (`SymmetricBuffer`: our one-shot kernel up to `one_shot_max_bytes`, 4 MiB on 2 ranks, NCCL's symmetric kernels above), and the same buffers with the one-shot kernel off (NCCL's symmetric kernels at every size), all on a communicator made with `Config::for_symmetric_kernels` (at least 16 CTAs); target at 2 MiB bf16: symmetric / raw ≤ 0.6 (`small_allreduce_over_nccl_2mib`). PyTorch's rows (mode torch, `--python`) hold its NCCL all_reduce, its symmetric-memory one-shot and two-shot in the first three columns. Rows `threads graph`: the same ways, each's `-n` calls captured in one CUDA graph and replayed (`--graph-launches` times per round). Wrong: elements off the exact sum, over every way.\n\n| mode | dtype | bytes | raw | plain | symmetric | NCCL symmetric | symmetric / raw | wrong |\n|---|---|---|---|---|---|---|---|---|\n";
    let found = phase(md, docs, "small-", heading);
    for &(mode, doc) in &found {
        let rows: Vec<&Value> = doc["small"].as_array().into_iter().flatten().collect();
        let mut keys: Vec<(String, u64)> = Vec::new();
        for r in &rows {
            let key = (s(r, "dtype").to_string(), r["bytes"].as_u64().unwrap_or(0));
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        for (dtype, bytes) in keys {
            let of = |way: &str| {
                rows.iter()
                    .find(|r| s(r, "dtype") == dtype && r["bytes"] == bytes && s(r, "layer") == way)
                    .map(|r| (f(r, "time_us"), f(r, "wrong")))
            };
            // PyTorch's rows (`--python`): its NCCL path, one-shot and
            // two-shot, in the same three columns; ours eager, then in
            // CUDA graphs (`<way>_graph`).
            let variants: &[(&str, [&str; 4])] = if mode == "torch" {
                &[("", ["torch_nccl", "torch_one_shot", "torch_two_shot", ""])]
            } else {
                &[
                    ("", ["raw", "plain", "symmetric", "nccl_symmetric"]),
                    (
                        " graph",
                        [
                            "raw_graph",
                            "plain_graph",
                            "symmetric_graph",
                            "nccl_symmetric_graph",
                        ],
                    ),
                ]
            };
            for (suffix, ways) in variants {
                let found = [of(ways[0]), of(ways[1]), of(ways[2]), of(ways[3])];
                if found.iter().all(Option::is_none) {
                    continue;
                }
                small_row(md, &format!("{mode}{suffix}"), &dtype, bytes, found)?;
            }
        }
    }
    if !found.is_empty() {
        writeln!(md)?;
    }
    Ok(())
}

/// One row of the small section: raw, plain, symmetric and NCCL's
/// symmetric kernels, each (µs, wrong) where measured.
fn small_row(
    md: &mut String,
    mode: &str,
    dtype: &str,
    bytes: u64,
    ways: [Option<(f64, f64)>; 4],
) -> Result<()> {
    let [raw, plain, sym, nccl_sym] = ways;
    let cell = |v: Option<(f64, f64)>| v.map_or("-".to_string(), |(t, _)| format!("{t:.2}"));
    let ratio = match (sym, raw) {
        (Some((a, _)), Some((b, _))) => format!("{:.3}", a / b),
        _ => "-".to_string(),
    };
    let wrong: f64 = ways.iter().flatten().map(|(_, w)| w).sum();
    writeln!(
        md,
        "| {mode} | {dtype} | {bytes} | {} | {} | {} | {} | {ratio} | {wrong} |",
        cell(raw),
        cell(plain),
        cell(sym),
        cell(nccl_sym),
    )?;
    Ok(())
}

/// The recover phase: per rep, the slowest survivor's `World::recover`
/// and recover + first all-reduce, from the loss known.
pub fn recover_section(md: &mut String, docs: &BTreeMap<String, Value>) -> Result<()> {
    let heading = "## Recovery\n\nms from a survivor knowing of the loss (the last rank lost on purpose: with a thread per GPU its thread panics, with a process per GPU its process kills itself, one launch a rep, mode `processes-N`), slowest survivor: `World::recover`, then with the first all-reduce on the recovered world done (`recover_ms`: the median of the last column). The span columns split the recovery by the crates' `tracing` spans on the slowest survivor's thread (with processes, the recovered world's rank 0's): waiting for the losses to settle, the old world's communicators given up (aborted, and NCCL done with every one of them on every thread; in earlier runs this was part of the old world's drop), the new world's id and watchdog posted or taken, communicator init and splits, the rest of the old world dropped. Where the old world's communicators were parked instead of aborted (NCCL 2.27+), there is no give-up: the survivors wait until NCCL is done with the old world's other communicators (quiet), then shrink the parked one (`ncclCommShrink` with `NCCL_SHRINK_ABORT`) and split the world's from it.\n\n| mode | rep | recover | recover + first all-reduce | settle | give up | quiet | post | init | shrink | splits | drop old |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let found = phase(md, docs, "recover-", heading);
    for &(mode, doc) in &found {
        for r in doc["recover"].as_array().into_iter().flatten() {
            let span = |k: &str| {
                r["spans"][k]
                    .as_f64()
                    .map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
            };
            writeln!(
                md,
                "| {mode} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r["rep"],
                f(r, "recover_ms"),
                f(r, "recover_and_first_all_reduce_ms"),
                span("nccl.recover_settle"),
                span("nccl.recover_give_up"),
                span("nccl.recover_quiet"),
                span("nccl.recover_post"),
                span("nccl.init_rank"),
                span("nccl.shrink"),
                span("nccl.split"),
                span("nccl.recover_drop_old"),
            )?;
        }
    }
    if !found.is_empty() {
        writeln!(md)?;
    }
    Ok(())
}

/// The results of one phase (files `PREFIX-MODE.json`) with their modes,
/// after writing the section's `heading` when there are any.
pub fn phase<'d>(
    md: &mut String,
    docs: &'d BTreeMap<String, Value>,
    prefix: &str,
    heading: &str,
) -> Vec<(&'d str, &'d Value)> {
    let found: Vec<(&str, &Value)> = docs
        .iter()
        .filter_map(|(name, doc)| name.strip_prefix(prefix).map(|mode| (mode, doc)))
        .collect();
    if !found.is_empty() {
        md.push_str(heading);
    }
    found
}

/// busbw against size (log-log), one panel per collective, one line per
/// layer, out of place.
pub fn plot(doc: &Value, path: &Path) -> Result<()> {
    let rs: Vec<&Value> = results(doc).filter(|r| r["in_place"] == false).collect();
    let colls: Vec<&str> = NCCL_TESTS_2G
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| rs.iter().any(|r| s(r, "coll") == *c))
        .collect();
    if colls.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (1500, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 4));
    let max_bytes = rs
        .iter()
        .filter_map(|r| r["bytes"].as_u64())
        .max()
        .unwrap_or(8) as f64;
    let max_bw = rs.iter().map(|r| f(r, "busbw_gbs")).fold(1.0, f64::max) * 1.1;
    for (coll, area) in colls.iter().zip(panels.iter()) {
        let mut chart = ChartBuilder::on(area)
            .caption(*coll, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(
                (8f64..max_bytes).log_scale(),
                (0.001f64..max_bw).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("bytes")
            .y_desc("busbw GB/s")
            .x_label_formatter(&|x| human(*x as u64))
            .y_label_formatter(&|y| format!("{y:.3}"))
            .draw()?;
        for (layer, color) in [("raw", &BLACK), ("safe", &BLUE), ("dist", &RED)] {
            let mut points: Vec<(f64, f64)> = rs
                .iter()
                .filter(|r| s(r, "coll") == *coll && s(r, "layer") == layer)
                .map(|r| (f(r, "bytes"), f(r, "busbw_gbs")))
                .filter(|(_, y)| *y > 0.0)
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(points.clone(), color))?
                .label(layer)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 2, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
