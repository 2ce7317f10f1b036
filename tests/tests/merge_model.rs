//! Merged models (#57) against an independent reference. On two generated
//! families, `tiny-alt-qk` (glm4moe: separate gate and up, selection bias,
//! shared expert, a leading dense block) and `qwen35moe-fused` (one fused
//! `ffn_gate_up_exps`), each quantised by llama.cpp's own quantiser to
//! F16, BF16, Q8_0 and Q4_K (and left F32), every merged expert tensor of
//! the merged file, read back through llama.cpp's GGUF reader and ggml's
//! `to_float` (not the slicer's code), equals the weighted mean of its
//! members' dequantised values computed here in f64: exactly for F32,
//! within one step of the type's grid for the others. Router rows and
//! selection biases are the centres', every other tensor the base's; the
//! merged file loads and runs in llama.cpp. A plan that merges nothing
//! writes the pruned slice of its centres byte for byte.

use fixtures::llama_gguf::{F32Tensor, LlamaGguf};
use fixtures::llama_quantize::quantize;
use llama::GgmlCodec;
use llama_cpp_sys_2 as sys;
use runfiles::mergeplan::{Centre, Member, MergePlan};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use synth::Preset;

/// A plan of `k` centres per layer: centres chosen pseudo-randomly per
/// layer, every other expert merged into one of them with weight
/// `1 + id % 4`, except that the first centre stays alone and one expert
/// per layer is dropped.
fn plan(layers: &[u32], n_expert: u32, k: u32) -> MergePlan {
    let mut out = BTreeMap::new();
    for &l in layers {
        let mut ids: Vec<u32> = (0..n_expert).collect();
        let mut state = 0x2545_f491u64 + u64::from(l) * 131;
        for i in (1..ids.len()).rev() {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ids.swap(i, (state >> 33) as usize % (i + 1));
        }
        let mut centres: Vec<Centre> = ids[..k as usize]
            .iter()
            .map(|&c| Centre {
                centre: c,
                members: vec![Member {
                    expert: c,
                    weight: 1.0 + f64::from(c % 4),
                }],
            })
            .collect();
        centres.sort_by_key(|c| c.centre);
        // Centre 0 stays alone (weight 1: copied as it is); the last
        // non-centre is dropped.
        centres[0].members[0].weight = 1.0;
        let rest = &ids[k as usize..ids.len() - 1];
        for (i, &e) in rest.iter().enumerate() {
            let c = 1 + i % (k as usize - 1);
            centres[c].members.push(Member {
                expert: e,
                weight: 1.0 + f64::from(e % 4),
            });
        }
        out.insert(l, centres);
    }
    MergePlan {
        method: "test".into(),
        k,
        params: serde_json::Value::Null,
        saliency_sha256: String::new(),
        layers: out,
    }
}

