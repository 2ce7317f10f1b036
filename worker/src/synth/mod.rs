//! `worker synth-model`: deterministic, small but real MoE GGUF models.
//!
//! - [`Preset::Tiny`]: qwen3moe (softmax gating, normalised top-k weights).
//! - [`Preset::TinyAlt`]: glm4moe (a leading dense block so MoE layers start
//!   at block 1, sigmoid gating with a selection bias, a shared expert,
//!   normalised and scaled weights).
//! - [`Preset::Bench`]: a larger qwen3moe with Q8_0 weights, so a forward
//!   pass dominates the callback's cost.
//! - [`Preset::Wide`]: qwen3moe at the real routing shape (48 MoE layers x
//!   512 experts, top-10) with a small hidden size, so traces, replay and
//!   reports meet production sizes on a CPU.
//! - [`Preset::WideHidden`]: the real shape's hidden size (2,048) and
//!   routing (512 experts, top-10) in 2 MoE layers, so the bytes the
//!   observer reads per token and layer can be measured at that shape.
//! - [`Preset::Dense`]: a dense qwen3 model, for the "no MoE layers" error.
//! - [`Preset::TinyAltQk`]: `tiny-alt`'s architecture with hidden size and
//!   expert width 256, so llama.cpp's k-quants (blocks of 256) apply to the
//!   expert matrices and a quantised model can be made with its quantizer.
//! - [`Preset::Vocab152k`], [`Preset::Vocab248k`]: the real vocabularies
//!   (151,936: Qwen3 and Qwen3-Next; 248,320: Qwen3.5) at the real hidden
//!   size (2,048) and routing (512 experts, top-10) in 3 MoE layers, Q8_0,
//!   so the output head and logits rows have their real size (benchmarks).
//!
//! [`chunks`] makes synthetic token chunks for the benchmarks; [`corpus`]
//! a synthetic text corpus.

pub mod chunks;
pub mod corpus;
mod vocab;
mod weights;

use anyhow::Context;
use common::gguf::{GgufWriter, TensorType, Value};
use common::splitmix::SplitMix64;
use std::path::Path;
use weights::encode_into;

pub use vocab::{byte_to_unicode, CHAT_TEMPLATE, SPECIAL_TOKENS};

/// Which model to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// qwen3moe, 3 MoE layers, 16 experts, top-4, f32.
    Tiny,
    /// glm4moe, 1 dense + 3 MoE layers, 24 experts, top-4, sigmoid + bias, shared expert, f32.
    TinyAlt,
    /// qwen3moe, 8 MoE layers, 64 experts, top-8, hidden 512, Q8_0.
    Bench,
    /// qwen3moe, 48 MoE layers, 512 experts, top-10, hidden 64, expert width 16, f16.
    Wide,
    /// qwen3moe, 2 MoE layers, 512 experts, top-10, hidden 2048, expert width 32, Q8_0.
    WideHidden,
    /// qwen3 without experts: a valid model that the collector must refuse.
    Dense,
    /// glm4moe like `tiny-alt` (1 dense + 2 MoE layers, 16 experts, top-4)
    /// with hidden size and expert width 256, f16: every expert row is a
    /// whole number of k-quant blocks.
    TinyAltQk,
    /// qwen3moe with Qwen3's vocabulary size (151,936), hidden 2048, 3 MoE
    /// layers, 512 experts, top-10, expert width 32, Q8_0, tied embeddings.
    #[value(name = "vocab-152k")]
    Vocab152k,
    /// `vocab-152k` with Qwen3.5's vocabulary size (248,320).
    #[value(name = "vocab-248k")]
    Vocab248k,
}

/// Encoding of a generated model's weight matrices (norms and routers stay
/// f32), to test that slicing and loading work for more than f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 8-bit blocks of 32 with an f16 scale.
    #[value(name = "q8_0")]
    Q8_0,
}

impl WeightType {
    /// The GGUF tensor type.
    pub fn tensor_type(self) -> TensorType {
        match self {
            WeightType::F32 => TensorType::F32,
            WeightType::F16 => TensorType::F16,
            WeightType::Q8_0 => TensorType::Q8_0,
        }
    }
}

/// Shape and routing facts of a generated model.
#[derive(Clone, Debug)]
pub struct Spec {
    /// llama.cpp architecture name.
    pub arch: &'static str,
    /// Hidden size.
    pub n_embd: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Blocks in total.
    pub n_layer: usize,
    /// Leading dense (non-MoE) blocks.
    pub n_dense_lead: usize,
    /// Routed experts per MoE block.
    pub n_expert: usize,
    /// Experts per token.
    pub n_expert_used: usize,
    /// Width of one expert's FFN.
    pub n_ff_exp: usize,
    /// Width of the dense FFN blocks.
    pub n_ff_dense: usize,
    /// Shared experts per MoE block.
    pub n_shared: usize,
    /// Weight encoding of the matrices.
    pub weight_type: TensorType,
    /// BPE merges in the vocabulary.
    pub n_merges: usize,
    /// Tokens in the vocabulary: unused tokens pad the learnt ones up to
    /// it (0: the learnt vocabulary, a few hundred tokens).
    pub n_vocab: usize,
    /// The output head reuses the token embedding (no `output.weight`), as
    /// in many real models; it halves the file at a large vocabulary.
    pub tied_output: bool,
}

