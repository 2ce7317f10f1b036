//! The routing semantics of a model read from the graph llama.cpp builds for
//! it (DESIGN section 3), never from a table keyed on the architecture: one
//! token is decoded with an observer that records, per block, the routing
//! nodes of `build_moe_ffn` in graph order, and [`Probed::routing`] reads
//! them: the op of `ffn_moe_probs` is the gating function,
//! `ffn_moe_weights_norm` / `_scaled` normalise and scale the weights,
//! `ffn_moe_weighted` before `ffn_moe_down` means the gate multiplies the
//! expert input, `ffn_moe_probs_biased` adds the selection bias (read from
//! its operand), `ffn_moe_group_topk` limits the groups, and the blocks that
//! emit `ffn_moe_topk` are the MoE layers.

use super::names::{parse_layer_node, weight_name};
use llama::{Context, ContextParams, ElemType, GraphObserver, Logits, Model, TensorRef};
use numbers::routing::{ExpertGroups, GateSite, Routing};
use numbers::Gating;
use std::collections::BTreeMap;

/// One routing node of the probe decode.
#[derive(Clone, Debug)]
struct Node {
    /// Position in graph order.
    order: usize,
    /// ggml's op name.
    op: &'static str,
    /// `ggml_scale`'s factor, for `ffn_moe_weights_scaled`.
    scale: Option<f32>,
    /// The bias operand of `ffn_moe_probs_biased`.
    bias: Option<Vec<f32>>,
    /// (groups used, groups) of `ffn_moe_group_topk` and its argsort.
    groups: Option<(usize, usize)>,
}

/// Records every `ffn_moe_*-L` node of a decode.
#[derive(Default)]
struct Recorder {
    seen: usize,
    blocks: BTreeMap<u32, BTreeMap<String, Node>>,
    routers: BTreeMap<u32, RouterInput>,
}

/// What a block's router reads, from its `ffn_moe_logits` node: the
/// router's weight (and bias), and the norm its input is the output of.
/// Lookahead guesses (`collect/lookahead.rs`) apply them to another layer's
/// hidden state.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterInput {
    /// The router matrix (`blk.L.ffn_gate_inp.weight`): `ffn_moe_logits`'s weight.
    pub weight: String,
    /// The router's bias (`ffn_moe_logits_biased`'s operand), if any.
    pub bias: Option<String>,
    /// The RMS norm the router input is (weight name and epsilon), or what
    /// computes it instead when it is not `rms_norm(x) * w`.
    pub norm: Result<(String, f32), String>,
}

/// Ops that only reshape: the router input is looked for through them.
const RESHAPES: [&str; 4] = ["RESHAPE", "VIEW", "CONT", "PERMUTE"];

/// The router input of an `ffn_moe_logits` node.
fn router_input(t: &TensorRef<'_>) -> Option<RouterInput> {
    let weight = weight_name(t.src(0)?.name()).to_string();
    let mut x = t.src(1)?;
    for _ in 0..4 {
        if !RESHAPES.contains(&x.op_desc()) {
            break;
        }
        x = x.src(0)?;
    }
    let norm = match (x.op_desc(), x.src(0), x.src(1)) {
        ("MUL", Some(n), Some(w)) if n.op_desc() == "RMS_NORM" && w.elem() == ElemType::F32 => n
            .op_param_f32(0)
            .map(|eps| (weight_name(w.name()).to_string(), eps))
            .ok_or_else(|| format!("{} has no epsilon", n.name())),
        (op, a, _) => Err(format!(
            "{} ({op} of {})",
            x.name(),
            a.map_or("nothing".into(), |a| a.op_desc().to_string())
        )),
    };
    Some(RouterInput {
        weight,
        bias: None,
        norm,
    })
}

impl GraphObserver for Recorder {
    fn wants(&mut self, t: &TensorRef<'_>) -> bool {
        parse_layer_node(t.name()).is_some_and(|(base, _)| base.starts_with("ffn_moe_"))
    }

    fn observe(&mut self, t: &TensorRef<'_>) {
        let Some((base, layer)) = parse_layer_node(t.name()) else {
            return;
        };
        if base == "ffn_moe_logits" {
            if let Some(r) = router_input(t) {
                self.routers.insert(layer, r);
            }
        }
        if base == "ffn_moe_logits_biased" {
            let bias = t.src(1).map(|b| weight_name(b.name()).to_string());
            if let Some(r) = self.routers.get_mut(&layer) {
                r.bias = bias;
            }
        }
        let bias = (base == "ffn_moe_probs_biased")
            .then(|| t.src(1))
            .flatten()
            .filter(|b| b.elem() == ElemType::F32)
            .map(|b| llama::f32s(&b.bytes()).collect());
        let groups = (base == "ffn_moe_group_topk")
            .then(|| t.src(0).map(|s| (t.ne()[0], s.ne()[0])))
            .flatten();
        let node = Node {
            order: self.seen,
            op: t.op_desc(),
            scale: (base == "ffn_moe_weights_scaled")
                .then(|| t.op_param_f32(0))
                .flatten(),
            bias,
            groups,
        };
        self.seen += 1;
        self.blocks
            .entry(layer)
            .or_default()
            .entry(base.to_string())
            .or_insert(node);
    }
}

