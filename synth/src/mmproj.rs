//! `worker synth-mmproj`: a deterministic, small but real `mmproj` GGUF (a
//! CLIP-style vision transformer and a LLaVA `mlp` projector) that llama.cpp's
//! mtmd loads beside any generated text model: the projector's output width
//! is the text model's hidden size, read from its GGUF.
//!
//! Names and keys are those `tools/mtmd/clip.cpp` reads (`clip-impl.h`):
//! `v.patch_embd`, `v.position_embd`, `v.pre_ln`, `v.blk.N.{attn_q,attn_k,
//! attn_v,attn_out,ln1,ln2,ffn_up,ffn_down}` and `mm.0` / `mm.2`. With the
//! `mlp` projector mtmd resizes (and pads) every image to `image_size`
//! squared, so an image always becomes `(image_size / patch_size)^2`
//! positions, and its encoder runs the first `n_layer - 1` blocks (LLaVA's
//! second-to-last feature layer).

use super::weights::{random_matrix, random_vector};
use crate::error::SynthError;
use gguf::read::GgufReader;
use gguf::write::{GgufWriter, TensorType, Value};
use std::path::Path;

/// Shape of the generated vision encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmprojSpec {
    /// Side of the square image the encoder sees, in pixels.
    pub image_size: usize,
    /// Side of one patch, in pixels.
    pub patch_size: usize,
    /// Hidden size of the encoder.
    pub n_embd: usize,
    /// Attention heads of the encoder.
    pub n_head: usize,
    /// Width of the encoder's FFN.
    pub n_ff: usize,
    /// Encoder blocks in the file (mtmd runs all but the last).
    pub n_layer: usize,
    /// Output width of the projector: the text model's hidden size.
    pub n_embd_text: usize,
    /// The text model's image channel ([`super::vision`]), to which the
    /// projector adds [`super::vision::IMAGE_BIAS`]; `None` for a model
    /// without vision experts.
    pub image_channel: Option<usize>,
}

impl MmprojSpec {
    /// The default shape: 32x32 images in 8x8 patches (16 positions per
    /// image), hidden 32, 3 blocks, projecting to `n_embd_text`.
    pub fn tiny(n_embd_text: usize) -> MmprojSpec {
        MmprojSpec {
            image_size: 32,
            patch_size: 8,
            n_embd: 32,
            n_head: 4,
            n_ff: 64,
            n_layer: 3,
            n_embd_text,
            image_channel: None,
        }
    }

    /// [`MmprojSpec::tiny`] for the text model GGUF `model`: its hidden
    /// size, and its image channel when it has vision experts.
    pub fn for_model(model: &Path) -> Result<MmprojSpec, SynthError> {
        let r = GgufReader::open(model)?;
        let channel = r
            .header
            .get(super::vision::CHANNEL_KEY)
            .and_then(|v| v.as_u64());
        Ok(MmprojSpec {
            image_channel: channel.map(|c| c as usize),
            ..MmprojSpec::tiny(text_hidden_size(model)?)
        })
    }

    /// Positions one image becomes in the text model: one per patch (the
    /// `mlp` projector neither merges patches nor adds markers).
    pub fn positions_per_image(&self) -> usize {
        (self.image_size / self.patch_size).pow(2)
    }
}

/// The hidden size of a text model GGUF (`{general.architecture}.embedding_length`).
pub fn text_hidden_size(model: &Path) -> Result<usize, SynthError> {
    let r = GgufReader::open(model)?;
    let h = &r.header;
    let missing = |key: String| SynthError::MissingKey {
        path: model.display().to_string(),
        key,
    };
    let arch = h
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| missing("general.architecture".to_string()))?;
    let key = format!("{arch}.embedding_length");
    let n = h
        .get(&key)
        .and_then(|v| v.as_u64())
        .ok_or_else(|| missing(key))?;
    Ok(n as usize)
}

/// Writes the mmproj of `spec` to `path` (atomically), weights from `seed`.
pub fn write_mmproj(spec: &MmprojSpec, seed: u64, path: &Path) -> Result<(), SynthError> {
    super::write_gguf(&build(spec, seed), path)
}

/// The GGUF bytes of the mmproj of `spec`.
pub fn mmproj_bytes(spec: &MmprojSpec, seed: u64) -> Vec<u8> {
    build(spec, seed).to_bytes()
}

struct Weights<'a> {
    g: &'a mut GgufWriter,
    seed: u64,
}

