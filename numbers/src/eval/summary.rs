//! `eval/summary.json`: the float view of a merged [`EvalPartial`], one
//! schema shared by the coordinator that writes it and the report that
//! reads it.

use super::generation::{GenerateJob, GenerationNoise, GenerationSummary};
use super::partial::{CandidateResult, ChunkSums, EvalPartial, Group};
use super::stats::{estimate, nan_if_null, percentile, same, Cluster, Interval};
use crate::exact::ExactSum;
use crate::split::{Modality, Split};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// KL(p || q) figures over a set of scored positions: llama-perplexity's
/// KL block (its percentiles interpolate linearly, [`percentile`]) with a
/// cluster-robust interval of the mean (by group clusters,
/// [`super::stats`]; NaN, `null` in JSON, below two clusters).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct KlFigures {
    /// Mean (llama-perplexity's `Mean KLD` over the same positions).
    pub mean: f64,
    /// Standard error of the mean by group clusters ([`super::stats`]).
    #[serde(deserialize_with = "nan_if_null")]
    pub se: f64,
    /// Lower end of the mean's 95% interval (group clusters).
    #[serde(deserialize_with = "nan_if_null")]
    pub lo: f64,
    /// Upper end of the mean's 95% interval (group clusters).
    #[serde(deserialize_with = "nan_if_null")]
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

/// Equal field by field, an unknown (NaN) interval equal to another.
impl PartialEq for KlFigures {
    fn eq(&self, o: &KlFigures) -> bool {
        let f = |k: &KlFigures| {
            [
                k.mean,
                k.se,
                k.lo,
                k.hi,
                k.se_positions,
                k.max,
                k.p999,
                k.p99,
                k.p95,
                k.p90,
                k.p50,
                k.p10,
                k.p5,
                k.p1,
                k.p01,
                k.min,
            ]
        };
        f(self).into_iter().zip(f(o)).all(|(a, b)| same(a, b))
    }
}

/// Figures of one candidate over one split or one (split, domain), each
/// with its 95% interval by group clusters (`*_ci`, each naming its
/// number of clusters).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Figures {
    /// Scored positions.
    pub n: u64,
    /// Chunks with scored positions.
    pub chunks: u64,
    /// Clusters with scored positions (held-out groups, or documents where
    /// the corpus has no group key): the clusters of the intervals.
    pub clusters: u64,
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
    /// Its interval, paired: from the per-cluster sums of the NLL difference.
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
/// interval by group clusters (per-cluster sums of the difference).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Paired {
    /// The best candidate's name.
    pub against: String,
    /// Mean of KL(candidate) - KL(best) per position (0 for the best).
    pub diff: f64,
    /// Its interval.
    pub ci: Interval,
}

/// What a [`PairedRow`] compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Comparison {
    /// Two methods at the same K: which keep map to ship at that size.
    SameK,
    /// A candidate (`a`) against the next larger evaluated K of its method
    /// (`b`): the cost of pruning further.
    SmallerK,
    /// A merged candidate (`a`, `<method>_merge_K<k>`) against the pruned
    /// one of the same method and K (`b`, `<method>_K<k>`): whether to
    /// merge or drop the experts that go (issue #57).
    MergedPruned,
}

/// A paired comparison where a choice is made: the mean over the split's
/// positions of KL(`a`) - KL(`b`) per position, with its interval by group
/// clusters (per-cluster sums of the difference); negative when `a` is
/// closer to the base model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairedRow {
    /// The split compared (eval sets are kept out of its whole).
    pub split: Split,
    /// What the pair compares.
    pub compares: Comparison,
    /// First candidate.
    pub a: String,
    /// Second candidate.
    pub b: String,
    /// Mean of KL(a) - KL(b) per position.
    pub diff: f64,
    /// Its interval, with its number of clusters.
    pub ci: Interval,
    /// The same difference over each domain's positions alone (eval sets
    /// included), with the domain's own clusters: a pooled difference can
    /// hide a domain one candidate serves much worse.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub domains: BTreeMap<String, DomainDiff>,
}

/// A paired difference over one domain's positions ([`PairedRow::domains`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DomainDiff {
    /// Mean of KL(a) - KL(b) per position of the domain.
    pub diff: f64,
    /// Its interval by the domain's group clusters.
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
    /// The corpus's domain names (calibration domains and eval sets), so a
    /// domain without held-out positions is seen, not silently absent.
    #[serde(default)]
    pub domains: Vec<String>,
    /// Paired comparisons where choices are made ([`PairedRow`]): every
    /// pair of candidates at the same K, and each candidate against the
    /// next larger K of its method, per split.
    #[serde(default)]
    pub pairs: Vec<PairedRow>,
    /// The generation check's noise floor: the base model against itself
    /// with its prompts decoded in another micro-batch size, when the
    /// evaluation generated with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_noise: Option<GenerationNoise>,
    /// Domains with held-out text that the generation check has no prompt
    /// for, by name, and why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub generation_unprompted: BTreeMap<String, String>,
}