/// What the probe found: the MoE blocks and their common semantics.
#[derive(Clone, Debug, PartialEq)]
pub struct Probed {
    /// Blocks whose graph emits `ffn_moe_topk`, ascending.
    pub moe_layers: Vec<u32>,
    /// The gating function.
    pub gating: Gating,
    /// Everything else.
    pub routing: Routing,
    /// Per MoE block, what its router reads.
    pub routers: BTreeMap<u32, RouterInput>,
}

/// Decodes one token of `model` and reads its routing semantics; `n_expert`
/// is the model's routed expert count (checked against the bias operands).
pub fn probe(model: &Model, n_expert: usize, threads: u32) -> Result<Probed, String> {
    let params = ContextParams {
        n_ctx: 16,
        n_ubatch: 1,
        threads,
        f32_kv: false,
        flash_attn: false,
        logits: Logits::Host,
    };
    let mut ctx = Context::new(model, &params, Recorder::default())
        .map_err(|e| format!("routing probe: {e}"))?;
    ctx.decode(&[0], 0)
        .map_err(|e| format!("routing probe: {e}"))?;
    let blocks = std::mem::take(&mut ctx.observer().blocks);
    let mut routers = std::mem::take(&mut ctx.observer().routers);
    let nextn = (model.n_layer()..model.n_layer() + model.n_layer_nextn()).collect();
    let mut probed = read_routing(&blocks, n_expert, nextn)?;
    routers.retain(|l, _| probed.moe_layers.contains(l));
    probed.routers = routers;
    Ok(probed)
}

/// The semantics of the recorded blocks; every MoE block must agree.
fn read_routing(
    blocks: &BTreeMap<u32, BTreeMap<String, Node>>,
    n_expert: usize,
    nextn_blocks: Vec<u32>,
) -> Result<Probed, String> {
    let mut moe_layers = Vec::new();
    let mut first: Option<(u32, Gating, Routing)> = None;
    let mut selection_bias = BTreeMap::new();
    for (&layer, nodes) in blocks {
        if !nodes.contains_key("ffn_moe_topk") {
            continue;
        }
        moe_layers.push(layer);
        let (gating, routing, bias) = read_block(layer, nodes, n_expert)?;
        if let Some(b) = bias {
            selection_bias.insert(layer, b);
        }
        match &first {
            None => first = Some((layer, gating, routing)),
            Some((l0, g0, r0)) if (*g0, r0) != (gating, &routing) => {
                return Err(format!(
                    "MoE block {layer} routes as {gating:?} {routing:?}, block {l0} as {g0:?} {r0:?}: moe-census assumes one routing per model"
                ))
            }
            Some(_) => {}
        }
    }
    let Some((_, gating, mut routing)) = first else {
        return Err("the decode graph has no ffn_moe_topk node: no MoE block ran".into());
    };
    if !selection_bias.is_empty() && selection_bias.len() != moe_layers.len() {
        return Err(format!(
            "a selection bias in blocks {:?} of MoE blocks {moe_layers:?}",
            selection_bias.keys().collect::<Vec<_>>()
        ));
    }
    routing.selection_bias = selection_bias;
    routing.nextn_blocks = nextn_blocks;
    Ok(Probed {
        moe_layers,
        gating,
        routing,
        routers: BTreeMap::new(),
    })
}

