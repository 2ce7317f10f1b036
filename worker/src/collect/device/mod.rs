//! The collector's device path: the observed tensors are reduced on the
//! backend that holds them ([`llama::Reducer`]) and only the results
//! cross to the host: per-(token, slot) expert ids, gate weights,
//! expert-output norms and largest elements, router-probability sums per
//! (split, domain) group, and importance-matrix sums accumulated on the
//! device over one chunk.
//!
//! Counts come from the same ids as on the host path, so they are equal;
//! sums are computed in f32 on the device, so they differ from the host
//! path's f64 sums in the last bits (within 1e-5 relative; the tests check
//! it). Anything the device cannot reduce (an unsupported op, an unexpected
//! shape) is read on the host instead, and its bytes count as crossing.

mod options;

pub use options::Reduce;

use super::scratch::ChunkScratch;
use llama::Offload;
use llama::{ChunkSquares, ExpertIds, Op, ReduceError, Reducer, RouterQuery, TensorRef};
use numbers::Split;
use std::collections::BTreeMap;

/// The backend description partials and the join `Hello` carry: llama.cpp's
/// own with the weights' placement ([`llama::backend_description`]),
/// plus `, device reductions` on the device path, whose sums round
/// differently from the host's (so redundancy checks compare such partials
/// within tolerance, not bitwise).
pub fn backend_label(on_device: bool, offload: &Offload) -> String {
    let mut backend = llama::backend_description(offload);
    if on_device {
        backend.push_str(", device reductions");
    }
    backend
}

/// Per (token, slot) of `ffn_moe_down`: the output's L2 norm and its
/// largest element.
pub type NormsAndMaxima = (Vec<f32>, Vec<f32>);

/// Per token, a router's top-N expert ids and their gating values
/// (`[top_n, tokens]` each).
pub type RankedTopN = (Vec<i32>, Vec<f32>);

/// Router-probability sums of one layer and micro-batch per token group.
pub type GroupSums = Vec<((Split, u16), Vec<f32>)>;

/// Device-side reads and reductions of one collection run.
#[derive(Default)]
pub struct DeviceReads {
    reducer: Reducer,
    /// Distinct (split, domain) labels of the micro-batch, in first-seen order.
    groups: Vec<(Split, u16)>,
    /// One-hot group membership, `[n_tokens][groups]` row-major.
    membership: Vec<f32>,
    /// Graph nodes of expert ids checked to lie below `n_expert` in this
    /// micro-batch (`ggml_get_rows` requires it).
    checked_ids: Vec<usize>,
    /// Matmul inputs reduced in this micro-batch and the weight whose
    /// accumulator holds their sums.
    reduced: Vec<(InputKey, String)>,
    /// Weights whose inputs were another weight's in every micro-batch of
    /// the chunk (`attn_k` of `attn_q`, `ffn_up_exps` of `ffn_gate_exps`):
    /// their sums are that weight's, read once.
    mirrors: BTreeMap<String, String>,
}

/// What makes two matmuls' importance sums equal: the same input node and
/// ids node over the same number of matrices (as on the host path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InputKey {
    input: usize,
    ids: usize,
    n_in: usize,
    n_mat: usize,
}

impl DeviceReads {
    /// Device reads with no reduction started yet.
    pub fn new() -> DeviceReads {
        DeviceReads::default()
    }

    /// Bytes copied from the backend by the device reductions so far.
    pub fn bytes_read(&self) -> u64 {
        self.reducer.bytes_read()
    }

    /// Starts a micro-batch of tokens labelled `labels`.
    pub fn begin_ubatch(&mut self, labels: &[(Split, u16)]) {
        self.groups.clear();
        for l in labels {
            if !self.groups.contains(l) {
                self.groups.push(*l);
            }
        }
        let n = self.groups.len();
        self.membership = vec![0.0; labels.len() * n];
        for (t, l) in labels.iter().enumerate() {
            let g = self
                .groups
                .iter()
                .position(|x| x == l)
                .expect("listed above");
            self.membership[t * n + g] = 1.0;
        }
        self.checked_ids.clear();
        self.reduced.clear();
    }

    /// Sums of `ffn_moe_probs` `[n_expert, n_tokens]` per token group, or
    /// `None` when the host must read the probabilities (a non-finite value,
    /// which the host counts and drops, or a tensor the device cannot reduce).
    pub fn probs_by_group(&mut self, t: &TensorRef<'_>) -> Result<Option<GroupSums>, String> {
        let n_expert = t.ne()[0];
        let Some(sums) = fallback(
            t,
            self.reducer
                .weighted_sums(t, &self.membership, self.groups.len()),
        )?
        else {
            return Ok(None);
        };
        if sums.iter().any(|v| !v.is_finite()) {
            return Ok(None);
        }
        let per_group = self
            .groups
            .iter()
            .zip(sums.chunks_exact(n_expert))
            .map(|(g, s)| (*g, s.to_vec()))
            .collect();
        Ok(Some(per_group))
    }

    /// The selected expert ids `[k, n_tokens]` (a strided view), compacted
    /// on the device; remembered as safe for one-hot rows when all lie below
    /// `n_expert`.
    pub fn expert_ids(
        &mut self,
        t: &TensorRef<'_>,
        n_expert: usize,
    ) -> Result<Option<Vec<i32>>, String> {
        let ids = fallback(t, self.reducer.compact_i32(t))?;
        if let Some(ids) = &ids {
            if ids.iter().all(|&e| e >= 0 && (e as usize) < n_expert) {
                self.checked_ids.push(t.node_id());
            }
        }
        Ok(ids)
    }

