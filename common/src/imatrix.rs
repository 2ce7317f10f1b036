//! The importance matrix: per weight tensor, the sum and the sum of squares
//! of each input column (per expert for stacked expert weights) and token
//! counts, with an exact merge and llama.cpp's GGUF imatrix output format.

use crate::exact::ExactSum;
use crate::gguf::{GgufWriter, Value};
use crate::stats::MergeError;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Sums for one weight tensor (`blk.N.ffn_down_exps.weight`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImatrixEntry {
    /// Input columns of the weight (`ne[0]`).
    pub n_in: u32,
    /// Matrices in the tensor: experts for `MUL_MAT_ID`, 1 for dense weights.
    pub n_mat: u32,
    /// `sum x_j^2` per (matrix, column), row-major `[n_mat][n_in]`.
    pub in_sum2: Vec<ExactSum>,
    /// `sum x_j` per (matrix, column), same layout: llama-imatrix's
    /// `in_sum`, which its statistics (means, cosine similarity) read.
    pub in_sum: Vec<ExactSum>,
    /// Tokens (input rows) seen per matrix.
    pub counts: Vec<u64>,
}

impl ImatrixEntry {
    /// An empty entry.
    pub fn new(n_in: u32, n_mat: u32) -> Self {
        ImatrixEntry {
            n_in,
            n_mat,
            in_sum2: vec![ExactSum::ZERO; n_in as usize * n_mat as usize],
            in_sum: vec![ExactSum::ZERO; n_in as usize * n_mat as usize],
            counts: vec![0; n_mat as usize],
        }
    }

    /// The two sum vectors, `in_sum2` then `in_sum`: what the partial
    /// encoding stores as columns, in this order.
    pub fn sums(&self) -> [&Vec<ExactSum>; 2] {
        [&self.in_sum2, &self.in_sum]
    }

    /// [`ImatrixEntry::sums`], writable.
    pub fn sums_mut(&mut self) -> [&mut Vec<ExactSum>; 2] {
        [&mut self.in_sum2, &mut self.in_sum]
    }

    /// Per (matrix, column), `sqrt(count * in_sum2)`: the Cauchy-Schwarz
    /// bound on `|in_sum|` and at least `sum |x_j|`, so the scale that
    /// rounding errors of the signed `in_sum` are relative to (a sum that
    /// cancels to near zero is compared against it, not against itself).
    pub fn in_sum_scale(&self) -> Vec<f64> {
        let n_in = self.n_in.max(1) as usize;
        self.in_sum2
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let count = self.counts.get(i / n_in).copied().unwrap_or(0);
                (count as f64 * s.to_f64().max(0.0)).sqrt()
            })
            .collect()
    }

    /// Adds an entry of the same shape, sum by sum.
    fn add(&mut self, other: &ImatrixEntry) -> Result<(), MergeError> {
        for (a, b) in self.in_sum2.iter_mut().zip(&other.in_sum2) {
            a.add(*b)?;
        }
        for (a, b) in self.in_sum.iter_mut().zip(&other.in_sum) {
            a.add(*b)?;
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.checked_add(*b).ok_or(MergeError::CountOverflow)?;
        }
        Ok(())
    }
}

/// Importance matrix of a partial or merged result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imatrix {
    /// Per weight tensor name.
    pub entries: BTreeMap<String, ImatrixEntry>,
    /// Chunks processed.
    pub chunk_count: u64,
    /// Tokens per chunk (the context size).
    pub chunk_size: u32,
}

impl Imatrix {
    /// Adds another importance matrix computed with the same chunk size.
    /// Tensors are added in parallel (rayon): each sum is one integer
    /// addition, so the result is the same bits in any order. A tensor of
    /// another shape is refused before anything is added.
    pub fn merge(&mut self, other: &Imatrix) -> Result<(), MergeError> {
        if self.chunk_size != 0 && other.chunk_size != 0 && self.chunk_size != other.chunk_size {
            return Err(MergeError::Shape(format!(
                "imatrix chunk size {} vs {}",
                self.chunk_size, other.chunk_size
            )));
        }
        for (name, e) in &other.entries {
            if let Some(mine) = self.entries.get(name) {
                if (mine.n_in, mine.n_mat) != (e.n_in, e.n_mat) {
                    return Err(MergeError::Shape(format!(
                        "imatrix {name}: [{}, {}] vs [{}, {}]",
                        mine.n_in, mine.n_mat, e.n_in, e.n_mat
                    )));
                }
            }
        }
        self.chunk_size = self.chunk_size.max(other.chunk_size);
        self.chunk_count += other.chunk_count;
        self.entries
            .par_iter_mut()
            .filter_map(|(name, mine)| other.entries.get(name).map(|e| (mine, e)))
            .try_for_each(|(mine, e)| mine.add(e))?;
        for (name, e) in &other.entries {
            if !self.entries.contains_key(name) {
                self.entries.insert(name.clone(), e.clone());
            }
        }
        Ok(())
    }

    /// llama.cpp's GGUF imatrix file: `general.type = imatrix`, per tensor
    /// `<name>.in_sum2` `[n_in, n_mat]`, `<name>.counts` `[1, n_mat]` and
    /// `<name>.in_sum` `[n_in, n_mat]` (f32, in llama-imatrix's order),
    /// `imatrix.datasets`, `imatrix.chunk_count`, `imatrix.chunk_size`.
    pub fn to_gguf(&self, datasets: &[String]) -> Vec<u8> {
        let mut g = GgufWriter::new();
        g.kv("general.type", Value::Str("imatrix".into()))
            .kv("imatrix.datasets", Value::StrArray(datasets.to_vec()))
            .kv("imatrix.chunk_count", Value::U32(self.chunk_count as u32))
            .kv("imatrix.chunk_size", Value::U32(self.chunk_size));
        let f32s =
            |sums: &[ExactSum]| -> Vec<f32> { sums.iter().map(|s| s.to_f64() as f32).collect() };
        for (name, e) in &self.entries {
            let shape = [e.n_in as u64, e.n_mat as u64];
            let counts: Vec<f32> = e.counts.iter().map(|&c| c as f32).collect();
            g.tensor_f32(&format!("{name}.in_sum2"), &shape, &f32s(&e.in_sum2));
            g.tensor_f32(&format!("{name}.counts"), &[1, e.n_mat as u64], &counts);
            g.tensor_f32(&format!("{name}.in_sum"), &shape, &f32s(&e.in_sum));
        }
        g.to_bytes()
    }
}
