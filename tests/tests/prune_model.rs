//! Pruned models against independent references. A keep-all slice gives
//! bitwise the base model's logits; a real slice of `tiny` (qwen3moe) and
//! `tiny-alt` (glm4moe: selection bias, shared expert, leading dense block)
//! routes and predicts like an f64 forward pass of the *base* weights with
//! the removed experts masked out of the router; f16 and Q8_0 slices equal
//! the base's kept experts element for element (dequantised by ggml) and run
//! in llama.cpp exactly like the base model with the removed experts masked
//! through its selection bias. A Q4_K_M model made by llama.cpp's own
//! quantizer, pruned by `coordinator prune`, keeps the base's kept experts'
//! bytes and runs like the masked base too. On a grouped model with a
//! selection bias (deepseek2), the substitution screen's predicted routing
//! of a pruned model is llama.cpp's, token for token, at the first MoE layer.

use fixtures::llama_gguf::LlamaGguf;
use fixtures::llama_logits::logits;
use fixtures::oracle::Oracle;
use runfiles::keepmap::KeepMap;
use slicer::slice_model;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use synth::{Preset, WeightType};
use worker::collect::CollectOptions;

const N_CTX: u32 = 48;
/// Largest logit difference allowed, relative to the row's largest |logit|.
const REL: f64 = 1e-4;

/// A keep map keeping `k` pseudo-randomly chosen experts of each layer
/// (a different choice per layer).
fn keep_map(layers: &[u32], n_expert: u32, k: u32) -> KeepMap {
    let mut layer_map = BTreeMap::new();
    for &l in layers {
        let mut ids: Vec<u32> = (0..n_expert).collect();
        let mut state = 0x9e37_79b9u64 + l as u64 * 7919;
        for i in (1..ids.len()).rev() {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ids.swap(i, (state >> 33) as usize % (i + 1));
        }
        let mut kept = ids[..k as usize].to_vec();
        kept.sort();
        layer_map.insert(l, kept);
    }
    KeepMap {
        method: "test".into(),
        k,
        params: serde_json::Value::Null,
        saliency_sha256: String::new(),
        layers: layer_map,
    }
}

fn layers_of(map: &KeepMap) -> BTreeMap<u32, Vec<u32>> {
    map.layers.clone()
}

fn tokens() -> Vec<i32> {
    fixtures::chunks(2, N_CTX)[0].tokens.clone()
}

/// Selected experts per (block, position) as llama.cpp routed them in
/// `model`, read from the collector's trace (ids of that model).
fn routing(model: &Path, dir: &Path) -> BTreeMap<(u32, usize), Vec<u32>> {
    let chunks = fixtures::chunks(2, N_CTX)[..1].to_vec();
    let opts = CollectOptions {
        n_ubatch: N_CTX,
        threads: 2,
        trace_every: 1,
        trace_top_n: 4,
        f32_kv: true,
        flash_attn: false,
        ..Default::default()
    };
    fixtures::collect(model, dir, &chunks, N_CTX, opts)
        .trace
        .iter()
        .map(|r| {
            let mut sel: Vec<u32> = r.selected.iter().map(|&e| e as u32).collect();
            sel.sort();
            ((r.layer, r.pos as usize), sel)
        })
        .collect()
}

/// Pruned-model routing translated back to base expert ids.
fn to_base_ids(
    routing: BTreeMap<(u32, usize), Vec<u32>>,
    keep: &BTreeMap<u32, Vec<u32>>,
) -> BTreeMap<(u32, usize), Vec<u32>> {
    routing
        .into_iter()
        .map(|((l, pos), sel)| {
            let mut base: Vec<u32> = sel.iter().map(|&e| keep[&l][e as usize]).collect();
            base.sort();
            ((l, pos), base)
        })
        .collect()
}

/// Asserts every logit within `rel` of the row's largest |reference logit|.
fn assert_logits_close(what: &str, got: &[Vec<f32>], want: &[Vec<f64>], rel: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: positions");
    let mut worst = 0f64;
    for (pos, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: vocabulary");
        let scale = w.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (tok, (a, b)) in g.iter().zip(w).enumerate() {
            let d = (*a as f64 - b).abs() / scale;
            worst = worst.max(d);
            assert!(d <= rel, "{what}: pos {pos} token {tok}: llama.cpp {a}, reference {b} (|diff| / max|logit| = {d:e})");
        }
    }
    worst
}

