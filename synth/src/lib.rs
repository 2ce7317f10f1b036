//! Test models and data, generated here without llama.cpp (the `worker
//! synth-*` commands are a thin front over it; no other product crate
//! depends on it). Models: deterministic, small but real MoE GGUF models, one
//! preset per MoE family llama.cpp runs, with that family's tensor layout
//! (DESIGN section 3's routing variants). [`layout`] knows each family's
//! metadata and tensors; [`builder`] makes the random weights.
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
//! - [`Preset::RealWidth`]: that hidden size and routing with the real
//!   expert width (512) in 4 MoE layers, so a layer's whole forward costs
//!   what it costs in production (the lookahead's share is measured on it).
//! - [`Preset::Dense`]: a dense qwen3 model, for the "no MoE layers" error.
//! - [`Preset::TinyAltQk`]: `tiny-alt`'s architecture with hidden size and
//!   expert width 256, so llama.cpp's k-quants (blocks of 256) apply to the
//!   expert matrices and a quantised model can be made with its quantizer.
//! - One preset per other family: gpt-oss, llama4 (plain and interleaved),
//!   deepseek2 (V3: MLA, groups, sigmoid with bias; V2: softmax without a
//!   gating key), glm4moe with an MTP block, qwen3next (with and without
//!   MTP), qwen35moe, granitemoe, mixtral, qwen2moe and minimax-m2.
//! - [`Preset::Vocab152k`], [`Preset::Vocab248k`]: the real vocabularies
//!   (151,936: Qwen3 and Qwen3-Next; 248,320: Qwen3.5) at the real hidden
//!   size (2,048) and routing (512 experts, top-10) in 3 MoE layers, Q8_0,
//!   so the output head and logits rows have their real size (benchmarks).
//!
//! [`chunks`] makes synthetic token chunks for the benchmarks; [`fake`] the
//! partials of a stand-in engine for protocol tests; [`corpus`]
//! a synthetic text corpus; [`images`] the bundled image sample; [`mmproj`] a vision encoder and projector that
//! mtmd loads beside a generated model.

mod builder;
pub mod chunks;
pub mod corpus;
mod error;
pub mod fake;
pub mod images;
mod layout;
pub mod mmproj;
pub mod vision;
mod vocab;
mod weights;

use builder::Builder;
pub use error::SynthError;
use gguf::write::{GgufWriter, TensorType, Value};
use std::path::{Path, PathBuf};

pub use vocab::{byte_to_unicode, CHAT_TEMPLATE, SPECIAL_TOKENS};

