//! Acceptance of a partial before it is merged: everything the coordinator
//! already knows about a unit is checked against what the partial claims.
//!
//! - the partial covers exactly the chunks of its units (one lease, or
//!   every lease of a worker's checkpoint: each check below is over the
//!   units together), of the run's model and corpus;
//! - its MoE shape is the model's (expert count and k from the GGUF header
//!   when the coordinator can read it) and the same as every partial accepted
//!   before it;
//! - its token count per (split, domain) equals the corpus's spans over the
//!   unit's chunks;
//! - it has no (split, domain) group the unit lacks, not even an empty one;
//! - in every group and layer, `sum(count) == n_tokens * k` and each count is
//!   at most `n_tokens`;
//! - every value is one an honest worker can produce and any merge can hold
//!   ([`numbers::partial_check`]);
//! - its importance matrix covers the unit's chunks at the corpus's chunk
//!   size; a dense weight's token count (per matrix) is the unit's fit
//!   tokens, a stacked expert weight's count per expert is the fit split's
//!   `count` of its layer (each token's row counts once for each of the k
//!   experts it selected, as llama.cpp's `MUL_MAT_ID` imatrix counts);
//! - with the model's headers ([`Acceptance::with_weights`]: the coordinator
//!   reads them): every entry is one of the model's weights with the model's
//!   shape ([`gguf::model_weights`]), every MoE layer is one the model
//!   routes in, and the router and stacked expert weights of each MoE layer
//!   are there; all of it is checked on the partial's header, before any
//!   sum is unpacked or the running total grows. Without them (test
//!   harnesses), each tensor has the shape the first accepted partial gave it;
//! - its per-chunk statistics, when it has them, are one per chunk of the
//!   unit with that chunk's fit tokens; its trace parts are the unit's.
//!
//! The same function serves results arriving from workers and partials read
//! back on resume, so a fabricated or damaged partial never reaches the merge.
//! Strings taken from the partial are shown escaped and shortened, lists
//! summarised.

use bytes::Bytes;
use gguf::model_check::MoeFacts;
use gguf::model_weights::{expert_stack_layer, ModelWeights};
use numbers::partial::{PackedPartial, Partial};
use numbers::partial_check::{check_header_values, Budget, ImatrixSums};
use numbers::peer_text::{peer_text, summarise};
use numbers::stats::{GroupKey, MoeShape};
use numbers::{ChunkRange, Modality, Split};
use runfiles::corpus::{Chunk, CorpusIndex};
use runfiles::layout::trace_part;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Tokens per (split, domain) of one unit.
pub type GroupTokens = BTreeMap<GroupKey, u64>;

/// What the first accepted partial fixed for the ones after it.
#[derive(Debug, Default)]
struct Pinned {
    shape: Option<MoeShape>,
    /// `(n_in, n_mat)` per importance-matrix tensor.
    imatrix: BTreeMap<String, (u32, u32)>,
}

/// What a partial of this run must look like.
#[derive(Debug)]
pub struct Acceptance {
    model_sha256: String,
    corpus_sha256: String,
    n_ctx: u32,
    model: Option<MoeFacts>,
    /// The importance-matrix entries the model defines, when its headers
    /// were read.
    weights: Option<ModelWeights>,
    expected: BTreeMap<ChunkRange, GroupTokens>,
    /// Fit tokens per chunk id.
    chunk_fit: Vec<u32>,
    budget: Budget,
    pinned: Mutex<Pinned>,
}

