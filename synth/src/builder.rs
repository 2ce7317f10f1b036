//! The tensors of a generated model: deterministic random weights, one
//! stream per tensor name, so a tensor's values depend on the seed and its
//! name only.

use super::weights::{encode_into, random_matrix, random_stream, random_vector};
use super::Spec;
use gguf::write::GgufWriter;

/// Builds the tensors of one model; `seed` makes every weight reproducible.
pub(super) struct Builder<'a> {
    pub g: GgufWriter,
    pub seed: u64,
    pub spec: &'a Spec,
}

impl Builder<'_> {
    /// A matrix `[n_in, n_out, n_mat]` with uniform values scaled by
    /// 1/sqrt(n_in), drawn and encoded a piece at a time (a real-vocabulary
    /// embedding is 300-500M values: 1-2 GB as f32).
    pub fn matrix(&mut self, name: &str, dims: &[usize], gain: f32) {
        let scale = gain * (3.0 / dims[0] as f32).sqrt();
        let ty = self.spec.weight_type;
        let data = if super::vision::patches(self.spec, name) {
            // The same values, changed where the vision experts need it.
            let n: usize = dims.iter().product();
            let mut values: Vec<f32> = random_stream(self.seed, name, scale).take(n).collect();
            super::vision::patch(self.spec, name, dims, &mut values);
            let mut data = Vec::with_capacity(ty.bytes_for(n));
            encode_into(&values, ty, &mut data);
            data
        } else {
            random_matrix(self.seed, name, dims, scale, ty)
        };
        let dims64: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        self.g.tensor(name, &dims64, ty, data);
    }

    /// A norm weight: ones with a little noise (always f32, as llama.cpp expects).
    pub fn norm(&mut self, name: &str, n: usize) {
        self.vector(name, n, 1.0, 0.1);
    }

    /// An f32 vector `center + spread * u`, `u` uniform in [-1, 1): biases,
    /// norms, per-head constants.
    pub fn vector(&mut self, name: &str, n: usize, center: f32, spread: f32) {
        let values = random_vector(self.seed, name, n, center, spread);
        self.g.tensor_f32(name, &[n as u64], &values);
    }

    /// An f32 matrix of small values (expert biases `[n, n_expert]`).
    pub fn small_f32(&mut self, name: &str, dims: &[usize], spread: f32) {
        let n: usize = dims.iter().product();
        let values: Vec<f32> = random_stream(self.seed, name, spread).take(n).collect();
        let dims64: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        self.g.tensor_f32(name, &dims64, &values);
    }

    /// The router: rows scaled unevenly so some experts are heavy hitters.
    pub fn router(&mut self, name: &str) {
        let (n_embd, n_expert) = (self.spec.n_embd, self.spec.n_expert);
        // Sigmoid routers saturate at 1.0 in f32 with large logits; keep them moderate.
        let sharpness = if self.spec.sigmoid_router() { 1.0 } else { 4.0 };
        let scale = sharpness * (3.0 / n_embd as f32).sqrt();
        let mut stream = random_stream(self.seed, name, scale);
        let mut values = Vec::with_capacity(n_embd * n_expert);
        for e in 0..n_expert {
            let gain = 0.4 + 1.6 * ((e * 7) % n_expert) as f32 / n_expert as f32;
            values.extend(stream.by_ref().take(n_embd).map(|v| v * gain));
        }
        super::vision::patch(self.spec, name, &[n_embd, n_expert], &mut values);
        // The router stays f32 so routing is not perturbed by quantisation.
        self.g
            .tensor_f32(name, &[n_embd as u64, n_expert as u64], &values);
    }
}