/// What [`EvalSummary::uncertainty`] says.
pub const UNCERTAINTY: &str = "cluster-robust (CR1) standard errors over clusters of the unit of sampling: the corpus group of each position's span (the held-out split takes whole groups; a corpus without a group key has one group per document), 95% intervals with Student's t at (clusters - 1) degrees of freedom, n/a below two clusters; paired differences, the perplexity ratio and every other figure from per-cluster sums of the per-position values";

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
            domains: domains.to_vec(),
            pairs: Vec::new(),
            generation_noise: GenerationSummary::of(&p.noise, p.generate.0, domains).map(
                |figures| GenerationNoise {
                    n_ubatch: p.generate.1,
                    figures,
                },
            ),
            generation_unprompted: BTreeMap::new(),
        }
        .paired(p, &apart)
        .pair_rows(p, &apart)
    }

    /// Fills [`EvalSummary::pairs`]: per split, every pair of candidates at
    /// the same K (in the job's order; a merged candidate before the pruned
    /// one of its method, [`Comparison::MergedPruned`]), and each candidate
    /// against the next larger evaluated K of its method.
    fn pair_rows(mut self, p: &EvalPartial, apart: &BTreeSet<u16>) -> EvalSummary {
        let cs = &self.candidates;
        let merged_of = |m: usize, pruned: usize| {
            crate::keep_name::merged_from(&cs[m].method) == Some(cs[pruned].method.as_str())
        };
        let mut pairs: Vec<(Comparison, usize, usize)> = Vec::new();
        for a in 0..cs.len() {
            for b in a + 1..cs.len() {
                if cs[a].k != cs[b].k {
                    continue;
                }
                pairs.push(match (merged_of(a, b), merged_of(b, a)) {
                    (true, _) => (Comparison::MergedPruned, a, b),
                    (_, true) => (Comparison::MergedPruned, b, a),
                    _ => (Comparison::SameK, a, b),
                });
            }
        }
        for a in 0..cs.len() {
            let larger = (0..cs.len())
                .filter(|&b| cs[b].method == cs[a].method && cs[b].k > cs[a].k)
                .min_by_key(|&b| cs[b].k);
            if let Some(b) = larger {
                pairs.push((Comparison::SmallerK, a, b));
            }
        }
        for split in &p.splits {
            let in_split = |g: &Group| g.split == *split && !apart.contains(&g.domain);
            for &(compares, a, b) in &pairs {
                let (diff, ci) = paired_diff(&p.candidates[a], &p.candidates[b], &in_split);
                if ci.clusters == 0 {
                    continue;
                }
                let mut domains = BTreeMap::new();
                for (d, name) in self.domains.iter().enumerate() {
                    let one = |g: &Group| g.split == *split && usize::from(g.domain) == d;
                    let (diff, ci) = paired_diff(&p.candidates[a], &p.candidates[b], &one);
                    if ci.clusters > 0 {
                        domains.insert(name.clone(), DomainDiff { diff, ci });
                    }
                }
                self.pairs.push(PairedRow {
                    split: *split,
                    compares,
                    a: cs[a].name.clone(),
                    b: cs[b].name.clone(),
                    diff,
                    ci,
                    domains,
                });
            }
        }
        self
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
            let against = self.candidates[best].name.clone();
            for (c, result) in self.candidates.iter_mut().zip(&p.candidates) {
                let Some(f) = c.splits.get_mut(split) else {
                    continue;
                };
                let (diff, ci) = paired_diff(result, &p.candidates[best], &in_split);
                f.paired = Some(Paired {
                    against: against.clone(),
                    diff,
                    ci,
                });
            }
        }
        self
    }

    /// The summary with the domains `job` found no generation prompt for
    /// (with why), by name.
    pub fn with_unprompted(mut self, job: &GenerateJob) -> EvalSummary {
        self.generation_unprompted = job
            .unprompted
            .iter()
            .map(|(&d, why)| {
                let name = self.domains.get(usize::from(d)).cloned();
                (name.unwrap_or_else(|| format!("domain {d}")), why.clone())
            })
            .collect();
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
        generation: GenerationSummary::of(&c.generations, p.generate.0, domains),
    }
}

