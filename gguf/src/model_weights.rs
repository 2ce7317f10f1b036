//! The importance-matrix entries a model defines, read from its GGUF
//! headers (every file of a split model): what a coordinator accepts from a
//! worker and what `verify` expects of a run's `imatrix.gguf`.
//!
//! A worker measures the input of every `MUL_MAT` whose weight is a model
//! tensor named `blk.*` and of every `MUL_MAT_ID` (stacked experts, also
//! `blk.*`), so an entry names one of the model's `blk.*` tensors, with
//! `n_in = ne[0]` (the matmul's shared dimension) and `n_mat = ne[2] * ne[3]`
//! (the matrices of a stack, or the heads of a per-head weight). Which of
//! those tensors a graph multiplies is llama.cpp's business, so only the
//! ones every block surely multiplies are required: the router
//! (`ffn_gate_inp`) and the stacked expert weights of each MoE layer, and
//! of every block but the NextN ones (which llama.cpp's graph skips) the
//! dense weights every token passes through ([`DENSE_WEIGHTS`]).

use crate::read::TensorInfo;
use std::collections::BTreeMap;
use std::path::Path;

/// llama.cpp's `GGML_MAX_NAME`: a tensor name and its terminating NUL.
pub const GGML_MAX_NAME: usize = 64;

/// Longest importance-matrix entry name: `<name>.in_sum2`, the longest
/// tensor name the imatrix file gives it, must fit [`GGML_MAX_NAME`], or
/// llama.cpp's GGUF loader refuses the file.
pub const MAX_ENTRY_NAME: usize = GGML_MAX_NAME - 1 - ".in_sum2".len();

/// The stacked expert weights of a MoE block (one matrix per expert,
/// multiplied by `MUL_MAT_ID`), as `blk.L.<name>.weight`.
pub const EXPERT_STACKS: [&str; 4] = [
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "ffn_gate_up_exps",
];

/// The weights of a block that every token of it passes through, each
/// multiplied by a `MUL_MAT` wherever llama.cpp's graphs have it: the
/// attention projections, a dense feed-forward network and a MoE block's
/// shared expert, as `blk.L.<name>.weight`.
pub const DENSE_WEIGHTS: [&str; 11] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_qkv",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "ffn_gate_shexp",
    "ffn_up_shexp",
    "ffn_down_shexp",
];

/// The shape of an importance-matrix entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryShape {
    /// Input columns (`ne[0]` of the weight).
    pub n_in: u32,
    /// Matrices (`ne[2] * ne[3]`: experts of a stack, heads, else 1).
    pub n_mat: u32,
}

/// The entries a model defines: its `blk.*` tensors with their shapes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelWeights {
    shapes: BTreeMap<String, EntryShape>,
    /// The first NextN block (`block_count - nextn_predict_layers`), which
    /// llama.cpp's graph skips with every block after it; `None`: none.
    nextn_from: Option<u32>,
}

impl ModelWeights {
    /// The entries of the model whose first (or only) file is `path`; the
    /// error names the file.
    pub fn read(path: &Path) -> Result<ModelWeights, String> {
        let joined = crate::split::open_joined(path).map_err(|e| format!("model {e}"))?;
        let header = &joined.header;
        let num = |key: &str| {
            let arch = header.get("general.architecture")?.as_str()?;
            header.get(&format!("{arch}.{key}"))?.as_u64()
        };
        let nextn_from = match (num("block_count"), num("nextn_predict_layers")) {
            (Some(blocks), Some(n)) if n > 0 => u32::try_from(blocks.saturating_sub(n)).ok(),
            _ => None,
        };
        Ok(ModelWeights {
            nextn_from,
            ..ModelWeights::from_tensors(&header.tensors)
        })
    }

    /// The entries of a model with `tensors`: each `blk.*` tensor whose
    /// shape fits an entry and whose name fits [`MAX_ENTRY_NAME`] (a
    /// longer one cannot be written to an imatrix file llama.cpp reads).
    pub fn from_tensors(tensors: &[TensorInfo]) -> ModelWeights {
        let shapes = tensors
            .iter()
            .filter(|t| t.name.starts_with("blk.") && t.name.len() <= MAX_ENTRY_NAME)
            .filter_map(|t| Some((t.name.clone(), shape_of(&t.dims)?)))
            .collect();
        ModelWeights {
            shapes,
            nextn_from: None,
        }
    }

    /// The shape of entry `name`, when the model defines it.
    pub fn shape(&self, name: &str) -> Option<EntryShape> {
        self.shapes.get(name).copied()
    }

    /// Every entry the model defines, by name.
    pub fn shapes(&self) -> &BTreeMap<String, EntryShape> {
        &self.shapes
    }

    /// The entries every honest result measures when its MoE layers are
    /// `moe_layers`: each layer's router and stacked expert weights that
    /// the model has.
    pub fn required(&self, moe_layers: &[u32]) -> Vec<String> {
        moe_layers
            .iter()
            .flat_map(|l| {
                std::iter::once("ffn_gate_inp")
                    .chain(EXPERT_STACKS)
                    .map(move |t| format!("blk.{l}.{t}.weight"))
            })
            .filter(|n| self.shapes.contains_key(n))
            .collect()
    }

