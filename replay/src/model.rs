//! Bytes moved per expert load, from the model's expert tensors.

use crate::ReplayError;
use gguf::read::GgufHeader;
use gguf::split::{open_joined, SplitError};
use std::collections::BTreeMap;
use std::path::Path;

/// Bytes of one expert of each MoE layer: the sizes of
/// `blk.L.ffn_{gate,up,down}_exps.weight` and of a fused
/// `blk.L.ffn_gate_up_exps.weight` divided by `n_expert`.
pub fn expert_bytes(model: &Path) -> Result<BTreeMap<u32, u64>, ReplayError> {
    let r = open(model)?;
    let mut per_layer: BTreeMap<u32, u64> = BTreeMap::new();
    for t in &r.tensors {
        let Some(rest) = t.name.strip_prefix("blk.") else {
            continue;
        };
        let Some((layer, kind)) = rest.split_once('.') else {
            continue;
        };
        if !matches!(
            kind,
            "ffn_gate_exps.weight"
                | "ffn_up_exps.weight"
                | "ffn_gate_up_exps.weight"
                | "ffn_down_exps.weight"
        ) {
            continue;
        }
        let layer: u32 = layer.parse().map_err(|source| ReplayError::TensorBlock {
            model: model.to_path_buf(),
            tensor: t.name.clone(),
            source,
        })?;
        let n_expert = *t
            .dims
            .last()
            .filter(|&&n| n > 0 && t.dims.len() == 3)
            .ok_or_else(|| ReplayError::TensorShape {
                model: model.to_path_buf(),
                tensor: t.name.clone(),
            })?;
        *per_layer.entry(layer).or_default() += t.n_bytes / n_expert;
    }
    if per_layer.is_empty() {
        return Err(ReplayError::NoExpertTensors {
            model: model.to_path_buf(),
        });
    }
    Ok(per_layer)
}

/// `{arch}.expert_count` of a model, if it has one.
pub fn expert_count(model: &Path) -> Result<Option<u64>, ReplayError> {
    let r = open(model)?;
    let arch = r
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    Ok(r.get(&format!("{arch}.expert_count"))
        .and_then(|v| v.as_u64()))
}

/// Reads the model's header: of all its files when it is split, whose
/// expert tensors may be in any of them.
fn open(model: &Path) -> Result<GgufHeader, ReplayError> {
    match open_joined(model) {
        Ok(joined) => Ok(joined.header),
        Err(SplitError::Read(source)) => Err(ReplayError::ModelRead { source }),
        Err(source) => Err(ReplayError::ModelFiles { source }),
    }
}
