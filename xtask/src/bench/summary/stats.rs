//! The statistics the summary and the report share: limits that never
//! let a missing (NaN) figure pass, medians, differences and ratios paired
//! by round, the busbw ratio at large sizes, sizes as text.

use serde_json::Value;

use crate::bench::json::{f, results, s, same};

/// `x ≤ limit`; false when `x` is NaN (a missing figure), so a missing
/// figure is never a hit.
pub fn at_most(x: f64, limit: f64) -> bool {
    x <= limit
}

/// `x ≥ limit`; false when `x` is NaN.
pub fn at_least(x: f64, limit: f64) -> bool {
    x >= limit
}

/// The largest of `(value, where)` pairs; NaN wins, so a missing figure
/// shows instead of hiding behind a real one.
pub fn worst(items: impl Iterator<Item = (f64, String)>) -> Option<(f64, String)> {
    items.fold(None, |acc, (v, at)| match acc {
        Some((a, _)) if a.is_nan() => acc,
        Some((a, _)) if !v.is_nan() && v <= a => acc,
        _ => Some((v, at)),
    })
}

/// The least of `(value, where)` pairs; NaN wins, as in [`worst`], so a
/// missing figure is never passed over for a real one.
pub fn least(items: impl Iterator<Item = (f64, String)>) -> Option<(f64, String)> {
    items.fold(None, |acc, (v, at)| match acc {
        Some((a, _)) if a.is_nan() => acc,
        Some((a, _)) if !v.is_nan() && v >= a => acc,
        _ => Some((v, at)),
    })
}

/// The middle value (the upper one of an even count), as the reports'
/// medians take it; `None` for no value.
pub fn upper_median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The least busbw of `layer` over raw's at the same point (size,
/// placement; paired by round, see [`paired_busbw_ratio`]), over every
/// size of `coll` from 128 MiB up, in a sweep's records; `None` where
/// there is no such size. A point without raw's record, or whose records
/// have neither rounds that line up nor busbw, gives NaN, which wins (a
/// miss).
pub fn large_busbw_ratio(rs: &[&Value], coll: &str, layer: &str) -> Option<(f64, String)> {
    fn of<'r, 'v>(
        rs: &'r [&'v Value],
        coll: &'r str,
        layer: &'r str,
    ) -> impl Iterator<Item = &'v Value> + 'r {
        rs.iter()
            .copied()
            .filter(move |r| s(r, "coll") == coll && s(r, "layer") == layer)
    }
    least(
        of(rs, coll, layer)
            .filter(|r| r["bytes"].as_u64().unwrap_or(0) >= 128 << 20)
            .map(|r| {
                let raw = of(rs, coll, "raw").find(|q| same(q, r));
                let place = if r["in_place"] == true {
                    "in place"
                } else {
                    "out of place"
                };
                // `f` gives NaN for a missing figure; 0/0 is NaN too.
                let ratio = raw.map_or(f64::NAN, |q| paired_busbw_ratio(r, q));
                (
                    ratio,
                    format!(
                        "{coll} {layer} {} {place}",
                        human(r["bytes"].as_u64().unwrap_or(0))
                    ),
                )
            }),
    )
}

/// The smallest size of each collective measured through `layer` in
/// `doc`, out of place: (coll, record).
pub fn smallest<'d>(doc: &'d Value, layer: &str) -> Vec<(&'d str, &'d Value)> {
    let mut out: Vec<(&str, &Value)> = Vec::new();
    for r in results(doc).filter(|r| r["in_place"] == false && s(r, "layer") == layer) {
        let c = s(r, "coll");
        match out.iter_mut().find(|(k, _)| *k == c) {
            Some(slot) if slot.1["bytes"].as_u64() > r["bytes"].as_u64() => slot.1 = r,
            Some(_) => {}
            None => out.push((c, r)),
        }
    }
    out
}

/// The numbers under `key` in `r` (a record's per-round times), if all
/// are numbers.
fn per_round(r: &Value, key: &str) -> Option<Vec<f64>> {
    r[key].as_array()?.iter().map(Value::as_f64).collect()
}

