//! Per-chunk float scratch, folded exactly into the run's accumulators.
//!
//! Within one chunk every value arrives in the same order wherever the chunk
//! runs, so an f64 sum per chunk is reproducible; adding those per-chunk sums
//! as [`ExactSum`]s makes the total independent of how chunks are grouped.

use super::strata::Strata;
use numbers::exact::ExactSum;
use numbers::imatrix::{Imatrix, ImatrixEntry};
use numbers::partial::ChunkStats;
use numbers::stats::{ExpertAccum, MergeError};
use numbers::Split;
use std::collections::{BTreeMap, HashMap};

/// One layer's sums for one (split, domain) within a chunk.
#[derive(Clone)]
pub struct LayerScratch {
    pub count: Vec<u64>,
    pub prob: Vec<f64>,
    pub weight: Vec<f64>,
    pub ean: Vec<f64>,
    pub l2: Vec<f64>,
    pub l2_sq: Vec<f64>,
    /// Largest expert output norm.
    pub ean_max: Vec<f64>,
}

impl LayerScratch {
    fn new(n: usize) -> Self {
        LayerScratch {
            count: vec![0; n],
            prob: vec![0.0; n],
            weight: vec![0.0; n],
            ean: vec![0.0; n],
            l2: vec![0.0; n],
            l2_sq: vec![0.0; n],
            ean_max: vec![0.0; n],
        }
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
}

impl ChunkScratch {
    /// Empty scratch for a model with `n_layers` MoE layers of `n_expert` experts.
    pub fn new(n_layers: usize, n_expert: usize) -> Self {
        ChunkScratch {
            n_expert,
            n_layers,
            groups: BTreeMap::new(),
            imatrix: HashMap::new(),
        }
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
        let mut s = ChunkStats {
            chunk,
            n_tokens: 0,
            count: vec![0; n],
            reap_l2_sum: vec![0.0; n],
            reap_l2_sq_sum: vec![0.0; n],
        };
        let mut l2 = vec![0f64; n];
        let mut l2_sq = vec![0f64; n];
        for ((split, _), g) in &self.groups {
            if *split != Split::Fit {
                continue;
            }
            s.n_tokens += g.n_tokens as u32;
            for (li, layer) in g.layers.iter().enumerate() {
                for e in 0..self.n_expert {
                    let i = li * self.n_expert + e;
                    s.count[i] += layer.count[e] as u32;
                    l2[i] += layer.l2[e];
                    l2_sq[i] += layer.l2_sq[e];
                }
            }
        }
        s.reap_l2_sum = l2.iter().map(|v| *v as f32).collect();
        s.reap_l2_sq_sum = l2_sq.iter().map(|v| *v as f32).collect();
        s
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
                let pairs = [
                    (&mut dst.prob_sum, &src.prob),
                    (&mut dst.weight_sum, &src.weight),
                    (&mut dst.ean_sum, &src.ean),
                    (&mut dst.reap_l2_sum, &src.l2),
                    (&mut dst.reap_l2_sq_sum, &src.l2_sq),
                ];
                for (d, s) in pairs {
                    add_exact(d, s)?;
                }
                numbers::stats::max_into(&mut dst.ean_max, &src.ean_max)?;
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
