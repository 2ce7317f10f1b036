//! Per-chunk float scratch, folded exactly into the run's accumulators.
//!
//! Within one chunk every value arrives in the same order wherever the chunk
//! runs, so an f64 sum per chunk is reproducible; adding those per-chunk sums
//! as [`ExactSum`]s makes the total independent of how chunks are grouped.

use super::strata::Strata;
use numbers::exact::ExactSum;
use numbers::imatrix::{Imatrix, ImatrixEntry};
use numbers::projection::OutputProjection;
use numbers::stats::{ChunkStats, N_SUMS};
use numbers::stats::{ExpertAccum, MergeError};
use numbers::Split;
use std::collections::{BTreeMap, HashMap};

/// One layer's sums for one (split, domain) within a chunk.
#[derive(Clone)]
pub struct LayerScratch {
    pub count: Vec<u64>,
    /// Router probabilities, over every token.
    pub prob: Vec<f64>,
    /// The sums after `prob_sum` in [`numbers::stats::SUM_NAMES`] order, over routed
    /// tokens ([`numbers::stats::routed_terms`]).
    pub routed: [Vec<f64>; N_SUMS - 1],
    /// Largest expert output norm.
    pub ean_max: Vec<f64>,
    /// Largest single expert output element, from 0 (REAP's statistic).
    pub act_max: Vec<f64>,
}

impl LayerScratch {
    fn new(n: usize) -> Self {
        LayerScratch {
            count: vec![0; n],
            prob: vec![0.0; n],
            routed: std::array::from_fn(|_| vec![0.0; n]),
            ean_max: vec![0.0; n],
            act_max: vec![0.0; n],
        }
    }

    /// Every sum in [`numbers::stats::SUM_NAMES`] order.
    fn sums(&self) -> impl Iterator<Item = &Vec<f64>> {
        std::iter::once(&self.prob).chain(&self.routed)
    }
}

/// A (split, domain) group's sums within a chunk.
pub struct GroupScratch {
    pub n_tokens: u64,
    pub layers: Vec<LayerScratch>,
}

/// One weight tensor's imatrix sums within a chunk.
pub struct ImatrixScratch {
    pub n_in: usize,
    pub n_mat: usize,
    /// Sums of squares, `[n_mat][n_in]`.
    pub sum2: Vec<f64>,
    /// Sums, same layout.
    pub sum: Vec<f64>,
    pub counts: Vec<u64>,
}

/// Everything one chunk contributes.
pub struct ChunkScratch {
    n_expert: usize,
    n_layers: usize,
    pub groups: BTreeMap<(Split, u16), GroupScratch>,
    pub imatrix: HashMap<String, ImatrixScratch>,
    /// Projected expert outputs per split, `[layer][expert][dim]` flat
    /// (`[run] merge_projection`; empty when off).
    pub projection: BTreeMap<Split, Vec<f64>>,
}

impl ChunkScratch {
    /// Empty scratch for a model with `n_layers` MoE layers of `n_expert` experts.
    pub fn new(n_layers: usize, n_expert: usize) -> Self {
        ChunkScratch {
            n_expert,
            n_layers,
            groups: BTreeMap::new(),
            imatrix: HashMap::new(),
            projection: BTreeMap::new(),
        }
    }

    /// The projected-output sums of `split` at `dim` dimensions, created as
    /// zeros on first use.
    pub fn projected(&mut self, split: Split, dim: usize) -> &mut [f64] {
        let n = self.n_layers * self.n_expert * dim;
        self.projection.entry(split).or_insert_with(|| vec![0.0; n])
    }

    /// Adds this chunk's projected outputs exactly into `into` and zeroes
    /// them (the buffers are kept for the next chunk).
    pub fn fold_projection(&mut self, into: &mut OutputProjection) -> Result<(), MergeError> {
        let (n_layers, n_expert) = (self.n_layers, self.n_expert);
        let cells = n_expert * into.dim as usize;
        for (split, sums) in &mut self.projection {
            let layers = into.split_mut(*split, n_layers, n_expert);
            for (dst, src) in layers.iter_mut().zip(sums.chunks(cells.max(1))) {
                add_exact(dst, src)?;
            }
            sums.fill(0.0);
        }
        Ok(())
    }