/// `op` of the two sides' times, round by round, and the median of those
/// (the mean of the middle two for an even count); `None` when the rounds
/// are missing or do not line up.
fn paired(a: Option<Vec<f64>>, b: Option<Vec<f64>>, op: impl Fn(f64, f64) -> f64) -> Option<f64> {
    let (x, y) = (a?, b?);
    if x.len() != y.len() || x.is_empty() {
        return None;
    }
    let mut d: Vec<f64> = x.iter().zip(&y).map(|(p, q)| op(*p, *q)).collect();
    d.sort_by(f64::total_cmp);
    let m = d.len() / 2;
    Some(if d.len() % 2 == 1 {
        d[m]
    } else {
        (d[m - 1] + d[m]) / 2.0
    })
}

/// How much slower `a` is than `b` (µs per call), two layers measured at
/// the same point in interleaved rounds: the median over rounds of each
/// round's difference, so a stretch of seconds in which the whole machine
/// runs slow or fast moves both sides of a difference alike. Records
/// without per-round times (older runs) give the difference of medians.
pub fn paired_excess(a: &Value, b: &Value) -> f64 {
    paired(
        per_round(a, "rounds_us"),
        per_round(b, "rounds_us"),
        |p, q| p - q,
    )
    .unwrap_or_else(|| f(a, "time_us") - f(b, "time_us"))
}

/// `layer`'s busbw over raw's at one point (the same bytes, so raw's time
/// over the layer's): the median over rounds of each round's ratio, as
/// for the step, so that a stretch in which the GPUs run slow or fast (at
/// 128 MiB an all-to-all's time moves by 3 % from round to round on the
/// lent VMs) moves both sides alike. Records without per-round times give
/// the ratio of the busbw medians.
fn paired_busbw_ratio(layer: &Value, raw: &Value) -> f64 {
    paired(
        per_round(raw, "rounds_us"),
        per_round(layer, "rounds_us"),
        |p, q| p / q,
    )
    .unwrap_or_else(|| f(layer, "busbw_gbs") / f(raw, "busbw_gbs"))
}

/// A step job's default side over its raw side: the median over rounds of
/// each round's ratio (the sides take turns in every round, so a stretch
/// in which the whole machine runs slow or fast moves both alike; the raw
/// side's calls alone jump between about 7 and 10 µs from round to round
/// on the lent VMs). Records without per-round times give the ratio of
/// the medians.
pub fn paired_step_ratio(step: &Value) -> f64 {
    paired(
        per_round(step, "default_rounds_us"),
        per_round(step, "raw_rounds_us"),
        |p, q| p / q,
    )
    .unwrap_or_else(|| f(step, "default_us") / f(step, "raw_us"))
}

/// `layer` minus raw (µs per call, paired by round) at every size up to
/// 1 KiB and both placements of one latency job, each with `layer`'s
/// record; NaN where raw has no record at that point.
pub fn small_points<'d>(doc: &'d Value, layer: &str) -> Vec<(f64, &'d Value)> {
    let rs: Vec<&Value> = results(doc).collect();
    rs.iter()
        .filter(|r| s(r, "layer") == layer && r["bytes"].as_u64().is_some_and(|b| b <= 1024))
        .map(|r| {
            let over = rs
                .iter()
                .find(|q| s(q, "layer") == "raw" && same(q, r))
                .map_or(f64::NAN, |raw| paired_excess(r, raw));
            (over, *r)
        })
        .collect()
}

/// Where a point of [`small_points`] was, in `mode`'s job:
/// `threads all_reduce 8 B out of place`.
pub fn point_label(mode: &str, r: &Value) -> String {
    let place = if r["in_place"] == true {
        "in place"
    } else {
        "out of place"
    };
    let bytes = human(r["bytes"].as_u64().unwrap_or(0));
    format!("{mode} {} {bytes} {place}", s(r, "coll"))
}

/// A size in bytes as the report shows it (`8 B`, `1 KiB`, `2 GiB`).
pub fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
