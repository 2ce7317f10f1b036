//! A seeded random projection of every routed expert output: what merge
//! plans need to compare experts by what they compute (HC-SMoE's and REAM's
//! output similarity) without storing `d_model` floats per expert.
//!
//! Each token routed to expert `e` of a MoE layer adds `R y` to `e`'s sums,
//! `y` the expert's output before the routing weight (the `ffn_moe_down`
//! row) and `R` a `dim x n_embd` matrix of independent signs scaled by
//! `1/sqrt(dim)` (Achlioptas' database-friendly Johnson-Lindenstrauss
//! projection), drawn from [`SplitMix64`] seeded with
//! [`OutputProjection::seed`]: row-major, one 64-bit draw per entry, the
//! sign its top bit (1: negative). Sums are [`ExactSum`]s, per split, so
//! partials merge exactly and in any order; the mean projected output of
//! an expert is its sum over its routed count.

use crate::exact::{ExactError, ExactSum};
use crate::splitmix::SplitMix64;
use crate::stats::MergeError;
use crate::Split;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The seed every run's projection matrix is drawn from (the bytes of
/// `moe-cens`): fixed, so partials of any worker and run agree.
pub const SEED: u64 = 0x6d6f_652d_6365_6e73;

/// Largest projection dimension a partial may declare (a decoder's bound).
pub const MAX_DIM: u32 = 4096;

/// Projected expert outputs of a partial or a merged result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputProjection {
    /// Projected dimensions per expert.
    pub dim: u32,
    /// Seed of the projection matrix.
    pub seed: u64,
    /// Per split, per MoE layer (in block order), `n_expert x dim` sums,
    /// expert-major: `R y` summed over the expert's routed tokens.
    pub splits: BTreeMap<Split, Vec<Vec<ExactSum>>>,
}

impl OutputProjection {
    /// An empty projection to `dim` dimensions with the run's [`SEED`].
    pub fn new(dim: u32) -> OutputProjection {
        OutputProjection {
            dim,
            seed: SEED,
            splits: BTreeMap::new(),
        }
    }

    /// The sums of `split`, created as zeros for `n_layers` layers of
    /// `n_expert` experts on first use.
    pub fn split_mut(
        &mut self,
        split: Split,
        n_layers: usize,
        n_expert: usize,
    ) -> &mut Vec<Vec<ExactSum>> {
        let n = n_expert * self.dim as usize;
        self.splits
            .entry(split)
            .or_insert_with(|| vec![vec![ExactSum::ZERO; n]; n_layers])
    }

