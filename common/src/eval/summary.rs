//! `eval/summary.json`: the float view of a merged [`EvalPartial`], one
//! schema shared by the coordinator that writes it and the report that
//! reads it.

use super::partial::{BaseSums, CandidateResult, CandidateSums, EvalPartial, Group};
use crate::split::{Modality, Split};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// KL(p || q) figures over a set of scored positions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KlFigures {
    /// Mean.
    pub mean: f64,
    /// Standard error of the mean (0 below two positions).
    pub se: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest value.
    pub max: f64,
}

/// Figures of one candidate over one split or one (split, domain).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Scored positions.
    pub n: u64,
    /// KL(p || q).
    pub kl: KlFigures,
    /// Share of positions where both models pick the same top-1 token.
    pub top1_same: f64,
    /// Perplexity of the base model on the actual next tokens.
    pub ppl_base: f64,
    /// Perplexity of the candidate.
    pub ppl_candidate: f64,
    /// `ppl_candidate / ppl_base`.
    pub ppl_ratio: f64,
    /// Mean of q(next) - p(next).
    pub dprob_mean: f64,
}

/// Figures of one split, whole, per domain and per modality.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SplitFigures {
    /// The whole split.
    pub all: Figures,
    /// Per domain name.
    pub domains: BTreeMap<String, Figures>,
    /// Per modality name (`text`, `image`: image-conditioned positions),
    /// only when the evaluation scored image-conditioned positions, so a
    /// text run's summary is what it always was.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modalities: BTreeMap<String, Figures>,
}

/// One pruned candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateSummary {
    /// `<method>_K<k>`.
    pub name: String,
    /// Scoring method of its keep map.
    pub method: String,
    /// Experts kept per MoE layer.
    pub k: u32,
    /// SHA-256 of the pruned GGUF.
    pub sha256: String,
    /// Per split name (`fit`, `heldout`).
    pub splits: BTreeMap<String, SplitFigures>,
}

/// `eval/summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    /// SHA-256 of the base GGUF.
    pub base_sha256: String,
    /// SHA-256 of the corpus chunk table.
    pub corpus_sha256: String,
    /// Positions skipped at the start of every chunk.
    pub skip_first: u32,
    /// Chunks evaluated.
    pub n_chunks: u64,
    /// Backends that computed them.
    pub backends: Vec<String>,
    /// One entry per candidate, in the job's order.
    pub candidates: Vec<CandidateSummary>,
}

impl EvalSummary {
    /// The figures of a merged partial; `domains` names the corpus's domain
    /// indices.
    pub fn of(p: &EvalPartial, domains: &[String]) -> EvalSummary {
        let candidates = p
            .candidates
            .iter()
            .map(|c| candidate(p, c, domains))
            .collect();
        EvalSummary {
            base_sha256: p.base_sha256.clone(),
            corpus_sha256: p.corpus_sha256.clone(),
            skip_first: p.skip_first,
            n_chunks: p.n_chunks(),
            backends: p.backends.clone(),
            candidates,
        }
    }

    /// Pretty JSON with shortest round-trip floats.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("summary serialises")
    }
}

/// Splits a candidate name `<method>_K<k>` into its method.
pub fn method_of(name: &str) -> &str {
    name.rsplit_once("_K").map_or(name, |(m, _)| m)
}

fn candidate(p: &EvalPartial, c: &CandidateResult, domains: &[String]) -> CandidateSummary {
    let with_images = p.base.keys().any(|g| g.modality == Modality::Image);
    let mut splits = BTreeMap::new();
    for split in &p.splits {
        let in_split = |g: &Group| g.split == *split;
        let all = figures(p, c, &in_split);
        let mut by_domain = BTreeMap::new();
        for (d, name) in domains.iter().enumerate() {
            let one = |g: &Group| g.split == *split && g.domain as usize == d;
            let f = figures(p, c, &one);
            if f.n > 0 {
                by_domain.insert(name.clone(), f);
            }
        }
        let mut modalities = BTreeMap::new();
        for m in Modality::ALL.into_iter().filter(|_| with_images) {
            let one = |g: &Group| g.split == *split && g.modality == m;
            modalities.insert(m.as_str().to_string(), figures(p, c, &one));
        }
        splits.insert(
            split.as_str().to_string(),
            SplitFigures {
                all,
                domains: by_domain,
                modalities,
            },
        );
    }
    CandidateSummary {
        name: c.name.clone(),
        method: method_of(&c.name).to_string(),
        k: c.k,
        sha256: c.sha256.clone(),
        splits,
    }
}

fn figures(p: &EvalPartial, c: &CandidateResult, keep: &dyn Fn(&Group) -> bool) -> Figures {
    let mut base = BaseSums::default();
    for (_, b) in p.base.iter().filter(|(g, _)| keep(g)) {
        base.n += b.n;
        base.nll.0 = base.nll.0.saturating_add(b.nll.0);
    }
    let mut s = CandidateSums::default();
    for (_, x) in c.groups.iter().filter(|(g, _)| keep(g)) {
        s.n += x.n;
        s.top1_same += x.top1_same;
        for (a, b) in [
            (&mut s.kl, x.kl),
            (&mut s.kl_sq, x.kl_sq),
            (&mut s.nll, x.nll),
            (&mut s.dprob, x.dprob),
        ] {
            a.0 = a.0.saturating_add(b.0);
        }
    }
    let mut kl: Vec<f64> = c
        .tokens
        .iter()
        .filter(|t| keep(&t.group))
        .map(|t| t.kl)
        .collect();
    kl.sort_by(f64::total_cmp);
    let n = s.n as f64;
    if s.n == 0 {
        return Figures::default();
    }
    let mean = s.kl.to_f64() / n;
    let se = if s.n > 1 {
        let var = (s.kl_sq.to_f64() - s.kl.to_f64() * mean) / (n - 1.0);
        (var.max(0.0) / n).sqrt()
    } else {
        0.0
    };
    let ppl_base = (base.nll.to_f64() / base.n.max(1) as f64).exp();
    let ppl_candidate = (s.nll.to_f64() / n).exp();
    Figures {
        n: s.n,
        kl: KlFigures {
            mean,
            se,
            p50: nearest_rank(&kl, 0.5),
            p90: nearest_rank(&kl, 0.9),
            p95: nearest_rank(&kl, 0.95),
            p99: nearest_rank(&kl, 0.99),
            p999: nearest_rank(&kl, 0.999),
            max: kl.last().copied().unwrap_or(0.0),
        },
        top1_same: s.top1_same as f64 / n,
        ppl_base,
        ppl_candidate,
        ppl_ratio: ppl_candidate / ppl_base,
        dprob_mean: s.dprob.to_f64() / n,
    }
}

/// The nearest-rank percentile of sorted values: the smallest value with at
/// least a share `q` of the values at or below it.
pub fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Parses `fit`, `heldout` or `both` into the splits to score.
pub fn parse_splits(s: &str) -> Option<Vec<Split>> {
    match s {
        "both" => Some(Split::ALL.to_vec()),
        other => Split::parse(other).map(|x| vec![x]),
    }
}
