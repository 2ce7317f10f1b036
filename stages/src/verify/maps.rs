//! Keep-map invariants: valid maps ([`KeepMap::read`]: sorted, unique,
//! exactly K per layer) covering the model's blocks, nested across K,
//! and equal to a fresh recomputation from `saliency.json`; a map made by
//! hand ([`runfiles::keepmap::CUSTOM`]) is checked for its shape only.

use super::{names as inv, Check};
use crate::score::keep::{keep_map, map_recipe};
use crate::score::rank_all;
use numbers::saliency::Saliency;
use numbers::Split;
use runfiles::keepmap::KeepMap;
use std::collections::BTreeMap;

/// Checks the maps (object name, map) against `s`, whose bytes hash to
/// `sha`; `refused` says why each map that is not a valid keep map is not.
pub fn check_keep_maps(
    s: &Saliency,
    sha: &str,
    maps: &[(String, KeepMap)],
    refused: &[String],
) -> Vec<Check> {
    if maps.is_empty() && refused.is_empty() {
        let none = "no keep maps under keep_maps/".to_string();
        return vec![
            Check::info(inv::MAP_SHAPE, none.clone()),
            Check::info(inv::MAP_NESTED, none.clone()),
            Check::info(inv::MAP_RECOMPUTE, none),
        ];
    }
    // Maps made by hand have no recipe: their shape is checked like the
    // others', but they neither nest with nor recompute as `score`'s.
    let scored: Vec<(String, KeepMap)> = maps
        .iter()
        .filter(|(_, m)| !m.is_custom())
        .cloned()
        .collect();
    let mut recomputed = recompute(s, sha, &scored);
    let custom = maps.len() - scored.len();
    if custom > 0 {
        recomputed.figure = format!(
            "{} ({custom} made by hand, not recomputed)",
            recomputed.figure
        );
    }
    vec![shape(s, maps, refused), nested(&scored), recomputed]
}

fn shape(s: &Saliency, maps: &[(String, KeepMap)], refused: &[String]) -> Check {
    let mut want: Vec<u32> = s
        .split(Split::Fit)
        .map(|f| f.layers.iter().map(|l| l.layer).collect())
        .unwrap_or_default();
    want.sort();
    let mut bad = refused.to_vec();
    for (name, m) in maps {
        let have: Vec<u32> = m.layers.keys().copied().collect();
        if have != want {
            bad.push(format!(
                "{name} covers layers {have:?}, saliency.json has {want:?}"
            ));
        }
        for (layer, ids) in &m.layers {
            if let Some(e) = ids.iter().find(|&&e| e >= s.n_expert) {
                bad.push(format!(
                    "{name} layer {layer} keeps expert {e}, n_expert is {}",
                    s.n_expert
                ));
            }
        }
    }
    match bad.first() {
        Some(first) => Check::fail(
            inv::MAP_SHAPE,
            format!("{} problems; first: {first}", bad.len()),
        ),
        None => Check::pass(inv::MAP_SHAPE, format!("{} maps", maps.len())),
    }
}

fn nested(maps: &[(String, KeepMap)]) -> Check {
    // Maps of one recipe (method, params, saliency) must nest as K grows,
    // but for worst_domain's, each the best max-min set of its own size
    // (which need not nest: see score's worst module).
    let mut families: BTreeMap<String, Vec<&(String, KeepMap)>> = BTreeMap::new();
    let not_nesting = maps
        .iter()
        .filter(|(_, m)| m.method == config::method::Method::WorstDomain.as_str())
        .count();
    for entry in maps {
        let m = &entry.1;
        if m.method == config::method::Method::WorstDomain.as_str() {
            continue;
        }
        families
            .entry(format!("{}|{}|{}", m.method, m.params, m.saliency_sha256))
            .or_default()
            .push(entry);
    }
    let mut bad = Vec::new();
    let mut pairs = 0;
    for fam in families.values_mut() {
        fam.sort_by_key(|e| e.1.k);
        for w in fam.windows(2) {
            pairs += 1;
            let ((sn, small), (bn, big)) = (w[0], w[1]);
            for (layer, ids) in &small.layers {
                let outer = big.layers.get(layer).map(Vec::as_slice).unwrap_or(&[]);
                if let Some(e) = ids.iter().find(|e| !outer.contains(e)) {
                    bad.push(format!(
                        "{sn} keeps expert {e} of layer {layer}, {bn} does not"
                    ));
                }
            }
        }
    }
    match bad.first() {
        Some(first) => Check::fail(
            inv::MAP_NESTED,
            format!("{} violations; first: {first}", bad.len()),
        ),
        None => Check::pass(
            inv::MAP_NESTED,
            format!(
                "{pairs} consecutive-K pairs in {} families{}",
                families.len(),
                if not_nesting > 0 {
                    format!(" ({not_nesting} worst_domain maps, not nested by design)")
                } else {
                    String::new()
                }
            ),
        ),
    }
}

fn recompute(s: &Saliency, sha: &str, maps: &[(String, KeepMap)]) -> Check {
    let mut bad = Vec::new();
    for (name, m) in maps {
        if m.saliency_sha256 != sha {
            bad.push(format!(
                "{name} cites saliency {}, saliency.json is {sha}",
                m.saliency_sha256
            ));
            continue;
        }
        let fresh = map_recipe(m).and_then(|(method, p)| {
            let ranked = rank_all(s, &[method], &p)?;
            keep_map(method, m.k, &p, sha, &ranked[0].1)
        });
        match fresh {
            Err(e) => bad.push(format!(
                "{name}: cannot recompute: {}",
                runfiles::error_text::with_causes(&e)
            )),
            Ok(f) => {
                if let Some((layer, ids)) = m
                    .layers
                    .iter()
                    .find(|(l, ids)| f.layers.get(*l) != Some(ids))
                {
                    bad.push(format!(
                        "{name} layer {layer}: file {ids:?}, fresh {:?}",
                        f.layers.get(layer)
                    ));
                }
            }
        }
    }
    match bad.first() {
        Some(first) => Check::fail(
            inv::MAP_RECOMPUTE,
            format!(
                "{} of {} maps differ; first: {first}",
                bad.len(),
                maps.len()
            ),
        ),
        None => Check::pass(
            inv::MAP_RECOMPUTE,
            format!("{} maps identical to recomputation", maps.len()),
        ),
    }
}