/// Asserts [`assert_logits_close`] for the logits llama.cpp computes with
/// `model` and with `reference` over [`tokens`]; the worst deviation.
fn assert_runs_like(what: &str, model: &Path, reference: &Path, rel: f64) -> f64 {
    let tokens = tokens();
    let got = logits(model, &tokens, 2).unwrap();
    let want: Vec<Vec<f64>> = logits(reference, &tokens, 2)
        .unwrap()
        .into_iter()
        .map(|r| r.into_iter().map(f64::from).collect())
        .collect();
    assert_logits_close(what, &got, &want, rel)
}

fn slice(base: &Path, map: &KeepMap, dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let sliced = slice_model(base, map, &out).unwrap();
    assert_eq!(sliced.k, map.k);
    assert_eq!(sliced.sha256, gguf::hash::sha256_file(&out).unwrap());
    out
}

fn keep_all_gives_the_base_logits_bitwise(preset: Preset) {
    let dir = tempfile::tempdir().unwrap();
    let base = fixtures::model(dir.path(), preset);
    let oracle = Oracle::load(&base);
    let n = oracle.n_expert() as u32;
    let map = keep_map(&oracle.moe_layers(), n, n);
    let pruned = slice(&base, &map, dir.path(), "keep-all.gguf");
    let tokens = tokens();
    let a = logits(&base, &tokens, 2).unwrap();
    let b = logits(&pruned, &tokens, 2).unwrap();
    for (pos, (x, y)) in a.iter().zip(&b).enumerate() {
        let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(
            same,
            "{preset:?} pos {pos}: keep-all logits differ from the base's"
        );
    }
}

#[test]
fn keep_all_tiny_gives_the_base_logits_bitwise() {
    keep_all_gives_the_base_logits_bitwise(Preset::Tiny);
}

#[test]
fn keep_all_tiny_alt_gives_the_base_logits_bitwise() {
    keep_all_gives_the_base_logits_bitwise(Preset::TinyAlt);
}

fn pruned_matches_the_masked_oracle(preset: Preset, k: u32) {
    let dir = tempfile::tempdir().unwrap();
    let base = fixtures::model(dir.path(), preset);
    let oracle = Oracle::load(&base);
    let map = keep_map(&oracle.moe_layers(), oracle.n_expert() as u32, k);
    let keep = layers_of(&map);
    let pruned = slice(&base, &map, dir.path(), "pruned.gguf");
    let tokens = tokens();
    let want = oracle.forward(&tokens, &keep);

    let routed = to_base_ids(routing(&pruned, dir.path()), &keep);
    assert_eq!(
        routed.len(),
        want.selected.len(),
        "one routing per MoE layer and token"
    );
    for (key, sel) in &want.selected {
        assert_eq!(
            &routed[key], sel,
            "{preset:?} block {} pos {}: selected experts",
            key.0, key.1
        );
    }
    let mut counts: BTreeMap<(u32, u32), u32> = BTreeMap::new();
    for ((l, _), sel) in &routed {
        sel.iter()
            .for_each(|&e| *counts.entry((*l, e)).or_default() += 1);
    }
    let removed_used = counts.keys().filter(|(l, e)| !keep[l].contains(e)).count();
    assert_eq!(removed_used, 0, "no removed expert is ever routed to");
    // The mask matters: the unmasked base routes some tokens to removed experts.
    let unmasked = oracle.forward(&tokens, &BTreeMap::new());
    assert!(unmasked
        .selected
        .iter()
        .any(|((l, _), sel)| sel.iter().any(|e| !keep[l].contains(e))));

    let got = logits(&pruned, &tokens, 2).unwrap();
    let worst = assert_logits_close(&format!("{preset:?} K={k}"), &got, &want.logits, REL);
    println!("{preset:?} K={k}: worst logit deviation {worst:e} of the row's max |logit|");
}

#[test]
fn pruned_tiny_routes_and_predicts_like_the_masked_base_oracle() {
    pruned_matches_the_masked_oracle(Preset::Tiny, 8);
    pruned_matches_the_masked_oracle(Preset::Tiny, 4);
}

