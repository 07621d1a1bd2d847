//! Reading the bench's JSON: one document per job, and the fields of its
//! results.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::Result;

pub fn load(dir: &Path) -> Result<BTreeMap<String, Value>> {
    let mut docs = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if path.extension().is_some_and(|e| e == "json") && name != "bench" {
            let text = std::fs::read_to_string(&path)?;
            docs.insert(name, serde_json::from_str(&text)?);
        }
    }
    Ok(docs)
}

pub fn results(doc: &Value) -> impl Iterator<Item = &Value> {
    doc["results"].as_array().into_iter().flatten()
}

pub fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

pub fn s<'v>(v: &'v Value, k: &str) -> &'v str {
    v[k].as_str().unwrap_or("")
}

/// The same measurement through another layer.
pub fn same(a: &Value, b: &Value) -> bool {
    ["coll", "bytes", "in_place", "mode", "graph"]
        .iter()
        .all(|k| a[*k] == b[*k])
}