impl Acceptance {
    /// The expectations of a run: per unit of `units`, the tokens per (split,
    /// domain) of `chunks` (the whole chunk table); `model` holds the GGUF's
    /// expert facts when the coordinator can read the model.
    pub fn new(
        model_sha256: &str,
        index: &CorpusIndex,
        chunks: &[Chunk],
        units: &[ChunkRange],
        model: Option<MoeFacts>,
    ) -> Result<Acceptance, String> {
        let mut expected: BTreeMap<ChunkRange, GroupTokens> =
            units.iter().map(|&u| (u, GroupTokens::new())).collect();
        let mut chunk_fit = vec![0u32; index.n_chunks as usize];
        for chunk in chunks {
            let id = chunk.id.0;
            let fit = chunk_fit
                .get_mut(id as usize)
                .ok_or_else(|| format!("chunk {id} is beyond the index's {}", index.n_chunks))?;
            let unit = units
                .get(units.partition_point(|u| u.end <= id))
                .filter(|u| u.start <= id)
                .ok_or_else(|| format!("chunk {id} is in no unit of the lease plan"))?;
            let groups = expected.get_mut(unit).expect("every unit has an entry");
            for span in &chunk.spans {
                let domain = index.domains.get(span.domain as usize).ok_or_else(|| {
                    format!(
                        "chunk {id}: span names domain #{} of {}",
                        span.domain,
                        index.domains.len()
                    )
                })?;
                if span.len == 0 {
                    continue;
                }
                if span.split == Split::Fit {
                    *fit += span.len;
                }
                let image = chunk.image_positions_in(span);
                for (modality, n) in [(Modality::Text, span.len - image), (Modality::Image, image)]
                {
                    if n > 0 {
                        let key = GroupKey {
                            split: span.split,
                            domain: domain.clone(),
                            modality,
                        };
                        *groups.entry(key).or_default() += u64::from(n);
                    }
                }
            }
        }
        Ok(Acceptance {
            model_sha256: model_sha256.to_string(),
            corpus_sha256: index.chunks_sha256.clone(),
            n_ctx: index.n_ctx,
            model,
            weights: None,
            expected,
            chunk_fit,
            budget: Budget::for_corpus(index.n_tokens),
            pinned: Mutex::new(Pinned::default()),
        })
    }

    /// These expectations, with every importance-matrix entry checked
    /// against `weights`, the entries of the run's model.
    pub fn with_weights(mut self, weights: ModelWeights) -> Acceptance {
        self.weights = Some(weights);
        self
    }

    fn pinned(&self) -> std::sync::MutexGuard<'_, Pinned> {
        self.pinned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads `bytes` (bounded, trailing bytes refused) and checks the
    /// partial as the result of `units`, its importance-matrix sums as they
    /// are unpacked: the packed partial, added into the run's total straight
    /// from its bytes.
    pub fn decode_and_check(
        &self,
        units: &[ChunkRange],
        bytes: Bytes,
    ) -> Result<PackedPartial, String> {
        let p = PackedPartial::parse_checked(bytes, |header| self.check_header(units, header))?;
        self.pin(p.header());
        Ok(p)
    }

    /// Every check of the module on a decoded partial of `units` (sorted,
    /// disjoint units of the plan); the first accepted partial fixes the
    /// run's MoE shape for the ones after it.
    pub fn check(&self, units: &[ChunkRange], p: &Partial) -> Result<(), String> {
        self.check_header(units, p)?.check_decoded(p)?;
        self.pin(p);
        Ok(())
    }

    /// Every check of the module but those of the importance matrix's sums,
    /// which the returned [`ImatrixSums`] makes; `p`'s importance-matrix
    /// sums may be empty (a packed partial's header).
    fn check_header(&self, units: &[ChunkRange], p: &Partial) -> Result<ImatrixSums, String> {
        crate::lease::check_covers("partial", units, &p.chunks)?;
        if p.model_sha256 != self.model_sha256 {
            return Err(format!(
                "partial of model \"{}\", the run's is {}",
                peer_text(&p.model_sha256),
                self.model_sha256
            ));
        }
        if p.corpus_sha256 != self.corpus_sha256 {
            return Err(format!(
                "partial of corpus \"{}\", the run's is {}",
                peer_text(&p.corpus_sha256),
                self.corpus_sha256
            ));
        }
        self.check_shape(&p.experts.shape)?;
        let mut expected = GroupTokens::new();
        for range in units {
            let groups = self
                .expected
                .get(range)
                .ok_or_else(|| format!("{range} is not a unit of the lease plan"))?;
            for (k, n) in groups {
                *expected.entry(k.clone()).or_default() += n;
            }
        }
        check_tokens(&expected, p)?;
        check_counts(p)?;
        let sums = check_header_values(p, &self.budget)?;
        self.check_chunk_stats(units, p)?;
        check_trace_parts(units, p)?;
        let fit = expected
            .iter()
            .filter(|(k, _)| k.split == Split::Fit)
            .map(|(_, n)| n)
            .sum();
        self.check_imatrix(units, fit, p)?;
        Ok(sums)
    }