#[test]
fn pruned_tiny_alt_routes_and_predicts_like_the_masked_base_oracle() {
    pruned_matches_the_masked_oracle(Preset::TinyAlt, 12);
}

/// A copy of glm4moe `base` whose selection bias is -1e30 for the experts
/// `keep` removes: llama.cpp then never selects them, and computes what the
/// pruned model should. Patched through llama.cpp's own view of the file.
fn masked_base(base: &Path, keep: &BTreeMap<u32, Vec<u32>>, out: &Path) {
    let g = LlamaGguf::open(base).unwrap();
    let mut bytes = std::fs::read(base).unwrap();
    for (l, kept) in keep {
        let (start, len) = g
            .tensor_range(&format!("blk.{l}.exp_probs_b.bias"))
            .unwrap();
        for e in 0..len as usize / 4 {
            if !kept.contains(&(e as u32)) {
                let at = start as usize + 4 * e;
                bytes[at..at + 4].copy_from_slice(&(-1e30f32).to_le_bytes());
            }
        }
    }
    std::fs::write(out, bytes).unwrap();
}

fn quantized_slice_runs_like_the_masked_base(weights: WeightType, ggml_type: u32) {
    let dir = tempfile::tempdir().unwrap();
    let base = fixtures::model_as(dir.path(), Preset::TinyAlt, weights);
    let g = LlamaGguf::open(&base).unwrap();
    let (layers, n_expert) = ((1..4).collect::<Vec<u32>>(), 24);
    let map = keep_map(&layers, n_expert, 12);
    let keep = layers_of(&map);
    let pruned = slice(&base, &map, dir.path(), "pruned.gguf");

    let p = LlamaGguf::open(&pruned).unwrap();
    for (l, kept) in &keep {
        for name in [
            "ffn_gate_exps",
            "ffn_up_exps",
            "ffn_down_exps",
            "ffn_gate_inp",
            "exp_probs_b",
        ] {
            let suffix = if name == "exp_probs_b" {
                "bias"
            } else {
                "weight"
            };
            let name = format!("blk.{l}.{name}.{suffix}");
            if name.contains("_exps") {
                assert_eq!(
                    p.tensor_type(&name),
                    Some(ggml_type),
                    "{name} keeps its type"
                );
            }
            let (b, s) = (
                g.tensor_as_f32(&name).unwrap(),
                p.tensor_as_f32(&name).unwrap(),
            );
            let outer = b.ne.iter().rposition(|&n| n > 1).unwrap();
            assert_eq!(s.ne[outer], kept.len(), "{name}: experts");
            let per = b.data.len() / n_expert as usize;
            let want: Vec<u32> = kept
                .iter()
                .flat_map(|&e| {
                    b.data[e as usize * per..(e as usize + 1) * per]
                        .iter()
                        .map(|v| v.to_bits())
                })
                .collect();
            let got: Vec<u32> = s.data.iter().map(|v| v.to_bits()).collect();
            assert!(
                got == want,
                "{name}: dequantised values are the base's kept experts'"
            );
        }
    }

    let masked = dir.path().join("masked.gguf");
    masked_base(&base, &keep, &masked);
    let sub = dir.path().join("runs");
    std::fs::create_dir_all(sub.join("a")).unwrap();
    std::fs::create_dir_all(sub.join("b")).unwrap();
    let routed = to_base_ids(routing(&pruned, &sub.join("a")), &keep);
    let reference = routing(&masked, &sub.join("b"));
    assert_eq!(
        routed, reference,
        "{weights:?}: pruned and masked-base routing"
    );
    let worst = assert_runs_like(&format!("{weights:?}"), &pruned, &masked, 1e-5);
    println!(
        "{weights:?}: worst deviation from the masked base {worst:e} of the row's max |logit|"
    );
}

#[test]
fn f16_slice_runs_like_the_masked_base() {
    quantized_slice_runs_like_the_masked_base(WeightType::F16, 1);
}

#[test]
fn q8_0_slice_runs_like_the_masked_base() {
    quantized_slice_runs_like_the_masked_base(WeightType::Q8_0, 8);
}

/// The stacked expert matrices of a MoE block: the tensors a k-quant must
/// reach for the test below to test k-quant slicing at all.
const EXPERT_MATRICES: [&str; 3] = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"];