impl Weights<'_> {
    /// A matrix `[n_in, n_out]` (any dims), uniform with unit gain on `fan_in`.
    fn matrix(&mut self, name: &str, dims: &[usize], fan_in: usize) {
        let scale = (3.0 / fan_in as f32).sqrt();
        let data = random_matrix(self.seed, name, dims, scale, TensorType::F32);
        let dims64: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        self.g.tensor(name, &dims64, TensorType::F32, data);
    }

    fn vector(&mut self, name: &str, n: usize, center: f32, spread: f32) {
        let values = random_vector(self.seed, name, n, center, spread);
        self.g.tensor_f32(name, &[n as u64], &values);
    }

    /// A linear layer: `{name}.weight [n_in, n_out]` and `{name}.bias [n_out]`.
    fn linear(&mut self, name: &str, n_in: usize, n_out: usize) {
        self.linear_shifted(name, n_in, n_out, None);
    }

    /// [`Weights::linear`] with `shift.1` added to the bias of output
    /// channel `shift.0`.
    fn linear_shifted(
        &mut self,
        name: &str,
        n_in: usize,
        n_out: usize,
        shift: Option<(usize, f32)>,
    ) {
        self.matrix(&format!("{name}.weight"), &[n_in, n_out], n_in);
        let bias = format!("{name}.bias");
        let mut values = random_vector(self.seed, &bias, n_out, 0.0, 0.05);
        if let Some((channel, by)) = shift {
            values[channel] += by;
        }
        self.g.tensor_f32(&bias, &[n_out as u64], &values);
    }

    /// A layer norm: weight near one, bias near zero.
    fn layer_norm(&mut self, name: &str, n: usize) {
        self.vector(&format!("{name}.weight"), n, 1.0, 0.1);
        self.vector(&format!("{name}.bias"), n, 0.0, 0.05);
    }
}

fn build(s: &MmprojSpec, seed: u64) -> GgufWriter {
    let mut g = GgufWriter::new();
    let u = |v: usize| Value::U32(v as u32);
    g.kv("general.architecture", Value::Str("clip".into()))
        .kv(
            "general.name",
            Value::Str(format!("moe-census synthetic mmproj seed {seed}")),
        )
        .kv("clip.has_vision_encoder", Value::Bool(true))
        .kv("clip.projector_type", Value::Str("mlp".into()))
        .kv("clip.use_gelu", Value::Bool(true))
        .kv("clip.vision.image_size", u(s.image_size))
        .kv("clip.vision.patch_size", u(s.patch_size))
        .kv("clip.vision.embedding_length", u(s.n_embd))
        .kv("clip.vision.feed_forward_length", u(s.n_ff))
        .kv("clip.vision.block_count", u(s.n_layer))
        .kv("clip.vision.projection_dim", u(s.n_embd_text))
        .kv("clip.vision.attention.head_count", u(s.n_head))
        .kv("clip.vision.attention.layer_norm_epsilon", Value::F32(1e-6))
        .kv("clip.vision.image_mean", Value::F32Array(vec![0.5; 3]))
        .kv("clip.vision.image_std", Value::F32Array(vec![0.5; 3]));
    let mut w = Weights { g: &mut g, seed };
    let (e, p) = (s.n_embd, s.patch_size);
    // ggml's conv_2d kernel: [kernel w, kernel h, input channels, output channels].
    w.matrix("v.patch_embd.weight", &[p, p, 3, e], p * p * 3);
    w.vector("v.patch_embd.bias", e, 0.0, 0.05);
    let n_patches = s.positions_per_image();
    w.matrix("v.position_embd.weight", &[e, n_patches], e);
    w.layer_norm("v.pre_ln", e);
    for i in 0..s.n_layer {
        let t = |k: &str| format!("v.blk.{i}.{k}");
        w.layer_norm(&t("ln1"), e);
        for k in ["attn_q", "attn_k", "attn_v", "attn_out"] {
            w.linear(&t(k), e, e);
        }
        w.layer_norm(&t("ln2"), e);
        w.linear(&t("ffn_up"), e, s.n_ff);
        w.linear(&t("ffn_down"), s.n_ff, e);
    }
    w.linear("mm.0", e, s.n_embd_text);
    // The image channel of a model with vision experts is raised on every
    // image position.
    let shift = s.image_channel.map(|c| (c, super::vision::IMAGE_BIAS));
    w.linear_shifted("mm.2", s.n_embd_text, s.n_embd_text, shift);
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::read::GgufReader;

    #[test]
    fn same_seed_same_bytes_and_projector_matches_text_width() {
        let spec = MmprojSpec::tiny(64);
        let a = mmproj_bytes(&spec, 7);
        assert_eq!(a, mmproj_bytes(&spec, 7));
        assert_ne!(a, mmproj_bytes(&spec, 8));
        let r = GgufReader::new(std::io::Cursor::new(a), "<memory>").unwrap();
        let mm2 = r.header.tensor("mm.2.weight").unwrap();
        assert_eq!(mm2.dims, vec![64, 64]);
        let blocks = r.header.get("clip.vision.block_count").unwrap();
        assert_eq!(blocks.as_u64(), Some(3));
        assert_eq!(spec.positions_per_image(), 16);
    }
}