    /// What an accepted partial fixes for the ones after it: the MoE shape
    /// and each importance-matrix tensor's shape.
    fn pin(&self, p: &Partial) {
        let mut pinned = self.pinned();
        pinned.shape.get_or_insert_with(|| p.experts.shape.clone());
        for (name, e) in &p.imatrix.entries {
            pinned
                .imatrix
                .entry(name.clone())
                .or_insert((e.n_in, e.n_mat));
        }
    }

    /// Per-chunk statistics: none, or one for each chunk of the units with
    /// its fit tokens.
    fn check_chunk_stats(&self, units: &[ChunkRange], p: &Partial) -> Result<(), String> {
        if p.chunk_stats.is_empty() {
            return Ok(());
        }
        let mut ids: Vec<u32> = p.chunk_stats.iter().map(|c| c.chunk).collect();
        ids.sort_unstable();
        if !ids
            .iter()
            .copied()
            .eq(units.iter().flat_map(|r| r.start..r.end))
        {
            return Err(format!(
                "per-chunk statistics of {} chunks ({}..), the lease has chunks {}",
                ids.len(),
                ids.first().copied().unwrap_or(0),
                summarise(units)
            ));
        }
        match p
            .chunk_stats
            .iter()
            .find(|c| self.chunk_fit.get(c.chunk as usize) != Some(&c.n_tokens))
        {
            Some(c) => Err(format!(
                "per-chunk statistics of chunk {} claim {} fit tokens, the corpus has {}",
                c.chunk,
                c.n_tokens,
                self.chunk_fit.get(c.chunk as usize).copied().unwrap_or(0)
            )),
            None => Ok(()),
        }
    }

    /// The importance matrix against the unit (see the module doc).
    fn check_imatrix(&self, units: &[ChunkRange], fit: u64, p: &Partial) -> Result<(), String> {
        let im = &p.imatrix;
        let n_chunks: u64 = units.iter().map(|r| u64::from(r.len())).sum();
        if im.chunk_count != n_chunks || im.chunk_size != self.n_ctx {
            return Err(format!(
                "importance matrix of {} chunks of {} tokens, the lease has {n_chunks} chunks of {}",
                im.chunk_count, im.chunk_size, self.n_ctx
            ));
        }
        if let Some(weights) = &self.weights {
            check_model_entries(weights, p, fit)?;
        }
        let pinned = self.pinned();
        for (name, e) in &im.entries {
            let shown = || peer_text(name);
            if let Some(&(n_in, n_mat)) = pinned.imatrix.get(name) {
                if (n_in, n_mat) != (e.n_in, e.n_mat) {
                    return Err(format!(
                        "importance matrix {} is [{}, {}], earlier partials had [{n_in}, {n_mat}]",
                        shown(),
                        e.n_in,
                        e.n_mat
                    ));
                }
            }
            let expected = match expert_layer(name, e.n_mat, &p.experts.shape) {
                Some(layer) => fit_counts(p, layer),
                None if e.n_mat == 1 || self.weights.is_some() => vec![fit; e.n_mat as usize],
                None => continue,
            };
            if e.counts != expected {
                return Err(format!(
                    "importance matrix {} counts {} tokens, the lease's fit split has {}",
                    shown(),
                    summarise(&e.counts),
                    summarise(&expected)
                ));
            }
        }
        Ok(())
    }

