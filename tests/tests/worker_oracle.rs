//! The collector against an independent oracle: router probabilities, top-k,
//! gate weights and expert outputs recomputed in plain Rust (f64) from the
//! GGUF weights, as llama.cpp's own GGUF reader returns them, and from the
//! MoE input dumped out of the graph; the importance matrix's `in_sum2`,
//! `in_sum` and counts from the same dumps. Runs on both generated
//! architectures.

use common::imatrix::Imatrix;
use common::stats::GroupKey;
use common::{Gating, Split};
use fixtures::llama_gguf::LlamaGguf;
use std::collections::BTreeMap;
use worker::collect::device::Reduce;
use worker::collect::{CollectOptions, Collected, Collector};
use worker::synth::Preset;

const N_CTX: u32 = 48;
const N_CHUNKS: u32 = 4;
const REL: f64 = 1e-4;

/// Expected statistics of one (split, domain) and layer.
#[derive(Clone, Default)]
struct Expected {
    count: Vec<u64>,
    prob: Vec<f64>,
    weight: Vec<f64>,
    ean: Vec<f64>,
    l2: Vec<f64>,
    l2_sq: Vec<f64>,
}

impl Expected {
    fn new(n: usize) -> Self {
        Expected {
            count: vec![0; n],
            prob: vec![0.0; n],
            weight: vec![0.0; n],
            ean: vec![0.0; n],
            l2: vec![0.0; n],
            l2_sq: vec![0.0; n],
        }
    }
}

/// Expected importance-matrix sums of one weight; `abs` (the sums of
/// `|x|`) scales the tolerance of the signed `sum`, which cancels.
#[derive(Clone)]
struct ExpectedImatrix {
    n_in: usize,
    sum: Vec<f64>,
    abs: Vec<f64>,
    sum2: Vec<f64>,
    counts: Vec<u64>,
}

impl ExpectedImatrix {
    fn new(n_in: usize, n_mat: usize) -> Self {
        ExpectedImatrix {
            n_in,
            sum: vec![0.0; n_in * n_mat],
            abs: vec![0.0; n_in * n_mat],
            sum2: vec![0.0; n_in * n_mat],
            counts: vec![0; n_mat],
        }
    }
    fn add(&mut self, mat: usize, x: &[f64]) {
        self.counts[mat] += 1;
        let at = mat * self.n_in..(mat + 1) * self.n_in;
        for (i, v) in at.zip(x) {
            self.sum[i] += v;
            self.abs[i] += v.abs();
            self.sum2[i] += v * v;
        }
    }
}

fn assert_close(what: &str, got: f64, want: f64) {
    let tol = REL * want.abs().max(got.abs()) + 1e-9;
    assert!(
        (got - want).abs() <= tol,
        "{what}: measured {got}, oracle {want} (|diff| {} > {tol})",
        (got - want).abs()
    );
}

fn matvec(w: &[f32], n_in: usize, row0: usize, n_out: usize, x: &[f64]) -> Vec<f64> {
    (0..n_out)
        .map(|r| {
            w[(row0 + r) * n_in..(row0 + r + 1) * n_in]
                .iter()
                .zip(x)
                .map(|(a, b)| *a as f64 * b)
                .sum()
        })
        .collect()
}

fn collect(
    preset: Preset,
    dir: &std::path::Path,
    reduce: Reduce,
) -> (
    std::path::PathBuf,
    Vec<common::corpus::Chunk>,
    Collected,
    Collector,
) {
    let model = fixtures::model(dir, preset);
    let chunks = fixtures::chunks(N_CHUNKS, N_CTX);
    let index = fixtures::write_corpus(dir, &chunks, N_CTX);
    let probe = Collector::load(&model, CollectOptions::default()).unwrap();
    let layers = probe.shape().moe_layers.clone();
    let mut dump: Vec<String> = layers
        .iter()
        .map(|l| format!("blk.{l}.ffn_gate_inp.weight"))
        .collect();
    dump.push("blk.0.attn_q.weight".into());
    let opts = CollectOptions {
        n_ubatch: 32,
        threads: 2,
        trace_every: 1,
        trace_top_n: 1000,
        f32_kv: true,
        flash_attn: false,
        dump_inputs: dump,
        reduce,
        ..Default::default()
    };
    let mut collector = Collector::load(&model, opts).unwrap();
    let collected = collector.run(&index, &chunks, &mut |_, _| {}).unwrap();
    (model, chunks, collected, collector)
}

