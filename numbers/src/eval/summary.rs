//! `eval/summary.json`: the float view of a merged [`EvalPartial`], one
//! schema shared by the coordinator that writes it and the report that
//! reads it.

use super::generation::GenerationSummary;
use super::partial::{CandidateResult, ChunkSums, EvalPartial, Group};
use super::stats::{estimate, percentile, Cluster, Interval};
use crate::exact::ExactSum;
use crate::split::{Modality, Split};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// KL(p || q) figures over a set of scored positions: llama-perplexity's
/// KL block (its percentiles interpolate linearly, [`percentile`]) with a
/// cluster-robust interval of the mean.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KlFigures {
    /// Mean (llama-perplexity's `Mean KLD` over the same positions).
    pub mean: f64,
    /// Standard error of the mean by chunk clusters ([`super::stats`]).
    pub se: f64,
    /// Lower end of the mean's 95% interval (chunk clusters).
    pub lo: f64,
    /// Upper end of the mean's 95% interval (chunk clusters).
    pub hi: f64,
    /// Standard error with positions taken as independent (the error
    /// llama-perplexity prints after `Mean KLD`); smaller than `se`
    /// whenever positions of a chunk are correlated.
    pub se_positions: f64,
    /// Largest value.
    pub max: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Median.
    pub p50: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 5th percentile.
    pub p5: f64,
    /// 1st percentile.
    pub p1: f64,
    /// 0.1th percentile.
    pub p01: f64,
    /// Smallest value.
    pub min: f64,
}

/// Figures of one candidate over one split or one (split, domain), each
/// with its 95% interval by chunk clusters (`*_ci`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Figures {
    /// Scored positions.
    pub n: u64,
    /// Chunks with scored positions: the clusters of the intervals.
    pub chunks: u64,
    /// KL(p || q).
    pub kl: KlFigures,
    /// Share of positions where both models pick the same top-1 token
    /// (llama-perplexity's `Same top p`).
    pub top1_same: f64,
    /// Its interval.
    pub top1_same_ci: Interval,
    /// Perplexity of the base model on the actual next tokens.
    pub ppl_base: f64,
    /// Its interval (from the interval of the mean NLL).
    pub ppl_base_ci: Interval,
    /// Perplexity of the candidate.
    pub ppl_candidate: f64,
    /// Its interval.
    pub ppl_candidate_ci: Interval,
    /// `ppl_candidate / ppl_base` (llama-perplexity's `Mean
    /// PPL(Q)/PPL(base)`).
    pub ppl_ratio: f64,
    /// Its interval, paired: from the per-chunk sums of the NLL difference.
    pub ppl_ratio_ci: Interval,
    /// Mean of q(next) - p(next).
    pub dprob_mean: f64,
    /// Its interval.
    pub dprob_mean_ci: Interval,
    /// Root mean square of q(next) - p(next) (llama-perplexity's `RMS Δp`).
    pub dprob_rms: f64,
    /// Its interval (from the interval of the mean square).
    pub dprob_rms_ci: Interval,
}

/// A candidate against the best one (lowest mean KL of the split) over the
/// same positions: the mean of the per-position KL difference, with its
/// interval by chunk clusters (per-chunk sums of the difference).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Paired {
    /// The best candidate's name.
    pub against: String,
    /// Mean of KL(candidate) - KL(best) per position (0 for the best).
    pub diff: f64,
    /// Its interval.
    pub ci: Interval,
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
    /// The whole split's KL against the best candidate's, when the
    /// evaluation had more than one candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paired: Option<Paired>,
    /// The domain (not an eval set) with the highest mean KL, whose figures
    /// are in `domains`: the domain this candidate serves worst.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_domain: Option<String>,
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
    /// Per split (`fit`, `heldout` in the file).
    pub splits: BTreeMap<Split, SplitFigures>,
    /// Size of the candidate's model file in bytes, when the evaluation
    /// knew it (the coordinator's slice, or a shipped file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The generation check: greedy continuations of held-out prompts
    /// against the base model's, when the evaluation generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationSummary>,
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
    /// How intervals are computed ([`UNCERTAINTY`]).
    #[serde(default)]
    pub uncertainty: String,
    /// One entry per candidate, in the job's order.
    pub candidates: Vec<CandidateSummary>,
    /// Per method, the smallest evaluated K within a KL budget, when one
    /// was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetPicks>,
    /// The corpus's eval sets (`[[corpus.eval_sets]]`): domains of their own,
    /// held out whole, whose figures the eval table lists apart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eval_sets: Vec<String>,
}

/// What [`EvalSummary::uncertainty`] says.
pub const UNCERTAINTY: &str = "cluster-robust (CR1) standard errors over chunk clusters (each chunk is decoded alone; its positions share their context), 95% intervals with Student's t at (chunks - 1) degrees of freedom; paired differences from per-chunk sums of the per-position difference";

