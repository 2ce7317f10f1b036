//! Merge plans: per MoE layer, the experts that stay (centres, in order)
//! and, for each, the experts merged into it with their weights. A merged
//! model writes each centre as the weighted mean of its members; the
//! router keeps the centres' rows. A plan whose every centre has only
//! itself as member is a keep map ([`MergePlan::keep_map`]).

use crate::file_error::FileError;
use crate::keepmap::KeepMap;
use crate::store::RunStore;
use numbers::keep_name::KeepMapName;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The suffix a merge plan's method carries in its name:
/// `<method>_merge_K<k>` (`reap_merge_K16`).
pub use numbers::keep_name::MERGE_SUFFIX;

/// A merge plan as written to `merge_plans/<method>_merge_K<k>.json`, or by
/// hand (only `layers` is needed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergePlan {
    /// Scoring method that chose the centres (`reap_mean`, ...), or
    /// [`crate::keepmap::CUSTOM`].
    #[serde(default = "custom")]
    pub method: String,
    /// Centres (experts that stay) per layer.
    #[serde(default)]
    pub k: u32,
    /// Parameters of the plan (clustering, weights), as given.
    #[serde(default)]
    pub params: serde_json::Value,
    /// SHA-256 of the `saliency.json` bytes the plan was computed from
    /// (empty for a plan made by hand).
    #[serde(default)]
    pub saliency_sha256: String,
    /// Block index to its centres, sorted by expert id; in the file each
    /// block is a string key, as in keep maps.
    #[serde(with = "crate::keepmap::block_keys")]
    pub layers: BTreeMap<u32, Vec<Centre>>,
}

fn custom() -> String {
    crate::keepmap::CUSTOM.into()
}

/// One expert that stays and the experts merged into it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Centre {
    /// The expert id whose router row the merged expert keeps.
    pub centre: u32,
    /// The experts averaged into it, the centre among them, each with a
    /// positive weight (normalised to sum 1 when the model is written).
    pub members: Vec<Member>,
}

/// An expert merged into a centre.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    /// Its expert id.
    pub expert: u32,
    /// Its weight in the mean (positive, finite).
    pub weight: f64,
}

impl Centre {
    /// A centre that merges nothing: only itself, weight 1.
    pub fn alone(expert: u32) -> Centre {
        Centre {
            centre: expert,
            members: vec![Member {
                expert,
                weight: 1.0,
            }],
        }
    }

    /// Member ids with their weights divided by the weights' sum, in the
    /// plan's order: what the merged expert is the weighted mean of.
    pub fn normalised(&self) -> Vec<(u32, f64)> {
        let sum: f64 = self.members.iter().map(|m| m.weight).sum();
        self.members
            .iter()
            .map(|m| (m.expert, m.weight / sum))
            .collect()
    }
}

impl MergePlan {
    /// The plan's name: `<method>_merge_K<k>`.
    pub fn name(&self) -> String {
        KeepMapName::new(&self.merge_method(), self.k).to_string()
    }

    /// `<method>_merge`, the method part of the plan's name.
    pub fn merge_method(&self) -> String {
        format!("{}{MERGE_SUFFIX}", self.method)
    }

    /// The object name of a plan under the run:
    /// `merge_plans/<method>_merge_K<k>.json`.
    pub fn file_name(method: &str, k: u32) -> String {
        let name = KeepMapName::new(&format!("{method}{MERGE_SUFFIX}"), k);
        format!("{MERGE_PLANS_DIR}/{name}.json")
    }

    /// The keep map of the centres (what the router and every per-expert
    /// tensor that is not merged keep), named `<method>_merge`.
    pub fn keep_map(&self) -> KeepMap {
        KeepMap {
            method: self.merge_method(),
            k: self.k,
            params: self.params.clone(),
            saliency_sha256: self.saliency_sha256.clone(),
            layers: self
                .layers
                .iter()
                .map(|(&l, cs)| (l, cs.iter().map(|c| c.centre).collect()))
                .collect(),
        }
    }