impl Preset {
    /// The preset's shape.
    pub fn spec(self) -> Spec {
        match self {
            Preset::Tiny => Spec {
                arch: "qwen3moe",
                n_embd: 64,
                n_head: 4,
                n_head_kv: 2,
                head_dim: 16,
                n_layer: 3,
                n_dense_lead: 0,
                n_expert: 16,
                n_expert_used: 4,
                n_ff_exp: 32,
                n_ff_dense: 0,
                n_shared: 0,
                weight_type: TensorType::F32,
                n_merges: 400,
                n_vocab: 0,
                tied_output: false,
            },
            Preset::TinyAlt => Spec {
                arch: "glm4moe",
                n_embd: 64,
                n_head: 4,
                n_head_kv: 2,
                head_dim: 16,
                n_layer: 4,
                n_dense_lead: 1,
                n_expert: 24,
                n_expert_used: 4,
                n_ff_exp: 32,
                n_ff_dense: 96,
                n_shared: 1,
                weight_type: TensorType::F32,
                n_merges: 400,
                n_vocab: 0,
                tied_output: false,
            },
            Preset::Bench => Spec {
                arch: "qwen3moe",
                n_embd: 512,
                n_head: 8,
                n_head_kv: 4,
                head_dim: 64,
                n_layer: 8,
                n_dense_lead: 0,
                n_expert: 64,
                n_expert_used: 8,
                n_ff_exp: 256,
                n_ff_dense: 0,
                n_shared: 0,
                weight_type: TensorType::Q8_0,
                n_merges: 400,
                n_vocab: 0,
                tied_output: false,
            },
            Preset::Wide => Spec {
                n_layer: 48,
                n_expert: 512,
                n_expert_used: 10,
                n_ff_exp: 16,
                // f16 halves the file (~150 MB); Q8_0 needs rows of 32 and the
                // down projection's rows are 16 wide.
                weight_type: TensorType::F16,
                ..Preset::Tiny.spec()
            },
            Preset::WideHidden => Spec {
                n_embd: 2048,
                n_head: 16,
                n_head_kv: 4,
                head_dim: 128,
                n_layer: 2,
                n_expert: 512,
                n_expert_used: 10,
                // The real width (512) would make each layer 1.6G weights;
                // 32 is the least Q8_0 rows allow. Only the down projection's
                // input depends on it (BENCHMARKS.md gives the formula).
                n_ff_exp: 32,
                weight_type: TensorType::Q8_0,
                ..Preset::Tiny.spec()
            },
            Preset::Dense => Spec {
                arch: "qwen3",
                n_dense_lead: 2,
                n_layer: 2,
                n_expert: 0,
                n_expert_used: 0,
                n_ff_dense: 96,
                ..Preset::Tiny.spec()
            },
            Preset::TinyAltQk => Spec {
                n_embd: 256,
                head_dim: 64,
                n_layer: 3,
                n_expert: 16,
                n_ff_exp: 256,
                n_ff_dense: 256,
                weight_type: TensorType::F16,
                ..Preset::TinyAlt.spec()
            },
            Preset::Vocab152k => Spec {
                n_layer: 3,
                n_vocab: 151_936,
                tied_output: true,
                ..Preset::WideHidden.spec()
            },
            Preset::Vocab248k => Spec {
                n_vocab: 248_320,
                ..Preset::Vocab152k.spec()
            },
        }
    }
}

/// Builds the tensors of one model; `seed` makes every weight reproducible.
struct Builder<'a> {
    g: GgufWriter,
    seed: u64,
    spec: &'a Spec,
}