/// Whether a tensor has the expert axis (DESIGN section 12's expert family,
/// as far as the generated architectures have it).
fn expert_family(name: &str) -> bool {
    ["ffn_gate_inp.", "exp_probs_b.", "_exps."]
        .iter()
        .any(|f| name.contains(f))
}

/// An importance matrix shaped like the stacked expert weights of
/// `tiny-alt-qk`'s MoE blocks, each expert's counts = its id.
fn qk_imatrix(layers: &[u32], n_in: u32, n_expert: u32) -> Vec<u8> {
    let mut m = numbers::imatrix::Imatrix {
        chunk_count: 1,
        chunk_size: N_CTX,
        ..Default::default()
    };
    for l in layers {
        for name in EXPERT_MATRICES {
            let mut e = numbers::imatrix::ImatrixEntry::new(n_in, n_expert);
            e.counts = (0..u64::from(n_expert)).collect();
            m.entries.insert(format!("blk.{l}.{name}.weight"), e);
        }
    }
    m.to_gguf(&["test".into()])
}

/// A tensor's data bytes in `file`, where llama.cpp's reader places them.
fn tensor_bytes<'a>(file: &'a [u8], g: &LlamaGguf, name: &str) -> &'a [u8] {
    let (start, len) = g
        .tensor_range(name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    &file[start as usize..(start + len) as usize]
}

#[test]
fn k_quant_model_pruned_by_coordinator_prune_runs_like_the_masked_base() {
    use fixtures::llama_quantize::{quantize, Q4_K_M};
    use llama_cpp_sys_2 as sys;
    let dir = tempfile::tempdir().unwrap();
    let f16 = fixtures::model(dir.path(), Preset::TinyAltQk);
    let base = dir.path().join("base-q4_k_m.gguf");
    quantize(&f16, &base, Q4_K_M, 2).unwrap();
    let g = LlamaGguf::open(&base).unwrap();
    let n_expert = g.u32("glm4moe.expert_count").unwrap();
    let layers: Vec<u32> = (1..3).collect();
    // llama.cpp falls back to other types for rows that are not whole
    // blocks of 256: the expert matrices must really be k-quants.
    let mut k_types = std::collections::BTreeSet::new();
    for l in &layers {
        for m in EXPERT_MATRICES {
            let name = format!("blk.{l}.{m}.weight");
            let t = g.tensor_type(&name).unwrap();
            assert!(
                (sys::GGML_TYPE_Q2_K..=sys::GGML_TYPE_Q6_K).contains(&t),
                "{name} is ggml type {t}, not a k-quant"
            );
            k_types.insert(t);
        }
        let bias = format!("blk.{l}.exp_probs_b.bias");
        assert_eq!(g.tensor_type(&bias), Some(sys::GGML_TYPE_F32), "{bias}");
    }
    assert!(k_types.contains(&sys::GGML_TYPE_Q4_K), "{k_types:?}");

    let map = keep_map(&layers, n_expert, 8);
    let keep = layers_of(&map);
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("keep_maps")).unwrap();
    std::fs::write(
        run.join(KeepMap::object_name("test_K8")),
        serde_json::to_vec(&map).unwrap(),
    )
    .unwrap();
    std::fs::write(run.join("imatrix.gguf"), qk_imatrix(&layers, 256, n_expert)).unwrap();
    let pruned = dir.path().join("pruned.gguf");
    let out = fixtures::run_ok(
        "coordinator",
        &[
            "prune",
            run.to_str().unwrap(),
            "--keep-map",
            "test_K8",
            "--model",
            base.to_str().unwrap(),
            "--out",
            pruned.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Router, selection bias and three expert matrices in each of 2 blocks.
    assert!(stdout.contains("10 tensors sliced"), "{stdout}");

    let p = LlamaGguf::open(&pruned).unwrap();
    assert_eq!(p.u32("glm4moe.expert_count"), Some(8));
    assert_eq!(
        p.u32("glm4moe.expert_used_count"),
        g.u32("glm4moe.expert_used_count")
    );
    assert_eq!(p.tensor_names(), g.tensor_names());
    let (base_file, pruned_file) = (
        std::fs::read(&base).unwrap(),
        std::fs::read(&pruned).unwrap(),
    );
    let mut sliced = 0;
    for name in g.tensor_names() {
        assert_eq!(p.tensor_type(&name), g.tensor_type(&name), "{name}: type");
        let (b, s) = (
            tensor_bytes(&base_file, &g, &name),
            tensor_bytes(&pruned_file, &p, &name),
        );
        let block: Option<u32> = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse().ok());
        let Some(kept) = block
            .and_then(|l| keep.get(&l))
            .filter(|_| expert_family(&name))
        else {
            assert!(b == s, "{name}: copied unchanged");
            continue;
        };
        assert_eq!(b.len() % n_expert as usize, 0, "{name}: whole experts");
        let per = b.len() / n_expert as usize;
        let want: Vec<u8> = kept
            .iter()
            .flat_map(|&e| &b[e as usize * per..(e as usize + 1) * per])
            .copied()
            .collect();
        assert!(s == want, "{name}: the kept experts' byte ranges, in order");
        sliced += 1;
    }
    assert_eq!(sliced, 10);

    // llama.cpp loads the pruned model and routes and predicts like the
    // base with the removed experts masked out of its selection.
    let masked = dir.path().join("masked.gguf");
    masked_base(&base, &keep, &masked);
    let sub = dir.path().join("runs");
    for s in ["pruned", "masked", "base"] {
        std::fs::create_dir_all(sub.join(s)).unwrap();
    }
    let routed = to_base_ids(routing(&pruned, &sub.join("pruned")), &keep);
    let reference = routing(&masked, &sub.join("masked"));
    assert_eq!(
        routed.len(),
        2 * N_CTX as usize,
        "every token in both MoE blocks"
    );
    assert_eq!(routed, reference, "Q4_K_M: pruned and masked-base routing");
    let unmasked = routing(&base, &sub.join("base"));
    assert!(
        unmasked
            .iter()
            .any(|((l, _), sel)| sel.iter().any(|e| !keep[l].contains(e))),
        "the unmasked base routes some tokens to removed experts"
    );
    // Same kernels on the same k-quant bytes: nothing may move at all.
    assert_runs_like("Q4_K_M", &pruned, &masked, 0.0);
    println!(
        "Q4_K_M (ggml types {k_types:?}): the pruned model's logits are the masked base's, bitwise"
    );
}

