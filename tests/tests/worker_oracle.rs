//! The collector against an independent oracle, on every generated MoE
//! architecture: router probabilities, top-k, gate weights and expert
//! outputs recomputed in plain Rust (f64) from the GGUF weights, as
//! llama.cpp's own GGUF reader returns them, and from the MoE input dumped
//! out of the graph, under each architecture's routing as this file states
//! it from llama.cpp's graph builders (`src/models/<arch>.cpp`,
//! `build_moe_ffn`): not from the collector's probe, whose findings are
//! checked against the same table.

use fixtures::llama_gguf::{F32Tensor, LlamaGguf};
use fixtures::oracle::matvec;
use numbers::imatrix::Imatrix;
use numbers::routing::GateSite;
use numbers::stats::GroupKey;
use numbers::{Gating, Split};
use std::collections::BTreeMap;
use synth::Preset;
use worker::collect::device::Reduce;
use worker::collect::{CollectOptions, Collected, Collector};

const N_CTX: u32 = 48;
const N_CHUNKS: u32 = 4;
const REL: f64 = 1e-4;

/// How an architecture routes, as llama.cpp's builder for it computes.
struct Expect {
    gating: Gating,
    /// `ffn_moe_weights_norm`.
    norm: bool,
    /// `expert_weights_scale` (1 when unscaled).
    scale: f64,
    /// llama4 multiplies the expert input by the gate.
    gate_on_input: bool,
    /// `(n_group, n_group_used)` of group-limited selection.
    groups: Option<(usize, usize)>,
    /// gpt-oss: SwiGLU-OAI activation and biases on router and experts.
    oai: bool,
    moe_layers: Vec<u32>,
    nextn: Vec<u32>,
    /// A dense weight of block 0 that reads the normed hidden state.
    attn_weight: &'static str,
}

fn expect(preset: Preset) -> Expect {
    let plain = Expect {
        gating: Gating::Softmax,
        norm: true,
        scale: 1.0,
        gate_on_input: false,
        groups: None,
        oai: false,
        moe_layers: vec![0, 1, 2],
        nextn: vec![],
        attn_weight: "blk.0.attn_q.weight",
    };
    let sigmoid = Expect {
        gating: Gating::Sigmoid,
        scale: 2.5,
        moe_layers: vec![1, 2, 3],
        ..plain_clone(&plain)
    };
    match preset {
        Preset::Tiny | Preset::Granitemoe | Preset::Mixtral => plain,
        Preset::Qwen2moe => Expect {
            norm: false,
            ..plain
        },
        Preset::TinyAlt => sigmoid,
        Preset::Glm4moeMtp => Expect {
            moe_layers: vec![1, 2],
            nextn: vec![3],
            ..sigmoid
        },
        Preset::MinimaxM2 => Expect {
            scale: 1.0,
            moe_layers: vec![0, 1, 2],
            ..sigmoid
        },
        Preset::GptOss => Expect {
            gating: Gating::SoftmaxWeight,
            norm: false,
            oai: true,
            ..plain
        },
        Preset::Llama4 => Expect {
            gating: Gating::Sigmoid,
            norm: false,
            gate_on_input: true,
            moe_layers: vec![0, 1, 2, 3],
            ..plain
        },
        Preset::Llama4Interleaved => Expect {
            gating: Gating::Sigmoid,
            norm: false,
            gate_on_input: true,
            moe_layers: vec![1, 3],
            ..plain
        },
        Preset::Deepseek2 => Expect {
            groups: Some((4, 2)),
            attn_weight: "blk.0.attn_q_a.weight",
            ..sigmoid
        },
        Preset::Deepseek2V2 => Expect {
            norm: false,
            moe_layers: vec![1, 2, 3],
            attn_weight: "blk.0.attn_q_a.weight",
            ..plain
        },
        Preset::Qwen3next | Preset::Qwen35moe => Expect {
            moe_layers: vec![0, 1, 2, 3],
            attn_weight: "blk.0.attn_qkv.weight",
            ..plain
        },
        Preset::Qwen3nextMtp => Expect {
            moe_layers: vec![0, 1, 2, 3],
            nextn: vec![4],
            attn_weight: "blk.0.attn_qkv.weight",
            ..plain
        },
        other => panic!("no routing table entry for {other:?}"),
    }
}

