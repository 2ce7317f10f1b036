//! The observer's side of `[run] merge_projection`: each routed expert
//! output row (`ffn_moe_down`, before the routing weight) projected to
//! `dim` dimensions ([`numbers::projection`]), the matrix drawn once the
//! first row gives the model's width.

use super::kernels::extend_rows;
use numbers::projection::{project_into, signs};

/// The projection matrix and a reused row buffer.
pub struct Projector {
    dim: usize,
    seed: u64,
    /// `dim x n_embd` signs, drawn on the first row.
    signs: Vec<f32>,
    n_embd: usize,
    row: Vec<f32>,
}

impl Projector {
    /// A projector to `dim` dimensions with matrix seed `seed`.
    pub fn new(dim: usize, seed: u64) -> Projector {
        Projector {
            dim,
            seed,
            signs: Vec::new(),
            n_embd: 0,
            row: Vec::new(),
        }
    }

    /// Projected dimensions per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Appends the projection of the `n_embd` f32 values at `bytes` (element
    /// stride `stride` bytes) to `out`.
    pub fn project_row(&mut self, bytes: &[u8], stride: usize, n_embd: usize, out: &mut Vec<f64>) {
        if self.n_embd != n_embd {
            self.signs = signs(self.seed, self.dim, n_embd);
            self.n_embd = n_embd;
        }
        self.row.clear();
        extend_rows(
            &mut self.row,
            bytes,
            [stride, stride * n_embd, 0, 0],
            n_embd,
            1,
        );
        let at = out.len();
        out.resize(at + self.dim, 0.0);
        project_into(&self.signs, &self.row, &mut out[at..]);
    }
}
