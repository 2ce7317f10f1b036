//! Graph node names: which MoE tensors the worker reads and how layers and
//! weight names are parsed out of them.

/// The role of a named MoE graph node (DESIGN section 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeNode {
    /// `ffn_moe_probs-L`: router probabilities `[n_expert, n_tokens]`.
    Probs,
    /// `ffn_moe_topk-L`: selected expert ids `[k, n_tokens]` (a strided view).
    TopK,
    /// `ffn_moe_weights[_softmax|_norm|_scaled]-L`: gate weights; the last one wins.
    Weights,
    /// `ffn_moe_down[_scaled|_biased]-L`: expert outputs `[n_embd, k, n_tokens]`; the last one wins.
    Down,
}

/// Parses `base-L` exactly (derived nodes such as `ffn_moe_probs-1 (reshaped)` do not match).
pub fn parse_moe_node(name: &str) -> Option<(MoeNode, u32)> {
    let (base, layer) = parse_layer_node(name)?;
    let node = match base {
        "ffn_moe_probs" => MoeNode::Probs,
        "ffn_moe_topk" => MoeNode::TopK,
        "ffn_moe_weights"
        | "ffn_moe_weights_softmax"
        | "ffn_moe_weights_norm"
        | "ffn_moe_weights_scaled" => MoeNode::Weights,
        "ffn_moe_down" | "ffn_moe_down_scaled" | "ffn_moe_down_biased" => MoeNode::Down,
        _ => return None,
    };
    Some((node, layer))
}

/// Splits a per-block graph node name `base-L` into its base and block
/// (`ffn_moe_probs_biased-3` -> (`ffn_moe_probs_biased`, 3)); derived names
/// (`... (reshaped)`, `... (view)`) do not match.
pub fn parse_layer_node(name: &str) -> Option<(&str, u32)> {
    let (base, layer) = name.rsplit_once('-')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base, layer.parse().ok()?))
}

/// Strips backend decorations: `CUDA0#blk.0.attn_k.weight#0` -> `blk.0.attn_k.weight`.
pub fn weight_name(name: &str) -> &str {
    match name.split_once('#') {
        Some((_, rest)) => rest.split_once('#').map_or(rest, |(w, _)| w),
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moe_node_names_match_exactly() {
        assert_eq!(
            parse_moe_node("ffn_moe_probs-12"),
            Some((MoeNode::Probs, 12))
        );
        assert_eq!(
            parse_moe_node("ffn_moe_weights_norm-3"),
            Some((MoeNode::Weights, 3))
        );
        assert_eq!(parse_moe_node("ffn_moe_down-0"), Some((MoeNode::Down, 0)));
        assert_eq!(parse_moe_node("ffn_moe_probs-1 (reshaped)"), None);
        assert_eq!(parse_moe_node("ffn_moe_probs_biased-1"), None);
        assert_eq!(parse_moe_node("ffn_moe_weights_sum-1"), None);
    }

    #[test]
    fn backend_decorations_are_stripped() {
        assert_eq!(
            weight_name("CUDA0#blk.0.attn_k.weight#0"),
            "blk.0.attn_k.weight"
        );
        assert_eq!(
            weight_name("blk.1.ffn_gate_inp.weight"),
            "blk.1.ffn_gate_inp.weight"
        );
    }
}
