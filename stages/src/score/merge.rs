//! Merge plans (#57): REAM's pseudo-grouping (Jha et al. 2026,
//! `ream/ream.py`, `pseudo_group`) on this run's statistics. Per layer the
//! centres are the method's keep map of size K (so REAP's saliency under
//! the REAP methods, super experts among them); walking the centres from
//! the most salient, each takes up to [`GROUP_SIZE`] - 1 of the closest
//! experts not yet taken; what is left goes to its closest centre
//! (MC-SMoE's rule, REAM's `group_size = 0`). Super experts stay
//! singletons (REAP's merging code can keep them so). Each member weighs
//! its REAP mass (`reap_l2_sum`), REAM's saliency-weighted average.
//!
//! Closeness ([`Similarity`]) is by default the experts' outputs: the
//! cosine of their mean outputs over their routed fit tokens, seen
//! through the run's seeded random projection ([`OutputMeans`],
//! `[run] merge_projection`), HC-SMoE's similarity and REAM's `sim_out`.
//! The router's (the cosine, over the traced fit tokens, of two experts'
//! router probabilities; each trace row holds the router's top-N, the
//! others count as 0: REAM's gate-logit similarity `sim_gate`) stays
//! available, alone or averaged with the output's as REAM averages them.

use super::keep::LayerRanking;
use super::source::LayerInput;
use numbers::projection::cosine;
use runfiles::mergeplan::{Centre, Member, MergePlan};
use runfiles::trace::TraceRow;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which closeness assigns members to centres.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Similarity {
    /// Cosine of the experts' mean projected outputs (HC-SMoE's); the
    /// router's where the run collected no projection.
    #[default]
    Output,
    /// Cosine of the experts' router probabilities over traced fit tokens.
    Router,
    /// REAM's: the mean of the output similarity mapped to `[0, 1]`
    /// (`(1 + cos) / 2`) and the router's (already in `[0, 1]`).
    OutputRouter,
}

impl Similarity {
    /// Its name in a plan's params.
    pub fn as_str(self) -> &'static str {
        match self {
            Similarity::Output => "output_projection_cosine",
            Similarity::Router => "router_probability_cosine",
            Similarity::OutputRouter => "mean_of_output_and_router",
        }
    }

    /// Whether it reads the router's Gram matrix.
    pub fn needs_router(self) -> bool {
        self != Similarity::Output
    }

    /// Whether it reads projected outputs.
    pub fn needs_outputs(self) -> bool {
        self != Similarity::Router
    }
}

/// Per MoE layer (block index), each expert's mean projected output over
/// its routed fit tokens (zeros for an expert never routed).
pub struct OutputMeans {
    /// Projected dimensions.
    pub dim: u32,
    layers: BTreeMap<u32, Vec<Vec<f64>>>,
}

impl OutputMeans {
    /// The means of `projection`'s fit split, its layers being `layers`
    /// (block indices, in order) with routed counts `counts`; None when
    /// the fit split was not projected.
    pub fn of(
        projection: &numbers::projection::OutputProjection,
        layers: &[u32],
        counts: &[Vec<u64>],
    ) -> Option<OutputMeans> {
        let means = projection.means(numbers::Split::Fit, counts)?;
        Some(OutputMeans {
            dim: projection.dim,
            layers: layers.iter().copied().zip(means).collect(),
        })
    }

    /// The cosine of experts `i` and `j`'s mean outputs in `layer` (0 when
    /// either was never routed).
    pub fn cosine(&self, layer: u32, i: usize, j: usize) -> f64 {
        match self.layers.get(&layer) {
            Some(m) if i < m.len() && j < m.len() => cosine(&m[i], &m[j]),
            _ => 0.0,
        }
    }
}

/// What the closeness of two experts is read from.
pub struct Closeness<'a> {
    /// The similarity used (after any fallback).
    pub similarity: Similarity,
    /// The router's Gram matrix, when `similarity` needs it.
    pub gram: Option<&'a RouterGram>,
    /// Projected mean outputs, when `similarity` needs them.
    pub outputs: Option<&'a OutputMeans>,
}

