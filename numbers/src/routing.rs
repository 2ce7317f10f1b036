//! How a model routes a token to its experts, as llama.cpp's graph computes
//! it (DESIGN section 3): the worker reads it from the graph of a probe
//! decode, every partial's MoE shape carries it, `saliency.json` records it,
//! and the later stages follow it: `verify` asserts what the gating implies,
//! `score` keeps the same number of experts per routing group, and the
//! substitution screen and replay pick a pruned model's experts with
//! [`Routing::select_kept`], the rule llama.cpp applies.

use crate::split::Gating;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One traced token's router candidates: expert ids in the full model's
/// selection order and their router probabilities.
#[derive(Clone, Copy, Debug)]
pub struct Candidates<'a> {
    /// Expert ids, best first (as traced).
    pub id: &'a [u16],
    /// Their probabilities under the full model's router.
    pub prob: &'a [f32],
}

/// What the gate weight multiplies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateSite {
    /// The expert's output (`ffn_moe_weighted` after `ffn_moe_down`): most models.
    #[default]
    Output,
    /// The expert's input (`ffn_moe_weighted` before the expert matmuls;
    /// llama4): `ffn_moe_down` already holds the gated contribution.
    Input,
}

/// Group-limited selection (DeepSeek-V3's `n_group` / `topk_group`): the
/// experts are `n_group` runs of consecutive ids; a token may only pick
/// from the `n_group_used` groups whose two best selection scores add up
/// highest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertGroups {
    /// Number of groups (`{arch}.expert_group_count`).
    pub n_group: u32,
    /// Groups a token routes to (`{arch}.expert_group_used_count`).
    pub n_group_used: u32,
}

/// The routing semantics of one model beyond its gating function, the same
/// in every MoE block except the per-block selection bias.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Routing {
    /// The k gate weights are divided by their sum (`ffn_moe_weights_norm`).
    pub weights_norm: bool,
    /// Factor the gate weights are multiplied by after that
    /// (`ffn_moe_weights_scaled`; 1 when the graph has none).
    pub weights_scale: f32,
    /// What the gate weight multiplies.
    pub gate: GateSite,
    /// Per MoE block, the bias added to the probabilities for the choice of
    /// experts only (`exp_probs_b`, `ffn_moe_probs_biased`); empty without one.
    pub selection_bias: BTreeMap<u32, Vec<f32>>,
    /// Group-limited selection (`ffn_moe_group_topk`), if the graph has it.
    pub groups: Option<ExpertGroups>,
    /// Blocks of the model that a decode never runs: NextN / MTP blocks
    /// after the last layer, run only by llama.cpp's MTP draft context.
    pub nextn_blocks: Vec<u32>,
}

impl Default for Routing {
    /// Plain top-k: unnormalised, unscaled weights on the output, no bias,
    /// no groups, no NextN block.
    fn default() -> Self {
        Routing {
            weights_norm: false,
            weights_scale: 1.0,
            gate: GateSite::Output,
            selection_bias: BTreeMap::new(),
            groups: None,
            nextn_blocks: Vec::new(),
        }
    }
}

impl Routing {
    /// The score llama.cpp ranks expert `e` of block `layer` on: its router
    /// probability plus the block's selection bias (added in f32, as ggml does).
    pub fn selection_score(&self, layer: u32, e: usize, prob: f32) -> f32 {
        match self.selection_bias.get(&layer).and_then(|b| b.get(e)) {
            Some(b) => prob + b,
            None => prob,
        }
    }

