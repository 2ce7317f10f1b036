//! What a slice does, decided from the header alone: which tensors are cut
//! to which experts, which metadata entry changes, and every refusal.

use super::PruneError;
use crate::gguf_read::{ggml_type_size, GgufHeader, GgufValue, TensorInfo};
use crate::keepmap::KeepMap;
use std::collections::{BTreeMap, BTreeSet};

/// Base names of the tensors that carry one slice per routed expert, with
/// the expert axis outermost (DESIGN section 12).
const EXPERT_FAMILY: [&str; 7] = [
    "ffn_gate_inp",
    "exp_probs_b",
    "exp_probs_b_vl",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "ffn_gate_up_exps",
];

/// The slice of one file.
pub(super) struct Plan {
    /// Experts kept per layer.
    pub k: u32,
    /// Per tensor of the header, in order: the experts to keep when the
    /// tensor is cut along its outermost axis, `None` when it is copied whole.
    pub cuts: Vec<Option<Vec<u32>>>,
    /// Metadata entries (indices into the header's `kv`, ascending)
    /// replaced by new encoded bytes (key, type and value).
    pub kv_overrides: Vec<(usize, Vec<u8>)>,
}

/// The keep map's layers, checked on their own: numeric keys, sorted unique
/// ids, the same K in every layer and in the `k` field.
fn map_layers(keep: &KeepMap) -> Result<(BTreeMap<u32, Vec<u32>>, u32), PruneError> {
    let map = map_name(keep);
    let bad = |reason: String| PruneError::KeepMap {
        map: map.clone(),
        reason,
    };
    let mut layers = BTreeMap::new();
    let mut k = None;
    for (key, ids) in &keep.layers {
        let layer: u32 = key
            .parse()
            .ok()
            .filter(|l: &u32| l.to_string() == *key)
            .ok_or_else(|| bad(format!("layer key {key:?} is not a block number")))?;
        if ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad(format!("layer {layer}: ids are not sorted and unique")));
        }
        match k {
            None => k = Some(ids.len()),
            Some(k0) if k0 != ids.len() => {
                return Err(bad(format!(
                    "layer {layer} keeps {} experts, other layers {k0}: llama.cpp has one expert count for all layers",
                    ids.len()
                )))
            }
            Some(_) => {}
        }
        layers.insert(layer, ids.clone());
    }
    let k = k.ok_or_else(|| bad("names no layers".into()))?;
    if k == 0 {
        return Err(bad("keeps no experts".into()));
    }
    if k as u64 != keep.k as u64 {
        return Err(bad(format!(
            "its k field says {} but each layer keeps {k}",
            keep.k
        )));
    }
    Ok((layers, k as u32))
}

/// `<method>_K<k>`, the name a keep map goes by in messages.
pub(super) fn map_name(keep: &KeepMap) -> String {
    format!("{}_K{}", keep.method, keep.k)
}

/// `(block, base name)` of `blk.N.<base>.{weight,bias,scale}` when the base
/// is of the expert family.
fn expert_family(name: &str) -> Option<(u32, &str)> {
    let (layer, base) = block_tensor(name)?;
    let base = base
        .strip_suffix(".weight")
        .or_else(|| base.strip_suffix(".bias"))
        .or_else(|| base.strip_suffix(".scale"))?;
    EXPERT_FAMILY.contains(&base).then_some((layer, base))
}