impl Closeness<'_> {
    /// `1 -` the similarity of experts `a` and `b` in `layer`.
    pub fn distance(&self, layer: u32, a: usize, b: usize) -> f64 {
        let out = || self.outputs.map_or(0.0, |o| o.cosine(layer, a, b));
        let router = || self.gram.map_or(0.0, |g| g.cosine(layer, a, b));
        1.0 - match self.similarity {
            Similarity::Output => out(),
            Similarity::Router => router(),
            Similarity::OutputRouter => ((1.0 + out()) / 2.0 + router()) / 2.0,
        }
    }
}

/// REAM's group size C (its default): at most this many experts per
/// centre in the first pass.
pub const GROUP_SIZE: usize = 16;

/// Router probabilities per trace row taken into the similarity (the
/// largest first): 16 x 16 products a row.
pub const TOP_PER_ROW: usize = 16;

/// Per MoE layer, the Gram matrix of the experts' router probabilities
/// over the traced fit tokens (`n x n`, f32), from which cosines follow.
/// At 48 layers x 512 experts: 48 x 512^2 x 4 bytes = 50 MB.
pub struct RouterGram {
    n: usize,
    layers: BTreeMap<u32, Vec<f32>>,
}

impl RouterGram {
    /// An empty Gram matrix for `n_expert` experts of each of `layers`.
    pub fn new(layers: &[u32], n_expert: usize) -> RouterGram {
        RouterGram {
            n: n_expert,
            layers: layers
                .iter()
                .map(|&l| (l, vec![0.0; n_expert * n_expert]))
                .collect(),
        }
    }

    /// Adds the fit rows of `rows` (others, and layers or ids it does not
    /// know, are skipped).
    pub fn add(&mut self, rows: &[TraceRow]) {
        for r in rows.iter().filter(|r| r.split == numbers::Split::Fit) {
            let Some(g) = self.layers.get_mut(&r.layer) else {
                continue;
            };
            let top: Vec<(usize, f32)> = r
                .topn_id
                .iter()
                .zip(&r.topn_prob)
                .take(TOP_PER_ROW)
                .map(|(&i, &p)| (usize::from(i), p))
                .filter(|&(i, p)| i < self.n && p.is_finite())
                .collect();
            for &(i, pi) in &top {
                for &(j, pj) in &top {
                    g[i * self.n + j] += pi * pj;
                }
            }
        }
    }

    /// The cosine similarity of experts `i` and `j` in `layer` (0 when
    /// either was never among a traced row's top).
    pub fn cosine(&self, layer: u32, i: usize, j: usize) -> f64 {
        let Some(g) = self.layers.get(&layer) else {
            return 0.0;
        };
        let (ii, jj) = (g[i * self.n + i], g[j * self.n + j]);
        if ii <= 0.0 || jj <= 0.0 {
            return 0.0;
        }
        f64::from(g[i * self.n + j]) / (f64::from(ii) * f64::from(jj)).sqrt()
    }
}

/// The merge plan of `method` at size `k` from its rankings (whose keep
/// map's experts are the centres); `keep` is that keep map's per-layer
/// experts, `layers` the scored statistics.
pub fn merge_plan(
    method: &str,
    keep: &runfiles::keepmap::KeepMap,
    rankings: &[LayerRanking],
    layers: &[LayerInput],
    close: &Closeness<'_>,
) -> MergePlan {
    let mut out = BTreeMap::new();
    for (r, l) in rankings.iter().zip(layers) {
        let centres = keep.kept(r.layer).unwrap_or_default();
        out.insert(r.layer, layer_plan(r, l, centres, close, GROUP_SIZE));
    }
    let mut params = serde_json::json!({
        "centres": keep.method,
        "keep_params": keep.params,
        "recipe": "ream_pseudo_group",
        "group_size": GROUP_SIZE,
        "similarity": close.similarity.as_str(),
        "weights": "reap_l2_sum",
    });
    if close.similarity.needs_router() {
        params["top_per_row"] = TOP_PER_ROW.into();
    }
    if let Some(o) = close.outputs.filter(|_| close.similarity.needs_outputs()) {
        params["projection_dim"] = o.dim.into();
    }
    MergePlan {
        method: method.to_string(),
        k: keep.k,
        params,
        saliency_sha256: keep.saliency_sha256.clone(),
        layers: out,
    }
}