/// `blk.N.<base>` of a merged tensor (gate, up, down, fused gate_up).
fn merged_tensor(name: &str) -> Option<u32> {
    let (layer, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    [
        "ffn_gate_exps.",
        "ffn_up_exps.",
        "ffn_down_exps.",
        "ffn_gate_up_exps.",
    ]
    .iter()
    .any(|b| rest.starts_with(b))
    .then(|| layer.parse().ok())?
}

/// `blk.N.<base>` of a per-expert tensor that keeps the centres' rows.
fn centre_rows(name: &str) -> Option<u32> {
    let (layer, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    (rest.starts_with("ffn_gate_inp.") || rest.starts_with("exp_probs_b."))
        .then(|| layer.parse().ok())?
}

/// The largest error a value re-encoded as ggml type `ty` may have, for
/// each value of `exact` (one expert's values): about one step of the
/// type's grid in its block.
fn tolerance(ty: u32, exact: &[f32]) -> Vec<f32> {
    let per_block = |n: usize, step: &dyn Fn(&[f32]) -> f32| -> Vec<f32> {
        exact
            .chunks(n)
            .flat_map(|b| std::iter::repeat_n(step(b), b.len()))
            .collect()
    };
    let amax = |b: &[f32]| b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let range = |b: &[f32]| {
        let (lo, hi) = b
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        hi - lo
    };
    match ty {
        sys::GGML_TYPE_F32 => vec![0.0; exact.len()],
        // Half a unit in the last place, relative, and f16's subnormal step.
        sys::GGML_TYPE_F16 => exact.iter().map(|v| v.abs() / 2048.0 + 6e-8).collect(),
        sys::GGML_TYPE_BF16 => exact.iter().map(|v| v.abs() / 256.0 + 1e-38).collect(),
        // Half a step of amax/127, and the f16 rounding of the scale.
        sys::GGML_TYPE_Q8_0 => per_block(32, &|b| 0.6 * amax(b) / 127.0),
        // 4 / 5 / 6-bit k-quants in blocks of 256 with quantised sub-block
        // scales and mins: one step of the block's range, plus the
        // quantisation of the sub-block scales.
        sys::GGML_TYPE_Q4_K => per_block(256, &|b| range(b) / 15.0 + amax(b) / 63.0),
        sys::GGML_TYPE_Q5_K => per_block(256, &|b| range(b) / 31.0 + amax(b) / 63.0),
        sys::GGML_TYPE_Q6_K => per_block(256, &|b| amax(b) / 31.0),
        other => panic!("no tolerance for ggml type {other}"),
    }
}

/// Checks every tensor of `merged` against `base` and `plan`; returns the
/// ggml types of the merged tensors it compared.
fn check_merged(base: &Path, merged: &Path, plan: &MergePlan) -> Vec<u32> {
    let b = LlamaGguf::open(base).unwrap();
    let m = LlamaGguf::open(merged).unwrap();
    let mut names = m.tensor_names();
    let mut base_names = b.tensor_names();
    names.sort();
    base_names.sort();
    assert_eq!(names, base_names, "the merged file has the base's tensors");
    let mut types = Vec::new();
    for name in m.tensor_names() {
        let ty = m.tensor_type(&name).unwrap();
        assert_eq!(ty, b.tensor_type(&name).unwrap(), "{name}: type kept");
        let (bt, mt) = (
            b.tensor_as_f32(&name).unwrap(),
            m.tensor_as_f32(&name).unwrap(),
        );
        let experts = |t: &F32Tensor| -> Vec<Vec<f32>> {
            let n = t.ne.iter().rev().find(|&&n| n > 1).copied().unwrap_or(1);
            t.data
                .chunks(t.data.len() / n)
                .map(<[f32]>::to_vec)
                .collect()
        };
        if let Some(l) = merged_tensor(&name) {
            types.push(ty);
            let (be, me) = (experts(&bt), experts(&mt));
            let centres = &plan.layers[&l];
            assert_eq!(me.len(), centres.len(), "{name}: one expert per centre");
            for (c, got) in centres.iter().zip(&me) {
                let sum: f64 = c.members.iter().map(|x| x.weight).sum();
                let want: Vec<f32> = (0..got.len())
                    .map(|j| {
                        let mut a = 0f64;
                        for x in &c.members {
                            a += x.weight / sum * f64::from(be[x.expert as usize][j]);
                        }
                        a as f32
                    })
                    .collect();
                let tol = match c.members.len() {
                    1 => vec![0.0; want.len()], // copied as it is
                    _ => tolerance(ty, &want),
                };
                for (j, ((g, w), t)) in got.iter().zip(&want).zip(&tol).enumerate() {
                    assert!(
                        (g - w).abs() <= *t,
                        "{name} (type {ty}), centre {}, value {j}: {g} vs the mean {w} (allowed {t})",
                        c.centre
                    );
                }
            }
        } else if let Some(l) = centre_rows(&name) {
            let be = experts(&bt);
            let want: Vec<f32> = plan.layers[&l]
                .iter()
                .flat_map(|c| be[c.centre as usize].clone())
                .collect();
            assert_eq!(mt.data, want, "{name}: the centres' rows");
        } else {
            assert_eq!(mt.data, bt.data, "{name}: the base's tensor");
        }
    }
    types
}

/// The base model of `preset` as llama.cpp's quantiser writes `ftype`
/// (none: the generated f32 model).
fn base_as(dir: &Path, preset: Preset, ftype: Option<sys::llama_ftype>) -> PathBuf {
    let f32_model = dir.join(format!("{preset:?}-f32.gguf"));
    if !f32_model.exists() {
        synth::write_model_as(preset, 7, Some(synth::WeightType::F32), &f32_model).unwrap();
    }
    match ftype {
        None => f32_model,
        Some(ftype) => {
            let out = dir.join(format!("{preset:?}-{ftype}.gguf"));
            quantize(&f32_model, &out, ftype, 2).unwrap();
            out
        }
    }
}

fn merges_every_type_like_the_reference(preset: Preset, moe_layers: &[u32]) {
    let dir = tempfile::tempdir().unwrap();
    let spec = preset.spec();
    let plan = plan(moe_layers, spec.n_expert as u32, 6);
    assert!(plan.merges_anything());
    let codec = GgmlCodec::new();
    let tokens: Vec<i32> = fixtures::chunks(2, 32)[0].tokens.clone();
    let mut seen = Vec::new();
    for (label, ftype) in [
        ("F32", None),
        ("F16", Some(sys::LLAMA_FTYPE_MOSTLY_F16)),
        ("BF16", Some(sys::LLAMA_FTYPE_MOSTLY_BF16)),
        ("Q8_0", Some(sys::LLAMA_FTYPE_MOSTLY_Q8_0)),
        ("Q4_K_S", Some(sys::LLAMA_FTYPE_MOSTLY_Q4_K_S)),
    ] {
        let base = base_as(dir.path(), preset, ftype);
        let out = dir.path().join(format!("merged-{label}.gguf"));
        let sliced = slicer::merge_model(&base, &plan, Some(&codec), &out)
            .unwrap_or_else(|e| panic!("{preset:?} {label}: {e}"));
        assert_eq!(sliced.k, 6);
        let types = check_merged(&base, &out, &plan);
        let logits = fixtures::llama_logits::logits(&out, &tokens, 2)
            .unwrap_or_else(|e| panic!("{preset:?} {label}: {e}"));
        assert!(
            logits.iter().flatten().all(|v| v.is_finite()),
            "{preset:?} {label}: llama.cpp ran the merged model to finite logits"
        );
        let name = LlamaGguf::open(&out).unwrap().str("general.name").unwrap();
        assert!(
            name.ends_with(&format!("(merged to 6 of {} experts)", spec.n_expert)),
            "{name}"
        );
        seen.extend(types);
    }
    for ty in [
        sys::GGML_TYPE_F32,
        sys::GGML_TYPE_F16,
        sys::GGML_TYPE_BF16,
        sys::GGML_TYPE_Q8_0,
        sys::GGML_TYPE_Q4_K,
    ] {
        assert!(
            seen.contains(&ty),
            "{preset:?}: type {ty} among the merged tensors {seen:?}"
        );
    }
}

#[test]
fn merged_glm4moe_experts_are_the_weighted_means_of_their_members() {
    merges_every_type_like_the_reference(Preset::TinyAltQk, &[1, 2]);
}

#[test]
fn merged_fused_gate_up_experts_are_the_weighted_means_of_their_members() {
    merges_every_type_like_the_reference(Preset::Qwen35moeFused, &[0, 1, 2, 3]);
}

#[test]
fn a_plan_that_merges_nothing_writes_the_pruned_slice_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_as(
        dir.path(),
        Preset::TinyAltQk,
        Some(sys::LLAMA_FTYPE_MOSTLY_Q4_K_M),
    );
    let mut alone = plan(&[1, 2], 16, 6);
    for centres in alone.layers.values_mut() {
        centres
            .iter_mut()
            .for_each(|c| *c = Centre::alone(c.centre));
    }
    let (merged, pruned) = (dir.path().join("m.gguf"), dir.path().join("p.gguf"));
    let a = slicer::merge_model(&base, &alone, Some(&GgmlCodec::new()), &merged).unwrap();
    let b = slicer::slice_model(&base, &alone.keep_map(), &pruned).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        std::fs::read(&merged).unwrap(),
        std::fs::read(&pruned).unwrap()
    );
    // Without a codec a quantised model's experts cannot be merged, and
    // nothing is written.
    let out = dir.path().join("refused.gguf");
    let err = slicer::merge_model(&base, &plan(&[1, 2], 16, 6), None, &out).unwrap_err();
    assert!(
        err.to_string().contains("needs ggml's type traits"),
        "{err}"
    );
    assert!(!out.exists());
}