impl EvalSummary {
    /// The figures of a merged partial; `domains` names the corpus's domain
    /// indices.
    pub fn of(p: &EvalPartial, domains: &[String]) -> EvalSummary {
        EvalSummary::of_run(p, domains, &[])
    }

    /// [`EvalSummary::of`] for a corpus whose domains named in `eval_sets`
    /// are its eval sets: their figures are their own (per domain), kept
    /// out of each split's whole and of the paired comparisons.
    pub fn of_run(p: &EvalPartial, domains: &[String], eval_sets: &[String]) -> EvalSummary {
        let apart: BTreeSet<u16> = (0..domains.len())
            .filter(|&d| eval_sets.contains(&domains[d]))
            .map(|d| d as u16)
            .collect();
        let candidates = p
            .candidates
            .iter()
            .map(|c| candidate(p, c, domains, &apart))
            .collect();
        EvalSummary {
            base_sha256: p.base_sha256.clone(),
            corpus_sha256: p.corpus_sha256.clone(),
            skip_first: p.skip_first,
            n_chunks: p.n_chunks(),
            backends: p.backends.clone(),
            uncertainty: UNCERTAINTY.to_string(),
            candidates,
            budget: None,
            eval_sets: eval_sets.to_vec(),
        }
        .paired(p, &apart)
    }

    /// Fills each split's paired comparison against its best candidate
    /// (the lowest mean KL over the whole split; the first on a tie).
    fn paired(mut self, p: &EvalPartial, apart: &BTreeSet<u16>) -> EvalSummary {
        if p.candidates.len() < 2 {
            return self;
        }
        for split in &p.splits {
            let mean = |c: &CandidateSummary| c.splits.get(split).map_or(0.0, |f| f.all.kl.mean);
            let Some(best) = (0..self.candidates.len())
                .min_by(|&a, &b| mean(&self.candidates[a]).total_cmp(&mean(&self.candidates[b])))
            else {
                continue;
            };
            let in_split = |g: &Group| g.split == *split && !apart.contains(&g.domain);
            let best_kl = chunk_kl(&p.candidates[best], &in_split);
            let against = self.candidates[best].name.clone();
            for (c, result) in self.candidates.iter_mut().zip(&p.candidates) {
                let Some(f) = c.splits.get_mut(split) else {
                    continue;
                };
                let mine = chunk_kl(result, &in_split);
                let clusters: Vec<Cluster> = mine
                    .iter()
                    .map(|(chunk, &(n, kl))| {
                        // The difference of exact sums is exact.
                        let best = best_kl.get(chunk).map_or(0, |b| b.1 .0);
                        (n, ExactSum(kl.0.saturating_sub(best)).to_f64())
                    })
                    .collect();
                let (diff, ci) = estimate(&clusters);
                f.paired = Some(Paired {
                    against: against.clone(),
                    diff,
                    ci,
                });
            }
        }
        self
    }

    /// Records each candidate's model file size, by name (`bytes`).
    pub fn with_sizes(mut self, sizes: &BTreeMap<String, u64>) -> EvalSummary {
        for c in &mut self.candidates {
            c.bytes = sizes.get(&c.name).copied();
        }
        self
    }

    /// Pretty JSON with shortest round-trip floats.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("summary serialises")
    }
}

fn candidate(
    p: &EvalPartial,
    c: &CandidateResult,
    domains: &[String],
    apart: &BTreeSet<u16>,
) -> CandidateSummary {
    let with_images = p.base.keys().any(|g| g.modality == Modality::Image);
    let mut splits = BTreeMap::new();
    for split in &p.splits {
        let in_split = |g: &Group| g.split == *split && !apart.contains(&g.domain);
        let all = figures(c, &in_split);
        let mut by_domain = BTreeMap::new();
        for (d, name) in domains.iter().enumerate() {
            let one = |g: &Group| g.split == *split && g.domain as usize == d;
            let f = figures(c, &one);
            if f.n > 0 {
                by_domain.insert(name.clone(), f);
            }
        }
        let mut modalities = BTreeMap::new();
        for m in Modality::ALL.into_iter().filter(|_| with_images) {
            let one =
                |g: &Group| g.split == *split && g.modality == m && !apart.contains(&g.domain);
            modalities.insert(m.as_str().to_string(), figures(c, &one));
        }
        let worst_domain = by_domain
            .iter()
            .filter(|(name, _)| {
                !apart
                    .iter()
                    .any(|&d| domains.get(d as usize) == Some(*name))
            })
            .max_by(|a, b| a.1.kl.mean.total_cmp(&b.1.kl.mean))
            .map(|(name, _)| name.clone());
        splits.insert(
            *split,
            SplitFigures {
                all,
                domains: by_domain,
                modalities,
                paired: None,
                worst_domain,
            },
        );
    }
    CandidateSummary {
        name: c.name.clone(),
        method: crate::keep_name::method_of(&c.name).to_string(),
        k: c.k,
        sha256: c.sha256.clone(),
        splits,
        bytes: None,
        generation: GenerationSummary::of(&c.generations, p.generate_tokens, domains),
    }
}