    fn check_shape(&self, shape: &MoeShape) -> Result<(), String> {
        let pinned = self.pinned();
        if let Some(m) = &self.model {
            if (shape.n_expert, shape.n_expert_used) != (m.n_expert, m.n_expert_used) {
                return Err(format!(
                    "partial claims {} experts, top-{}; the model has {} experts, top-{}",
                    shape.n_expert, shape.n_expert_used, m.n_expert, m.n_expert_used
                ));
            }
        }
        if shape.n_expert_used == 0 || shape.n_expert_used > shape.n_expert {
            return Err(format!(
                "partial claims top-{} of {} experts",
                shape.n_expert_used, shape.n_expert
            ));
        }
        match pinned.shape.as_ref() {
            Some(s) if s != shape => Err(format!(
                "partial's MoE shape ({shape}) differs from the run's ({s})"
            )),
            _ => Ok(()),
        }
    }
}

/// The block of a stacked expert weight (`blk.L.ffn_{gate,up,down,gate_up}_exps.weight`
/// with one matrix per expert) of a MoE layer, whose counts per expert are
/// the tokens routed to that expert.
fn expert_layer(name: &str, n_mat: u32, shape: &MoeShape) -> Option<u32> {
    expert_stack_layer(name)
        .filter(|layer| n_mat == shape.n_expert && shape.moe_layers.contains(layer))
}

/// The importance matrix's entries against the model's: each one of its
/// weights with its shape, each MoE layer one the model routes in, and
/// every entry an honest worker surely measures there: each MoE layer's
/// router and expert stacks, and, when the lease has `fit` tokens (which
/// pass through every block), every dense weight of the model.
fn check_model_entries(weights: &ModelWeights, p: &Partial, fit: u64) -> Result<(), String> {
    let shape = &p.experts.shape;
    if let Some(l) = shape.moe_layers.iter().find(|&&l| !weights.has_router(l)) {
        return Err(format!(
            "partial claims MoE layer {l}; the model has no router (blk.{l}.ffn_gate_inp.weight) there"
        ));
    }
    for (name, e) in &p.imatrix.entries {
        let Some(want) = weights.shape(name) else {
            return Err(format!(
                "importance matrix {} is not a weight of the model",
                peer_text(name)
            ));
        };
        if (want.n_in, want.n_mat) != (e.n_in, e.n_mat) {
            return Err(format!(
                "importance matrix {} is [{}, {}], the model's weight is [{}, {}]",
                peer_text(name),
                e.n_in,
                e.n_mat,
                want.n_in,
                want.n_mat
            ));
        }
    }
    let missing: Vec<String> = weights
        .required(&shape.moe_layers)
        .into_iter()
        .filter(|n| !p.imatrix.entries.contains_key(n))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "importance matrix lacks {}, which every MoE layer measures",
            summarise(&missing)
        ));
    }
    let dense: Vec<String> = match fit {
        0 => Vec::new(),
        _ => weights.required_dense(),
    };
    let missing: Vec<&String> = dense
        .iter()
        .filter(|n| !p.imatrix.entries.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "importance matrix lacks {}, a dense weight that each of the lease's {fit} fit \
             tokens passes through",
            summarise(&missing)
        ));
    }
    Ok(())
}

/// Tokens of the fit split routed to each expert of block `layer`.
fn fit_counts(p: &Partial, layer: u32) -> Vec<u64> {
    let mut out = vec![0u64; p.experts.shape.n_expert as usize];
    let fit = p
        .experts
        .groups
        .iter()
        .filter(|(k, _)| k.split == Split::Fit);
    for l in fit.flat_map(|(_, g)| g.layers.iter().filter(|l| l.layer == layer)) {
        for (o, c) in out.iter_mut().zip(&l.count) {
            *o += c;
        }
    }
    out
}