fn check_against_oracle(preset: Preset, reduce: Reduce) {
    let dir = tempfile::tempdir().unwrap();
    let (model, chunks, c, collector) = collect(preset, dir.path(), reduce);
    let shape = collector.shape().clone();
    let g = LlamaGguf::open(&model).unwrap();
    let arch = g.str("general.architecture").unwrap();
    let n_embd = g.u32(&format!("{arch}.embedding_length")).unwrap() as usize;
    let n_ff = g
        .u32(&format!("{arch}.expert_feed_forward_length"))
        .unwrap() as usize;
    let (n_expert, k) = (shape.n_expert as usize, shape.n_expert_used as usize);
    let norm_w = g
        .bool(&format!("{arch}.expert_weights_norm"))
        .unwrap_or(arch == "qwen3moe");
    let w_scale = g
        .f32(&format!("{arch}.expert_weights_scale"))
        .filter(|s| *s != 0.0)
        .unwrap_or(1.0) as f64;
    let domains = ["en", "ja"];
    let dumps = &c.dumps;

    let mut expected: BTreeMap<(Split, u16, usize), Expected> = BTreeMap::new();
    let mut imatrix: BTreeMap<String, ExpectedImatrix> = BTreeMap::new();
    let mut routed_rows = 0usize;
    for (li, &layer) in shape.moe_layers.iter().enumerate() {
        let t = |n: &str| {
            g.f32_tensor(&format!("blk.{layer}.{n}"))
                .unwrap_or_else(|| panic!("no f32 blk.{layer}.{n}"))
        };
        let router = t("ffn_gate_inp.weight");
        let bias = g.f32_tensor(&format!("blk.{layer}.exp_probs_b.bias"));
        let (gate, up, down) = (
            t("ffn_gate_exps.weight"),
            t("ffn_up_exps.weight"),
            t("ffn_down_exps.weight"),
        );
        let router_name = format!("blk.{layer}.ffn_gate_inp.weight");
        for chunk in &chunks {
            let xs = dumps
                .get(&(router_name.clone(), chunk.id.0))
                .unwrap_or_else(|| panic!("no dump of the MoE input of layer {layer}"));
            assert_eq!(
                xs.len(),
                chunk.tokens.len() * n_embd,
                "dumped MoE input covers every token"
            );
            let labels = chunk.token_labels();
            for (pos, x) in xs.chunks(n_embd).enumerate() {
                let x: Vec<f64> = x.iter().map(|v| *v as f64).collect();
                let logits = matvec(&router.data, n_embd, 0, n_expert, &x);
                let probs: Vec<f64> = match shape.gating {
                    Gating::Softmax => {
                        let m = logits.iter().cloned().fold(f64::MIN, f64::max);
                        let e: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
                        let s: f64 = e.iter().sum();
                        e.iter().map(|v| v / s).collect()
                    }
                    Gating::Sigmoid => logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect(),
                    Gating::SoftmaxWeight => unreachable!("no preset uses it"),
                };
                let score: Vec<f64> = match &bias {
                    Some(b) => probs
                        .iter()
                        .zip(&b.data)
                        .map(|(p, b)| p + *b as f64)
                        .collect(),
                    None => probs.clone(),
                };
                let mut order: Vec<usize> = (0..n_expert).collect();
                order.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
                let selected = &order[..k];
                let mut w: Vec<f64> = selected.iter().map(|&e| probs[e]).collect();
                if norm_w {
                    let s: f64 = w.iter().sum::<f64>().max(6.103515625e-5);
                    w.iter_mut().for_each(|v| *v /= s);
                }
                w.iter_mut().for_each(|v| *v *= w_scale);
                let (split, domain) = labels[pos];
                let fit = split == Split::Fit;
                let ex = expected
                    .entry((split, domain, li))
                    .or_insert_with(|| Expected::new(n_expert));
                probs.iter().enumerate().for_each(|(e, p)| ex.prob[e] += p);
                let row = c
                    .trace
                    .iter()
                    .find(|r| r.chunk == chunk.id.0 && r.pos == pos as u32 && r.layer == layer)
                    .expect("trace row");
                let mut got: Vec<u16> = row.selected.clone();
                got.sort();
                let mut want: Vec<u16> = selected.iter().map(|&e| e as u16).collect();
                want.sort();
                assert_eq!(
                    got, want,
                    "layer {layer} chunk {} pos {pos}: top-k",
                    chunk.id
                );
                assert_eq!(row.token_id, chunk.tokens[pos]);
                let max_prob = probs.iter().cloned().fold(f64::MIN, f64::max);
                assert_close(
                    "router top-1 probability",
                    probs[row.topn_id[0] as usize],
                    max_prob,
                );
                assert_close(
                    "traced top-1 probability",
                    row.topn_prob[0] as f64,
                    max_prob,
                );
                if fit {
                    imatrix
                        .entry(router_name.clone())
                        .or_insert_with(|| ExpectedImatrix::new(n_embd, 1))
                        .add(0, &x);
                }
                for (j, &e) in selected.iter().enumerate() {
                    let gv = matvec(&gate.data, n_embd, e * n_ff, n_ff, &x);
                    let uv = matvec(&up.data, n_embd, e * n_ff, n_ff, &x);
                    let h: Vec<f64> = gv
                        .iter()
                        .zip(&uv)
                        .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
                        .collect();
                    let y = matvec(&down.data, n_ff, e * n_embd, n_embd, &h);
                    let norm = y.iter().map(|v| v * v).sum::<f64>().sqrt();
                    ex.count[e] += 1;
                    ex.weight[e] += w[j];
                    ex.ean[e] += norm;
                    ex.l2[e] += w[j] * norm;
                    ex.l2_sq[e] += (w[j] * norm).powi(2);
                    let wi = (
                        j,
                        row.selected.iter().position(|&s| s as usize == e).unwrap(),
                    );
                    assert_close(
                        "trace gate weight",
                        row.selected_weight[wi.1] as f64,
                        w[wi.0],
                    );
                    if fit {
                        for (name, input, n_in) in [
                            ("ffn_gate_exps", &x, n_embd),
                            ("ffn_up_exps", &x, n_embd),
                            ("ffn_down_exps", &h, n_ff),
                        ] {
                            imatrix
                                .entry(format!("blk.{layer}.{name}.weight"))
                                .or_insert_with(|| ExpectedImatrix::new(n_in, n_expert))
                                .add(e, input);
                        }
                    }
                }
                routed_rows += 1;
            }
        }
    }
    assert_eq!(
        routed_rows,
        chunks.iter().map(|c| c.tokens.len()).sum::<usize>() * shape.moe_layers.len()
    );
    assert_eq!(
        c.trace.len(),
        routed_rows,
        "one trace row per token and MoE layer"
    );

    // Every statistic of every (split, domain, layer, expert).
    let accum = &c.partial.experts;
    for ((split, domain, li), ex) in &expected {
        let key = GroupKey {
            split: *split,
            domain: domains[*domain as usize].to_string(),
        };
        let got = &accum.groups[&key].layers[*li];
        assert_eq!(
            got.count, ex.count,
            "{split}/{} layer #{li}: counts",
            key.domain
        );
        for (name, g, w) in [
            ("prob_sum", &got.prob_sum, &ex.prob),
            ("weight_sum", &got.weight_sum, &ex.weight),
            ("ean_sum", &got.ean_sum, &ex.ean),
            ("reap_l2_sum", &got.reap_l2_sum, &ex.l2),
            ("reap_l2_sq_sum", &got.reap_l2_sq_sum, &ex.l2_sq),
        ] {
            for e in 0..n_expert {
                assert_close(
                    &format!("{split}/{} layer #{li} expert {e} {name}", key.domain),
                    g[e].to_f64(),
                    w[e],
                );
            }
        }
    }

    // Per-layer invariants: sum(count) == n_tokens * k; softmax probabilities sum to n_tokens.
    let n_tokens: u64 = accum.groups.values().map(|g| g.n_tokens).sum();
    for li in 0..shape.moe_layers.len() {
        let counts: u64 = accum
            .groups
            .values()
            .map(|g| g.layers[li].count.iter().sum::<u64>())
            .sum();
        assert_eq!(counts, n_tokens * k as u64);
        let probs: f64 = accum
            .groups
            .values()
            .flat_map(|g| g.layers[li].prob_sum.iter().map(|p| p.to_f64()))
            .sum();
        if shape.gating == Gating::Softmax {
            assert!(
                (probs - n_tokens as f64).abs() <= 1e-6 * n_tokens as f64,
                "layer #{li}: prob sum {probs} vs {n_tokens}"
            );
        }
    }

    // The attention input of block 0, from its own dump.
    let attn = "blk.0.attn_q.weight".to_string();
    let mut exp_attn = ExpectedImatrix::new(n_embd, 1);
    for chunk in &chunks {
        let xs = &dumps[&(attn.clone(), chunk.id.0)];
        for (pos, x) in xs.chunks(n_embd).enumerate() {
            if chunk.token_labels()[pos].0 == Split::Fit {
                exp_attn.add(0, &x.iter().map(|v| *v as f64).collect::<Vec<_>>());
            }
        }
    }
    // attn_k and attn_v multiply the same normed input as attn_q (the
    // worker computes those sums once and shares them), so they expect the
    // same sums, whatever their output width.
    for shared in ["blk.0.attn_k.weight", "blk.0.attn_v.weight"] {
        imatrix.insert(shared.to_string(), exp_attn.clone());
    }
    imatrix.insert(attn, exp_attn);
    check_imatrix(&c.partial.imatrix, &imatrix);
}