    /// The group of a token label, created on first use.
    pub fn group(&mut self, label: (Split, u16)) -> &mut GroupScratch {
        let (n_layers, n_expert) = (self.n_layers, self.n_expert);
        self.groups.entry(label).or_insert_with(|| GroupScratch {
            n_tokens: 0,
            layers: vec![LayerScratch::new(n_expert); n_layers],
        })
    }

    /// The imatrix sums of `weight`, created with the given shape on first use.
    pub fn imatrix_entry(
        &mut self,
        weight: &str,
        n_in: usize,
        n_mat: usize,
    ) -> &mut ImatrixScratch {
        if !self.imatrix.contains_key(weight) {
            self.imatrix.insert(
                weight.to_string(),
                ImatrixScratch {
                    n_in,
                    n_mat,
                    sum2: vec![0.0; n_in * n_mat],
                    sum: vec![0.0; n_in * n_mat],
                    counts: vec![0; n_mat],
                },
            );
        }
        self.imatrix.get_mut(weight).expect("inserted above")
    }

    /// Compact fit-split statistics of this chunk, for bootstrap resampling.
    pub fn chunk_stats(&self, chunk: u32) -> ChunkStats {
        let n = self.n_layers * self.n_expert;
        let (mut n_tokens, mut count) = (0, vec![0u32; n]);
        let mut sums: [Vec<f64>; N_SUMS] = std::array::from_fn(|_| vec![0.0; n]);
        for ((split, _), g) in &self.groups {
            if *split != Split::Fit {
                continue;
            }
            n_tokens += g.n_tokens as u32;
            for (li, layer) in g.layers.iter().enumerate() {
                let cells = li * self.n_expert..(li + 1) * self.n_expert;
                for (c, &k) in count[cells.clone()].iter_mut().zip(&layer.count) {
                    *c += k as u32;
                }
                for (total, sum) in sums.iter_mut().zip(layer.sums()) {
                    for (t, v) in total[cells.clone()].iter_mut().zip(sum) {
                        *t += v;
                    }
                }
            }
        }
        ChunkStats::from_sums(chunk, n_tokens, count, &sums)
    }

    /// Adds this chunk's sums exactly into the run accumulators and empties
    /// the scratch for the next chunk. The imatrix buffers (a few MB) are
    /// zeroed and kept rather than reallocated per chunk.
    pub fn fold_into(
        &mut self,
        strata: &Strata,
        experts: &mut ExpertAccum,
        imatrix: &mut Imatrix,
    ) -> Result<(), MergeError> {
        for ((split, stratum), g) in std::mem::take(&mut self.groups) {
            let target = experts.group_of(strata.key(split, stratum));
            target.n_tokens += g.n_tokens;
            for (dst, src) in target.layers.iter_mut().zip(&g.layers) {
                for (a, b) in dst.count.iter_mut().zip(&src.count) {
                    *a += b;
                }
                for (d, s) in dst.sums_mut().into_iter().zip(src.sums()) {
                    add_exact(d, s)?;
                }
                numbers::stats::max_into(&mut dst.ean_max, &src.ean_max)?;
                numbers::stats::max_into(&mut dst.act_max, &src.act_max)?;
            }
        }
        for (name, s) in &mut self.imatrix {
            let entry = imatrix
                .entries
                .entry(name.clone())
                .or_insert_with(|| ImatrixEntry::new(s.n_in as u32, s.n_mat as u32));
            if entry.in_sum2.len() != s.sum2.len() {
                return Err(MergeError::Shape(format!(
                    "imatrix {name} changed shape between chunks"
                )));
            }
            add_exact(&mut entry.in_sum2, &s.sum2)?;
            add_exact(&mut entry.in_sum, &s.sum)?;
            for (a, b) in entry.counts.iter_mut().zip(&s.counts) {
                *a += b;
            }
            s.sum2.fill(0.0);
            s.sum.fill(0.0);
            s.counts.fill(0);
        }
        Ok(())
    }
}

fn add_exact(dst: &mut [ExactSum], src: &[f64]) -> Result<(), MergeError> {
    for (a, b) in dst.iter_mut().zip(src) {
        if *b != 0.0 {
            a.add_f64(*b)?;
        }
    }
    Ok(())
}