/// `(block, rest)` of `blk.N.rest`.
fn block_tensor(name: &str) -> Option<(u32, &str)> {
    let (layer, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    Some((layer.parse().ok()?, rest))
}

/// Checks that `t` has `n_expert` as its outermost axis and that one
/// expert's slice is a whole number of blocks.
fn check_expert_axis(t: &TensorInfo, n_expert: u64, path: &str) -> Result<(), PruneError> {
    let bad = |reason: String| PruneError::Tensor {
        path: path.to_string(),
        tensor: t.name.clone(),
        reason,
    };
    if t.dims.last() != Some(&n_expert) {
        let reason = if t.dims.contains(&n_expert) {
            format!(
                "dims {:?}: the {n_expert}-expert axis is not the outermost one, so experts are not contiguous byte ranges",
                t.dims
            )
        } else {
            format!("dims {:?} have no {n_expert}-expert axis", t.dims)
        };
        return Err(bad(reason));
    }
    let per_expert = t.n_elements() / n_expert;
    let (block, _) = ggml_type_size(t.ggml_type).expect("the reader knows the type");
    if !per_expert.is_multiple_of(block) {
        return Err(bad(format!(
            "one expert's {per_expert} elements are not whole blocks of {block}"
        )));
    }
    Ok(())
}

/// Checks the map's layers against the layers that have experts, and each
/// id against `n_expert`.
fn check_layers(
    layers: &BTreeMap<u32, Vec<u32>>,
    moe_layers: &BTreeSet<u32>,
    n_expert: u64,
    mismatch: &dyn Fn(String) -> PruneError,
) -> Result<(), PruneError> {
    if let Some(l) = layers.keys().find(|l| !moe_layers.contains(l)) {
        return Err(mismatch(format!(
            "names layer {l}, which is not an MoE layer (MoE layers: {moe_layers:?})"
        )));
    }
    if let Some(l) = moe_layers.iter().find(|l| !layers.contains_key(l)) {
        return Err(mismatch(format!("does not cover MoE layer {l}")));
    }
    for (l, ids) in layers {
        if let Some(id) = ids.iter().find(|&&id| id as u64 >= n_expert) {
            return Err(mismatch(format!(
                "layer {l} keeps expert {id}, but there are {n_expert}"
            )));
        }
    }
    Ok(())
}

/// The plan of a model file: the experts `keep` keeps (when given) and
/// `{arch}.expert_used_count` lowered to `top_k` (when given; metadata only).
pub(super) fn model(
    header: &GgufHeader,
    keep: Option<&KeepMap>,
    top_k: Option<u32>,
    path: &str,
) -> Result<Plan, PruneError> {
    let not_moe = |reason: String| PruneError::NotMoe {
        path: path.to_string(),
        reason,
    };
    let arch = header
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| not_moe("no general.architecture".into()))?;
    let count_key = format!("{arch}.expert_count");
    let count_index = header
        .kv
        .iter()
        .position(|(key, _)| *key == count_key)
        .ok_or_else(|| not_moe(format!("no {count_key}: not a Mixture-of-Experts model")))?;
    let n_expert = header.kv[count_index]
        .1
        .as_u64()
        .filter(|&n| n > 0)
        .ok_or_else(|| not_moe(format!("{count_key} is not a positive integer")))?;
    let used_key = format!("{arch}.expert_used_count");
    let used_index = header.kv.iter().position(|(key, _)| *key == used_key);
    let used = used_index.and_then(|i| header.kv[i].1.as_u64());
    let mut kv_overrides = Vec::new();
    if let Some(t) = top_k {
        let bad = |reason: String| PruneError::TopK {
            path: path.to_string(),
            top_k: t,
            reason,
        };
        let (Some(i), Some(used)) = (used_index, used) else {
            return Err(bad(format!("the model has no integer {used_key}")));
        };
        if t == 0 || u64::from(t) >= used {
            return Err(bad(format!(
                "a top-k candidate routes to fewer experts than {used_key} = {used}"
            )));
        }
        kv_overrides.push((i, encode_count(&used_key, &header.kv[i].1, t)));
    }
    let routed = top_k.map(u64::from).or(used);
    let mut plan = Plan {
        k: n_expert as u32,
        cuts: vec![None; header.tensors.len()],
        kv_overrides,
    };
    if let Some(keep) = keep {
        let (layers, k) = map_layers(keep)?;
        let map = map_name(keep);
        let mismatch = |reason: String| PruneError::Mismatch {
            path: path.to_string(),
            map: map.clone(),
            reason,
        };
        if let Some(routed) = routed.filter(|&r| r > u64::from(k)) {
            let routes = match top_k {
                Some(_) => format!("the top-k candidate routes to {routed}"),
                None => format!("{used_key} is {routed}"),
            };
            return Err(mismatch(format!(
                "keeps {k} experts per layer but {routes}: llama.cpp needs at least as many experts as it routes to"
            )));
        }
        let mut moe_layers = BTreeSet::new();
        let mut expert_tensors = Vec::new();
        for (i, t) in header.tensors.iter().enumerate() {
            if let Some((layer, _)) = expert_family(&t.name) {
                check_expert_axis(t, n_expert, path)?;
                moe_layers.insert(layer);
                expert_tensors.push((i, layer));
            } else if block_tensor(&t.name).is_some_and(|(_, rest)| rest.contains("_exps")) {
                return Err(PruneError::Tensor {
                    path: path.to_string(),
                    tensor: t.name.clone(),
                    reason: "an expert tensor this slicer does not know how to cut".into(),
                });
            }
        }
        check_layers(&layers, &moe_layers, n_expert, &mismatch)?;
        check_groups(header, arch, n_expert, &layers, &mismatch)?;
        for (i, layer) in expert_tensors {
            plan.cuts[i] = Some(layers[&layer].clone());
        }
        plan.k = k;
        plan.kv_overrides.push((
            count_index,
            encode_count(&count_key, &header.kv[count_index].1, k),
        ));
        plan.kv_overrides.sort_by_key(|(i, _)| *i);
    }
    Ok(plan)
}