/// One layer's centres (sorted by id) with their members, at most
/// `group_size` experts a centre in the first pass.
fn layer_plan(
    r: &LayerRanking,
    l: &LayerInput,
    centres: &[u32],
    close: &Closeness<'_>,
    group_size: usize,
) -> Vec<Centre> {
    let n = l.reap_l2_sum.len();
    let is_centre = |e: usize| centres.contains(&(e as u32));
    let mass = |e: usize| l.reap_l2_sum[e];
    // Centres that take members: not super experts, with some mass.
    let takes = |c: usize| !l.guarded.get(c).copied().unwrap_or(false) && mass(c) > 0.0;
    // Experts to merge: the others with some mass (a dead expert adds
    // nothing to a mean and is dropped, as pruning drops it).
    let mut free: Vec<bool> = (0..n).map(|e| !is_centre(e) && mass(e) > 0.0).collect();
    let mut members: BTreeMap<u32, Vec<u32>> = centres.iter().map(|&c| (c, Vec::new())).collect();
    let by_salience: Vec<u32> = r
        .order
        .iter()
        .copied()
        .filter(|&e| is_centre(e as usize))
        .collect();
    let distance = |a: usize, b: usize| close.distance(l.layer, a, b);
    for &c in &by_salience {
        if !takes(c as usize) {
            continue;
        }
        let mut close: Vec<usize> = (0..n).filter(|&e| free[e]).collect();
        close.sort_by(|&a, &b| {
            distance(c as usize, a)
                .total_cmp(&distance(c as usize, b))
                .then(a.cmp(&b))
        });
        for e in close.into_iter().take(group_size - 1) {
            free[e] = false;
            members.get_mut(&c).expect("a centre").push(e as u32);
        }
    }
    for e in (0..n).filter(|&e| free[e]) {
        let best = by_salience
            .iter()
            .filter(|&&c| takes(c as usize))
            .min_by(|&&a, &&b| {
                distance(a as usize, e)
                    .total_cmp(&distance(b as usize, e))
                    .then(a.cmp(&b))
            });
        if let Some(&c) = best {
            members.get_mut(&c).expect("a centre").push(e as u32);
        }
    }
    members
        .into_iter()
        .map(|(c, ms)| match takes(c as usize) {
            false => Centre::alone(c),
            true => Centre {
                centre: c,
                members: std::iter::once(c)
                    .chain(ms)
                    .map(|e| Member {
                        expert: e,
                        weight: mass(e as usize),
                    })
                    .collect(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use numbers::Split;

    fn row(layer: u32, top: &[(u16, f32)]) -> TraceRow {
        TraceRow {
            split: Split::Fit,
            domain: "en".into(),
            chunk: 0,
            pos: 0,
            token_id: 1,
            layer,
            selected: vec![top[0].0],
            selected_weight: vec![1.0],
            topn_id: top.iter().map(|t| t.0).collect(),
            topn_prob: top.iter().map(|t| t.1).collect(),
            lookahead: Vec::new(),
        }
    }

    /// Six experts: 0 and 1 always fire together, 2 and 3 together, 4
    /// with 5 now and then; 0 and 2 are the centres (most salient), 5 is
    /// a super expert kept as a centre too, and 4 is dead.
    /// Layer 3 of six experts as both merge-plan tests read it: 5 a super
    /// expert (guarded), 4 dead, REAP masses 6, 2, 5, 3, 0, 9; ranked
    /// 5, 0, 2, 3, 1, 4.
    fn six_experts() -> (LayerInput, LayerRanking) {
        let l = LayerInput {
            layer: 3,
            count: vec![10.0, 10.0, 10.0, 10.0, 0.0, 1.0],
            raw_count: vec![10.0, 10.0, 10.0, 10.0, 0.0, 1.0],
            reap_l2_sum: vec![6.0, 2.0, 5.0, 3.0, 0.0, 9.0],
            reap_l2_sq_sum: vec![0.0; 6],
            guarded: vec![false, false, false, false, false, true],
            domain_mass: Vec::new(),
        };
        let r = LayerRanking {
            layer: 3,
            order: vec![5, 0, 2, 3, 1, 4],
            kept_at: BTreeMap::new(),
        };
        (l, r)
    }

    #[test]
    fn members_join_the_centre_the_router_treats_them_like() {
        let mut gram = RouterGram::new(&[3], 6);
        let mut rows = Vec::new();
        for _ in 0..10 {
            rows.push(row(3, &[(0, 0.6), (1, 0.4)]));
            rows.push(row(3, &[(2, 0.5), (3, 0.5)]));
        }
        rows.push(row(3, &[(5, 0.9), (4, 0.1)]));
        let mut held_out = row(3, &[(1, 0.5), (2, 0.5)]);
        held_out.split = Split::Heldout;
        rows.push(held_out);
        gram.add(&rows);
        assert!((gram.cosine(3, 0, 1) - 1.0).abs() < 1e-6);
        assert_eq!(gram.cosine(3, 0, 3), 0.0);
        assert_eq!(gram.cosine(3, 1, 2), 0.0, "held-out rows are not counted");
        let (l, r) = six_experts();
        let close = Closeness {
            similarity: Similarity::Router,
            gram: Some(&gram),
            outputs: None,
        };
        let got = |group_size| -> Vec<(u32, Vec<(u32, f64)>)> {
            layer_plan(&r, &l, &[0, 2, 5], &close, group_size)
                .iter()
                .map(|c| {
                    (
                        c.centre,
                        c.members.iter().map(|m| (m.expert, m.weight)).collect(),
                    )
                })
                .collect()
        };
        // REAM's first pass: the most salient centre that takes members
        // (0; 5 is a super expert) takes its closest free experts, up to
        // the group size: with 16 both, the closest first.
        assert_eq!(
            got(16),
            vec![
                (0, vec![(0, 6.0), (1, 2.0), (3, 3.0)]),
                (2, vec![(2, 5.0)]),
                (5, vec![(5, 1.0)]),
            ]
        );
        assert_eq!(
            got(2),
            vec![
                (0, vec![(0, 6.0), (1, 2.0)]),
                (2, vec![(2, 5.0), (3, 3.0)]),
                (5, vec![(5, 1.0)]),
            ]
        );
    }

    /// The same six experts compared by their outputs: 1 computes what 2
    /// computes and 3 what 0 does (though the router fires 0 with 1), so
    /// output similarity groups them the other way; REAM's mean of both
    /// sits between (1 is as close to 0 by the router as to 2 by output).
    #[test]
    fn members_join_the_centre_whose_output_they_resemble() {
        let mut x = numbers::projection::OutputProjection::new(2);
        let dirs = [
            [1.0, 0.0],
            [0.0, 2.0],
            [0.1, 1.0],
            [3.0, 0.2],
            [0.0, 0.0],
            [-1.0, -1.0],
        ];
        let counts = vec![vec![10, 10, 10, 10, 0, 1]];
        for (e, d) in dirs.iter().enumerate() {
            for (i, v) in d.iter().enumerate() {
                let sum = v * counts[0][e] as f64;
                x.split_mut(Split::Fit, 1, 6)[0][e * 2 + i] =
                    numbers::ExactSum::from_f64(sum).unwrap();
            }
        }
        let means = OutputMeans::of(&x, &[3], &counts).unwrap();
        assert!((means.cosine(3, 1, 2) - 0.995).abs() < 0.01);
        assert_eq!(means.cosine(3, 0, 4), 0.0, "a dead expert has no direction");
        let (l, r) = six_experts();
        let close = Closeness {
            similarity: Similarity::Output,
            gram: None,
            outputs: Some(&means),
        };
        let members = |c: &Centre| c.members.iter().map(|m| m.expert).collect::<Vec<u32>>();
        let plan = layer_plan(&r, &l, &[0, 2, 5], &close, 2);
        let got: Vec<Vec<u32>> = plan.iter().map(members).collect();
        assert_eq!(got, vec![vec![0, 3], vec![2, 1], vec![5]]);
    }
}