    /// Adds another projection of the same dimension and seed.
    pub fn merge(&mut self, other: &OutputProjection) -> Result<(), MergeError> {
        if (self.dim, self.seed) != (other.dim, other.seed) {
            return Err(MergeError::Shape(format!(
                "output projection to {} dimensions (seed {:#x}) vs {} (seed {:#x})",
                self.dim, self.seed, other.dim, other.seed
            )));
        }
        for (split, layers) in &other.splits {
            match self.splits.get_mut(split) {
                None => {
                    self.splits.insert(*split, layers.clone());
                }
                Some(mine) => {
                    if mine.len() != layers.len()
                        || mine.iter().zip(layers).any(|(a, b)| a.len() != b.len())
                    {
                        return Err(MergeError::Shape(format!(
                            "{split} output projection of {} layers vs {}",
                            mine.len(),
                            layers.len()
                        )));
                    }
                    for (a, b) in mine.iter_mut().zip(layers) {
                        crate::exact::add_all(a, b).map_err(|(_, v)| ExactError::Overflow(v))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Per MoE layer, each expert's mean projected output over its routed
    /// tokens in `split` (`counts[layer][expert]`); an expert never routed
    /// gets zeros. None when the split was not measured.
    pub fn means(&self, split: Split, counts: &[Vec<u64>]) -> Option<Vec<Vec<Vec<f64>>>> {
        let layers = self.splits.get(&split)?;
        let dim = self.dim as usize;
        Some(
            layers
                .iter()
                .zip(counts)
                .map(|(sums, count)| {
                    sums.chunks(dim.max(1))
                        .zip(count)
                        .map(|(s, &c)| {
                            let c = c.max(1) as f64;
                            s.iter().map(|v| v.to_f64() / c).collect()
                        })
                        .collect()
                })
                .collect(),
        )
    }
}

/// The projection matrix `R` (`dim x n_embd`, row-major) as signs `±1`
/// (the scale `1/sqrt(dim)` is applied by [`project_into`]).
pub fn signs(seed: u64, dim: usize, n_embd: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..dim * n_embd)
        .map(|_| if rng.next_u64() >> 63 == 1 { -1.0 } else { 1.0 })
        .collect()
}

/// `R y` into `out` (`dim` values), `signs` from [`signs`]: each dot
/// product in f32 over eight lanes in a fixed order (so a row gives the
/// same bits wherever it is projected), scaled by `1/sqrt(dim)`.
pub fn project_into(signs: &[f32], y: &[f32], out: &mut [f64]) {
    let n = y.len();
    let scale = 1.0 / (out.len() as f64).sqrt();
    for (o, row) in out.iter_mut().zip(signs.chunks_exact(n)) {
        let mut lanes = [0f32; 8];
        let (head, tail) = (n / 8 * 8, n % 8);
        for (r, v) in row[..head].chunks_exact(8).zip(y[..head].chunks_exact(8)) {
            for i in 0..8 {
                lanes[i] += r[i] * v[i];
            }
        }
        let mut dot: f32 = lanes.iter().sum();
        for i in 0..tail {
            dot += row[head + i] * y[head + i];
        }
        *o = f64::from(dot) * scale;
    }
}

/// Cosine similarity of two vectors (0 when either is zero).
pub fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa <= 0.0 || bb <= 0.0 {
        0.0
    } else {
        ab / (aa * bb).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projected_cosines_are_close_to_the_true_ones() {
        // Two random vectors at a known angle in 2048 dimensions: at 128
        // projected dimensions the cosine moves by a few hundredths
        // (standard deviation about (1 - c^2) / sqrt(dim) = 0.07 here).
        let (n, dim) = (2048, 128);
        let r = signs(SEED, dim, n);
        let mut g = SplitMix64::new(7);
        let u: Vec<f32> = (0..n).map(|_| g.unit() as f32 - 0.5).collect();
        let w: Vec<f32> = (0..n).map(|_| g.unit() as f32 - 0.5).collect();
        let v: Vec<f32> = u.iter().zip(&w).map(|(a, b)| a + b).collect();
        let f = |x: &[f32]| x.iter().map(|&a| f64::from(a)).collect::<Vec<f64>>();
        let truth = cosine(&f(&u), &f(&v));
        let (mut pu, mut pv) = (vec![0.0; dim], vec![0.0; dim]);
        project_into(&r, &u, &mut pu);
        project_into(&r, &v, &mut pv);
        let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
        assert!(
            (truth - std::f64::consts::FRAC_1_SQRT_2).abs() < 0.05,
            "{truth}"
        );
        assert!((cosine(&pu, &pv) - truth).abs() < 0.2);
        let ratio = norm(&pu) / norm(&f(&u));
        assert!((ratio - 1.0).abs() < 0.25, "{ratio}");
    }

    #[test]
    fn merging_adds_per_split_and_refuses_another_dimension() {
        let mut a = OutputProjection::new(2);
        a.split_mut(Split::Fit, 1, 2)[0][3] = ExactSum::from_f64(1.5).unwrap();
        let mut b = OutputProjection::new(2);
        b.split_mut(Split::Fit, 1, 2)[0][3] = ExactSum::from_f64(2.0).unwrap();
        b.split_mut(Split::Heldout, 1, 2)[0][0] = ExactSum::from_f64(1.0).unwrap();
        let mut ab = a.clone();
        ab.merge(&b).unwrap();
        let mut ba = b.clone();
        ba.merge(&a).unwrap();
        assert_eq!(ab, ba);
        assert_eq!(ab.splits[&Split::Fit][0][3].to_f64(), 3.5);
        let means = ab.means(Split::Fit, &[vec![0, 7]]).unwrap();
        assert_eq!(means, vec![vec![vec![0.0, 0.0], vec![0.0, 0.5]]]);
        let e = ab.merge(&OutputProjection::new(3)).unwrap_err();
        assert!(e.to_string().contains("2 dimensions"), "{e}");
    }
}