/// Trace parts: at most each unit's prefill part and its decode part.
fn check_trace_parts(units: &[ChunkRange], p: &Partial) -> Result<(), String> {
    let allowed: std::collections::BTreeSet<String> = units
        .iter()
        .flat_map(|&r| [trace_part(r, false), trace_part(r, true)])
        .collect();
    let mut parts = p.trace_parts.clone();
    parts.sort();
    parts.dedup();
    match p.trace_parts.iter().find(|n| !allowed.contains(*n)) {
        Some(n) => Err(format!(
            "trace part \"{}\" is not a part of {}",
            peer_text(n),
            summarise(units)
        )),
        None if parts.len() != p.trace_parts.len() => {
            Err(format!("trace parts of {} listed twice", summarise(units)))
        }
        None => Ok(()),
    }
}

/// The partial's groups and their tokens equal the corpus's: no group the
/// unit lacks (not even one of 0 tokens, whose name would reach the
/// results), none missing.
fn check_tokens(expected: &GroupTokens, p: &Partial) -> Result<(), String> {
    let got: GroupTokens = p
        .experts
        .groups
        .iter()
        .map(|(k, g)| (k.clone(), g.n_tokens))
        .collect();
    if &got == expected {
        return Ok(());
    }
    let describe = |m: &GroupTokens| {
        let shown: Vec<String> = m.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        summarise(&shown)
    };
    Err(format!(
        "token counts per (split, domain, modality) are [{}], the corpus has [{}]",
        describe(&got),
        describe(expected)
    ))
}

/// Per group and layer: `n_expert` values of each statistic, the shape's
/// layers, `sum(count) == n_tokens * k` and no count above `n_tokens`.
fn check_counts(p: &Partial) -> Result<(), String> {
    let shape = &p.experts.shape;
    let n = shape.n_expert as usize;
    let k = u128::from(shape.n_expert_used);
    for (key, g) in &p.experts.groups {
        let at = || format!("{}/{}", key.split, peer_text(&key.domain));
        let layers: Vec<u32> = g.layers.iter().map(|l| l.layer).collect();
        if layers != shape.moe_layers {
            return Err(format!(
                "group {} has layers [{}], the shape says [{}]",
                at(),
                summarise(&layers),
                summarise(&shape.moe_layers)
            ));
        }
        for l in &g.layers {
            let lens: Vec<usize> = std::iter::once(l.count.len())
                .chain(l.sums().map(Vec::len))
                .collect();
            if lens.iter().any(|&x| x != n) {
                return Err(format!(
                    "group {} layer {}: statistics of lengths {lens:?}, expected {n}",
                    at(),
                    l.layer
                ));
            }
            let sum: u128 = l.count.iter().map(|&c| u128::from(c)).sum();
            if sum != u128::from(g.n_tokens) * k {
                return Err(format!(
                    "group {} layer {}: sum(count) = {sum}, n_tokens x k = {} x {k}",
                    at(),
                    l.layer,
                    g.n_tokens
                ));
            }
            if let Some(e) = l.count.iter().position(|&c| c > g.n_tokens) {
                return Err(format!(
                    "group {} layer {}: expert {e} counted {} times in {} tokens",
                    at(),
                    l.layer,
                    l.count[e],
                    g.n_tokens
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// Collection leases: workers measure, and each partial passes every check
/// of this module.
impl crate::lease::LeaseKind for Acceptance {
    type Output = Partial;

    fn task(&self) -> protocol::wire::Task {
        protocol::wire::Task::Collect
    }

    fn table(m: &mut runfiles::manifest::RunManifest) -> &mut runfiles::manifest::Records {
        &mut m.partials
    }

    fn decode_and_check(
        &self,
        units: &[ChunkRange],
        bytes: Bytes,
    ) -> Result<PackedPartial, String> {
        Acceptance::decode_and_check(self, units, bytes)
    }
}