fn plain_clone(e: &Expect) -> Expect {
    Expect {
        moe_layers: e.moe_layers.clone(),
        nextn: e.nextn.clone(),
        ..*e
    }
}

/// Expected statistics of one (split, domain) and layer.
#[derive(Clone, Default)]
struct Expected {
    count: Vec<u64>,
    prob: Vec<f64>,
    weight: Vec<f64>,
    ean: Vec<f64>,
    l2: Vec<f64>,
    l2_sq: Vec<f64>,
    ean_max: Vec<f64>,
    /// REAP's `max_activations`: the largest element of `y`, from 0.
    act_max: Vec<f64>,
}

/// Projected dimensions of the oracle runs on the host path.
const PROJECTION: usize = 8;

/// The projection matrix as `numbers::projection` documents it, drawn here
/// with a SplitMix64 of this file's own: `dim x n_embd` row-major, one
/// draw per entry, negative where the top bit is set, times `1/sqrt(dim)`.
fn projection_matrix(seed: u64, dim: usize, n_embd: usize) -> Vec<f64> {
    let mut state = seed;
    let scale = 1.0 / (dim as f64).sqrt();
    (0..dim * n_embd)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            if z >> 63 == 1 {
                -scale
            } else {
                scale
            }
        })
        .collect()
}

/// Expected projected-output sums of one split and layer (`[expert][dim]`
/// flat), with the sum of the projected rows' norms as the scale of the
/// rounding each sum may carry.
#[derive(Clone)]
struct ExpectedProjection {
    sums: Vec<f64>,
    scale: Vec<f64>,
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
            ean_max: vec![0.0; n],
            act_max: vec![0.0; n],
        }
    }
}

/// Expected importance-matrix sums of one weight.
#[derive(Clone)]
struct ExpectedImatrix {
    n_in: usize,
    sum2: Vec<f64>,
    /// `sum x` per cell: llama-imatrix's `in_sum`.
    sum: Vec<f64>,
    /// `sum |x|` per cell: the scale `sum`'s rounding is relative to (a
    /// signed sum can cancel to near zero).
    abs: Vec<f64>,
    counts: Vec<u64>,
}