/// Per chunk, (positions, exact KL sum) of a candidate's positions in
/// groups `keep` selects.
fn chunk_kl(c: &CandidateResult, keep: &dyn Fn(&Group) -> bool) -> BTreeMap<u32, (u64, ExactSum)> {
    chunk_sums(c, keep)
        .into_iter()
        .map(|(chunk, s)| (chunk, (s.n, s.kl)))
        .collect()
}

/// Per chunk, a candidate's sums over the groups `keep` selects.
fn chunk_sums(c: &CandidateResult, keep: &dyn Fn(&Group) -> bool) -> BTreeMap<u32, ChunkSums> {
    let mut out: BTreeMap<u32, ChunkSums> = BTreeMap::new();
    for ((chunk, _), s) in c.chunks.iter().filter(|((_, g), _)| keep(g)) {
        // Sums of one chunk stay far inside the accumulator's range.
        let _ = out.entry(*chunk).or_default().merge(s);
    }
    out
}

fn figures(c: &CandidateResult, keep: &dyn Fn(&Group) -> bool) -> Figures {
    let chunks: Vec<ChunkSums> = chunk_sums(c, keep).into_values().collect();
    let n: u64 = chunks.iter().map(|s| s.n).sum();
    if n == 0 {
        return Figures::default();
    }
    let of = |f: &dyn Fn(&ChunkSums) -> f64| -> (f64, Interval) {
        let clusters: Vec<Cluster> = chunks.iter().map(|s| (s.n, f(s))).collect();
        estimate(&clusters)
    };
    let (kl_mean, kl_ci) = of(&|s| s.kl.to_f64());
    let (top1_same, top1_same_ci) = of(&|s| s.top1_same as f64);
    let (nll_base, nll_base_ci) = of(&|s| s.nll_base.to_f64());
    let (nll, nll_ci) = of(&|s| s.nll.to_f64());
    let (log_ratio, log_ratio_ci) = of(&|s| s.nll.to_f64() - s.nll_base.to_f64());
    let (dprob_mean, dprob_mean_ci) = of(&|s| s.dprob.to_f64());
    let (mse, mse_ci) = of(&|s| s.dprob_sq.to_f64());
    let exp = |m: f64, ci: Interval| (m.exp(), ci.map(f64::exp, m.exp()));
    let (ppl_base, ppl_base_ci) = exp(nll_base, nll_base_ci);
    let (ppl_candidate, ppl_candidate_ci) = exp(nll, nll_ci);
    let (ppl_ratio, ppl_ratio_ci) = exp(log_ratio, log_ratio_ci);
    let dprob_rms = mse.max(0.0).sqrt();
    let dprob_rms_ci = mse_ci.map(
        |v| v.max(0.0).sqrt(),
        if dprob_rms > 0.0 {
            0.5 / dprob_rms
        } else {
            0.0
        },
    );
    let mut kl_sq = ExactSum::default();
    for (_, s) in c.groups.iter().filter(|(g, _)| keep(g)) {
        kl_sq.0 = kl_sq.0.saturating_add(s.kl_sq.0);
    }
    let total = n as f64;
    let se_positions = if n > 1 {
        let var = (kl_sq.to_f64() - kl_mean * kl_mean * total) / (total - 1.0);
        (var.max(0.0) / total).sqrt()
    } else {
        0.0
    };
    let mut kl: Vec<f64> = c
        .tokens
        .iter()
        .filter(|t| keep(&t.group))
        .map(|t| t.kl)
        .collect();
    kl.sort_by(f64::total_cmp);
    let at = |q: f64| percentile(&kl, q);
    Figures {
        n,
        chunks: chunks.iter().filter(|s| s.n > 0).count() as u64,
        kl: KlFigures {
            mean: kl_mean,
            se: kl_ci.se,
            lo: kl_ci.lo,
            hi: kl_ci.hi,
            se_positions,
            max: kl.last().copied().unwrap_or(0.0),
            p999: at(0.999),
            p99: at(0.99),
            p95: at(0.95),
            p90: at(0.9),
            p50: at(0.5),
            p10: at(0.1),
            p5: at(0.05),
            p1: at(0.01),
            p01: at(0.001),
            min: kl.first().copied().unwrap_or(0.0),
        },
        top1_same,
        top1_same_ci,
        ppl_base,
        ppl_base_ci,
        ppl_candidate,
        ppl_candidate_ci,
        ppl_ratio,
        ppl_ratio_ci,
        dprob_mean,
        dprob_mean_ci,
        dprob_rms,
        dprob_rms_ci,
    }
}

/// What a KL budget chose.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetPicks {
    /// The budget: a mean KL in nats.
    pub kl_budget: f64,
    /// The split whose KL was compared (`heldout`, or `fit` in a run
    /// without held-out positions).
    pub split: Split,
    /// Per method, the candidate with the smallest K whose KL interval's
    /// upper end is within the budget; `None` when no evaluated K fits.
    pub picks: BTreeMap<String, Option<String>>,
}