    /// Whether some centre has a member besides itself.
    pub fn merges_anything(&self) -> bool {
        self.layers.values().flatten().any(|c| c.members.len() > 1)
    }

    /// The one decoder of a merge plan's bytes: parsed and checked
    /// ([`MergePlan::check`]), `k` filled in when absent. Errors name
    /// `file` (its URL or path) and say what is wrong.
    pub fn decode(bytes: &[u8], file: &str) -> Result<MergePlan, FileError> {
        MergePlan::parse(bytes).map_err(|problem| FileError::invalid(file, "merge plan", problem))
    }

    /// Reads the run's merge plan `object` (`merge_plans/<name>.json`):
    /// a valid plan ([`MergePlan::decode`]) whose name is the object's.
    pub async fn read_object(store: &RunStore, object: &str) -> Result<MergePlan, FileError> {
        let bytes = store.get(object).await?;
        let plan = MergePlan::decode(&bytes, &store.url_of(object))?;
        if MergePlan::file_name(&plan.method, plan.k) != object {
            return Err(FileError::invalid(
                store.url_of(object),
                "merge plan",
                format!("it holds the plan {}", plan.name()),
            ));
        }
        Ok(plan)
    }

    /// Parses and checks a plan; the problem in words
    /// ([`MergePlan::decode`] names the file).
    fn parse(bytes: &[u8]) -> Result<MergePlan, String> {
        let mut plan: MergePlan = serde_json::from_slice(bytes).map_err(|e| {
            format!(
                "not a merge plan ({e}); expected {{\"layers\": {{\"0\": [{{\"centre\": id, \"members\": [{{\"expert\": id, \"weight\": w}}, ...]}}, ...]}}}}"
            )
        })?;
        if plan.k == 0 {
            plan.k = plan.layers.values().next().map_or(0, |c| c.len() as u32);
        }
        plan.check()?;
        Ok(plan)
    }