impl ExpectedImatrix {
    fn new(n_in: usize, n_mat: usize) -> Self {
        ExpectedImatrix {
            n_in,
            sum2: vec![0.0; n_in * n_mat],
            sum: vec![0.0; n_in * n_mat],
            abs: vec![0.0; n_in * n_mat],
            counts: vec![0; n_mat],
        }
    }
    fn add(&mut self, mat: usize, x: &[f64]) {
        self.counts[mat] += 1;
        let cells = mat * self.n_in..(mat + 1) * self.n_in;
        for (i, v) in cells.zip(x) {
            self.sum2[i] += v * v;
            self.sum[i] += v;
            self.abs[i] += v.abs();
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

fn softmax(v: &[f64]) -> Vec<f64> {
    let m = v.iter().cloned().fold(f64::MIN, f64::max);
    let e: Vec<f64> = v.iter().map(|l| (l - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// One block's weights as f32.
struct Block {
    router: F32Tensor,
    router_bias: Option<F32Tensor>,
    bias: Option<F32Tensor>,
    gate: F32Tensor,
    up: F32Tensor,
    down: F32Tensor,
    gate_b: Option<F32Tensor>,
    up_b: Option<F32Tensor>,
    down_b: Option<F32Tensor>,
}

impl Block {
    fn load(g: &LlamaGguf, layer: u32) -> Block {
        let t = |n: &str| {
            g.f32_tensor(&format!("blk.{layer}.{n}"))
                .unwrap_or_else(|| panic!("no f32 blk.{layer}.{n}"))
        };
        let o = |n: &str| g.f32_tensor(&format!("blk.{layer}.{n}"));
        Block {
            router: t("ffn_gate_inp.weight"),
            router_bias: o("ffn_gate_inp.bias"),
            bias: o("exp_probs_b.bias"),
            gate: t("ffn_gate_exps.weight"),
            up: t("ffn_up_exps.weight"),
            down: t("ffn_down_exps.weight"),
            gate_b: o("ffn_gate_exps.bias"),
            up_b: o("ffn_up_exps.bias"),
            down_b: o("ffn_down_exps.bias"),
        }
    }

    /// Expert `e` on input `x`: its output and the input of its down projection.
    fn expert(&self, ex: &Expect, e: usize, x: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (n_embd, n_ff) = (self.gate.ne[0], self.gate.ne[1]);
        let bias = |b: &Option<F32Tensor>, n: usize, v: &mut Vec<f64>| {
            if let Some(b) = b {
                v.iter_mut()
                    .zip(&b.data[e * n..(e + 1) * n])
                    .for_each(|(a, b)| *a += *b as f64);
            }
        };
        let mut gv = matvec(&self.gate.data, n_embd, e * n_ff, n_ff, x);
        let mut uv = matvec(&self.up.data, n_embd, e * n_ff, n_ff, x);
        bias(&self.gate_b, n_ff, &mut gv);
        bias(&self.up_b, n_ff, &mut uv);
        let h: Vec<f64> = if ex.oai {
            // ggml_swiglu_oai with alpha 1.702 and limit 7.
            gv.iter()
                .zip(&uv)
                .map(|(&a, &b)| {
                    let a = a.min(7.0);
                    let b = b.clamp(-7.0, 7.0);
                    a / (1.0 + (-1.702 * a).exp()) * (b + 1.0)
                })
                .collect()
        } else {
            gv.iter()
                .zip(&uv)
                .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
                .collect()
        };
        let mut y = matvec(&self.down.data, n_ff, e * n_embd, n_embd, &h);
        bias(&self.down_b, n_embd, &mut y);
        (y, h)
    }
}

/// The oracle's routing of one token: probabilities, the selection and
/// the selection scores (probability plus bias).
struct Routed {
    probs: Vec<f64>,
    score: Vec<f64>,
    selected: Vec<usize>,
    weights: Vec<f64>,
}

fn route(b: &Block, ex: &Expect, n_expert: usize, k: usize, x: &[f64]) -> Routed {
    let n_embd = x.len();
    let mut logits = matvec(&b.router.data, n_embd, 0, n_expert, x);
    if let Some(rb) = &b.router_bias {
        logits
            .iter_mut()
            .zip(&rb.data)
            .for_each(|(l, b)| *l += *b as f64);
    }
    let probs = match ex.gating {
        Gating::Softmax | Gating::SoftmaxWeight => softmax(&logits),
        Gating::Sigmoid => logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect(),
        Gating::SqrtSoftplus => unreachable!("no preset uses it"),
    };
    let score: Vec<f64> = match &b.bias {
        Some(bias) => probs
            .iter()
            .zip(&bias.data)
            .map(|(p, b)| p + *b as f64)
            .collect(),
        None => probs.clone(),
    };
    let by_score =
        |ids: &mut Vec<usize>| ids.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
    let mut allowed: Vec<usize> = (0..n_expert).collect();
    if let Some((n_group, used)) = ex.groups {
        // DeepSeek-V3: groups ranked by the sum of their two best scores.
        let size = n_expert / n_group;
        let mut group_score: Vec<(f64, usize)> = (0..n_group)
            .map(|g| {
                let mut ids: Vec<usize> = (g * size..(g + 1) * size).collect();
                by_score(&mut ids);
                (score[ids[0]] + score[ids[1]], g)
            })
            .collect();
        group_score.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let chosen: Vec<usize> = group_score[..used].iter().map(|g| g.1).collect();
        allowed.retain(|e| chosen.contains(&(e / size)));
    }
    by_score(&mut allowed);
    let selected = allowed[..k].to_vec();
    let mut weights: Vec<f64> = selected.iter().map(|&e| probs[e]).collect();
    if ex.gating == Gating::SoftmaxWeight {
        let sel: Vec<f64> = selected.iter().map(|&e| logits[e]).collect();
        weights = softmax(&sel);
    }
    if ex.norm {
        let s: f64 = weights.iter().sum::<f64>().max(6.103515625e-5);
        weights.iter_mut().for_each(|v| *v /= s);
    }
    weights.iter_mut().for_each(|v| *v *= ex.scale);
    Routed {
        probs,
        score,
        selected,
        weights,
    }
}

/// Collects the test corpus with the router inputs of the expected MoE
/// layers and `ex.attn_weight`'s input dumped, on `threads` CPU threads,
/// expert outputs projected to `merge_projection` dimensions.
fn collect(
    preset: Preset,
    dir: &std::path::Path,
    reduce: Reduce,
    ex: &Expect,
    (threads, merge_projection): (u32, u32),
) -> (
    std::path::PathBuf,
    Vec<runfiles::corpus::Chunk>,
    Collected,
    Collector,
) {
    let model = fixtures::model(dir, preset);
    let chunks = fixtures::chunks(N_CHUNKS, N_CTX);
    let index = fixtures::write_corpus(dir, &chunks, N_CTX);
    let mut dump: Vec<String> = ex
        .moe_layers
        .iter()
        .map(|l| format!("blk.{l}.ffn_gate_inp.weight"))
        .collect();
    dump.push(ex.attn_weight.into());
    let opts = CollectOptions {
        n_ubatch: 32,
        threads,
        trace_every: 1,
        trace_top_n: 1000,
        f32_kv: true,
        flash_attn: false,
        dump_inputs: dump,
        reduce,
        merge_projection,
        ..Default::default()
    };
    let mut collector = Collector::load(&model, opts).unwrap();
    let collected = collector.run(&index, &chunks, &mut |_, _| {}).unwrap();
    (model, chunks, collected, collector)
}

/// Checks one preset on `threads` CPU threads (two exercise ggml's
/// threading; one avoids its spinning barriers on a loaded machine). The
/// host path projects expert outputs; the device path is checked without
/// (so its own norms are), and with in a test of its own.
fn check_against_oracle(preset: Preset, reduce: Reduce, threads: u32) {
    let projection = match reduce {
        Reduce::Host => PROJECTION,
        _ => 0,
    };
    check_projected(preset, reduce, threads, projection)
}

/// [`check_against_oracle`] with expert outputs projected to `projection`
/// dimensions (0: none).
fn check_projected(preset: Preset, reduce: Reduce, threads: u32, projection: usize) {
    let ex = expect(preset);
    let dir = tempfile::tempdir().unwrap();
    let (model, chunks, c, collector) = collect(
        preset,
        dir.path(),
        reduce,
        &ex,
        (threads, projection as u32),
    );
    let shape = collector.shape().clone();
    let g = LlamaGguf::open(&model).unwrap();

    // What the probe read from the graph is what the builders compute.
    let r = &shape.routing;
    assert_eq!(shape.gating, ex.gating, "{preset:?}: gating");
    assert_eq!(shape.moe_layers, ex.moe_layers, "{preset:?}: MoE layers");
    assert_eq!(r.nextn_blocks, ex.nextn, "{preset:?}: NextN blocks");
    assert_eq!(r.weights_norm, ex.norm, "{preset:?}: weights_norm");
    assert_eq!(f64::from(r.weights_scale), ex.scale, "{preset:?}: scale");
    let site = if ex.gate_on_input {
        GateSite::Input
    } else {
        GateSite::Output
    };
    assert_eq!(r.gate, site, "{preset:?}: gate site");
    assert_eq!(
        r.groups
            .map(|g| (g.n_group as usize, g.n_group_used as usize)),
        ex.groups,
        "{preset:?}: groups"
    );
    for &layer in &shape.moe_layers {
        let bias = g.f32_tensor(&format!("blk.{layer}.exp_probs_b.bias"));
        assert_eq!(
            r.selection_bias.get(&layer),
            bias.map(|b| b.data).as_ref(),
            "{preset:?} layer {layer}: selection bias"
        );
    }

    let (n_expert, k) = (shape.n_expert as usize, shape.n_expert_used as usize);
    let domains = ["en", "ja"];
    let dumps = &c.dumps;
    let mut expected: BTreeMap<(Split, u16, usize), Expected> = BTreeMap::new();
    let mut imatrix: BTreeMap<String, ExpectedImatrix> = BTreeMap::new();
    let mut projected: BTreeMap<(Split, usize), ExpectedProjection> = BTreeMap::new();
    let seed = c.partial.projection.as_ref().map_or(0, |x| x.seed);
    let mut matrix: Vec<f64> = Vec::new();
    let mut routed_rows = 0usize;
    for (li, &layer) in shape.moe_layers.iter().enumerate() {
        let b = Block::load(&g, layer);
        let (n_embd, n_ff) = (b.gate.ne[0], b.gate.ne[1]);
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
                let rt = route(&b, &ex, n_expert, k, &x);
                let (split, domain) = labels[pos];
                let fit = split == Split::Fit;
                let e_acc = expected
                    .entry((split, domain, li))
                    .or_insert_with(|| Expected::new(n_expert));
                rt.probs
                    .iter()
                    .enumerate()
                    .for_each(|(e, p)| e_acc.prob[e] += p);
                let row = c
                    .trace
                    .iter()
                    .find(|r| r.chunk == chunk.id.0 && r.pos == pos as u32 && r.layer == layer)
                    .expect("trace row");
                let mut got: Vec<u16> = row.selected.clone();
                got.sort();
                let mut want: Vec<u16> = rt.selected.iter().map(|&e| e as u16).collect();
                want.sort();
                assert_eq!(
                    got, want,
                    "{preset:?} layer {layer} chunk {} pos {pos}: top-k",
                    chunk.id
                );
                assert_eq!(row.token_id, chunk.tokens[pos]);
                // The top-N is in selection order and holds probabilities.
                let best = (0..n_expert)
                    .max_by(|&a, &b| rt.score[a].total_cmp(&rt.score[b]).then(b.cmp(&a)))
                    .unwrap();
                assert_eq!(row.topn_id[0] as usize, best, "{preset:?}: traced top-1");
                assert_close(
                    "traced top-1 probability",
                    row.topn_prob[0] as f64,
                    rt.probs[best],
                );
                if fit {
                    imatrix
                        .entry(router_name.clone())
                        .or_insert_with(|| ExpectedImatrix::new(n_embd, 1))
                        .add(0, &x);
                }
                for (j, &e) in rt.selected.iter().enumerate() {
                    let w = rt.weights[j];
                    // With the gate on the input the expert sees w * x and
                    // its output is the whole contribution: REAP takes its
                    // norm without the gate.
                    let input: Vec<f64> = if ex.gate_on_input {
                        x.iter().map(|v| v * w).collect()
                    } else {
                        x.clone()
                    };
                    let (y, h) = b.expert(&ex, e, &input);
                    let norm = y.iter().map(|v| v * v).sum::<f64>().sqrt();
                    let reap = if ex.gate_on_input { norm } else { w * norm };
                    e_acc.count[e] += 1;
                    e_acc.weight[e] += w;
                    e_acc.ean[e] += norm;
                    e_acc.ean_max[e] = e_acc.ean_max[e].max(norm);
                    let largest = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    e_acc.act_max[e] = e_acc.act_max[e].max(largest);
                    e_acc.l2[e] += reap;
                    e_acc.l2_sq[e] += reap * reap;
                    if projection > 0 {
                        if matrix.len() != projection * y.len() {
                            matrix = projection_matrix(seed, projection, y.len());
                        }
                        let want =
                            projected
                                .entry((split, li))
                                .or_insert_with(|| ExpectedProjection {
                                    sums: vec![0.0; n_expert * projection],
                                    scale: vec![0.0; n_expert],
                                });
                        for (d, row) in matrix.chunks(y.len()).enumerate() {
                            let z: f64 = row.iter().zip(&y).map(|(r, v)| r * v).sum();
                            want.sums[e * projection + d] += z;
                        }
                        want.scale[e] += norm;
                    }
                    let slot = row.selected.iter().position(|&s| s as usize == e).unwrap();
                    assert_close("trace gate weight", row.selected_weight[slot] as f64, w);
                    if fit {
                        for (name, inp, n_in) in [
                            ("ffn_gate_exps", &input, n_embd),
                            ("ffn_up_exps", &input, n_embd),
                            ("ffn_down_exps", &h, n_ff),
                        ] {
                            imatrix
                                .entry(format!("blk.{layer}.{name}.weight"))
                                .or_insert_with(|| ExpectedImatrix::new(n_in, n_expert))
                                .add(e, inp);
                        }
                    }
                }
                routed_rows += 1;
            }
        }
    }
    let n_tokens_all = chunks.iter().map(|c| c.tokens.len()).sum::<usize>();
    assert_eq!(routed_rows, n_tokens_all * shape.moe_layers.len());
    assert_eq!(
        c.trace.len(),
        routed_rows,
        "one trace row per token and MoE layer"
    );

    // Every statistic of every (split, domain, layer, expert).
    let accum = &c.partial.experts;
    for ((split, domain, li), want) in &expected {
        let key = GroupKey {
            split: *split,
            domain: domains[*domain as usize].to_string(),
            modality: numbers::Modality::Text,
        };
        let got = &accum.groups[&key].layers[*li];
        assert_eq!(
            got.count, want.count,
            "{preset:?} {split}/{} layer #{li}: counts",
            key.domain
        );
        for (name, gs, ws) in [
            ("prob_sum", &got.prob_sum, &want.prob),
            ("weight_sum", &got.weight_sum, &want.weight),
            ("ean_sum", &got.ean_sum, &want.ean),
            ("reap_l2_sum", &got.reap_l2_sum, &want.l2),
            ("reap_l2_sq_sum", &got.reap_l2_sq_sum, &want.l2_sq),
        ] {
            for e in 0..n_expert {
                assert_close(
                    &format!(
                        "{preset:?} {split}/{} layer #{li} expert {e} {name}",
                        key.domain
                    ),
                    gs[e].to_f64(),
                    ws[e],
                );
            }
        }
        for e in 0..n_expert {
            for (name, g, w) in [
                ("ean_max", got.ean_max[e], want.ean_max[e]),
                ("act_max", got.act_max[e], want.act_max[e]),
            ] {
                let at = format!(
                    "{preset:?} {split}/{} layer #{li} expert {e} {name}",
                    key.domain
                );
                assert_close(&at, g, w);
            }
        }
        // The element maxima are measured, not trivially zero.
        assert!(
            (0..n_expert).any(|e| want.count[e] > 0 && got.act_max[e] > 0.0),
            "{preset:?} layer #{li}: no positive act_max"
        );
    }

    // The projected outputs: per split and layer, every expert's sum of
    // its routed outputs' projections, against the f64 recomputation.
    match (&c.partial.projection, projection) {
        (None, 0) => {}
        (Some(got), dim) if dim > 0 => {
            assert_eq!(got.dim as usize, dim, "{preset:?}: projected dimensions");
            assert_eq!(got.seed, numbers::projection::SEED);
            let splits: std::collections::BTreeSet<Split> =
                projected.keys().map(|(s, _)| *s).collect();
            assert_eq!(
                got.splits
                    .keys()
                    .copied()
                    .collect::<std::collections::BTreeSet<_>>(),
                splits,
                "{preset:?}: projected splits"
            );
            for ((split, li), want) in &projected {
                let sums = &got.splits[split][*li];
                assert_eq!(sums.len(), want.sums.len());
                for (i, (g, w)) in sums.iter().zip(&want.sums).enumerate() {
                    let (g, tol) = (g.to_f64(), REL * want.scale[i / dim] + 1e-9);
                    assert!(
                        (g - w).abs() <= tol,
                        "{preset:?} {split} layer #{li} expert {} dim {}: projected sum {g}, \
                         oracle {w} (tolerance {tol})",
                        i / dim,
                        i % dim
                    );
                }
                assert!(
                    want.sums.iter().any(|w| w.abs() > 1e-3),
                    "{preset:?}: the projected sums are not trivially zero"
                );
            }
        }
        (got, dim) => panic!(
            "{preset:?}: projection {:?} collected with merge_projection = {dim}",
            got.as_ref().map(|x| x.dim)
        ),
    }

    // Per-layer invariants: sum(count) == n_tokens * k; what the gating
    // implies of the probabilities.
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
        if shape.gating.probabilities_sum_to_one() {
            assert!(
                (probs - n_tokens as f64).abs() <= 1e-6 * n_tokens as f64,
                "layer #{li}: prob sum {probs} vs {n_tokens}"
            );
        }
    }

    // The attention input of block 0, from its own dump.
    let attn = ex.attn_weight.to_string();
    let n_in = dumps[&(attn.clone(), chunks[0].id.0)].len() / chunks[0].tokens.len();
    let mut exp_attn = ExpectedImatrix::new(n_in, 1);
    for chunk in &chunks {
        let xs = &dumps[&(attn.clone(), chunk.id.0)];
        for (pos, x) in xs.chunks(n_in).enumerate() {
            if chunk.token_labels()[pos].0 == Split::Fit {
                exp_attn.add(0, &x.iter().map(|v| *v as f64).collect::<Vec<_>>());
            }
        }
    }
    if attn == "blk.0.attn_q.weight" {
        // attn_k and attn_v multiply the same normed input as attn_q (the
        // worker computes those sums once and shares them), so they expect
        // the same sums, whatever their output width.
        for shared in ["blk.0.attn_k.weight", "blk.0.attn_v.weight"] {
            imatrix.insert(shared.to_string(), exp_attn.clone());
        }
    }
    imatrix.insert(attn, exp_attn);
    check_imatrix(&c.partial.imatrix, &imatrix);
    check_mla_counts(preset, &c.partial.imatrix, &chunks);
}

/// MLA's per-head matmuls (`attn_k_b`, `attn_v_b`, inputs `[d, n_tokens,
/// n_head]`) count fit tokens only, like every other weight.
fn check_mla_counts(preset: Preset, got: &Imatrix, chunks: &[runfiles::corpus::Chunk]) {
    let fit_tokens: u64 = chunks
        .iter()
        .flat_map(|c| c.token_labels())
        .filter(|l| l.0 == Split::Fit)
        .count() as u64;
    let all_tokens: u64 = chunks.iter().map(|c| c.tokens.len() as u64).sum();
    assert!(
        fit_tokens < all_tokens,
        "the corpus must hold held-out tokens for the fit-only count to mean anything"
    );
    let mut seen = 0;
    for (name, e) in &got.entries {
        if name.ends_with("attn_k_b.weight") || name.ends_with("attn_v_b.weight") {
            seen += 1;
            assert!(
                e.counts.iter().all(|&c| c == fit_tokens),
                "{preset:?} {name}: counts {:?}, fit tokens {fit_tokens}",
                e.counts
            );
        }
    }
    if preset == Preset::Deepseek2 || preset == Preset::Deepseek2V2 {
        assert!(
            seen >= 2,
            "{preset:?}: no MLA per-head entries in the imatrix"
        );
    }
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
        // The model's f32 activations differ from the f64 oracle's by about
        // 1e-7 each in absolute terms, which a sum of tiny or cancelling
        // values does not scale down: 1e-6 per row on top of REL * sum |x|.
        assert_eq!(e.in_sum.len(), ex.sum.len(), "{name}: in_sum length");
        for (i, (g, w)) in e.in_sum.iter().zip(&ex.sum).enumerate() {
            let rows = ex.counts[i / ex.n_in] as f64;
            let (g, tol) = (g.to_f64(), REL * ex.abs[i] + 1e-6 * rows);
            assert!(
                (g - w).abs() <= tol,
                "{name} in_sum[{i}]: measured {g}, oracle {w} (|diff| {} > {tol}, sum |x| {})",
                (g - w).abs(),
                ex.abs[i]
            );
        }
    }
}

#[test]
fn tiny_qwen3moe_statistics_match_the_oracle() {
    check_against_oracle(Preset::Tiny, Reduce::Host, 2);
}

#[test]
fn tiny_alt_glm4moe_statistics_match_the_oracle() {
    check_against_oracle(Preset::TinyAlt, Reduce::Host, 2);
}

/// The device path (issue #14) against the same f64 oracle.
#[test]
fn tiny_qwen3moe_statistics_match_the_oracle_with_device_reductions() {
    check_against_oracle(Preset::Tiny, Reduce::Device, 2);
}

/// The device path (issue #14) against the same f64 oracle.
#[test]
fn tiny_alt_glm4moe_statistics_match_the_oracle_with_device_reductions() {
    check_against_oracle(Preset::TinyAlt, Reduce::Device, 2);
}

/// Projected expert outputs (#57) on the device path, which then reads the
/// `ffn_moe_down` rows on the host, against the same f64 oracle; llama4's
/// gate on the expert input on the host path.
#[test]
fn projected_outputs_match_the_oracle_on_the_device_path_and_with_the_gate_inside() {
    check_projected(Preset::Tiny, Reduce::Device, 2, PROJECTION);
    check_projected(Preset::Llama4, Reduce::Host, 1, 3);
}

/// gpt-oss: `ffn_moe_probs` holds logits; probabilities are their softmax
/// over all experts, gate weights the softmax over the selected (issue #19).
#[test]
fn gpt_oss_statistics_match_the_oracle_on_both_paths() {
    check_against_oracle(Preset::GptOss, Reduce::Host, 1);
    check_against_oracle(Preset::GptOss, Reduce::Device, 1);
}

/// llama4: sigmoid gating with the gate on the expert input; REAP takes the
/// norm of the expert output, which already holds the gate (issue #19).
#[test]
fn llama4_plain_and_interleaved_statistics_match_the_oracle() {
    check_against_oracle(Preset::Llama4, Reduce::Host, 1);
    check_against_oracle(Preset::Llama4Interleaved, Reduce::Device, 1);
}

/// deepseek2: V3 (MLA, groups, sigmoid with bias) and V2 (softmax without a
/// gating key); the MLA importance entries count fit tokens only.
#[test]
fn deepseek2_v3_and_v2_statistics_match_the_oracle() {
    check_against_oracle(Preset::Deepseek2, Reduce::Host, 1);
    check_against_oracle(Preset::Deepseek2V2, Reduce::Host, 1);
}

/// NextN / MTP blocks are not run by a decode and have no statistics.
#[test]
fn mtp_models_statistics_match_the_oracle() {
    check_against_oracle(Preset::Glm4moeMtp, Reduce::Host, 1);
    check_against_oracle(Preset::Qwen3nextMtp, Reduce::Host, 1);
}

/// The families that worked before issue #19, each on its own layout.
#[test]
fn other_families_statistics_match_the_oracle() {
    for preset in [
        Preset::Qwen3next,
        Preset::Qwen35moe,
        Preset::Granitemoe,
        Preset::Mixtral,
        Preset::Qwen2moe,
        Preset::MinimaxM2,
    ] {
        check_against_oracle(preset, Reduce::Host, 1);
    }
}
