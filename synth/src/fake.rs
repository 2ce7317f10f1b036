//! The partials of a deterministic stand-in engine for protocol and
//! scheduling tests: statistics derived from the token ids alone (k distinct
//! experts per token, uniform router probabilities), so any grouping of
//! chunks merges to the same bytes and every `verify` invariant holds. Its
//! importance matrix holds each MoE layer's router (`ffn_gate_inp`, 4 input
//! columns) and attention key projection (`attn_k`, a dense weight), the
//! weights of the model [`FakeModel::model_gguf`] describes.

use gguf::write::{GgufWriter, Value};
use numbers::imatrix::{Imatrix, ImatrixEntry};
use numbers::partial::Partial;
use numbers::stats::{ExpertAccum, MoeShape};
use numbers::{ChunkRange, ExactSum, Gating, Split};
use runfiles::corpus::{Chunk, CorpusIndex};

/// The model a fake engine pretends to run.
#[derive(Clone, Debug)]
pub struct FakeModel {
    /// Model hash it claims (a mismatch with the job makes the worker refuse).
    pub model_sha256: String,
    /// Routed experts per layer.
    pub n_expert: u32,
    /// Experts per token.
    pub k: u32,
    /// MoE block indices.
    pub layers: Vec<u32>,
}

impl FakeModel {
    /// A fake of `n_expert` experts, top-`k`, over `layers`, claiming `model_sha256`.
    pub fn new(model_sha256: &str) -> FakeModel {
        FakeModel {
            model_sha256: model_sha256.to_string(),
            n_expert: 8,
            k: 2,
            layers: vec![0, 1],
        }
    }

    /// The partial of `chunks` (also usable without a worker, as a reference).
    pub fn partial(&self, index: &CorpusIndex, chunks: &[Chunk]) -> Result<Partial, String> {
        let shape = MoeShape {
            n_expert: self.n_expert,
            n_expert_used: self.k,
            gating: Gating::Softmax,
            moe_layers: self.layers.clone(),
            routing: numbers::routing::Routing::default(),
        };
        let mut experts = ExpertAccum::new(shape);
        let n_in = 4u32;
        let mut im = ImatrixEntry::new(n_in, 1);
        let prob = ExactSum::from_f64(1.0 / f64::from(self.n_expert)).map_err(|e| e.to_string())?;
        let mut ranges: Vec<ChunkRange> = Vec::new();
        for chunk in chunks {
            let labels = chunk.token_labels();
            for (&tok, (split, dom)) in chunk.tokens.iter().zip(labels) {
                let domain = index
                    .domains
                    .get(dom as usize)
                    .ok_or("span names an unknown domain")?;
                let group = experts.group_mut(split, domain);
                group.n_tokens += 1;
                for (li, layer) in group.layers.iter_mut().enumerate() {
                    let first = (tok.unsigned_abs() as usize + li * 3) % self.n_expert as usize;
                    for j in 0..self.k as usize {
                        let e = (first + j) % self.n_expert as usize;
                        let g = 1.0 / f64::from(self.k);
                        let y = 1.0 + f64::from((tok.unsigned_abs() + e as u32) % 7) / 8.0;
                        layer.count[e] += 1;
                        add(&mut layer.weight_sum[e], g)?;
                        add(&mut layer.ean_sum[e], y)?;
                        layer.ean_max[e] = layer.ean_max[e].max(y);
                        // An output of norm y with one element at 0.6 y.
                        layer.act_max[e] = layer.act_max[e].max(0.6 * y);
                        add(&mut layer.reap_l2_sum[e], g * y)?;
                        add(&mut layer.reap_l2_sq_sum[e], (g * y) * (g * y))?;
                    }
                    for p in layer.prob_sum.iter_mut() {
                        p.add(prob).map_err(|e| e.to_string())?;
                    }
                }
                // Like llama.cpp workers, the importance matrix counts fit tokens only.
                if split == Split::Fit {
                    for c in 0..n_in as usize {
                        let v = f64::from((tok.unsigned_abs() + c as u32) % 5);
                        add(&mut im.in_sum2[c], v)?;
                        add(&mut im.in_sum[c], v - 2.0)?;
                    }
                    im.counts[0] += 1;
                }
            }
            match ranges.last_mut() {
                Some(r) if r.end == chunk.id.0 => r.end += 1,
                _ => ranges.push(ChunkRange {
                    start: chunk.id.0,
                    end: chunk.id.0 + 1,
                }),
            }
        }
        // Every router and key projection reads the same input here: one
        // entry, shared.
        let entries = self
            .layers
            .iter()
            .flat_map(|l| ["ffn_gate_inp", "attn_k"].map(|t| format!("blk.{l}.{t}.weight")))
            .map(|name| (name, im.clone()))
            .collect();
        let imatrix = Imatrix {
            entries,
            chunk_count: chunks.len() as u64,
            chunk_size: index.n_ctx,
        };
        Ok(Partial::new(
            self.model_sha256.clone(),
            index.chunks_sha256.clone(),
            "fake".to_string(),
            ranges,
            experts,
            imatrix,
        ))
    }
}

impl FakeModel {
    /// A GGUF header (and zero weights) of the model this engine pretends
    /// to run: its expert count and k, and a router `[4, n_expert]` and a key
    /// projection `[4, 4]` per MoE layer, so a coordinator reads the same
    /// facts and importance-matrix entries from it as from a real model.
    pub fn model_gguf(&self) -> Vec<u8> {
        let mut g = GgufWriter::new();
        let blocks = self.layers.iter().max().map_or(0, |l| l + 1);
        g.kv("general.architecture", Value::Str("qwen3moe".into()))
            .kv("qwen3moe.block_count", Value::U32(blocks))
            .kv("qwen3moe.expert_count", Value::U32(self.n_expert))
            .kv("qwen3moe.expert_used_count", Value::U32(self.k));
        let zeros = vec![0.0f32; 4 * self.n_expert as usize];
        for l in &self.layers {
            let dims = [4, u64::from(self.n_expert)];
            g.tensor_f32(&format!("blk.{l}.ffn_gate_inp.weight"), &dims, &zeros);
            g.tensor_f32(&format!("blk.{l}.attn_k.weight"), &[4, 4], &[0.0; 16]);
        }
        g.to_bytes()
    }
}

fn add(sum: &mut ExactSum, v: f64) -> Result<(), String> {
    sum.add_f64(v).map_err(|e| e.to_string())
}