/// Under grouped routing (`{arch}.expert_group_count` > 1) every group of
/// `n_expert / groups` consecutive experts must keep the same number.
fn check_groups(
    header: &GgufHeader,
    arch: &str,
    n_expert: u64,
    layers: &BTreeMap<u32, Vec<u32>>,
    mismatch: &dyn Fn(String) -> PruneError,
) -> Result<(), PruneError> {
    let key = format!("{arch}.expert_group_count");
    let groups = header.get(&key).and_then(GgufValue::as_u64).unwrap_or(1);
    if groups <= 1 {
        return Ok(());
    }
    if !n_expert.is_multiple_of(groups) {
        return Err(mismatch(format!(
            "{key} {groups} does not divide the {n_expert} experts"
        )));
    }
    let size = n_expert / groups;
    for (l, ids) in layers {
        let mut per_group = vec![0u32; groups as usize];
        ids.iter()
            .for_each(|&id| per_group[(id as u64 / size) as usize] += 1);
        if per_group.iter().any(|&n| n != per_group[0]) {
            return Err(mismatch(format!(
                "layer {l} keeps {per_group:?} experts from its {groups} routing groups; grouped routing needs the same number from each"
            )));
        }
    }
    Ok(())
}

/// The metadata entry `key = k`, in the integer type the base file used.
fn encode_count(key: &str, old: &GgufValue, k: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 20);
    out.extend((key.len() as u64).to_le_bytes());
    out.extend(key.as_bytes());
    let (ty, value): (u32, Vec<u8>) = match old {
        GgufValue::U8(_) => (0, vec![k as u8]),
        GgufValue::I8(_) => (1, vec![k as u8]),
        GgufValue::U16(_) => (2, (k as u16).to_le_bytes().to_vec()),
        GgufValue::I16(_) => (3, (k as i16).to_le_bytes().to_vec()),
        GgufValue::I32(_) => (5, (k as i32).to_le_bytes().to_vec()),
        GgufValue::U64(_) => (10, (k as u64).to_le_bytes().to_vec()),
        GgufValue::I64(_) => (11, (k as i64).to_le_bytes().to_vec()),
        _ => (4, k.to_le_bytes().to_vec()),
    };
    out.extend(ty.to_le_bytes());
    out.extend(value);
    out
}

/// The slice of an importance matrix: the `in_sum`, `in_sum2` and `counts` tensors of
/// stacked expert weights (`blk.N.ffn_*_exps.weight`) are cut along their
/// outermost axis (`n_mat`, one per expert); everything else is copied.
pub(super) fn imatrix(header: &GgufHeader, keep: &KeepMap, path: &str) -> Result<Plan, PruneError> {
    let (layers, k) = map_layers(keep)?;
    let not_moe = |reason: String| PruneError::NotMoe {
        path: path.to_string(),
        reason,
    };
    if header.get("general.type").and_then(GgufValue::as_str) != Some("imatrix") {
        return Err(not_moe(
            "not an importance matrix (general.type is not \"imatrix\")".into(),
        ));
    }
    let mut n_expert = None;
    let mut moe_layers = BTreeSet::new();
    let mut expert_tensors = Vec::new();
    for (i, t) in header.tensors.iter().enumerate() {
        let weight = t
            .name
            .strip_suffix(".in_sum2")
            .or_else(|| t.name.strip_suffix(".in_sum"))
            .or_else(|| t.name.strip_suffix(".counts"));
        let Some((layer, base)) = weight.and_then(expert_family) else {
            continue;
        };
        if !base.ends_with("_exps") {
            continue; // the router's entry: its inputs are not per expert
        }
        let n_mat = *t.dims.last().unwrap_or(&0);
        let n = *n_expert.get_or_insert(n_mat);
        if n_mat != n || t.dims.len() != 2 {
            return Err(PruneError::Tensor {
                path: path.to_string(),
                tensor: t.name.clone(),
                reason: format!(
                    "dims {:?}: expected [n, {n}] like the other expert entries",
                    t.dims
                ),
            });
        }
        check_expert_axis(t, n, path)?;
        moe_layers.insert(layer);
        expert_tensors.push((i, layer));
    }
    let n_expert = n_expert.ok_or_else(|| {
        not_moe("no entries of stacked expert weights (blk.N.ffn_*_exps.weight)".into())
    })?;
    let map = map_name(keep);
    let mismatch = |reason: String| PruneError::Mismatch {
        path: path.to_string(),
        map: map.clone(),
        reason,
    };
    check_layers(&layers, &moe_layers, n_expert, &mismatch)?;
    let mut cuts = vec![None; header.tensors.len()];
    for (i, layer) in expert_tensors {
        cuts[i] = Some(layers[&layer].clone());
    }
    Ok(Plan {
        k,
        cuts,
        kv_overrides: Vec::new(),
    })
}
