//! The eval partial: what a worker returns for the chunks of one eval lease,
//! and the exact merge that combines partials into a run's result.

use super::generation::Generation;
use super::EvalError;
use crate::exact::ExactSum;
use crate::split::{ChunkRange, Modality, Split};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the eval partial encoding; bumped on any layout change
/// (2: groups carry their modality; 3: per-chunk sums; 4: generations;
/// 5: per-chunk sums split by cluster, the corpus group of each span;
/// 6: generations by prompt id with the matched prefix, and the noise
/// floor).
pub const EVAL_FORMAT_VERSION: u32 = 6;

/// Largest encoded eval partial the decoder accepts (1 GiB).
pub const MAX_EVAL_PARTIAL_BYTES: usize = 1 << 30;

/// A (split, domain, modality) group of scored positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Group {
    /// Fit or held-out.
    pub split: Split,
    /// Index into the corpus's domain list.
    pub domain: u16,
    /// [`Modality::Image`] for an image-conditioned position: one whose
    /// context holds an image of its chunk (the last position of an image
    /// and every later one); [`Modality::Text`] otherwise.
    pub modality: Modality,
}

impl Group {
    /// The text group of `split` and `domain`.
    pub fn text(split: Split, domain: u16) -> Group {
        Group {
            split,
            domain,
            modality: Modality::Text,
        }
    }
}

/// The base model's sums over the scored positions of one group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseSums {
    /// Scored positions.
    pub n: u64,
    /// Sum of the base model's negative log likelihood of the actual next token.
    pub nll: ExactSum,
}

/// One candidate's sums over the scored positions of one group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidateSums {
    /// Scored positions.
    pub n: u64,
    /// Sum of KL(p || q).
    pub kl: ExactSum,
    /// Sum of KL(p || q)^2 (standard error of the mean).
    pub kl_sq: ExactSum,
    /// Sum of the candidate's negative log likelihood of the actual next token.
    pub nll: ExactSum,
    /// Positions where base and candidate pick the same top-1 token.
    pub top1_same: u64,
    /// Sum of q(next) - p(next): the change in the next token's probability.
    pub dprob: ExactSum,
}

/// Where a candidate's [`ChunkSums`] are kept: `(chunk, cluster, group)`,
/// the chunk id, the cluster (the index of the position's span group in the
/// corpus index's groups: the unit the held-out split samples) and the
/// (split, domain, modality) group. Sums per cluster are exact and add
/// across chunks and partials, so a stored run can be re-clustered (by
/// group or by chunk).
pub type CellKey = (u32, u32, Group);

/// One candidate's sums over the scored positions of one chunk, one
/// cluster and one group ([`CellKey`]): summed by cluster, the clusters of
/// the summary's intervals and paired comparisons ([`super::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkSums {
    /// Scored positions.
    pub n: u64,
    /// Sum of KL(p || q).
    pub kl: ExactSum,
    /// Sum of the base model's negative log likelihood of the next token.
    pub nll_base: ExactSum,
    /// Sum of the candidate's.
    pub nll: ExactSum,
    /// Positions where both models pick the same top-1 token.
    pub top1_same: u64,
    /// Sum of q(next) - p(next).
    pub dprob: ExactSum,
    /// Sum of (q(next) - p(next))^2 (llama-perplexity's RMS Δp).
    pub dprob_sq: ExactSum,
}

impl ChunkSums {
    /// Adds one scored position's figures.
    pub fn add(
        &mut self,
        kl: f64,
        nll_base: f64,
        nll: f64,
        top1_same: bool,
        dprob: f64,
    ) -> Result<(), crate::exact::ExactError> {
        self.n += 1;
        self.top1_same += u64::from(top1_same);
        self.kl.add_f64(kl)?;
        self.nll_base.add_f64(nll_base)?;
        self.nll.add_f64(nll)?;
        self.dprob.add_f64(dprob)?;
        self.dprob_sq.add_f64(dprob * dprob)
    }

    /// Adds another chunk's or group's sums.
    pub fn merge(&mut self, o: &ChunkSums) -> Result<(), crate::exact::ExactError> {
        self.n += o.n;
        self.top1_same += o.top1_same;
        for (a, b) in [
            (&mut self.kl, o.kl),
            (&mut self.nll_base, o.nll_base),
            (&mut self.nll, o.nll),
            (&mut self.dprob, o.dprob),
            (&mut self.dprob_sq, o.dprob_sq),
        ] {
            a.add(b)?;
        }
        Ok(())
    }
}

/// KL of one scored position, kept so percentiles are exact after a merge.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenKl {
    /// Chunk id.
    pub chunk: u32,
    /// Position in the chunk whose logits predict the token at `pos + 1`.
    pub pos: u32,
    /// The position's cluster ([`CellKey`]).
    pub cluster: u32,
    /// The position's group.
    pub group: Group,
    /// KL(p || q) in f64.
    pub kl: f64,
}