/// One block's gating and routing (bias apart, returned as the third value).
fn read_block(
    layer: u32,
    nodes: &BTreeMap<String, Node>,
    n_expert: usize,
) -> Result<(Gating, Routing, Option<Vec<f32>>), String> {
    let node = |base: &str| nodes.get(base);
    let need = |base: &str| {
        node(base).ok_or_else(|| format!("MoE block {layer}: the graph has no {base}-{layer} node"))
    };
    let probs = need("ffn_moe_probs")?;
    let softmax_weights = node("ffn_moe_weights_softmax").is_some();
    let gating = match (probs.op, softmax_weights) {
        ("SOFT_MAX", false) => Gating::Softmax,
        ("SIGMOID", false) => Gating::Sigmoid,
        ("SQRT", false) => Gating::SqrtSoftplus,
        ("MUL_MAT" | "ADD", true) => Gating::SoftmaxWeight,
        (op, softmax) => {
            return Err(format!(
                "MoE block {layer}: ffn_moe_probs-{layer} is computed by {op}{}; moe-census does not know this gating",
                if softmax { " and the weights by a softmax" } else { "" }
            ))
        }
    };
    let weighted = need("ffn_moe_weighted")?;
    let down = need("ffn_moe_down")?;
    let gate = if weighted.order < down.order {
        GateSite::Input
    } else {
        GateSite::Output
    };
    let weights_scale = match node("ffn_moe_weights_scaled") {
        None => 1.0,
        Some(n) => n.scale.filter(|s| s.is_finite()).ok_or_else(|| {
            format!("MoE block {layer}: ffn_moe_weights_scaled-{layer} has no finite scale factor")
        })?,
    };
    let bias = match node("ffn_moe_probs_biased") {
        None => None,
        Some(n) => match (&n.bias, n.op) {
            (Some(b), "ADD") if b.len() == n_expert => Some(b.clone()),
            _ => {
                return Err(format!(
                    "MoE block {layer}: ffn_moe_probs_biased-{layer} ({}) is not probabilities plus a {n_expert}-expert bias",
                    n.op
                ))
            }
        },
    };
    let groups = match node("ffn_moe_group_topk") {
        None => None,
        Some(n) => {
            let (used, n_group) = n.groups.ok_or_else(|| {
                format!("MoE block {layer}: ffn_moe_group_topk-{layer} has no group scores")
            })?;
            if n_group == 0 || !n_expert.is_multiple_of(n_group) || used == 0 || used > n_group {
                return Err(format!(
                    "MoE block {layer}: {used} of {n_group} routing groups over {n_expert} experts"
                ));
            }
            Some(ExpertGroups {
                n_group: n_group as u32,
                n_group_used: used as u32,
            })
        }
    };
    let routing = Routing {
        weights_norm: node("ffn_moe_weights_norm").is_some(),
        weights_scale,
        gate,
        groups,
        ..Routing::default()
    };
    Ok((gating, routing, bias))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(names: &[(&str, &'static str)]) -> BTreeMap<String, Node> {
        names
            .iter()
            .enumerate()
            .map(|(i, (n, op))| {
                (
                    n.to_string(),
                    Node {
                        order: i,
                        op,
                        scale: None,
                        bias: None,
                        groups: None,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn gating_and_gate_site_come_from_the_graph() {
        let softmax = block(&[
            ("ffn_moe_logits", "MUL_MAT"),
            ("ffn_moe_probs", "SOFT_MAX"),
            ("ffn_moe_topk", "VIEW"),
            ("ffn_moe_weights", "GET_ROWS"),
            ("ffn_moe_weights_norm", "DIV"),
            ("ffn_moe_down", "MUL_MAT_ID"),
            ("ffn_moe_weighted", "MUL"),
        ]);
        let gate_first = block(&[
            ("ffn_moe_probs", "SIGMOID"),
            ("ffn_moe_topk", "VIEW"),
            ("ffn_moe_weights", "GET_ROWS"),
            ("ffn_moe_weighted", "MUL"),
            ("ffn_moe_down", "MUL_MAT_ID"),
        ]);
        let logits = block(&[
            ("ffn_moe_probs", "ADD"),
            ("ffn_moe_topk", "VIEW"),
            ("ffn_moe_weights", "GET_ROWS"),
            ("ffn_moe_weights_softmax", "SOFT_MAX"),
            ("ffn_moe_down", "ADD_ID"),
            ("ffn_moe_weighted", "MUL"),
        ]);
        let one = |b: &BTreeMap<String, Node>| {
            let blocks = [(1u32, b.clone())].into_iter().collect();
            read_routing(&blocks, 8, vec![]).unwrap()
        };
        let p = one(&softmax);
        assert_eq!(
            (p.gating, p.routing.gate),
            (Gating::Softmax, GateSite::Output)
        );
        assert!(p.routing.weights_norm);
        assert_eq!(p.moe_layers, vec![1]);
        let p = one(&gate_first);
        assert_eq!(
            (p.gating, p.routing.gate),
            (Gating::Sigmoid, GateSite::Input)
        );
        assert_eq!(one(&logits).gating, Gating::SoftmaxWeight);
    }

    #[test]
    fn blocks_without_topk_are_dense_and_disagreeing_blocks_are_refused() {
        let moe = block(&[
            ("ffn_moe_probs", "SOFT_MAX"),
            ("ffn_moe_topk", "VIEW"),
            ("ffn_moe_down", "MUL_MAT_ID"),
            ("ffn_moe_weighted", "MUL"),
        ]);
        let sigmoid = block(&[
            ("ffn_moe_probs", "SIGMOID"),
            ("ffn_moe_topk", "VIEW"),
            ("ffn_moe_down", "MUL_MAT_ID"),
            ("ffn_moe_weighted", "MUL"),
        ]);
        let blocks = [(1, moe.clone()), (3, moe.clone())].into_iter().collect();
        assert_eq!(
            read_routing(&blocks, 8, vec![4]).unwrap().moe_layers,
            vec![1, 3]
        );
        let blocks = [(1, moe), (2, sigmoid)].into_iter().collect();
        let e = read_routing(&blocks, 8, vec![]).unwrap_err();
        assert!(e.contains("one routing per model"), "{e}");
        let e = read_routing(&BTreeMap::new(), 8, vec![]).unwrap_err();
        assert!(e.contains("no MoE block"), "{e}");
    }
}
