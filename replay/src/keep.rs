//! From router output to cache requests, with or without a keep map.
//!
//! Without a keep map a token requests its selected experts. Under a keep map
//! it requests what the pruned model selects: the first `k` kept experts of
//! its router top-N (which the trace lists in llama.cpp's selection order,
//! selection bias included, re-ranked on renormalised probabilities under
//! softmax gating with a bias), within the allowed groups under grouped
//! routing ([`Routing::select_kept`]); when fewer than `k` survive, the empty slots
//! are forced misses. Near picks are the next `n_near` candidates (kept
//! ones, under a keep map) after the requested ones.

use super::steps::{TokenReqs, NONE};
use super::trace_io::RawLayer;
use numbers::routing::{Candidates, Routing};
use numbers::Gating;

/// One layer of a keep map, as replay applies it.
#[derive(Clone, Copy)]
pub struct KeptLayer<'a> {
    /// `kept[e]`: whether expert `e` survives.
    pub kept: &'a [bool],
    /// The block.
    pub layer: u32,
    /// The model's routing (groups limit what a pruned model selects).
    pub routing: &'a Routing,
    /// The model's gating function (softmax renormalises over kept experts).
    pub gating: Gating,
}

impl KeptLayer<'_> {
    /// Whether the pruned model's choice needs [`Routing::select_kept`]
    /// rather than the first `k` kept candidates: under grouped routing, or
    /// under softmax gating with a selection bias.
    fn needs_rule(&self) -> bool {
        self.routing.groups.is_some()
            || (self.gating == Gating::Softmax
                && self.routing.selection_bias.contains_key(&self.layer))
    }
}

/// Requests of one layer's tokens under `kept` (`None`: no keep map).
pub fn requests(
    raw: &RawLayer,
    n_expert: usize,
    kept: Option<KeptLayer<'_>>,
    n_near: usize,
) -> TokenReqs {
    let (k, n) = (raw.k, raw.n);
    let tokens = raw.tokens();
    let mut out = TokenReqs {
        n_expert,
        k,
        n_near,
        chunk: raw.chunk.clone(),
        expert: Vec::with_capacity(tokens * k),
        prob: Vec::with_capacity(tokens * k),
        rank: Vec::with_capacity(tokens * k),
        near: Vec::with_capacity(tokens * n_near),
    };
    // Per expert: the token that last listed it (1-based) and where.
    let mut stamp = vec![0u32; n_expert];
    let mut rank_at = vec![0u16; n_expert];
    let mut prob_at = vec![0f32; n_expert];
    let mut selected = vec![0u32; n_expert];
    for t in 0..tokens {
        let mark = t as u32 + 1;
        let top = &raw.topn[t * n..(t + 1) * n];
        let top_prob = &raw.topn_prob[t * n..(t + 1) * n];
        let near_before = out.near.len();
        match kept {
            None => {
                for (r, (&e, &p)) in top.iter().zip(top_prob).enumerate() {
                    stamp[e as usize] = mark;
                    rank_at[e as usize] = r as u16 + 1;
                    prob_at[e as usize] = p;
                }
                for (j, &e) in raw.selected[t * k..(t + 1) * k].iter().enumerate() {
                    let listed = stamp[e as usize] == mark;
                    out.expert.push(e);
                    out.rank.push(if listed {
                        rank_at[e as usize]
                    } else {
                        j as u16 + 1
                    });
                    out.prob
                        .push(if listed { prob_at[e as usize] } else { 0.0 });
                    selected[e as usize] = mark;
                }
                out.near.extend(
                    top.iter()
                        .filter(|&&e| selected[e as usize] != mark)
                        .take(n_near),
                );
            }
            Some(rule) if rule.needs_rule() => {
                let kept = rule.kept;
                let is_kept = |e: u16| kept[e as usize];
                let candidates = Candidates {
                    id: top,
                    prob: top_prob,
                };
                let sel = rule.routing.select_kept(
                    rule.gating,
                    rule.layer,
                    n_expert,
                    candidates,
                    &is_kept,
                    k,
                );
                for &e in &sel {
                    let r = top.iter().position(|&x| x == e).expect("selected from top");
                    out.expert.push(e);
                    out.rank.push(r as u16 + 1);
                    out.prob.push(top_prob[r]);
                }
                for _ in sel.len()..k {
                    out.expert.push(NONE);
                    out.rank.push(0);
                    out.prob.push(0.0);
                }
                out.near.extend(
                    top.iter()
                        .filter(|&&e| kept[e as usize] && !sel.contains(&e))
                        .take(n_near),
                );
            }
            Some(rule) => {
                let kept = rule.kept;
                let mut taken = 0;
                for (r, (&e, &p)) in top.iter().zip(top_prob).enumerate() {
                    if !kept[e as usize] {
                        continue;
                    }
                    if taken < k {
                        out.expert.push(e);
                        out.rank.push(r as u16 + 1);
                        out.prob.push(p);
                        taken += 1;
                    } else if out.near.len() - near_before < n_near {
                        out.near.push(e);
                    } else {
                        break;
                    }
                }
                for _ in taken..k {
                    out.expert.push(NONE);
                    out.rank.push(0);
                    out.prob.push(0.0);
                }
            }
        }
        out.near.resize(near_before + n_near, NONE);
    }
    out
}