impl Builder<'_> {
    /// A matrix `[n_in, n_out, n_mat]` with uniform values scaled by
    /// 1/sqrt(n_in), drawn and encoded a piece at a time (a real-vocabulary
    /// embedding is 500M values: 2 GB as f32).
    fn matrix(&mut self, name: &str, dims: &[usize], gain: f32) {
        const PIECE: usize = 32 * 1024;
        let n: usize = dims.iter().product();
        let scale = gain * (3.0 / dims[0] as f32).sqrt();
        let mut rng = SplitMix64::for_stream(self.seed, name);
        let ty = self.spec.weight_type;
        let mut data = Vec::with_capacity(ty.bytes_for(n));
        let mut piece = Vec::with_capacity(PIECE);
        for start in (0..n).step_by(PIECE) {
            piece.clear();
            piece.extend((start..n.min(start + PIECE)).map(|_| rng.symmetric_f32() * scale));
            encode_into(&piece, ty, &mut data);
        }
        let dims64: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        self.g.tensor(name, &dims64, ty, data);
    }

    /// A norm weight: ones with a little noise (always f32, as llama.cpp expects).
    fn norm(&mut self, name: &str, n: usize) {
        let mut rng = SplitMix64::for_stream(self.seed, name);
        let values: Vec<f32> = (0..n).map(|_| 1.0 + 0.1 * rng.symmetric_f32()).collect();
        self.g.tensor_f32(name, &[n as u64], &values);
    }

    /// The router: rows scaled unevenly so some experts are heavy hitters.
    fn router(&mut self, name: &str) {
        let (n_embd, n_expert) = (self.spec.n_embd, self.spec.n_expert);
        let mut rng = SplitMix64::for_stream(self.seed, name);
        // Sigmoid routers saturate at 1.0 in f32 with large logits; keep them moderate.
        let sharpness = if self.spec.arch == "glm4moe" {
            1.0
        } else {
            4.0
        };
        let scale = sharpness * (3.0 / n_embd as f32).sqrt();
        let mut values = Vec::with_capacity(n_embd * n_expert);
        for e in 0..n_expert {
            let gain = 0.4 + 1.6 * ((e * 7) % n_expert) as f32 / n_expert as f32;
            values.extend((0..n_embd).map(|_| rng.symmetric_f32() * scale * gain));
        }
        // The router stays f32 so routing is not perturbed by quantisation.
        self.g
            .tensor_f32(name, &[n_embd as u64, n_expert as u64], &values);
    }
}

/// Changes to a preset's shape (`None`: the preset's own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Encoding of the weight matrices.
    pub weights: Option<WeightType>,
    /// Tokens in the vocabulary (padded with unused tokens; at least the
    /// learnt vocabulary's few hundred).
    pub n_vocab: Option<usize>,
}

/// Writes the preset's model to `path` (atomically: a temporary file renamed).
pub fn write_model(preset: Preset, seed: u64, path: &Path) -> anyhow::Result<()> {
    write_model_with(preset, seed, Overrides::default(), path)
}

/// [`write_model`] with the weight matrices in `weights` instead of the
/// preset's own encoding.
pub fn write_model_as(
    preset: Preset,
    seed: u64,
    weights: Option<WeightType>,
    path: &Path,
) -> anyhow::Result<()> {
    let o = Overrides {
        weights,
        ..Overrides::default()
    };
    write_model_with(preset, seed, o, path)
}

/// [`write_model`] with the preset's shape changed by `o`; the file is
/// written as it is encoded, never held whole in memory.
pub fn write_model_with(
    preset: Preset,
    seed: u64,
    o: Overrides,
    path: &Path,
) -> anyhow::Result<()> {
    let model = build_model(preset, seed, o);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("gguf.partial");
    let written = std::fs::File::create(&tmp).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        model.write(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()
    });
    written.with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// The GGUF bytes of a preset.
pub fn model_bytes(preset: Preset, seed: u64) -> Vec<u8> {
    model_bytes_as(preset, seed, None)
}

/// The GGUF bytes of a preset with its weight matrices in `weights` (the
/// preset's own encoding when `None`).
pub fn model_bytes_as(preset: Preset, seed: u64, weights: Option<WeightType>) -> Vec<u8> {
    let o = Overrides {
        weights,
        ..Overrides::default()
    };
    build_model(preset, seed, o).to_bytes()
}