    /// An f32 tensor's values (gate weights), compacted on the device.
    pub fn values(&mut self, t: &TensorRef<'_>) -> Result<Option<Vec<f32>>, String> {
        fallback(t, self.reducer.compact_f32(t))
    }

    /// The L2 norm and the largest element of each expert output of
    /// `ffn_moe_down` `[n_embd, k, n_tokens]`, per (token, slot).
    pub fn output_norms_and_maxima(
        &mut self,
        t: &TensorRef<'_>,
    ) -> Result<Option<NormsAndMaxima>, String> {
        fallback(t, self.reducer.row_norms_and_maxima(t))
    }

    /// Adds the importance sums of weight `name`'s matmul `t` (input `x`,
    /// `n_mat` matrices) over the tokens where `fit` holds to its device
    /// accumulator. `Ok(false)`: not reduced here; the host must do it.
    pub fn importance(
        &mut self,
        name: &str,
        t: &TensorRef<'_>,
        x: &TensorRef<'_>,
        n_mat: usize,
        fit: &[bool],
    ) -> Result<bool, String> {
        let experts = match t.op() {
            Op::MulMatId => match t.src(2) {
                Some(ids) if self.checked_ids.contains(&ids.node_id()) => Some(ids),
                _ => return Ok(false),
            },
            _ if n_mat == 1 => None,
            _ => return Ok(false),
        };
        let key = InputKey {
            input: x.node_id(),
            ids: experts.as_ref().map_or(0, TensorRef::node_id),
            n_in: x.ne()[0],
            n_mat,
        };
        if let Some((_, source)) = self.reduced.iter().find(|(k, _)| *k == key) {
            if source != name {
                let source = source.clone();
                if let Some(other) = self.mirrors.insert(name.to_string(), source.clone()) {
                    if other != source {
                        return Err(format!(
                            "{name} read the input of {other}, then of {source}, within one chunk"
                        ));
                    }
                }
            }
            return Ok(true);
        }
        if self.mirrors.contains_key(name) {
            return Err(format!(
                "{name} shared another weight's input in one micro-batch and not in another"
            ));
        }
        let mask: Vec<f32> = fit.iter().map(|&f| f32::from(u8::from(f))).collect();
        let experts = experts.as_ref().map(|ids| ExpertIds { ids, n_mat });
        let done = self.reducer.accumulate_squares(name, x, experts, &mask);
        let done = fallback(x, done)?.is_some();
        if done {
            self.reduced.push((key, name.to_string()));
        }
        Ok(done)
    }

    /// A later layer's router top-N for the tokens `q.rows` of the residual
    /// stream `t` (lookahead guesses), ranked on the device: only the ids
    /// and gating values cross. `None`: the host must compute them.
    pub fn router_top_n(
        &mut self,
        t: &TensorRef<'_>,
        q: &RouterQuery<'_>,
    ) -> Result<Option<RankedTopN>, String> {
        fallback(t, self.reducer.router_top_n(t, q))
    }

    /// Moves the chunk's device importance sums into `scratch`.
    pub fn finish_chunk(&mut self, scratch: &mut ChunkScratch) -> Result<(), String> {
        let mirrors = std::mem::take(&mut self.mirrors);
        for s in self.reducer.take_chunk() {
            let copies = mirrors.iter().filter(|(_, src)| **src == s.weight);
            for weight in std::iter::once(&s.weight).chain(copies.map(|(w, _)| w)) {
                add_squares(scratch, weight, &s)?;
            }
        }
        Ok(())
    }
}

/// Adds one chunk's device sums `s` to the scratch entry of `weight`.
fn add_squares(scratch: &mut ChunkScratch, weight: &str, s: &ChunkSquares) -> Result<(), String> {
    let entry = scratch.imatrix_entry(weight, s.n_in, s.n_mat);
    if entry.sum2.len() != s.sum2.len()
        || entry.sum.len() != s.sum.len()
        || entry.counts.len() != s.counts.len()
    {
        return Err(format!(
            "{weight}: device sums of [{}] x {} do not fit the host's shape",
            s.n_in, s.n_mat
        ));
    }
    for (a, b) in entry.sum2.iter_mut().zip(&s.sum2) {
        *a += f64::from(*b);
    }
    for (a, b) in entry.sum.iter_mut().zip(&s.sum) {
        *a += f64::from(*b);
    }
    for (a, b) in entry.counts.iter_mut().zip(&s.counts) {
        if *b < 0.0 || b.fract() != 0.0 || *b >= 16_777_216.0 {
            return Err(format!(
                "{weight}: device row count {b} is not an exact count"
            ));
        }
        *a += *b as u64;
    }
    Ok(())
}

/// A device result, `None` where the host must read the tensor instead
/// (logged at debug level), or the failure.
fn fallback<T>(t: &TensorRef<'_>, r: Result<T, ReduceError>) -> Result<Option<T>, String> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e @ (ReduceError::Unsupported { .. } | ReduceError::Shape(_))) => {
            tracing::debug!(tensor = t.name(), "read on the host: {e}");
            Ok(None)
        }
        Err(e) => Err(format!("{}: {e}", t.name())),
    }
}