    /// The dense weights ([`DENSE_WEIGHTS`]) the model has outside its
    /// NextN blocks: every result with tokens measures them all.
    pub fn required_dense(&self) -> Vec<String> {
        self.shapes
            .keys()
            .filter(|name| {
                block_tensor(name).is_some_and(|(layer, stem)| {
                    DENSE_WEIGHTS.contains(&stem) && self.nextn_from.is_none_or(|n| layer < n)
                })
            })
            .cloned()
            .collect()
    }

    /// Whether block `layer` has a router (`blk.L.ffn_gate_inp.weight`):
    /// a MoE layer of the model.
    pub fn has_router(&self, layer: u32) -> bool {
        self.shapes
            .contains_key(&format!("blk.{layer}.ffn_gate_inp.weight"))
    }
}

/// The block of a stacked expert weight (`blk.L.ffn_*_exps.weight`), whose
/// counts per expert are the tokens routed to that expert.
pub fn expert_stack_layer(name: &str) -> Option<u32> {
    block_tensor(name).and_then(|(layer, stem)| EXPERT_STACKS.contains(&stem).then_some(layer))
}

/// `(L, name)` of a weight `blk.L.<name>.weight`.
fn block_tensor(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, tensor) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    Some((layer, tensor.strip_suffix(".weight")?))
}

/// `(ne[0], ne[2] * ne[3])` of a tensor of up to four dimensions, when both fit.
fn shape_of(dims: &[u64]) -> Option<EntryShape> {
    if dims.is_empty() || dims.len() > 4 {
        return None;
    }
    let n_in = u32::try_from(dims[0]).ok().filter(|&n| n > 0)?;
    let n_mat = dims
        .iter()
        .skip(2)
        .try_fold(1u64, |a, &d| a.checked_mul(d))?;
    let n_mat = u32::try_from(n_mat).ok().filter(|&n| n > 0)?;
    Some(EntryShape { n_in, n_mat })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::{GgufWriter, Value};

    #[test]
    fn entries_are_the_blk_tensors_with_their_shapes_and_the_moe_ones_are_required() {
        let mut g = GgufWriter::new();
        g.kv("general.architecture", Value::Str("qwen3moe".into()));
        let long = format!("blk.0.{}.weight", "x".repeat(50));
        for (name, dims) in [
            ("token_embd.weight", vec![8u64, 100]),
            ("blk.0.attn_norm.weight", vec![8]),
            ("blk.0.attn_k_b.weight", vec![4, 16, 3]),
            ("blk.0.ffn_gate_inp.weight", vec![8, 4]),
            ("blk.0.ffn_up_exps.weight", vec![8, 6, 4]),
            ("blk.0.ffn_down_exps.weight", vec![6, 8, 4]),
            ("blk.1.attn_q.weight", vec![8, 8]),
            (long.as_str(), vec![8, 8]),
        ] {
            let n = dims.iter().product::<u64>() as usize;
            g.tensor_f32(name, &dims, &vec![0.0; n]);
        }
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("m.gguf");
        std::fs::write(&path, g.to_bytes()).unwrap();
        let w = ModelWeights::read(&path).unwrap();
        let shape = |n_in, n_mat| Some(EntryShape { n_in, n_mat });
        assert_eq!(w.shape("blk.0.attn_norm.weight"), shape(8, 1));
        assert_eq!(w.shape("blk.0.attn_k_b.weight"), shape(4, 3));
        assert_eq!(w.shape("blk.0.ffn_up_exps.weight"), shape(8, 4));
        assert_eq!(w.shape("token_embd.weight"), None, "not a block weight");
        assert_eq!(w.shape(&long), None, "{} characters", long.len());
        assert_eq!(w.shapes().len(), 6);
        assert_eq!(
            w.required(&[0, 1]),
            [
                "blk.0.ffn_gate_inp.weight",
                "blk.0.ffn_up_exps.weight",
                "blk.0.ffn_down_exps.weight"
            ]
        );
        assert_eq!(w.required_dense(), ["blk.1.attn_q.weight"]);
        assert!(w.has_router(0) && !w.has_router(1));
        assert_eq!(expert_stack_layer("blk.12.ffn_down_exps.weight"), Some(12));
        assert_eq!(expert_stack_layer("blk.12.ffn_down_exps.bias"), None);
        assert_eq!(expert_stack_layer("blk.12.ffn_down.weight"), None);
        // A NextN block (the last of block_count) is not required.
        let mut g = GgufWriter::new();
        g.kv("general.architecture", Value::Str("glm4moe".into()))
            .kv("glm4moe.block_count", Value::U32(2))
            .kv("glm4moe.nextn_predict_layers", Value::U32(1));
        for name in [
            "blk.0.attn_k.weight",
            "blk.1.attn_k.weight",
            "blk.0.attn_k_norm.weight",
        ] {
            g.tensor_f32(name, &[4, 4], &[0.0; 16]);
        }
        std::fs::write(&path, g.to_bytes()).unwrap();
        let w = ModelWeights::read(&path).unwrap();
        assert_eq!(w.required_dense(), ["blk.0.attn_k.weight"]);
        let e = ModelWeights::read(&d.path().join("absent.gguf")).unwrap_err();
        assert!(e.starts_with("model ") && e.contains("absent.gguf"), "{e}");
    }
}
