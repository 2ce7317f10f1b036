//! Acceptance of a partial before it is merged: everything the coordinator
//! already knows about a unit is checked against what the partial claims.
//!
//! - the partial covers exactly the unit's chunk range, of the run's model
//!   and corpus;
//! - its MoE shape is the model's (expert count and k from the GGUF header
//!   when the coordinator can read it) and the same as every partial accepted
//!   before it;
//! - its token count per (split, domain) equals the corpus's spans over the
//!   unit's chunks;
//! - in every group and layer, `sum(count) == n_tokens * k` and each count is
//!   at most `n_tokens`.
//!
//! The same function serves results arriving from workers and partials read
//! back on resume, so a fabricated or damaged partial never reaches the merge.
//! Strings taken from the partial are shown escaped and shortened.

use common::corpus::{Chunk, CorpusIndex};
use common::model_check::MoeFacts;
use common::partial::Partial;
use common::peer_text::peer_text;
use common::stats::{GroupKey, MoeShape};
use common::ChunkRange;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Tokens per (split, domain) of one unit.
pub type GroupTokens = BTreeMap<GroupKey, u64>;

/// What a partial of this run must look like.
#[derive(Debug)]
pub struct Acceptance {
    model_sha256: String,
    corpus_sha256: String,
    model: Option<MoeFacts>,
    expected: BTreeMap<ChunkRange, GroupTokens>,
    shape: Mutex<Option<MoeShape>>,
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
        for chunk in chunks {
            let id = chunk.id.0;
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
                let key = GroupKey {
                    split: span.split,
                    domain: domain.clone(),
                };
                *groups.entry(key).or_default() += u64::from(span.len);
            }
        }
        Ok(Acceptance {
            model_sha256: model_sha256.to_string(),
            corpus_sha256: index.chunks_sha256.clone(),
            model,
            expected,
            shape: Mutex::new(None),
        })
    }

    /// Decodes `bytes` (bounded, trailing bytes refused) and checks the
    /// partial as the result of `range`.
    pub fn decode_and_check(&self, range: ChunkRange, bytes: &[u8]) -> Result<Partial, String> {
        let p = Partial::from_bytes(bytes)?;
        self.check(range, &p)?;
        Ok(p)
    }

    /// Every check of the module on a decoded partial; the first accepted
    /// partial fixes the run's MoE shape for the ones after it.
    pub fn check(&self, range: ChunkRange, p: &Partial) -> Result<(), String> {
        if p.chunks != [range] {
            return Err(format!(
                "partial covers {:?}, the lease was {range}",
                p.chunks
            ));
        }
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
        let expected = self
            .expected
            .get(&range)
            .ok_or_else(|| format!("{range} is not a unit of the lease plan"))?;
        check_tokens(expected, p)?;
        check_counts(p)?;
        if let Some(c) = p
            .chunk_stats
            .iter()
            .find(|c| c.chunk < range.start || c.chunk >= range.end)
        {
            return Err(format!(
                "per-chunk statistics of chunk {} outside {range}",
                c.chunk
            ));
        }
        let mut pinned = self.shape.lock().unwrap_or_else(|e| e.into_inner());
        pinned.get_or_insert_with(|| p.experts.shape.clone());
        Ok(())
    }

    fn check_shape(&self, shape: &MoeShape) -> Result<(), String> {
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
        let pinned = self.shape.lock().unwrap_or_else(|e| e.into_inner());
        match pinned.as_ref() {
            Some(s) if s != shape => Err(format!(
                "partial's MoE shape {shape:?} differs from the run's {s:?}"
            )),
            _ => Ok(()),
        }
    }
}

/// The partial's tokens per (split, domain) equal the corpus's.
fn check_tokens(expected: &GroupTokens, p: &Partial) -> Result<(), String> {
    let got: GroupTokens = p
        .experts
        .groups
        .iter()
        .filter(|(_, g)| g.n_tokens > 0)
        .map(|(k, g)| (k.clone(), g.n_tokens))
        .collect();
    if &got == expected {
        return Ok(());
    }
    let describe = |m: &GroupTokens| {
        m.iter()
            .map(|(k, n)| format!("{}/{}: {n}", k.split, peer_text(&k.domain)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(format!(
        "token counts per (split, domain) are [{}], the corpus has [{}]",
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
                "group {} has layers {layers:?}, the shape says {:?}",
                at(),
                shape.moe_layers
            ));
        }
        for l in &g.layers {
            let lens = [
                l.count.len(),
                l.prob_sum.len(),
                l.weight_sum.len(),
                l.ean_sum.len(),
                l.reap_l2_sum.len(),
                l.reap_l2_sq_sum.len(),
            ];
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

    fn task(&self) -> common::wire::Task {
        common::wire::Task::Collect
    }

    fn check(&self, range: ChunkRange, p: &Partial) -> Result<(), String> {
        Acceptance::check(self, range, p)
    }
}
