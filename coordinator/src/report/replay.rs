//! Miss-rate curves from `replay/*.json`, read without depending on the
//! replay module's types: any JSON object with a numeric `capacity` and a
//! miss rate (`miss_rate`, `hit_rate`, or `misses` / `requests`) is a point;
//! string fields such as `policy`, `split`, `mode` and `keep_map` (inherited
//! from enclosing objects) name its curve.

use super::plots::Series;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

const LABEL_FIELDS: [&str; 6] = ["policy", "split", "mode", "trace_mode", "keep_map", "step"];

fn miss_rate(o: &Map<String, Value>) -> Option<f64> {
    let num = |k: &str| o.get(k).and_then(Value::as_f64);
    num("miss_rate")
        .or_else(|| num("hit_rate").map(|h| 1.0 - h))
        .or_else(|| match (num("misses"), num("requests")) {
            (Some(m), Some(r)) if r > 0.0 => Some(m / r),
            _ => None,
        })
}

fn walk(v: &Value, labels: &BTreeMap<String, String>, out: &mut BTreeMap<String, Vec<(f64, f64)>>) {
    match v {
        Value::Object(o) => {
            let mut labels = labels.clone();
            for f in LABEL_FIELDS {
                if let Some(s) = o.get(f).and_then(Value::as_str) {
                    labels.insert(f.to_string(), s.to_string());
                }
            }
            if let (Some(c), Some(m)) = (o.get("capacity").and_then(Value::as_f64), miss_rate(o)) {
                let key: Vec<&str> = labels.values().map(String::as_str).collect();
                out.entry(key.join(" / ")).or_default().push((c, m));
            }
            o.values().for_each(|child| walk(child, &labels, out));
        }
        Value::Array(items) => items.iter().for_each(|child| walk(child, labels, out)),
        _ => {}
    }
}

/// Curves (two or more capacities) found in the given replay documents.
pub fn curves(docs: &[Value]) -> Vec<Series> {
    let mut found = BTreeMap::new();
    for d in docs {
        walk(d, &BTreeMap::new(), &mut found);
    }
    found
        .into_iter()
        .filter_map(|(label, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            points.dedup_by(|a, b| a.0 == b.0);
            (points.len() >= 2).then(|| Series {
                label: if label.is_empty() {
                    "replay".into()
                } else {
                    label
                },
                points,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curves_are_found_in_nested_results_and_single_points_are_ignored() {
        let doc = serde_json::json!({
            "split": "heldout",
            "results": [
                {"policy": "lru", "capacity": 4, "misses": 50, "requests": 100},
                {"policy": "lru", "capacity": 2, "miss_rate": 0.8},
                {"policy": "belady", "capacity": 2, "hit_rate": 0.5},
            ]
        });
        let c = curves(&[doc]);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].label, "lru / heldout");
        assert_eq!(c[0].points, vec![(2.0, 0.8), (4.0, 0.5)]);
    }
}
