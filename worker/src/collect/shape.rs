//! The model's MoE shape: expert counts from its GGUF metadata, everything
//! else (gating, routing, which blocks are MoE layers) from the graph
//! llama.cpp builds for it ([`super::probe`]). Metadata may confirm the
//! graph's semantics, never override them: where it disagrees, a warning
//! says so.

use super::probe::{probe, Probed, RouterInput};
use llama::Model;
use numbers::stats::MoeShape;
use numbers::Gating;
use std::collections::BTreeMap;

/// `(n_expert, k)` from `{arch}.expert_count` and `{arch}.expert_used_count`;
/// a model without experts is refused with the missing key named.
pub fn expert_counts(model: &Model) -> Result<(u32, u32), String> {
    let arch = model
        .meta("general.architecture")
        .ok_or("no general.architecture in the GGUF metadata")?;
    let num = |key: &str| meta_num(model, &arch, key);
    let n_expert = num("expert_count").filter(|&n| n > 0).ok_or_else(|| {
        format!("architecture {arch} has no MoE layers ({arch}.expert_count is missing or 0)")
    })?;
    let k = num("expert_used_count")
        .filter(|&k| k > 0 && k <= n_expert)
        .ok_or_else(|| format!("{arch}.expert_used_count is missing or not in 1..={n_expert}"))?;
    Ok((n_expert, k))
}

fn meta_num(model: &Model, arch: &str, key: &str) -> Option<u32> {
    model.meta(&format!("{arch}.{key}"))?.trim().parse().ok()
}

/// The whole MoE shape: counts from the metadata, the rest from a probe
/// decode of one token (`threads` CPU threads).
pub fn moe_shape(model: &Model, threads: u32) -> Result<MoeShape, String> {
    probe_shape(model, threads).map(|(shape, _)| shape)
}

/// [`moe_shape`] and, per MoE block, what its router reads.
pub(crate) fn probe_shape(
    model: &Model,
    threads: u32,
) -> Result<(MoeShape, BTreeMap<u32, RouterInput>), String> {
    let (n_expert, k) = expert_counts(model)?;
    let probed = probe(model, n_expert as usize, threads)?;
    for note in metadata_disagreements(model, &probed) {
        tracing::warn!("{note}; moe-census follows the graph");
    }
    let shape = MoeShape {
        n_expert,
        n_expert_used: k,
        gating: probed.gating,
        moe_layers: probed.moe_layers,
        routing: probed.routing,
    };
    Ok((shape, probed.routers))
}

/// Where the GGUF metadata says something else than the graph computes
/// (DeepSeek-V2 GGUFs without `expert_gating_func` run softmax, llama4's
/// sigmoid has no key at all, ...).
fn metadata_disagreements(model: &Model, p: &Probed) -> Vec<String> {
    let Some(arch) = model.meta("general.architecture") else {
        return Vec::new();
    };
    let num = |key: &str| meta_num(model, &arch, key);
    let mut notes = Vec::new();
    let gating = match num("expert_gating_func") {
        Some(1) => Some(Gating::Softmax),
        Some(2) => Some(Gating::Sigmoid),
        Some(3) => Some(Gating::SoftmaxWeight),
        Some(4) => Some(Gating::SqrtSoftplus),
        _ => None,
    };
    if let Some(g) = gating.filter(|g| *g != p.gating) {
        notes.push(format!(
            "{arch}.expert_gating_func says {g:?}, llama.cpp's graph computes {:?}",
            p.gating
        ));
    }
    if let Some(norm) = model.meta(&format!("{arch}.expert_weights_norm")) {
        let norm = norm.trim() == "true";
        if norm != p.routing.weights_norm {
            notes.push(format!(
                "{arch}.expert_weights_norm is {norm}, the graph {} the weights",
                if p.routing.weights_norm {
                    "normalises"
                } else {
                    "does not normalise"
                }
            ));
        }
    }
    let groups = num("expert_group_count").filter(|&g| g > 1);
    if groups != p.routing.groups.map(|g| g.n_group) {
        notes.push(format!(
            "{arch}.expert_group_count is {groups:?}, the graph routes with groups {:?}",
            p.routing.groups
        ));
    }
    let lead = num("leading_dense_block_count").unwrap_or(0);
    if p.moe_layers.first().is_some_and(|&l| l != lead)
        && num("interleave_moe_layer_step").is_none()
    {
        notes.push(format!(
            "{arch}.leading_dense_block_count is {lead}, the first MoE block is {:?}",
            p.moe_layers.first()
        ));
    }
    notes
}