/// The metadata and tensors of a preset changed by `o`.
fn build_model(preset: Preset, seed: u64, o: Overrides) -> GgufWriter {
    let mut spec = preset.spec();
    if let Some(w) = o.weights {
        spec.weight_type = w.tensor_type();
    }
    if let Some(n) = o.n_vocab {
        spec.n_vocab = n;
    }
    let mut vocab = vocab::build(spec.n_merges);
    vocab.pad_to(spec.n_vocab);
    let n_vocab = vocab.tokens.len();
    let s = &spec;
    let a = s.arch;
    let mut b = Builder {
        g: GgufWriter::new(),
        seed,
        spec: s,
    };
    let key = |k: &str| format!("{a}.{k}");
    b.g.kv("general.architecture", Value::Str(a.into()))
        .kv(
            "general.name",
            Value::Str(format!("moe-census synthetic {preset:?} seed {seed}")),
        )
        .kv(&key("context_length"), Value::U32(4096))
        .kv(&key("embedding_length"), Value::U32(s.n_embd as u32))
        .kv(&key("block_count"), Value::U32(s.n_layer as u32))
        .kv(
            &key("feed_forward_length"),
            Value::U32(s.n_ff_dense.max(s.n_ff_exp) as u32),
        )
        .kv(&key("attention.head_count"), Value::U32(s.n_head as u32))
        .kv(
            &key("attention.head_count_kv"),
            Value::U32(s.n_head_kv as u32),
        )
        .kv(&key("attention.key_length"), Value::U32(s.head_dim as u32))
        .kv(
            &key("attention.value_length"),
            Value::U32(s.head_dim as u32),
        )
        .kv(&key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .kv(&key("rope.freq_base"), Value::F32(10000.0));
    if s.n_expert > 0 {
        b.g.kv(&key("expert_count"), Value::U32(s.n_expert as u32))
            .kv(
                &key("expert_used_count"),
                Value::U32(s.n_expert_used as u32),
            )
            .kv(
                &key("expert_feed_forward_length"),
                Value::U32(s.n_ff_exp as u32),
            );
    }
    if a == "glm4moe" {
        b.g.kv(
            &key("leading_dense_block_count"),
            Value::U32(s.n_dense_lead as u32),
        )
        .kv(&key("expert_shared_count"), Value::U32(s.n_shared as u32))
        .kv(&key("expert_weights_norm"), Value::Bool(true))
        .kv(&key("expert_weights_scale"), Value::F32(2.5))
        .kv(&key("expert_gating_func"), Value::U32(2))
        .kv(&key("rope.dimension_count"), Value::U32(s.head_dim as u32));
    }
    b.g.kv("tokenizer.ggml.model", Value::Str("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::Str("qwen2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::StrArray(vocab.tokens.clone()),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::I32Array(vocab.token_types.clone()),
        )
        .kv(
            "tokenizer.ggml.merges",
            Value::StrArray(vocab.merges.clone()),
        )
        .kv(
            "tokenizer.ggml.bos_token_id",
            Value::U32(vocab.special_id("<|endoftext|>")),
        )
        .kv(
            "tokenizer.ggml.eos_token_id",
            Value::U32(vocab.special_id("<|im_end|>")),
        )
        .kv(
            "tokenizer.ggml.padding_token_id",
            Value::U32(vocab.special_id("<|endoftext|>")),
        )
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .kv("tokenizer.chat_template", Value::Str(CHAT_TEMPLATE.into()));

    let (e, hd) = (s.n_embd, s.head_dim);
    b.matrix("token_embd.weight", &[e, n_vocab], 3.0);
    b.norm("output_norm.weight", e);
    if !s.tied_output {
        b.matrix("output.weight", &[e, n_vocab], 1.0);
    }
    for i in 0..s.n_layer {
        let t = |n: &str| format!("blk.{i}.{n}.weight");
        b.norm(&t("attn_norm"), e);
        b.matrix(&t("attn_q"), &[e, s.n_head * hd], 1.0);
        b.matrix(&t("attn_k"), &[e, s.n_head_kv * hd], 1.0);
        b.matrix(&t("attn_v"), &[e, s.n_head_kv * hd], 1.0);
        b.matrix(&t("attn_output"), &[s.n_head * hd, e], 1.0);
        if a.starts_with("qwen3") {
            b.norm(&t("attn_q_norm"), hd);
            b.norm(&t("attn_k_norm"), hd);
            b.norm(&t("ffn_norm"), e);
        } else {
            b.norm(&t("post_attention_norm"), e);
        }
        if i < s.n_dense_lead {
            b.matrix(&t("ffn_gate"), &[e, s.n_ff_dense], 1.0);
            b.matrix(&t("ffn_up"), &[e, s.n_ff_dense], 1.0);
            b.matrix(&t("ffn_down"), &[s.n_ff_dense, e], 1.0);
            continue;
        }
        b.router(&t("ffn_gate_inp"));
        b.matrix(&t("ffn_gate_exps"), &[e, s.n_ff_exp, s.n_expert], 1.0);
        b.matrix(&t("ffn_up_exps"), &[e, s.n_ff_exp, s.n_expert], 1.0);
        b.matrix(&t("ffn_down_exps"), &[s.n_ff_exp, e, s.n_expert], 1.0);
        if s.n_shared > 0 {
            let w = s.n_ff_exp * s.n_shared;
            b.matrix(&t("ffn_gate_shexp"), &[e, w], 1.0);
            b.matrix(&t("ffn_up_shexp"), &[e, w], 1.0);
            b.matrix(&t("ffn_down_shexp"), &[w, e], 1.0);
        }
        if a == "glm4moe" {
            let name = format!("blk.{i}.exp_probs_b.bias");
            let mut rng = SplitMix64::for_stream(seed, &name);
            let bias: Vec<f32> = (0..s.n_expert)
                .map(|_| 0.05 * rng.symmetric_f32())
                .collect();
            b.g.tensor_f32(&name, &[s.n_expert as u64], &bias);
        }
    }
    b.g
}
