//! Merge-plan invariants (#57): each plan under `merge_plans/` is well
//! formed (K centres per layer, sorted, each its own member, no expert
//! merged twice, positive weights), covers the model's MoE layers with ids
//! below its expert count, and its centres are the experts of the keep map
//! of the same method and K (which `keep maps` recompute); the
//! super experts REAP's rule finds (on the statistic that keep map's
//! params name) stay alone.

use super::{names as inv, Check};
use crate::score::super_experts::{guarded, Statistic};
use numbers::saliency::Saliency;
use numbers::Split;
use runfiles::keepmap::KeepMap;
use runfiles::mergeplan::MergePlan;

/// Checks the plans (object name, plan) against `s` and the keep maps;
/// `refused` says why each plan that is not a valid plan
/// ([`MergePlan::read_object`]) is not.
pub fn check_merge_plans(
    s: &Saliency,
    plans: &[(String, MergePlan)],
    refused: &[String],
    maps: &[(String, KeepMap)],
) -> Check {
    if plans.is_empty() && refused.is_empty() {
        return Check::info(inv::MERGE_PLANS, "no merge plans under merge_plans/".into());
    }
    let mut want: Vec<u32> = s
        .split(Split::Fit)
        .map(|f| f.layers.iter().map(|l| l.layer).collect())
        .unwrap_or_default();
    want.sort();
    let supers = |statistic| guarded(s, statistic).ok();
    let mut bad = refused.to_vec();
    for (name, p) in plans {
        let have: Vec<u32> = p.layers.keys().copied().collect();
        if have != want {
            bad.push(format!(
                "{name} covers layers {have:?}, saliency.json has {want:?}"
            ));
            continue;
        }
        let keep = p.keep_map();
        let map = KeepMap::file_name(&p.method, p.k);
        let found = maps.iter().find(|(n, _)| *n == map);
        let supers = supers(found.map_or(Statistic::default(), |(_, m)| statistic_of(m)));
        match found {
            Some((_, m)) if m.layers == keep.layers => {}
            Some(_) => bad.push(format!("{name}: its centres are not the experts of {map}")),
            None if p.method != runfiles::keepmap::CUSTOM => {
                bad.push(format!("{name}: no {map} to take its centres from"))
            }
            None => {}
        }
        for (i, (layer, centres)) in p.layers.iter().enumerate() {
            for c in centres {
                if let Some(m) = c.members.iter().find(|m| m.expert >= s.n_expert) {
                    bad.push(format!(
                        "{name} layer {layer} merges expert {}, the model has {}",
                        m.expert, s.n_expert
                    ));
                }
                let is_super = supers
                    .as_ref()
                    .and_then(|g| g.get(i))
                    .and_then(|g| g.get(c.centre as usize))
                    .copied()
                    .unwrap_or(false);
                if is_super && c.members.len() > 1 {
                    bad.push(format!(
                        "{name} layer {layer}: super expert {} has members",
                        c.centre
                    ));
                }
            }
        }
    }
    match bad.first() {
        None => Check::pass(inv::MERGE_PLANS, format!("{} plans", plans.len())),
        Some(first) => Check::fail(
            inv::MERGE_PLANS,
            format!("{} of {} plans: {first}", bad.len(), plans.len()),
        ),
    }
}

/// The guard's statistic a keep map was scored with: its params' field, or
/// the norm for params written before the field existed.
fn statistic_of(map: &KeepMap) -> Statistic {
    map.params
        .get("super_expert_statistic")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_else(Statistic::before_elements)
}
