//! The importance matrix: per weight tensor, the sum and the sum of squares
//! of each input column (per expert for stacked expert weights) and token
//! counts, with an exact merge and llama.cpp's GGUF imatrix output format.

use crate::exact::ExactSum;
use crate::gguf::{GgufWriter, Value};
use crate::stats::MergeError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Sums for one weight tensor (`blk.N.ffn_down_exps.weight`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImatrixEntry {
    /// Input columns of the weight (`ne[0]`).
    pub n_in: u32,
    /// Matrices in the tensor: experts for `MUL_MAT_ID`, 1 for dense weights.
    pub n_mat: u32,
    /// `sum x_j` per (matrix, column), row-major `[n_mat][n_in]`: what
    /// llama.cpp's imatrix tool writes as `<tensor>.in_sum` (its statistics
    /// read the mean activation from it).
    pub in_sum: Vec<ExactSum>,
    /// `sum x_j^2` per (matrix, column), row-major `[n_mat][n_in]`.
    pub in_sum2: Vec<ExactSum>,
    /// Tokens (input rows) seen per matrix.
    pub counts: Vec<u64>,
}

impl ImatrixEntry {
    /// An empty entry.
    pub fn new(n_in: u32, n_mat: u32) -> Self {
        ImatrixEntry {
            n_in,
            n_mat,
            in_sum: vec![ExactSum::ZERO; n_in as usize * n_mat as usize],
            in_sum2: vec![ExactSum::ZERO; n_in as usize * n_mat as usize],
            counts: vec![0; n_mat as usize],
        }
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
    pub fn merge(&mut self, other: &Imatrix) -> Result<(), MergeError> {
        if self.chunk_size != 0 && other.chunk_size != 0 && self.chunk_size != other.chunk_size {
            return Err(MergeError::Shape(format!(
                "imatrix chunk size {} vs {}",
                self.chunk_size, other.chunk_size
            )));
        }
        self.chunk_size = self.chunk_size.max(other.chunk_size);
        self.chunk_count += other.chunk_count;
        for (name, e) in &other.entries {
            match self.entries.get_mut(name) {
                None => {
                    self.entries.insert(name.clone(), e.clone());
                }
                Some(mine) => {
                    if (mine.n_in, mine.n_mat) != (e.n_in, e.n_mat) {
                        return Err(MergeError::Shape(format!(
                            "imatrix {name}: [{}, {}] vs [{}, {}]",
                            mine.n_in, mine.n_mat, e.n_in, e.n_mat
                        )));
                    }
                    let sums = mine.in_sum.iter_mut().zip(&e.in_sum);
                    for (a, b) in sums.chain(mine.in_sum2.iter_mut().zip(&e.in_sum2)) {
                        a.add(*b)?;
                    }
                    for (a, b) in mine.counts.iter_mut().zip(&e.counts) {
                        *a = a.checked_add(*b).ok_or(MergeError::CountOverflow)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// llama.cpp's GGUF imatrix file: `general.type = imatrix`, per tensor
    /// `<name>.in_sum` and `<name>.in_sum2` `[n_in, n_mat]` and
    /// `<name>.counts` `[1, n_mat]` (f32), `imatrix.datasets`,
    /// `imatrix.chunk_count`, `imatrix.chunk_size`.
    pub fn to_gguf(&self, datasets: &[String]) -> Vec<u8> {
        let mut g = GgufWriter::new();
        g.kv("general.type", Value::Str("imatrix".into()))
            .kv("imatrix.datasets", Value::StrArray(datasets.to_vec()))
            .kv("imatrix.chunk_count", Value::U32(self.chunk_count as u32))
            .kv("imatrix.chunk_size", Value::U32(self.chunk_size));
        let f32s = |sums: &[ExactSum]| -> Vec<f32> {
            sums.iter().map(|s| s.to_f64() as f32).collect()
        };
        for (name, e) in &self.entries {
            let counts: Vec<f32> = e.counts.iter().map(|&c| c as f32).collect();
            let dims = [e.n_in as u64, e.n_mat as u64];
            g.tensor_f32(&format!("{name}.in_sum"), &dims, &f32s(&e.in_sum));
            g.tensor_f32(&format!("{name}.in_sum2"), &dims, &f32s(&e.in_sum2));
            g.tensor_f32(&format!("{name}.counts"), &[1, e.n_mat as u64], &counts);
        }
        g.to_bytes()
    }
}