    /// Checks the plan on its own: at least one layer; in every layer `k`
    /// centres sorted by id and unique, each its own member, no expert a
    /// member of two centres, every weight positive and finite.
    pub fn check(&self) -> Result<(), String> {
        if self.layers.is_empty() {
            return Err("its \"layers\" name no block".into());
        }
        for (layer, centres) in &self.layers {
            if centres.len() as u32 != self.k || self.k == 0 {
                return Err(format!(
                    "layer {layer} has {} centres, k is {}: llama.cpp needs the same positive number in every block",
                    centres.len(),
                    self.k
                ));
            }
            if !centres.windows(2).all(|w| w[0].centre < w[1].centre) {
                return Err(format!(
                    "layer {layer}: centres are not sorted by id and unique"
                ));
            }
            let mut seen = BTreeSet::new();
            for c in centres {
                if !c.members.iter().any(|m| m.expert == c.centre) {
                    return Err(format!(
                        "layer {layer}: centre {} is not among its own members",
                        c.centre
                    ));
                }
                for m in &c.members {
                    if !seen.insert(m.expert) {
                        return Err(format!(
                            "layer {layer}: expert {} is merged twice",
                            m.expert
                        ));
                    }
                    if !(m.weight.is_finite() && m.weight > 0.0) {
                        return Err(format!(
                            "layer {layer}: expert {} has weight {}, not a positive finite number",
                            m.expert, m.weight
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Merge plans of a run, `<method>_merge_K<k>.json`.
pub const MERGE_PLANS_DIR: &str = "merge_plans";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_parses_normalises_and_names_its_centres() {
        let text = br#"{"method": "reap", "layers": {"0": [
            {"centre": 1, "members": [{"expert": 1, "weight": 3}, {"expert": 0, "weight": 1}]},
            {"centre": 4, "members": [{"expert": 4, "weight": 2}]}],
            "1": [{"centre": 0, "members": [{"expert": 0, "weight": 1}]},
                  {"centre": 2, "members": [{"expert": 2, "weight": 1}]}]}}"#;
        let p = MergePlan::parse(text).unwrap();
        assert_eq!((p.k, p.name()), (2, "reap_merge_K2".to_string()));
        assert_eq!(p.layers[&0][0].normalised(), vec![(1, 0.75), (0, 0.25)]);
        assert!(p.merges_anything());
        let keep = p.keep_map();
        assert_eq!(
            (keep.kept(0), keep.kept(1)),
            (Some(&[1, 4][..]), Some(&[0, 2][..]))
        );
        assert_eq!(
            MergePlan::file_name("reap", 2),
            "merge_plans/reap_merge_K2.json"
        );
        let json = serde_json::to_vec(&p).unwrap();
        assert_eq!(MergePlan::parse(&json).unwrap(), p);
    }

    #[test]
    fn malformed_plans_are_refused_with_the_reason() {
        let c = |centre: u32, members: &[(u32, f64)]| Centre {
            centre,
            members: members
                .iter()
                .map(|&(expert, weight)| Member { expert, weight })
                .collect(),
        };
        let plan = |centres: Vec<Centre>| MergePlan {
            method: "reap".into(),
            k: 2,
            params: serde_json::Value::Null,
            saliency_sha256: String::new(),
            layers: [(0, centres)].into(),
        };
        for (centres, why) in [
            (vec![c(0, &[(0, 1.0)])], "has 1 centres, k is 2"),
            (vec![c(2, &[(2, 1.0)]), c(1, &[(1, 1.0)])], "not sorted"),
            (
                vec![c(0, &[(1, 1.0)]), c(2, &[(2, 1.0)])],
                "not among its own",
            ),
            (
                vec![c(0, &[(0, 1.0), (3, 1.0)]), c(2, &[(2, 1.0), (3, 1.0)])],
                "expert 3 is merged twice",
            ),
            (
                vec![c(0, &[(0, 1.0), (3, 0.0)]), c(2, &[(2, 1.0)])],
                "weight 0",
            ),
            (
                vec![c(0, &[(0, f64::NAN)]), c(2, &[(2, 1.0)])],
                "weight NaN",
            ),
        ] {
            let e = plan(centres).check().unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let e = MergePlan::parse(br#"{"layers": {"0": [1, 2]}}"#).unwrap_err();
        assert!(e.contains("not a merge plan"), "{e}");
    }

    #[tokio::test]
    async fn the_run_reader_refuses_bad_plans_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
        let one = |c: u32| format!(r#"{{"centre":{c},"members":[{{"expert":{c},"weight":1.0}}]}}"#);
        let good = format!(
            r#"{{"method":"reap","k":2,"layers":{{"0":[{},{}]}}}}"#,
            one(1),
            one(4)
        );
        let object = MergePlan::file_name("reap", 2);
        store.put(&object, good.clone()).await.unwrap();
        let plan = MergePlan::read_object(&store, &object).await.unwrap();
        assert_eq!((plan.name().as_str(), plan.k), ("reap_merge_K2", 2));
        for (text, why) in [
            (
                format!(
                    r#"{{"layers":{{"0":[{}],"1":[{},{}]}}}}"#,
                    one(1),
                    one(1),
                    one(2)
                ),
                "same positive number",
            ),
            (
                format!(r#"{{"layers":{{"0":[{},{}]}}}}"#, one(4), one(1)),
                "not sorted by id and unique",
            ),
            (
                format!(r#"{{"layers":{{"0":[{},{}]}}}}"#, one(1), one(1)),
                "not sorted by id and unique",
            ),
            (
                format!(r#"{{"method":"reap","layers":{{"0":[{}]}}}}"#, one(1)),
                "holds the plan reap_merge_K1",
            ),
        ] {
            store.put(&object, text.clone()).await.unwrap();
            let e = MergePlan::read_object(&store, &object)
                .await
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(why) && e.contains(&store.url_of(&object)),
                "{text}: {e}"
            );
        }
        let e = MergePlan::decode(b"[]", "plans/x.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("plans/x.json is not a valid merge plan: not a merge plan"),
            "{e}"
        );
    }
}