    /// The experts (at most `k`, in selection order) that a model keeping
    /// only the experts `kept` selects for one token, from the router's
    /// candidates (in the full model's selection order, as traced). Without
    /// groups these are the best `k` kept candidates; with groups, only
    /// candidates of the `n_group_used` groups whose two best kept
    /// candidates score highest. Exact when the candidates cover every
    /// expert; experts beyond a shorter top-N count as unavailable (fewer
    /// than `k` returned: forced misses).
    ///
    /// Under softmax gating the pruned model's softmax runs over the kept
    /// experts only, so their probabilities are the full model's divided by
    /// the kept mass `Z`. Without a selection bias that keeps their order;
    /// with one, `p / Z + bias` can order them differently from `p + bias`,
    /// so the kept candidates are re-ranked on it ([`Routing::kept_mass`]
    /// gives `Z`). Sigmoid-like gating is per expert: nothing changes.
    pub fn select_kept(
        &self,
        gating: Gating,
        layer: u32,
        n_expert: usize,
        top: Candidates<'_>,
        kept: &dyn Fn(u16) -> bool,
        k: usize,
    ) -> Vec<u16> {
        let renormalise = gating == Gating::Softmax && self.selection_bias.contains_key(&layer);
        let z = if renormalise {
            Self::kept_mass(n_expert, top, kept)
        } else {
            1.0
        };
        let score = |e: u16, p: f32| self.selection_score(layer, e as usize, p / z);
        let mut candidates: Vec<(u16, f32)> = top
            .id
            .iter()
            .zip(top.prob)
            .filter(|(&e, _)| kept(e))
            .map(|(&e, &p)| (e, p))
            .collect();
        if renormalise {
            // Stable: equal scores keep the traced order.
            candidates.sort_by(|a, b| score(b.0, b.1).total_cmp(&score(a.0, a.1)));
        }
        let Some(groups) = self.groups.filter(|g| g.n_group > 1) else {
            return candidates.into_iter().map(|(e, _)| e).take(k).collect();
        };
        let per_group = (n_expert / groups.n_group as usize).max(1);
        let group_of = |e: u16| e as usize / per_group;
        // The candidates come best first, so a group's first two are its top 2.
        let mut best: Vec<(f32, u8)> = vec![(0.0, 0); groups.n_group as usize];
        for &(e, p) in &candidates {
            let Some(slot) = best.get_mut(group_of(e)) else {
                continue;
            };
            if slot.1 < 2 {
                slot.0 += score(e, p);
                slot.1 += 1;
            }
        }
        let mut order: Vec<usize> = (0..best.len()).filter(|&g| best[g].1 > 0).collect();
        order.sort_by(|&a, &b| best[b].0.total_cmp(&best[a].0).then(a.cmp(&b)));
        order.truncate(groups.n_group_used as usize);
        candidates
            .into_iter()
            .filter(|&(e, _)| order.contains(&group_of(e)))
            .map(|(e, _)| e)
            .take(k)
            .collect()
    }

    /// The full model's softmax mass on the kept experts: the divisor that
    /// turns its probabilities into the pruned model's. Exact when the
    /// candidates cover every expert; otherwise the mass outside them
    /// (`1 - their sum`) is shared among the experts outside them evenly,
    /// and the kept ones' share is added.
    pub fn kept_mass(n_expert: usize, top: Candidates<'_>, kept: &dyn Fn(u16) -> bool) -> f32 {
        let mut inside = 0f32;
        let mut listed = 0f32;
        let mut kept_listed = 0usize;
        for (&e, &p) in top.id.iter().zip(top.prob) {
            listed += p;
            if kept(e) {
                inside += p;
                kept_listed += 1;
            }
        }
        let outside = n_expert.saturating_sub(top.id.len());
        if outside > 0 {
            let kept_outside = (0..n_expert as u16)
                .filter(|&e| kept(e))
                .count()
                .saturating_sub(kept_listed);
            inside += (1.0 - listed).max(0.0) * kept_outside as f32 / outside as f32;
        }
        if inside > 0.0 {
            inside
        } else {
            1.0
        }
    }
}

