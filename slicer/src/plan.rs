//! What a slice does, decided from the header alone: which tensors are cut
//! to which experts, which metadata entry changes, and every refusal.

use super::{kv, PruneError};
use gguf::read::{ggml_type_size, GgufHeader, GgufValue, TensorInfo};
use runfiles::keepmap::KeepMap;
use runfiles::mergeplan::MergePlan;
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

/// Per output expert, the input experts it sums and their weights.
pub(super) type Groups = Vec<Vec<(u32, f64)>>;

/// What happens to one tensor of the input.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Cut {
    /// Copied as it is.
    Whole,
    /// Cut along its outermost (expert) axis to these experts, in order.
    Experts(Vec<u32>),
    /// One expert per group along its outermost axis, in order: the sum
    /// of the group's experts times their weights (a lone expert with
    /// weight 1 is copied as it is).
    Merged(Groups),
    /// Left out: a NextN block's tensor.
    Drop,
}

/// The slice of one file.
pub(super) struct Plan {
    /// Experts kept per layer.
    pub k: u32,
    /// Per tensor of the header, in order.
    pub cuts: Vec<Cut>,
    /// Metadata entries (indices into the header's `kv`) replaced by new
    /// encoded bytes (key, type and value).
    pub kv_overrides: Vec<(usize, Vec<u8>)>,
    /// Metadata entries (indices) left out.
    pub kv_dropped: Vec<usize>,
    /// Encoded metadata entries appended after the header's own.
    pub kv_added: Vec<Vec<u8>>,
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
    for (&layer, ids) in &keep.layers {
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
    numbers::keep_name::KeepMapName::new(&keep.method, keep.k).to_string()
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

/// The slice of a model file.
pub(super) fn model(header: &GgufHeader, keep: &KeepMap, path: &str) -> Result<Plan, PruneError> {
    model_as(header, keep, "pruned", path)
}

/// [`model`], with `verb` in the new `general.name` ("pruned", "merged").
fn model_as(
    header: &GgufHeader,
    keep: &KeepMap,
    verb: &str,
    path: &str,
) -> Result<Plan, PruneError> {
    let (layers, k) = map_layers(keep)?;
    let (arch, count_key, count_index) = arch_key(header, "expert_count", path)?;
    let n_expert = expert_count(header, count_index, &count_key, path)?;
    let map = map_name(keep);
    let mismatch = |reason: String| PruneError::Mismatch {
        path: path.to_string(),
        map: map.clone(),
        reason,
    };
    let used_key = format!("{arch}.expert_used_count");
    if let Some(used) = header.get(&used_key).and_then(GgufValue::as_u64) {
        if used > k as u64 {
            return Err(mismatch(format!(
                "keeps {k} experts per layer but {used_key} is {used}: llama.cpp needs at least as many experts as it routes to"
            )));
        }
    }
    let nextn = NextN::of(header, arch);
    let mut moe_layers = BTreeSet::new();
    let mut expert_tensors = Vec::new();
    let mut cuts = vec![Cut::Whole; header.tensors.len()];
    for (i, t) in header.tensors.iter().enumerate() {
        if block_tensor(&t.name).is_some_and(|(b, _)| nextn.drops(b)) {
            cuts[i] = Cut::Drop;
        } else if let Some((layer, _)) = expert_family(&t.name) {
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
    check_groups(header, arch, n_expert, k, &layers, &mismatch)?;
    for (i, layer) in expert_tensors {
        cuts[i] = Cut::Experts(layers[&layer].clone());
    }
    let count = &header.kv[count_index].1;
    let mut kv_overrides = vec![(
        count_index,
        kv::entry(&count_key, &kv::same_int_type(count, u64::from(k))),
    )];
    kv_overrides.extend(nextn.kv_overrides(header, arch));
    // A map that keeps every expert prunes nothing: the file stays its base.
    let general = match u64::from(k) < n_expert {
        true => {
            let shapes = sliced_shapes(&header.tensors, &cuts);
            super::general::pruned(header, &shapes, k, n_expert, verb)
        }
        false => super::general::GeneralKv::default(),
    };
    kv_overrides.extend(general.overrides);
    Ok(Plan {
        k,
        cuts,
        kv_overrides,
        kv_dropped: general.dropped,
        kv_added: general.added,
    })
}

/// Base names of the expert tensors a merge averages; the rest of the
/// expert family (router rows, selection biases) keeps the centres'.
const MERGED_FAMILY: [&str; 4] = [
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "ffn_gate_up_exps",
];

/// The slice of a model file to a merge plan: [`model`] of the plan's
/// centres, with each merged tensor's experts (weights, biases, scales)
/// replaced by the weighted means of the centres' members. A plan that
/// merges nothing is its keep map's slice, byte for byte.
pub(super) fn merged(
    header: &GgufHeader,
    merge: &MergePlan,
    path: &str,
) -> Result<Plan, PruneError> {
    let keep = merge.keep_map();
    merge.check().map_err(|reason| PruneError::KeepMap {
        map: merge.name(),
        reason,
    })?;
    let verb = match merge.merges_anything() {
        true => "merged",
        false => "pruned",
    };
    let mut plan = model_as(header, &keep, verb, path)?;
    let (_, key, index) = arch_key(header, "expert_count", path)?;
    let n_expert = expert_count(header, index, &key, path)?;
    if let Some((l, m)) = merge.layers.iter().find_map(|(l, cs)| {
        cs.iter()
            .flat_map(|c| &c.members)
            .find(|m| u64::from(m.expert) >= n_expert)
            .map(|m| (l, m.expert))
    }) {
        return Err(PruneError::Mismatch {
            path: path.to_string(),
            map: merge.name(),
            reason: format!("layer {l} merges expert {m}, but there are {n_expert}"),
        });
    }
    let groups: BTreeMap<u32, Groups> = merge
        .layers
        .iter()
        .map(|(&l, cs)| (l, cs.iter().map(|c| c.normalised()).collect()))
        .collect();
    for (t, cut) in header.tensors.iter().zip(plan.cuts.iter_mut()) {
        let Some((layer, base)) = expert_family(&t.name) else {
            continue;
        };
        if MERGED_FAMILY.contains(&base) && matches!(cut, Cut::Experts(_)) {
            *cut = Cut::Merged(groups[&layer].clone());
        }
    }
    Ok(plan)
}

/// Each kept tensor's name and ggml dims after its cut.
fn sliced_shapes(tensors: &[TensorInfo], cuts: &[Cut]) -> Vec<(String, Vec<u64>)> {
    tensors
        .iter()
        .zip(cuts)
        .filter_map(|(t, cut)| {
            let mut dims = t.dims.clone();
            match cut {
                Cut::Drop => return None,
                Cut::Whole => {}
                Cut::Experts(ids) => {
                    if let Some(last) = dims.last_mut() {
                        *last = ids.len() as u64;
                    }
                }
                Cut::Merged(groups) => {
                    if let Some(last) = dims.last_mut() {
                        *last = groups.len() as u64;
                    }
                }
            }
            Some((t.name.clone(), dims))
        })
        .collect()
}

/// A plan that copies every tensor as it is (a candidate that keeps every
/// expert); K is the model's `{arch}.expert_count`.
pub(super) fn whole(header: &GgufHeader, path: &str) -> Result<Plan, PruneError> {
    let (_, key, index) = arch_key(header, "expert_count", path)?;
    let k = expert_count(header, index, &key, path)?;
    Ok(Plan {
        k: u32::try_from(k).map_err(|_| PruneError::NotMoe {
            path: path.to_string(),
            reason: format!("{key} = {k} is beyond u32"),
        })?,
        cuts: vec![Cut::Whole; header.tensors.len()],
        kv_overrides: Vec::new(),
        kv_dropped: Vec::new(),
        kv_added: Vec::new(),
    })
}

/// The architecture, the full name of `{arch}.{key}` and its index in
/// `header.kv`.
fn arch_key<'h>(
    header: &'h GgufHeader,
    key: &str,
    path: &str,
) -> Result<(&'h str, String, usize), PruneError> {
    let not_moe = |reason: String| PruneError::NotMoe {
        path: path.to_string(),
        reason,
    };
    let arch = header
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| not_moe("no general.architecture".into()))?;
    let full = format!("{arch}.{key}");
    let index = header
        .kv
        .iter()
        .position(|(k, _)| *k == full)
        .ok_or_else(|| not_moe(format!("no {full}: not a Mixture-of-Experts model")))?;
    Ok((arch, full, index))
}

/// The value of the expert count at `index` (named `key`), positive.
fn expert_count(
    header: &GgufHeader,
    index: usize,
    key: &str,
    path: &str,
) -> Result<u64, PruneError> {
    header.kv[index]
        .1
        .as_u64()
        .filter(|&n| n > 0)
        .ok_or_else(|| PruneError::NotMoe {
            path: path.to_string(),
            reason: format!("{key} is not a positive integer"),
        })
}

/// Adds to `plan` the change of `{arch}.expert_used_count` to `used`, the
/// experts each token is routed to (metadata only). Refused unless `used`
/// is at least 1 and at most the model's own count, and on grouped routing,
/// whose group selection this does not re-check.
pub(super) fn experts_used(
    header: &GgufHeader,
    plan: &mut Plan,
    used: u32,
    path: &str,
) -> Result<(), PruneError> {
    let (_, key, index) = arch_key(header, "expert_used_count", path)?;
    let refuse = |reason: String| PruneError::ExpertsUsed {
        path: path.to_string(),
        reason,
    };
    let old = &header.kv[index].1;
    let now = old
        .as_u64()
        .ok_or_else(|| refuse(format!("{key} is not an integer")))?;
    if used == 0 || u64::from(used) > now {
        return Err(refuse(format!(
            "{used} experts per token: a candidate routes each token to between 1 and the model's {now} ({key})"
        )));
    }
    let groups = key.replace("expert_used_count", "expert_group_count");
    if header.get(&groups).and_then(GgufValue::as_u64).unwrap_or(1) > 1 {
        return Err(refuse(format!(
            "{groups} > 1: lowering the experts per token of a grouped-routing model is not supported"
        )));
    }
    plan.kv_overrides.push((
        index,
        kv::entry(&key, &kv::same_int_type(old, u64::from(used))),
    ));
    Ok(())
}

/// The NextN (MTP) blocks of a model: `{arch}.nextn_predict_layers` blocks
/// at the end of `{arch}.block_count`. llama.cpp never runs them in a
/// decode (only its MTP draft context does), so no keep map can be scored
/// for their experts, and it checks their shapes against the one
/// `expert_count` even when it skips them: a pruned model without its
/// NextN blocks is the only one it can load. The slice drops their
/// tensors and makes the model an ordinary one of the remaining blocks.
struct NextN {
    /// First NextN block (= the blocks that remain); `blocks` when none.
    first: u64,
    /// `block_count` of the input (`u64::MAX` when the header has none).
    blocks: u64,
}

impl NextN {
    fn of(header: &GgufHeader, arch: &str) -> NextN {
        let num = |k: &str| {
            header
                .get(&format!("{arch}.{k}"))
                .and_then(GgufValue::as_u64)
        };
        let blocks = num("block_count").unwrap_or(u64::MAX);
        let n = num("nextn_predict_layers").unwrap_or(0).min(blocks);
        NextN {
            first: blocks - n,
            blocks,
        }
    }

    fn drops(&self, block: u32) -> bool {
        u64::from(block) >= self.first
    }

    /// `block_count` and `nextn_predict_layers` of the remaining blocks, and
    /// per-block arrays (one entry per block) cut to them.
    fn kv_overrides(&self, header: &GgufHeader, arch: &str) -> Vec<(usize, Vec<u8>)> {
        if self.first == self.blocks {
            return Vec::new();
        }
        let prefix = format!("{arch}.");
        let mut out = Vec::new();
        for (i, (key, value)) in header.kv.iter().enumerate() {
            let Some(name) = key.strip_prefix(&prefix) else {
                continue;
            };
            let new = match (name, value) {
                ("block_count", v) => kv::same_int_type(v, self.first),
                ("nextn_predict_layers", v) => kv::same_int_type(v, 0),
                (_, GgufValue::Array(items)) if items.len() as u64 == self.blocks => {
                    GgufValue::Array(items[..self.first as usize].to_vec())
                }
                _ => continue,
            };
            out.push((i, kv::entry(key, &new)));
        }
        out
    }
}

/// Under grouped routing (`{arch}.expert_group_count` > 1) every group of
/// `n_expert / groups` consecutive experts must keep the same number, and
/// enough for llama.cpp to run ([`numbers::routing::check_group_keep`]).
fn check_groups(
    header: &GgufHeader,
    arch: &str,
    n_expert: u64,
    k: u32,
    layers: &BTreeMap<u32, Vec<u32>>,
    mismatch: &dyn Fn(String) -> PruneError,
) -> Result<(), PruneError> {
    let num = |key: &str| {
        header
            .get(&format!("{arch}.{key}"))
            .and_then(GgufValue::as_u64)
    };
    let key = format!("{arch}.expert_group_count");
    let groups = num("expert_group_count").unwrap_or(1);
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
    let routing = numbers::routing::ExpertGroups {
        n_group: groups as u32,
        n_group_used: num("expert_group_used_count").unwrap_or(groups) as u32,
    };
    let used = num("expert_used_count").unwrap_or(0) as u32;
    numbers::routing::check_group_keep(Some(routing), n_expert as u32, used, k).map_err(mismatch)
}

/// The slice of an importance matrix: the `in_sum2`, `in_sum` and `counts` tensors of
/// stacked expert weights (`blk.N.ffn_*_exps.weight`) are cut along their
/// outermost axis (`n_mat`, one per expert); everything else is copied.
pub(super) fn imatrix(header: &GgufHeader, keep: &KeepMap, path: &str) -> Result<Plan, PruneError> {
    imatrix_cut(header, keep, None, path)
}

/// The importance matrix of a merged model: each centre's `in_sum2`,
/// `in_sum` and `counts` columns are the sums of its members' (what the
/// merged expert's inputs are: every token routed to any of them).
pub(super) fn imatrix_merged(
    header: &GgufHeader,
    merge: &MergePlan,
    path: &str,
) -> Result<Plan, PruneError> {
    merge.check().map_err(|reason| PruneError::KeepMap {
        map: merge.name(),
        reason,
    })?;
    let sums = merge
        .layers
        .iter()
        .map(|(&l, cs)| {
            let groups = cs
                .iter()
                .map(|c| c.members.iter().map(|m| (m.expert, 1.0)).collect())
                .collect();
            (l, groups)
        })
        .collect();
    imatrix_cut(header, &merge.keep_map(), Some(&sums), path)
}

/// [`imatrix`], each expert entry summed over `sums`' groups per layer
/// when given.
fn imatrix_cut(
    header: &GgufHeader,
    keep: &KeepMap,
    sums: Option<&BTreeMap<u32, Groups>>,
    path: &str,
) -> Result<Plan, PruneError> {
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
    if let Some((l, id)) = sums.into_iter().flatten().find_map(|(l, gs)| {
        gs.iter()
            .flatten()
            .find(|(id, _)| u64::from(*id) >= n_expert)
            .map(|(id, _)| (l, id))
    }) {
        return Err(mismatch(format!(
            "layer {l} merges expert {id}, but there are {n_expert}"
        )));
    }
    let mut cuts = vec![Cut::Whole; header.tensors.len()];
    for (i, layer) in expert_tensors {
        cuts[i] = match sums {
            Some(sums) => Cut::Merged(sums[&layer].clone()),
            None => Cut::Experts(layers[&layer].clone()),
        };
    }
    Ok(Plan {
        k,
        cuts,
        kv_overrides: Vec::new(),
        kv_dropped: Vec::new(),
        kv_added: Vec::new(),
    })
}
