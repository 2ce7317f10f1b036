//! An independent f64 forward pass of the generated MoE architectures
//! (qwen3moe and glm4moe as llama.cpp builds them), from weights read and
//! dequantised by llama.cpp's own GGUF reader, with an optional router mask:
//! experts outside the mask are never selected, which is what a model pruned
//! to the mask's experts computes. Shares no code with the slicer.

use crate::llama_gguf::{F32Tensor, LlamaGguf};
use std::collections::BTreeMap;
use std::path::Path;

/// The model's weights (as f32 values) and hyperparameters.
pub struct Oracle {
    w: BTreeMap<String, F32Tensor>,
    n_embd: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_layer: usize,
    n_dense_lead: usize,
    n_expert: usize,
    k: usize,
    eps: f64,
    freq_base: f64,
    sigmoid: bool,
    norm_w: bool,
    w_scale: f64,
    qk_norm: bool,
}

/// What a forward pass computed.
pub struct Forward {
    /// Logits per position (whole vocabulary).
    pub logits: Vec<Vec<f64>>,
    /// Selected experts (base ids) per (block, position), sorted.
    pub selected: BTreeMap<(u32, usize), Vec<u32>>,
}

fn rms_norm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * s * *w as f64).collect()
}

/// Rows `row0..row0 + n_out` of a row-major weight with `n_in` columns times
/// `x`, in f64: the product every oracle of these tests is made of.
pub fn matvec(w: &[f32], n_in: usize, row0: usize, n_out: usize, x: &[f64]) -> Vec<f64> {
    (0..n_out)
        .map(|r| {
            w[(row0 + r) * n_in..(row0 + r + 1) * n_in]
                .iter()
                .zip(x)
                .map(|(a, b)| *a as f64 * b)
                .sum()
        })
        .collect()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// NeoX rotary embedding over the whole head.
fn rope(x: &mut [f64], pos: usize, base: f64) {
    let half = x.len() / 2;
    for i in 0..half {
        let theta = pos as f64 * base.powf(-2.0 * i as f64 / x.len() as f64);
        let (s, c) = theta.sin_cos();
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * c - b * s;
        x[i + half] = a * s + b * c;
    }
}

impl Oracle {
    /// Loads every tensor of `model` through llama.cpp's GGUF reader.
    pub fn load(model: &Path) -> Oracle {
        let g = LlamaGguf::open(model).unwrap();
        let arch = g.str("general.architecture").unwrap();
        let u = |k: &str| g.u32(&format!("{arch}.{k}")).unwrap_or(0) as usize;
        let w = g
            .tensor_names()
            .into_iter()
            .map(|n| {
                let t = g
                    .tensor_as_f32(&n)
                    .unwrap_or_else(|| panic!("{n} converts to f32"));
                (n, t)
            })
            .collect();
        Oracle {
            w,
            n_embd: u("embedding_length"),
            n_head: u("attention.head_count"),
            n_head_kv: u("attention.head_count_kv"),
            head_dim: u("attention.key_length"),
            n_layer: u("block_count"),
            n_dense_lead: u("leading_dense_block_count"),
            n_expert: u("expert_count"),
            k: u("expert_used_count"),
            eps: g
                .f32(&format!("{arch}.attention.layer_norm_rms_epsilon"))
                .unwrap() as f64,
            freq_base: g.f32(&format!("{arch}.rope.freq_base")).unwrap() as f64,
            sigmoid: g.u32(&format!("{arch}.expert_gating_func")) == Some(2),
            norm_w: g
                .bool(&format!("{arch}.expert_weights_norm"))
                .unwrap_or(arch == "qwen3moe"),
            w_scale: g
                .f32(&format!("{arch}.expert_weights_scale"))
                .filter(|s| *s != 0.0)
                .unwrap_or(1.0) as f64,
            qk_norm: arch == "qwen3moe",
        }
    }

    /// Blocks with routed experts.
    pub fn moe_layers(&self) -> Vec<u32> {
        (self.n_dense_lead..self.n_layer)
            .map(|l| l as u32)
            .collect()
    }

    /// Routed experts per MoE block.
    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    fn t(&self, name: &str) -> &[f32] {
        &self
            .w
            .get(name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
            .data
    }

    /// A SiLU-gated FFN `down(silu(gate x) * up x)` from stacked weights,
    /// matrix `m` of each (0 for plain weights).
    fn ffn(&self, prefix: &str, suffix: &str, m: usize, x: &[f64]) -> Vec<f64> {
        let gate = &self.w[&format!("{prefix}ffn_gate{suffix}.weight")];
        let n_ff = gate.ne[1];
        let g = matvec(&gate.data, self.n_embd, m * n_ff, n_ff, x);
        let u = matvec(
            self.t(&format!("{prefix}ffn_up{suffix}.weight")),
            self.n_embd,
            m * n_ff,
            n_ff,
            x,
        );
        let h: Vec<f64> = g.iter().zip(&u).map(|(a, b)| silu(*a) * b).collect();
        let down = self.t(&format!("{prefix}ffn_down{suffix}.weight"));
        matvec(down, n_ff, m * self.n_embd, self.n_embd, &h)
    }

    /// Runs `tokens` (positions 0..) through the model. `keep` maps a block
    /// to the experts the router may select there; blocks it lacks use all.
    pub fn forward(&self, tokens: &[i32], keep: &BTreeMap<u32, Vec<u32>>) -> Forward {
        let (e, hd) = (self.n_embd, self.head_dim);
        let embd = self.t("token_embd.weight");
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| {
                embd[t as usize * e..(t as usize + 1) * e]
                    .iter()
                    .map(|v| *v as f64)
                    .collect()
            })
            .collect();
        let mut selected = BTreeMap::new();
        for il in 0..self.n_layer {
            let p = format!("blk.{il}.");
            let t = |n: &str| self.t(&format!("{p}{n}.weight"));
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (pos, xt) in x.iter().enumerate() {
                let h = rms_norm(xt, t("attn_norm"), self.eps);
                let mut q = matvec(t("attn_q"), e, 0, self.n_head * hd, &h);
                let mut k = matvec(t("attn_k"), e, 0, self.n_head_kv * hd, &h);
                let v = matvec(t("attn_v"), e, 0, self.n_head_kv * hd, &h);
                for (heads, norm) in [(&mut q, "attn_q_norm"), (&mut k, "attn_k_norm")] {
                    for head in heads.chunks_mut(hd) {
                        if self.qk_norm {
                            let normed = rms_norm(head, t(norm), self.eps);
                            head.copy_from_slice(&normed);
                        }
                        rope(head, pos, self.freq_base);
                    }
                }
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            let group = self.n_head / self.n_head_kv;
            let scale = 1.0 / (hd as f64).sqrt();
            for (pos, xt) in x.iter_mut().enumerate() {
                let mut att = vec![0.0; self.n_head * hd];
                for h in 0..self.n_head {
                    let kvh = h / group;
                    let q = &qs[pos][h * hd..(h + 1) * hd];
                    let scores: Vec<f64> = (0..=pos)
                        .map(|s| {
                            q.iter()
                                .zip(&ks[s][kvh * hd..(kvh + 1) * hd])
                                .map(|(a, b)| a * b)
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let ex: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = ex.iter().sum();
                    for (s, w) in ex.iter().enumerate() {
                        for (o, v) in att[h * hd..(h + 1) * hd]
                            .iter_mut()
                            .zip(&vs[s][kvh * hd..(kvh + 1) * hd])
                        {
                            *o += w / z * v;
                        }
                    }
                }
                let out = matvec(t("attn_output"), self.n_head * hd, 0, e, &att);
                xt.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
                let norm = if self.qk_norm {
                    "ffn_norm"
                } else {
                    "post_attention_norm"
                };
                let h = rms_norm(xt, t(norm), self.eps);
                let y = if il < self.n_dense_lead {
                    self.ffn(&p, "", 0, &h)
                } else {
                    let (y, sel) = self.moe(il, &h, keep.get(&(il as u32)));
                    selected.insert((il as u32, pos), sel);
                    y
                };
                xt.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
            }
        }
        let logits = x
            .iter()
            .map(|xt| {
                let h = rms_norm(xt, self.t("output_norm.weight"), self.eps);
                let out = &self.w["output.weight"];
                matvec(&out.data, e, 0, out.ne[1], &h)
            })
            .collect();
        Forward { logits, selected }
    }

    /// The MoE block: routing restricted to `keep`, routed experts, shared expert.
    fn moe(&self, il: usize, h: &[f64], keep: Option<&Vec<u32>>) -> (Vec<f64>, Vec<u32>) {
        let p = format!("blk.{il}.");
        let all: Vec<u32> = (0..self.n_expert as u32).collect();
        let allowed = keep.unwrap_or(&all);
        let logits = matvec(
            self.t(&format!("{p}ffn_gate_inp.weight")),
            self.n_embd,
            0,
            self.n_expert,
            h,
        );
        let mut probs = vec![0.0; self.n_expert];
        if self.sigmoid {
            for &i in allowed {
                probs[i as usize] = 1.0 / (1.0 + (-logits[i as usize]).exp());
            }
        } else {
            let m = allowed
                .iter()
                .map(|&i| logits[i as usize])
                .fold(f64::MIN, f64::max);
            let z: f64 = allowed
                .iter()
                .map(|&i| (logits[i as usize] - m).exp())
                .sum();
            for &i in allowed {
                probs[i as usize] = (logits[i as usize] - m).exp() / z;
            }
        }
        let bias = self.w.get(&format!("{p}exp_probs_b.bias"));
        let score = |i: u32| probs[i as usize] + bias.map_or(0.0, |b| b.data[i as usize] as f64);
        let mut order = allowed.clone();
        order.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
        let sel = &order[..self.k];
        let mut w: Vec<f64> = sel.iter().map(|&i| probs[i as usize]).collect();
        if self.norm_w {
            let s = w.iter().sum::<f64>().max(6.103515625e-5);
            w.iter_mut().for_each(|v| *v /= s);
        }
        let mut y = vec![0.0; self.n_embd];
        for (&i, wi) in sel.iter().zip(&w) {
            let out = self.ffn(&p, "_exps", i as usize, h);
            y.iter_mut()
                .zip(&out)
                .for_each(|(a, b)| *a += wi * self.w_scale * b);
        }
        if self.w.contains_key(&format!("{p}ffn_gate_shexp.weight")) {
            let out = self.ffn(&p, "_shexp", 0, h);
            y.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
        }
        let mut sel = sel.to_vec();
        sel.sort();
        (y, sel)
    }
}