/// A model split across files (llama.cpp's `gguf-split` layout, written by
/// the generator, not the slicer) merges to the same file as the model in
/// one file; merged into split files, llama.cpp loads it as that model.
#[test]
fn merging_a_split_model_gives_the_tensors_of_merging_it_in_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let (preset, layers) = (Preset::TinyAltQk, [1, 2]);
    let spec = preset.spec();
    // Q8_0 experts: the merge goes through ggml's codec.
    let o = synth::Overrides {
        weights: Some(synth::WeightType::Q8_0),
        ..Default::default()
    };
    let whole = dir.path().join("whole.gguf");
    synth::write_model_with(preset, 7, o, &whole).unwrap();
    let first =
        synth::write_model_split(preset, 7, o, &dir.path().join("split/m.gguf"), 3).unwrap();
    assert!(first.ends_with("split/m-00001-of-00003.gguf"));
    let plan = plan(&layers, spec.n_expert as u32, 6);
    assert!(plan.merges_anything());
    let codec = GgmlCodec::new();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    let from_whole = slicer::merge_model(&whole, &plan, Some(&codec), &a).unwrap();
    let from_split = slicer::merge_model(&first, &plan, Some(&codec), &b).unwrap();
    assert_eq!(from_whole, from_split);
    // Tensor by tensor, through llama.cpp's GGUF reader: same names, types
    // and bytes; and the merged experts are their members' means.
    let (ga, gb) = (LlamaGguf::open(&a).unwrap(), LlamaGguf::open(&b).unwrap());
    assert_eq!(ga.tensor_names(), gb.tensor_names());
    let (fa, fb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let mut q8 = 0;
    for name in ga.tensor_names() {
        assert_eq!(ga.tensor_type(&name), gb.tensor_type(&name), "{name}");
        let (ra, rb) = (
            ga.tensor_range(&name).unwrap(),
            gb.tensor_range(&name).unwrap(),
        );
        let bytes =
            |f: &[u8], (start, len): (u64, u64)| f[start as usize..(start + len) as usize].to_vec();
        assert!(bytes(&fa, ra) == bytes(&fb, rb), "{name}: same bytes");
        q8 += usize::from(
            merged_tensor(&name).is_some() && ga.tensor_type(&name) == Some(sys::GGML_TYPE_Q8_0),
        );
    }
    assert!(q8 > 0, "some merged tensor is Q8_0");
    assert!(fa == fb, "the same file");
    check_merged(&whole, &a, &plan);

    // Merged into split files of at most a third of the merged model each:
    // llama.cpp gives the same logits as for the one merged file.
    let third = fa.len() as u64 / 3;
    let parts_dir = dir.path().join("parts");
    std::fs::create_dir(&parts_dir).unwrap();
    let parts = slicer::merge_model_split(
        &first,
        &plan,
        Some(&codec),
        &parts_dir.join("m.gguf"),
        third,
    )
    .unwrap();
    assert!(parts.len() >= 3, "{} files", parts.len());
    let tokens: Vec<i32> = fixtures::chunks(2, 32)[0].tokens.clone();
    let one = fixtures::llama_logits::logits(&a, &tokens, 2).unwrap();
    let split = fixtures::llama_logits::logits(&parts[0].0, &tokens, 2).unwrap();
    assert_eq!(
        one, split,
        "llama.cpp runs the split merged model as the one file"
    );
}