/// Which model to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// qwen3moe at Qwen3-Next's routing width: 4 MoE layers, 512 experts,
    /// top-10, hidden 2048, expert width 512, Q8_0 (about 6.8 GB); for
    /// costs that scale with the real per-layer work (the lookahead's).
    RealWidth,
    /// qwen3 without experts: a valid model that the collector must refuse.
    Dense,
    /// glm4moe like `tiny-alt` (1 dense + 2 MoE layers, 16 experts, top-4)
    /// with hidden size and expert width 256, f16: every expert row is a
    /// whole number of k-quant blocks.
    TinyAltQk,
    /// gpt-oss: softmax over the selected logits, router and expert biases,
    /// attention sinks; 3 MoE layers, 16 experts, top-4.
    GptOss,
    /// llama4: sigmoid gate on the expert input, an ungated shared expert;
    /// 4 MoE layers, 16 experts, top-1.
    Llama4,
    /// llama4 with `interleave_moe_layer_step = 2` (Maverick): blocks 1 and
    /// 3 of 4 are MoE, 0 and 2 dense.
    Llama4Interleaved,
    /// deepseek2 as DeepSeek-V3: MLA attention, 1 dense + 3 MoE layers, 32
    /// experts in 4 groups (2 used), top-4, sigmoid with a selection bias,
    /// normalised weights scaled by 2.5, a shared expert.
    Deepseek2,
    /// deepseek2 as DeepSeek-V2: MLA, no `expert_gating_func` key (llama.cpp
    /// runs softmax), unnormalised weights, 16 experts, top-4.
    Deepseek2V2,
    /// `deepseek2` with softmax gating (`expert_gating_func = 1`) and its
    /// selection bias: a pruned model's softmax runs over the kept experts,
    /// which can reorder them against the bias.
    Deepseek2Softmax,
    /// glm4moe with an MTP (NextN) block: 1 dense + 2 MoE layers and block 3
    /// as NextN, 16 experts, top-4.
    Glm4moeMtp,
    /// qwen3next: gated DeltaNet and attention layers (3 + 1), softmax
    /// routing, a sigmoid-gated shared expert; 16 experts, top-4.
    Qwen3next,
    /// qwen3next with an MTP block after its 4 layers.
    Qwen3nextMtp,
    /// qwen35moe: Qwen3.5's hybrid layout (separate DeltaNet beta and alpha
    /// projections, multi-section RoPE); 16 experts, top-4.
    Qwen35moe,
    /// qwen35moe with each expert's gate and up projections fused in one
    /// tensor (`ffn_gate_up_exps`, gate rows first), hidden size and expert
    /// width 256: every expert row is a whole number of k-quant blocks.
    Qwen35moeFused,
    /// granitemoe: softmax top-k with logit, residual and embedding scales;
    /// 16 experts, top-4.
    Granitemoe,
    /// mixtral (llama.cpp's `llama` with experts): 8 experts, top-2.
    Mixtral,
    /// qwen2moe: softmax, unnormalised weights, a sigmoid-gated shared
    /// expert; 16 experts, top-4.
    Qwen2moe,
    /// minimax-m2: sigmoid with a selection bias, per-head q/k norms over
    /// all heads; 16 experts, top-4.
    MinimaxM2,
    /// qwen3moe with Qwen3's vocabulary size (151,936), hidden 2048, 3 MoE
    /// layers, 512 experts, top-10, expert width 32, Q8_0, tied embeddings.
    Vocab152k,
    /// `vocab-152k` with Qwen3.5's vocabulary size (248,320).
    Vocab248k,
}

/// Encoding of a generated model's weight matrices (norms and routers stay
/// f32), to test that slicing and loading work for more than f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 8-bit blocks of 32 with an f16 scale.
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
    /// Blocks a decode runs (NextN blocks come on top).
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
    /// Every `moe_step`-th block is an MoE block (llama4's
    /// `interleave_moe_layer_step`); 1: all after the leading dense ones.
    pub moe_step: usize,
    /// NextN / MTP blocks after the last layer (`nextn_predict_layers`).
    pub n_nextn: usize,
    /// Routing groups `(expert_group_count, expert_group_used_count)`;
    /// `(0, 0)`: plain top-k.
    pub groups: (usize, usize),
    /// `{arch}.expert_gating_func` as written (None: the key is absent).
    pub gating_key: Option<u32>,
    /// Tokens in the vocabulary: unused tokens pad the learnt ones up to
    /// it (0: the learnt vocabulary, a few hundred tokens).
    pub n_vocab: usize,
    /// The output head reuses the token embedding (no `output.weight`), as
    /// in many real models; it halves the file at a large vocabulary.
    pub tied_output: bool,
    /// The last this many experts of every MoE layer are routed to on image
    /// positions only ([`vision`]); 0 for none.
    pub vision_experts: usize,
    /// Routed experts' gate and up projections as one `ffn_gate_up_exps`
    /// tensor `[n_embd, 2 * n_ff_exp, n_expert]`, gate rows first.
    pub fused_gate_up: bool,
}

impl Spec {
    /// Whether block `i` has routed experts.
    pub fn is_moe(&self, i: usize) -> bool {
        self.n_expert > 0 && i >= self.n_dense_lead && (i + 1).is_multiple_of(self.moe_step.max(1))
    }

    /// Routers gated by a sigmoid get milder logits (f32 sigmoids saturate).
    fn sigmoid_router(&self) -> bool {
        self.gating_key == Some(2) || self.arch == "llama4"
    }
}