/// Whether a model of `n_expert` experts per block, routing to `k_used` of
/// them under `groups`, can be pruned to `k_keep` experts per block and
/// still run in llama.cpp: the same number per group (llama.cpp's groups are
/// equal runs of ids), at least two per group (it sums each group's top 2)
/// and enough in the groups a token may use to fill its `k_used` slots.
pub fn check_group_keep(
    groups: Option<ExpertGroups>,
    n_expert: u32,
    k_used: u32,
    k_keep: u32,
) -> Result<(), String> {
    let Some(g) = groups.filter(|g| g.n_group > 1) else {
        return Ok(());
    };
    if !n_expert.is_multiple_of(g.n_group) {
        return Err(format!(
            "{} routing groups do not divide the {n_expert} experts",
            g.n_group
        ));
    }
    if !k_keep.is_multiple_of(g.n_group) {
        return Err(format!(
            "K={k_keep} is not a multiple of the {} routing groups: llama.cpp needs the same number of experts in each group",
            g.n_group
        ));
    }
    let per_group = k_keep / g.n_group;
    if per_group < 2 {
        return Err(format!(
            "K={k_keep} keeps {per_group} expert per routing group; llama.cpp ranks groups by their two best experts and needs at least 2 in each"
        ));
    }
    if per_group * g.n_group_used < k_used {
        return Err(format!(
            "K={k_keep} keeps {per_group} experts in each of the {} groups a token may use: fewer than the {k_used} it routes to",
            g.n_group_used
        ));
    }
    Ok(())
}