/// A keep map keeping `k / n_group` pseudo-randomly chosen experts of every
/// routing group of each layer (groups of `n_expert / n_group` consecutive
/// ids), as grouped routing requires.
fn balanced_keep_map(layers: &[u32], n_expert: u32, n_group: u32, k: u32) -> KeepMap {
    let size = n_expert / n_group;
    let mut map = keep_map(layers, n_expert, k);
    for (&l, kept) in map.layers.iter_mut() {
        // A different pseudo-random choice per (layer, group).
        *kept = (0..n_group)
            .flat_map(|g| {
                let in_group = keep_map(&[l * n_group + g], size, k / n_group);
                in_group
                    .layers
                    .into_values()
                    .next()
                    .unwrap()
                    .into_iter()
                    .map(move |e| g * size + e)
            })
            .collect();
        kept.sort();
    }
    map
}

/// The substitution screen's predicted routing of a pruned model
/// (`KeepMask::predicted` on the base model's trace: probability plus
/// selection bias, within the groups the kept experts allow) is what
/// llama.cpp routes the pruned model to, token for token, at the first MoE
/// layer: deepseek2 as DeepSeek-V3 (32 experts in 4 groups, 2 used per
/// token, sigmoid with a selection bias). Block 1 follows a dense block, so
/// both models see the same router input there.
#[test]
fn screen_predicts_the_pruned_grouped_biased_routing_at_the_first_moe_layer() {
    screen_predicts_llama_cpp(Preset::Deepseek2);
}

/// The same with softmax gating and a selection bias: the pruned model's
/// softmax runs over the kept experts, and the screen re-ranks them on the
/// renormalised probabilities plus the bias. The unrenormalised rule (the
/// traced order, as sigmoid gating keeps it) mispredicts some tokens.
#[test]
fn screen_predicts_the_pruned_softmax_biased_routing_renormalised() {
    let (tokens, unrenormalised) = screen_predicts_llama_cpp(Preset::Deepseek2Softmax);
    println!("unrenormalised rule: {unrenormalised} of {tokens} tokens as llama.cpp routes them");
    assert!(
        unrenormalised < tokens,
        "the renormalisation must matter on this model: {unrenormalised} of {tokens}"
    );
}