impl Preset {
    /// The preset's shape.
    pub fn spec(self) -> Spec {
        let tiny = Spec {
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
            moe_step: 1,
            n_nextn: 0,
            groups: (0, 0),
            gating_key: None,
            n_vocab: 0,
            tied_output: false,
            vision_experts: 0,
            fused_gate_up: false,
        };
        let tiny_alt = Spec {
            arch: "glm4moe",
            n_layer: 4,
            n_dense_lead: 1,
            n_expert: 24,
            n_ff_dense: 96,
            n_shared: 1,
            gating_key: Some(2),
            ..tiny.clone()
        };
        match self {
            Preset::Tiny => tiny,
            Preset::TinyAlt => tiny_alt,
            Preset::Bench => Spec {
                n_embd: 512,
                n_head: 8,
                n_head_kv: 4,
                head_dim: 64,
                n_layer: 8,
                n_expert: 64,
                n_expert_used: 8,
                n_ff_exp: 256,
                weight_type: TensorType::Q8_0,
                ..tiny
            },
            Preset::Wide => Spec {
                n_layer: 48,
                n_expert: 512,
                n_expert_used: 10,
                n_ff_exp: 16,
                // f16 halves the file (~150 MB); Q8_0 needs rows of 32 and the
                // down projection's rows are 16 wide.
                weight_type: TensorType::F16,
                ..tiny
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
                ..tiny
            },
            Preset::Dense => Spec {
                arch: "qwen3",
                n_dense_lead: 2,
                n_layer: 2,
                n_expert: 0,
                n_expert_used: 0,
                n_ff_dense: 96,
                ..tiny
            },
            Preset::TinyAltQk => Spec {
                n_embd: 256,
                head_dim: 64,
                n_layer: 3,
                n_expert: 16,
                n_ff_exp: 256,
                n_ff_dense: 256,
                weight_type: TensorType::F16,
                ..tiny_alt
            },
            Preset::GptOss => Spec {
                arch: "gpt-oss",
                ..tiny
            },
            // llama4 needs 4 blocks: its 4th is the first without RoPE, the
            // only one that reads the attention temperature input.
            Preset::Llama4 => Spec {
                arch: "llama4",
                n_layer: 4,
                n_expert_used: 1,
                n_ff_dense: 96,
                n_shared: 1,
                ..tiny
            },
            Preset::Llama4Interleaved => Spec {
                moe_step: 2,
                ..Preset::Llama4.spec()
            },
            Preset::Deepseek2 => Spec {
                arch: "deepseek2",
                n_head_kv: 1,
                n_layer: 4,
                n_dense_lead: 1,
                n_expert: 32,
                n_ff_dense: 96,
                n_shared: 1,
                groups: (4, 2),
                gating_key: Some(2),
                ..tiny
            },
            Preset::Deepseek2Softmax => Spec {
                gating_key: Some(1),
                ..Preset::Deepseek2.spec()
            },
            Preset::Deepseek2V2 => Spec {
                n_expert: 16,
                groups: (0, 0),
                gating_key: None,
                ..Preset::Deepseek2.spec()
            },
            Preset::Glm4moeMtp => Spec {
                n_layer: 3,
                n_expert: 16,
                n_nextn: 1,
                ..tiny_alt
            },
            Preset::Qwen3next => Spec {
                arch: "qwen3next",
                n_layer: 4,
                n_shared: 1,
                ..tiny
            },
            Preset::Qwen3nextMtp => Spec {
                n_nextn: 1,
                ..Preset::Qwen3next.spec()
            },
            Preset::Qwen35moe => Spec {
                arch: "qwen35moe",
                ..Preset::Qwen3next.spec()
            },
            Preset::Qwen35moeFused => Spec {
                n_embd: 256,
                n_ff_exp: 256,
                fused_gate_up: true,
                ..Preset::Qwen35moe.spec()
            },
            Preset::Granitemoe => Spec {
                arch: "granitemoe",
                ..tiny
            },
            Preset::Mixtral => Spec {
                arch: "llama",
                n_expert: 8,
                n_expert_used: 2,
                ..tiny
            },
            Preset::Qwen2moe => Spec {
                arch: "qwen2moe",
                n_shared: 1,
                ..tiny
            },
            Preset::RealWidth => Spec {
                n_layer: 4,
                n_ff_exp: 512,
                ..Preset::WideHidden.spec()
            },
            Preset::MinimaxM2 => Spec {
                arch: "minimax-m2",
                gating_key: Some(2),
                ..tiny
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

/// Changes to a preset's shape (`None`: the preset's own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Encoding of the weight matrices.
    pub weights: Option<WeightType>,
    /// Tokens in the vocabulary (padded with unused tokens; at least the
    /// learnt vocabulary's few hundred).
    pub n_vocab: Option<usize>,
    /// Experts of every MoE layer routed to on image positions only
    /// ([`vision`]).
    pub vision_experts: Option<usize>,
}

/// Writes the preset's model to `path` (atomically: a temporary file renamed).
pub fn write_model(preset: Preset, seed: u64, path: &Path) -> Result<(), SynthError> {
    write_model_with(preset, seed, Overrides::default(), path)
}

/// [`write_model`] with the weight matrices in `weights` instead of the
/// preset's own encoding.
pub fn write_model_as(
    preset: Preset,
    seed: u64,
    weights: Option<WeightType>,
    path: &Path,
) -> Result<(), SynthError> {
    let o = Overrides {
        weights,
        ..Overrides::default()
    };
    write_model_with(preset, seed, o, path)
}

/// [`write_model`] with the preset's shape changed by `o`; the file is
/// written from the encoded tensors, never copied whole into one buffer.
pub fn write_model_with(
    preset: Preset,
    seed: u64,
    o: Overrides,
    path: &Path,
) -> Result<(), SynthError> {
    write_gguf(&checked_model(preset, seed, o)?, path)
}

/// [`write_model_with`] as `count` split files in llama.cpp's `gguf-split`
/// layout, named after `path` (`m.gguf`: `m-00001-of-00003.gguf`, ...),
/// the way large models are published; returns the first file's path, the
/// one llama.cpp (and every command here) is given.
pub fn write_model_split(
    preset: Preset,
    seed: u64,
    o: Overrides,
    path: &Path,
    count: u16,
) -> Result<PathBuf, SynthError> {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let file = |i: u16| path.with_file_name(gguf::split::shard_name(&stem, i, count));
    let shards = checked_model(preset, seed, o)?.into_shards(count);
    for (i, shard) in (0..).zip(&shards) {
        write_gguf(shard, &file(i))?;
    }
    Ok(file(0))
}

/// The preset's model changed by `o`, refusing overrides it cannot take.
fn checked_model(preset: Preset, seed: u64, o: Overrides) -> Result<GgufWriter, SynthError> {
    let spec = preset.spec();
    if let Some(n) = o.vision_experts {
        if n + spec.n_expert_used > spec.n_expert || spec.n_embd <= 2 {
            return Err(SynthError::VisionExperts {
                requested: n,
                preset: format!("{preset:?}"),
                n_expert: spec.n_expert,
                n_expert_used: spec.n_expert_used,
            });
        }
    }
    Ok(build_model(preset, seed, o))
}

/// Writes `g` to `path` atomically (a temporary file renamed), creating
/// the parent directory; the file is written from the encoded tensors,
/// never copied whole into one buffer.
fn write_gguf(g: &GgufWriter, path: &Path) -> Result<(), SynthError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(SynthError::creating(dir))?;
    }
    let tmp = path.with_extension("gguf.partial");
    let written = std::fs::File::create(&tmp).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        g.write(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()
    });
    written.map_err(SynthError::writing(&tmp))?;
    std::fs::rename(&tmp, path).map_err(SynthError::renaming_to(path))?;
    Ok(())
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
    if let Some(n) = o.vision_experts {
        spec.vision_experts = n;
    }
    let mut vocab = vocab::build(spec.n_merges);
    vocab.pad_to(spec.n_vocab);
    let mut b = Builder {
        g: GgufWriter::new(),
        seed,
        spec: &spec,
    };
    b.g.kv("general.architecture", Value::Str(spec.arch.into()))
        .kv(
            "general.name",
            Value::Str(format!("moe-census synthetic {preset:?} seed {seed}")),
        );
    layout::metadata(&mut b);
    if spec.vision_experts > 0 {
        let (image, _) = vision::channels(spec.n_embd);
        b.g.kv(vision::CHANNEL_KEY, Value::U32(image as u32));
    }
    vocab::write_tokenizer(&mut b.g, &vocab);
    layout::tensors(&mut b, vocab.tokens.len());
    b.g
}