/// The mean per position of KL(`a`) - KL(`b`) over the positions of the
/// groups `keep` selects, with its interval by cluster (per-cluster sums
/// of the difference; the two candidates scored the same positions).
fn paired_diff(
    a: &CandidateResult,
    b: &CandidateResult,
    keep: &dyn Fn(&Group) -> bool,
) -> (f64, Interval) {
    let theirs = cluster_sums(b, keep);
    let clusters: Vec<Cluster> = cluster_sums(a, keep)
        .iter()
        .map(|(cluster, s)| {
            // The difference of exact sums is exact.
            let other = theirs.get(cluster).map_or(0, |t| t.kl.0);
            (s.n, ExactSum(s.kl.0.saturating_sub(other)).to_f64())
        })
        .collect();
    estimate(&clusters)
}

/// Per cluster (the corpus group of the positions' spans), a candidate's
/// sums over the groups `keep` selects.
fn cluster_sums(c: &CandidateResult, keep: &dyn Fn(&Group) -> bool) -> BTreeMap<u32, ChunkSums> {
    let mut out: BTreeMap<u32, ChunkSums> = BTreeMap::new();
    for ((_, cluster, _), s) in c.chunks.iter().filter(|((_, _, g), _)| keep(g)) {
        // Sums of one run stay far inside the accumulator's range (the
        // group sums of the same positions were accepted).
        let _ = out.entry(*cluster).or_default().merge(s);
    }
    out
}

fn figures(c: &CandidateResult, keep: &dyn Fn(&Group) -> bool) -> Figures {
    let clusters: Vec<ChunkSums> = cluster_sums(c, keep).into_values().collect();
    let n: u64 = clusters.iter().map(|s| s.n).sum();
    if n == 0 {
        return Figures::default();
    }
    let chunks: BTreeSet<u32> = c
        .chunks
        .iter()
        .filter(|((_, _, g), s)| keep(g) && s.n > 0)
        .map(|((chunk, _, _), _)| *chunk)
        .collect();
    let of = |f: &dyn Fn(&ChunkSums) -> f64| -> (f64, Interval) {
        let clusters: Vec<Cluster> = clusters.iter().map(|s| (s.n, f(s))).collect();
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
        chunks: chunks.len() as u64,
        clusters: kl_ci.clusters,
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

/// Which held-out figures a KL budget must hold for (`[eval] budget_scope`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetScope {
    /// Every calibration domain's and eval set's held-out KL: a candidate
    /// that wrecks one small domain does not fit.
    #[default]
    EveryDomain,
    /// The pooled held-out KL (eval sets are not in it).
    Pooled,
}

impl BudgetScope {
    /// Parses `every_domain` or `pooled`; the error lists both.
    pub fn parse(text: &str) -> Result<BudgetScope, String> {
        match text {
            "every_domain" => Ok(BudgetScope::EveryDomain),
            "pooled" => Ok(BudgetScope::Pooled),
            other => Err(format!(
                "budget scope {other:?} is neither \"every_domain\" nor \"pooled\""
            )),
        }
    }
}

/// The figure that binds a method's budget pick: the check with the
/// largest upper end at the pick (the first to fail if the budget were
/// tighter), or, without a pick, the check that fails at the largest K.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Binding {
    /// The candidate it was read from.
    pub candidate: String,
    /// The domain or eval set (or the pooled held-out split).
    pub domain: String,
    /// Its held-out KL interval's upper end (NaN, `null` in JSON, when
    /// fewer than two clusters leave it unknown).
    #[serde(deserialize_with = "nan_if_null")]
    pub hi: f64,
    /// Its clusters.
    pub clusters: u64,
    /// The largest K of the method that misses the budget (it and every
    /// smaller K are not picked), if one does.
    pub missed: Option<String>,
}

/// What a KL budget chose.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetPicks {
    /// The budget: a mean KL in nats.
    pub kl_budget: f64,
    /// The split whose KL was compared: always `heldout` (the fit split
    /// would judge the calibration text in-sample).
    pub split: Split,
    /// Which held-out figures every K must fit.
    #[serde(default)]
    pub scope: BudgetScope,
    /// Per method, the candidate with the smallest K such that it and every
    /// larger evaluated K fit the budget; `None` when the largest does not.
    pub picks: BTreeMap<String, Option<String>>,
    /// Per method, the figure that binds ([`Binding`]).
    #[serde(default)]
    pub binding: BTreeMap<String, Option<Binding>>,
    /// Domains of the corpus without held-out positions: nothing of theirs
    /// was checked.
    #[serde(default)]
    pub unchecked: Vec<String>,
    /// Why nothing was picked, when no held-out position was scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