/// Checks the screen's prediction against llama.cpp's routing of pruned
/// slices of `preset` at K = 8 and 16; returns the tokens compared and how
/// many of them the unrenormalised rule (the traced order) also predicts.
fn screen_predicts_llama_cpp(preset: Preset) -> (usize, usize) {
    use numbers::Gating;
    use stages::score::screen::KeepMask;
    let dir = tempfile::tempdir().unwrap();
    let base = fixtures::model(dir.path(), preset);
    let chunks = fixtures::chunks(2, N_CTX)[..1].to_vec();
    let index = fixtures::write_corpus(dir.path(), &chunks, N_CTX);
    let opts = CollectOptions {
        n_ubatch: N_CTX,
        threads: 2,
        trace_every: 1,
        trace_top_n: 1000,
        f32_kv: true,
        flash_attn: false,
        ..Default::default()
    };
    let mut c = worker::collect::Collector::load(&base, opts).unwrap();
    let trace = c.run(&index, &chunks, &mut |_, _| {}).unwrap().trace;
    let shape = c.shape().clone();
    let groups = shape
        .routing
        .groups
        .expect("deepseek2 preset routes by groups");
    assert!(groups.n_group > 1 && !shape.routing.selection_bias.is_empty());
    let first = shape.moe_layers[0];
    let rows: Vec<_> = trace.iter().filter(|r| r.layer == first).collect();
    assert_eq!(rows.len(), N_CTX as usize);
    let (mut compared, mut plain_right) = (0, 0);
    for k in [8, 16] {
        let map = balanced_keep_map(&shape.moe_layers, shape.n_expert, groups.n_group, k);
        let pruned = slice(&base, &map, dir.path(), &format!("pruned-{k}.gguf"));
        let sub = dir.path().join(format!("routing-{k}"));
        std::fs::create_dir_all(&sub).unwrap();
        let real = to_base_ids(routing(&pruned, &sub), &layers_of(&map));
        let mask = KeepMask::new(&map, shape.n_expert as usize, &shape.routing, shape.gating);
        // The traced order with no renormalisation (what sigmoid gating keeps).
        let traced = KeepMask::new(
            &map,
            shape.n_expert as usize,
            &shape.routing,
            Gating::Sigmoid,
        );
        let kept = &layers_of(&map)[&first];
        let (mut substituted, mut rule_matters) = (0, 0);
        for row in &rows {
            let sorted = |m: &KeepMask| {
                let mut v: Vec<u32> = m
                    .predicted(row)
                    .unwrap()
                    .iter()
                    .map(|&e| e as u32)
                    .collect();
                v.sort();
                v
            };
            let predicted = sorted(&mask);
            let pos = row.pos as usize;
            assert_eq!(
                Some(&predicted),
                real.get(&(first, pos)),
                "{preset:?} K={k} pos {pos}: screen vs llama.cpp"
            );
            compared += 1;
            plain_right += usize::from(Some(&sorted(&traced)) == real.get(&(first, pos)));
            let mut base_sel: Vec<u32> = row.selected.iter().map(|&e| e as u32).collect();
            base_sel.sort();
            substituted += usize::from(base_sel != predicted);
            // The plain rule: the best kept experts by probability alone.
            let mut by_prob: Vec<(u32, f32)> = row
                .topn_id
                .iter()
                .zip(&row.topn_prob)
                .filter(|(e, _)| kept.contains(&u32::from(**e)))
                .map(|(&e, &p)| (u32::from(e), p))
                .collect();
            by_prob.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut plain: Vec<u32> = by_prob
                .iter()
                .take(row.selected.len())
                .map(|&(e, _)| e)
                .collect();
            plain.sort();
            rule_matters += usize::from(plain != predicted);
        }
        assert!(
            substituted > 0,
            "K={k}: the map must prune selected experts"
        );
        assert!(
            rule_matters > 0,
            "K={k}: bias and groups must change some token's routing"
        );
    }
    (compared, plain_right)
}
