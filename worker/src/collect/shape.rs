//! The model's MoE shape from its GGUF metadata.

use crate::llama::Model;
use common::stats::MoeShape;
use common::Gating;

/// Reads expert count, top-k, gating and MoE block indices; a model without
/// experts is refused with the missing key named.
pub fn moe_shape(model: &Model) -> Result<MoeShape, String> {
    let arch = model
        .meta("general.architecture")
        .ok_or("no general.architecture in the GGUF metadata")?;
    let num =
        |key: &str| -> Option<u32> { model.meta(&format!("{arch}.{key}"))?.trim().parse().ok() };
    let n_expert = num("expert_count").filter(|&n| n > 0).ok_or_else(|| {
        format!("architecture {arch} has no MoE layers ({arch}.expert_count is missing or 0)")
    })?;
    let k = num("expert_used_count")
        .filter(|&k| k > 0 && k <= n_expert)
        .ok_or_else(|| format!("{arch}.expert_used_count is missing or not in 1..={n_expert}"))?;
    let gating = match num("expert_gating_func") {
        Some(2) => Gating::Sigmoid,
        Some(3) => Gating::SoftmaxWeight,
        Some(1) => Gating::Softmax,
        Some(other) => {
            return Err(format!(
                "{arch}.expert_gating_func {other} is not supported"
            ))
        }
        None if matches!(arch.as_str(), "glm4moe" | "deepseek2" | "deepseek3") => Gating::Sigmoid,
        None => Gating::Softmax,
    };
    let n_layer = model.n_layer();
    let dense_lead = num("leading_dense_block_count").unwrap_or(0);
    if dense_lead >= n_layer {
        return Err(format!(
            "all {n_layer} blocks are dense ({arch}.leading_dense_block_count)"
        ));
    }
    Ok(MoeShape {
        n_expert,
        n_expert_used: k,
        gating,
        moe_layers: (dense_lead..n_layer).collect(),
    })
}