fn check_imatrix(got: &Imatrix, expected: &BTreeMap<String, ExpectedImatrix>) {
    for (name, ex) in expected {
        let e = got
            .entries
            .get(name)
            .unwrap_or_else(|| panic!("imatrix lacks {name}"));
        assert_eq!(e.n_in as usize, ex.n_in, "{name}: n_in");
        assert_eq!(e.counts, ex.counts, "{name}: counts");
        for (i, (g, w)) in e.in_sum2.iter().zip(&ex.sum2).enumerate() {
            assert_close(&format!("{name} in_sum2[{i}]"), g.to_f64(), *w);
        }
        assert_eq!(e.in_sum.len(), ex.sum.len(), "{name}: in_sum length");
        for (i, g) in e.in_sum.iter().enumerate() {
            let (got, want) = (g.to_f64(), ex.sum[i]);
            let tol = REL * ex.abs[i] + 1e-9;
            assert!(
                (got - want).abs() <= tol,
                "{name} in_sum[{i}]: measured {got}, oracle {want} (|diff| {} > {tol})",
                (got - want).abs()
            );
        }
    }
}

#[test]
fn tiny_qwen3moe_statistics_match_the_oracle() {
    check_against_oracle(Preset::Tiny, Reduce::Host);
}

#[test]
fn tiny_alt_glm4moe_statistics_match_the_oracle() {
    check_against_oracle(Preset::TinyAlt, Reduce::Host);
}

/// The device path (issue #14) against the same f64 oracle.
#[test]
fn tiny_qwen3moe_statistics_match_the_oracle_with_device_reductions() {
    check_against_oracle(Preset::Tiny, Reduce::Device);
}

/// The device path (issue #14) against the same f64 oracle.
#[test]
fn tiny_alt_glm4moe_statistics_match_the_oracle_with_device_reductions() {
    check_against_oracle(Preset::TinyAlt, Reduce::Device);
}