/// A pruned candidate and everything measured for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateResult {
    /// Candidate name: the keep map's `<method>_K<k>`.
    pub name: String,
    /// SHA-256 of the pruned GGUF the worker sliced and ran.
    pub sha256: String,
    /// Experts kept per MoE layer.
    pub k: u32,
    /// Sums per group.
    pub groups: BTreeMap<Group, CandidateSums>,
    /// Sums per (chunk, cluster, group).
    pub chunks: BTreeMap<CellKey, ChunkSums>,
    /// Per-position KL, sorted by (chunk, pos).
    pub tokens: Vec<TokenKl>,
    /// The generation check, by prompt id ([`super::generation`]).
    pub generations: BTreeMap<u32, Generation>,
}

impl CandidateResult {
    /// Whether the per-chunk sums agree exactly with the group sums and
    /// the base model's (the same positions, KL, NLL, top-1 and probability
    /// change) and name only chunks of `chunks`; why not otherwise.
    pub fn check_chunk_sums(
        &self,
        base: &BTreeMap<Group, BaseSums>,
        chunks: &[ChunkRange],
    ) -> Result<(), String> {
        let mut by_group: BTreeMap<Group, ChunkSums> = BTreeMap::new();
        for ((chunk, _, g), s) in &self.chunks {
            if !chunks.iter().any(|r| r.contains(*chunk)) {
                return Err(format!(
                    "per-chunk sums of chunk {chunk}, outside the partial"
                ));
            }
            by_group
                .entry(*g)
                .or_default()
                .merge(s)
                .map_err(|e| format!("per-chunk sums: {e}"))?;
        }
        let empty = ChunkSums::default();
        for g in self.groups.keys().chain(by_group.keys()) {
            let (s, c) = (
                self.groups.get(g).cloned().unwrap_or_default(),
                by_group.get(g).unwrap_or(&empty),
            );
            let b = base.get(g).cloned().unwrap_or_default();
            let agree = (s.n, s.kl, s.nll, s.top1_same, s.dprob)
                == (c.n, c.kl, c.nll, c.top1_same, c.dprob)
                && b.nll == c.nll_base;
            if !agree {
                return Err(format!(
                    "per-chunk sums of {g:?} disagree with its group sums"
                ));
            }
        }
        Ok(())
    }
}

/// Accumulators of an evaluation for a disjoint set of chunks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalPartial {
    /// [`EVAL_FORMAT_VERSION`] at writing time.
    pub format_version: u32,
    /// SHA-256 of the base GGUF.
    pub base_sha256: String,
    /// SHA-256 of the corpus chunk table.
    pub corpus_sha256: String,
    /// Positions skipped at the start of every chunk.
    pub skip_first: u32,
    /// Splits scored.
    pub splits: Vec<Split>,
    /// Greedy tokens generated after each prompt and the noise floor's
    /// micro-batch ([`super::generation::GenerateJob::settings`]; zero
    /// without generation).
    pub generate: (u32, u32),
    /// Backends that computed the chunks.
    pub backends: Vec<String>,
    /// Chunks covered, sorted and disjoint.
    pub chunks: Vec<ChunkRange>,
    /// The base model's sums per group.
    pub base: BTreeMap<Group, BaseSums>,
    /// One entry per candidate, in the job's order.
    pub candidates: Vec<CandidateResult>,
    /// The noise floor by prompt id: the base model's continuation with
    /// the prompt decoded in micro-batches of the job's `noise_ubatch`
    /// against its own ([`super::generation`]).
    pub noise: BTreeMap<u32, Generation>,
}

impl EvalPartial {
    /// Total chunks covered.
    pub fn n_chunks(&self) -> u64 {
        self.chunks.iter().map(|r| r.len() as u64).sum()
    }

    /// Scored positions (all groups).
    pub fn n_scored(&self) -> u64 {
        self.base.values().map(|b| b.n).sum()
    }

