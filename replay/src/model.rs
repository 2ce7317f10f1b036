//! Bytes moved per expert load, from the model's expert tensors.

use anyhow::Context;
use common::gguf_read::GgufReader;
use std::collections::BTreeMap;
use std::path::Path;

/// Bytes of one expert of each MoE layer: the sizes of
/// `blk.L.ffn_{gate,up,down}_exps.weight` divided by `n_expert`.
pub fn expert_bytes(model: &Path) -> anyhow::Result<BTreeMap<u32, u64>> {
    let r =
        GgufReader::open(model).with_context(|| format!("reading model {}", model.display()))?;
    let mut per_layer: BTreeMap<u32, u64> = BTreeMap::new();
    for t in &r.header.tensors {
        let Some(rest) = t.name.strip_prefix("blk.") else {
            continue;
        };
        let Some((layer, kind)) = rest.split_once('.') else {
            continue;
        };
        if !matches!(
            kind,
            "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_down_exps.weight"
        ) {
            continue;
        }
        let layer: u32 = layer.parse().with_context(|| {
            format!(
                "model {}: tensor {} has no block number",
                model.display(),
                t.name
            )
        })?;
        let n_expert = *t
            .dims
            .last()
            .filter(|&&n| n > 0 && t.dims.len() == 3)
            .with_context(|| {
                format!(
                    "model {}: tensor {} is not [in, out, n_expert]",
                    model.display(),
                    t.name
                )
            })?;
        *per_layer.entry(layer).or_default() += t.n_bytes / n_expert;
    }
    anyhow::ensure!(
        !per_layer.is_empty(),
        "model {} has no blk.N.ffn_*_exps.weight tensors",
        model.display()
    );
    Ok(per_layer)
}

/// `{arch}.expert_count` of a model, if it has one.
pub fn expert_count(model: &Path) -> anyhow::Result<Option<u64>> {
    let r =
        GgufReader::open(model).with_context(|| format!("reading model {}", model.display()))?;
    let arch = r
        .header
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    Ok(r.header
        .get(&format!("{arch}.expert_count"))
        .and_then(|v| v.as_u64()))
}