/// A ranking (best first) reordered so that every prefix whose length is a
/// multiple of the group count keeps the same number from each group: the
/// best expert of every group first (in ranking order), then the second
/// best of every group, and so on. A keep map of K experts from it keeps
/// each group's best K / n_group, and maps of growing K stay nested.
/// Without groups the ranking is returned as it is.
pub fn balanced_order(ranking: &[u32], groups: Option<ExpertGroups>, n_expert: u32) -> Vec<u32> {
    let Some(g) = groups.filter(|g| g.n_group > 1 && n_expert.is_multiple_of(g.n_group)) else {
        return ranking.to_vec();
    };
    let per_group = n_expert / g.n_group;
    let mut seen = vec![0u32; g.n_group as usize];
    let mut keyed: Vec<(u32, usize, u32)> = ranking
        .iter()
        .enumerate()
        .map(|(pos, &e)| {
            let slot = &mut seen[((e / per_group) as usize).min(g.n_group as usize - 1)];
            *slot += 1;
            (*slot, pos, e)
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, _, e)| e).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c<'a>(id: &'a [u16], prob: &'a [f32]) -> Candidates<'a> {
        Candidates { id, prob }
    }

    fn grouped(n_group: u32, n_group_used: u32) -> Routing {
        Routing {
            groups: Some(ExpertGroups {
                n_group,
                n_group_used,
            }),
            ..Routing::default()
        }
    }

    #[test]
    fn without_groups_the_first_kept_candidates_are_selected() {
        let r = Routing::default();
        let ids = [5, 1, 7, 0, 2];
        let probs = [0.5, 0.2, 0.1, 0.1, 0.05];
        let kept = |e: u16| e != 1;
        assert_eq!(
            r.select_kept(Gating::Softmax, 0, 8, c(&ids, &probs), &kept, 2),
            vec![5, 7]
        );
        assert_eq!(
            r.select_kept(Gating::Softmax, 0, 8, c(&ids, &probs), &kept, 9)
                .len(),
            4
        );
    }

    #[test]
    fn groups_rank_by_their_two_best_kept_candidates() {
        // 8 experts in 4 groups of 2: {0,1} {2,3} {4,5} {6,7}; one group used.
        let r = grouped(4, 1);
        let ids = [6, 0, 1, 7, 2, 3, 4, 5];
        let probs = [0.9, 0.8, 0.7, 0.1, 0.5, 0.45, 0.2, 0.1];
        let all = |_: u16| true;
        // Group {0,1} sums 1.5, group {6,7} 1.0: the token routes to 0 and 1.
        assert_eq!(
            r.select_kept(Gating::Sigmoid, 0, 8, c(&ids, &probs), &all, 2),
            vec![0, 1]
        );
        // Without expert 1, group {0,..} has 0.8 alone, {2,3} 0.95, {6,7} 1.0.
        let no_one = |e: u16| e != 1;
        assert_eq!(
            r.select_kept(Gating::Sigmoid, 0, 8, c(&ids, &probs), &no_one, 2),
            vec![6, 7]
        );
        // A selection bias moves group sums too.
        let mut biased = grouped(4, 1);
        biased
            .selection_bias
            .insert(0, vec![0.0, 0.0, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(biased.selection_score(0, 2, 0.5), 1.1);
        assert_eq!(
            biased.select_kept(Gating::Sigmoid, 0, 8, c(&ids, &probs), &all, 2),
            vec![2, 3]
        );
    }

    /// A worked example: softmax over 4 experts with probabilities
    /// 0.4, 0.3, 0.2, 0.1 and a selection bias of 0, 0, 0.15, 0.25. The full
    /// model selects on `p + b`: 0.4, 0.3, 0.35, 0.35. Pruning expert 0
    /// leaves a kept mass of 0.6: the pruned model's probabilities are 0.5,
    /// 0.333, 0.167 and its scores `p / 0.6 + b` are 0.5, 0.483, 0.417. Its
    /// top-2 is {1, 2}; the unrenormalised rule (traced order 2, 3, 1 after
    /// dropping 0, ties by id) would say {2, 3}.
    #[test]
    fn softmax_with_a_bias_re_ranks_kept_experts_on_renormalised_probabilities() {
        let mut r = Routing::default();
        r.selection_bias.insert(0, vec![0.0, 0.0, 0.15, 0.25]);
        // Traced (full-model) selection order: 0 (0.4), 2 (0.35), 3 (0.35), 1 (0.3).
        let ids = [0, 2, 3, 1];
        let probs = [0.4, 0.2, 0.1, 0.3];
        let no_zero = |e: u16| e != 0;
        let z = Routing::kept_mass(4, c(&ids, &probs), &no_zero);
        assert!((z - 0.6).abs() < 1e-6, "{z}");
        assert_eq!(
            r.select_kept(Gating::Softmax, 0, 4, c(&ids, &probs), &no_zero, 2),
            vec![1, 2]
        );
        // Sigmoid gating is per expert: the traced order stands.
        assert_eq!(
            r.select_kept(Gating::Sigmoid, 0, 4, c(&ids, &probs), &no_zero, 2),
            vec![2, 3]
        );
        // Without a bias renormalising changes no order.
        let plain = Routing::default();
        assert_eq!(
            plain.select_kept(Gating::Softmax, 0, 4, c(&ids, &probs), &no_zero, 2),
            vec![2, 3]
        );
        // A top-N that misses experts 1 and 3: their mass (1 - 0.6 listed)
        // is shared evenly, and keeping 1 but not 3 adds half of it.
        let one_two = |e: u16| e == 1 || e == 2;
        let z = Routing::kept_mass(4, c(&[0, 2], &[0.4, 0.2]), &one_two);
        assert!((z - (0.2 + 0.4 * 0.5)).abs() < 1e-6, "{z}");
    }

    #[test]
    fn group_keep_sizes_that_llama_cpp_cannot_run_are_refused() {
        let g = Some(ExpertGroups {
            n_group: 4,
            n_group_used: 2,
        });
        assert!(check_group_keep(g, 32, 4, 16).is_ok());
        assert!(check_group_keep(None, 32, 4, 7).is_ok());
        let e = check_group_keep(g, 32, 4, 10).unwrap_err();
        assert!(e.contains("not a multiple of the 4"), "{e}");
        let e = check_group_keep(g, 32, 4, 4).unwrap_err();
        assert!(e.contains("at least 2"), "{e}");
        let e = check_group_keep(g, 32, 6, 8).unwrap_err();
        assert!(e.contains("fewer than the 6"), "{e}");
    }

    #[test]
    fn balanced_orders_put_each_groups_ith_best_before_any_groups_next() {
        let g = Some(ExpertGroups {
            n_group: 2,
            n_group_used: 1,
        });
        // Groups {0..3} and {4..7}; the ranking favours group 0.
        let ranking = [0, 1, 2, 4, 3, 5, 6, 7];
        let order = balanced_order(&ranking, g, 8);
        assert_eq!(order, vec![0, 4, 1, 5, 2, 6, 3, 7]);
        let mut top4 = order[..4].to_vec();
        top4.sort();
        assert_eq!(top4, vec![0, 1, 4, 5]);
        assert_eq!(balanced_order(&ranking, None, 8), ranking.to_vec());
    }
}