    /// Adds another partial exactly; refuses another base, corpus, setting or
    /// candidate list (names, SHA-256, K), and any chunk covered twice.
    pub fn merge(&mut self, other: &EvalPartial) -> Result<(), EvalError> {
        let differ = |what: &str, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
            EvalError::Mismatch(format!("{what}: {a:?} vs {b:?}"))
        };
        if self.base_sha256 != other.base_sha256 {
            return Err(differ("base model", &self.base_sha256, &other.base_sha256));
        }
        if self.corpus_sha256 != other.corpus_sha256 {
            return Err(differ("corpus", &self.corpus_sha256, &other.corpus_sha256));
        }
        if (self.skip_first, &self.splits) != (other.skip_first, &other.splits) {
            return Err(differ(
                "settings (skip_first, splits)",
                &(self.skip_first, &self.splits),
                &(other.skip_first, &other.splits),
            ));
        }
        if self.generate != other.generate {
            return Err(differ(
                "generation (new tokens, noise micro-batch)",
                &self.generate,
                &other.generate,
            ));
        }
        let ids = |p: &EvalPartial| -> Vec<(String, String, u32)> {
            p.candidates
                .iter()
                .map(|c| (c.name.clone(), c.sha256.clone(), c.k))
                .collect()
        };
        if ids(self) != ids(other) {
            return Err(differ(
                "candidates (name, sha256, k)",
                &ids(self),
                &ids(other),
            ));
        }
        self.chunks = union_disjoint(&self.chunks, &other.chunks)?;
        for b in &other.backends {
            if !self.backends.contains(b) {
                self.backends.push(b.clone());
            }
        }
        self.backends.sort();
        for (g, b) in &other.base {
            let mine = self.base.entry(*g).or_default();
            mine.n += b.n;
            add(&mut mine.nll, b.nll)?;
        }
        for (mine, theirs) in self.candidates.iter_mut().zip(&other.candidates) {
            for (g, s) in &theirs.groups {
                let m = mine.groups.entry(*g).or_default();
                m.n += s.n;
                m.top1_same += s.top1_same;
                add(&mut m.kl, s.kl)?;
                add(&mut m.kl_sq, s.kl_sq)?;
                add(&mut m.nll, s.nll)?;
                add(&mut m.dprob, s.dprob)?;
            }
            for (key, s) in &theirs.chunks {
                if mine.chunks.insert(*key, s.clone()).is_some() {
                    return Err(EvalError::Mismatch(format!(
                        "chunk {} is covered twice",
                        key.0
                    )));
                }
            }
            merge_generations(&mut mine.generations, &theirs.generations)?;
            mine.tokens.extend_from_slice(&theirs.tokens);
            mine.tokens.sort_by_key(|t| (t.chunk, t.pos));
        }
        merge_generations(&mut self.noise, &other.noise)
    }

    /// Binary encoding (bincode 2, standard config).
    pub fn to_bytes(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(self, bincode::config::standard())
            .expect("eval partial encodes")
    }

    /// Decodes an eval partial: at most [`MAX_EVAL_PARTIAL_BYTES`], no
    /// trailing bytes, this build's format version.
    pub fn from_bytes(bytes: &[u8]) -> Result<EvalPartial, EvalError> {
        if bytes.len() > MAX_EVAL_PARTIAL_BYTES {
            return Err(EvalError::Decode(format!(
                "{} bytes exceed the limit of {MAX_EVAL_PARTIAL_BYTES}",
                bytes.len()
            )));
        }
        let config = bincode::config::standard().with_limit::<MAX_EVAL_PARTIAL_BYTES>();
        let (p, used): (EvalPartial, usize) = bincode::serde::decode_from_slice(bytes, config)
            .map_err(|e| EvalError::Decode(format!("not a moe-census eval partial: {e}")))?;
        if used != bytes.len() {
            return Err(EvalError::Decode(format!(
                "{} trailing bytes after the eval partial",
                bytes.len() - used
            )));
        }
        if p.format_version != EVAL_FORMAT_VERSION {
            return Err(EvalError::Decode(format!(
                "eval partial format version {} (this build reads {EVAL_FORMAT_VERSION})",
                p.format_version
            )));
        }
        Ok(p)
    }
}

fn add(sum: &mut ExactSum, other: ExactSum) -> Result<(), EvalError> {
    sum.add(other)
        .map_err(|e| EvalError::Mismatch(format!("exact sum: {e}")))
}

/// Adds generations of other prompts to `mine`; a prompt in both is
/// refused.
fn merge_generations(
    mine: &mut BTreeMap<u32, Generation>,
    theirs: &BTreeMap<u32, Generation>,
) -> Result<(), EvalError> {
    for (id, g) in theirs {
        if mine.insert(*id, *g).is_some() {
            return Err(EvalError::Mismatch(format!(
                "generation of prompt {id} is covered twice"
            )));
        }
    }
    Ok(())
}

/// Union of two sorted disjoint range lists; an overlap is an error.
fn union_disjoint(a: &[ChunkRange], b: &[ChunkRange]) -> Result<Vec<ChunkRange>, EvalError> {
    let all: Vec<ChunkRange> = a.iter().chain(b).copied().collect();
    crate::split::coalesce(&all)
        .map_err(|chunk| EvalError::Mismatch(format!("chunk {chunk} is covered twice")))
}
