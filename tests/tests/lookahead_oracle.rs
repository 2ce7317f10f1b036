//! The worker's lookahead guesses (issue #56) against an independent
//! oracle, on generated models of three routing families: softmax
//! (qwen3moe), sigmoid with a selection bias (glm4moe) and group-limited
//! sigmoid with a bias (deepseek2 V3).
//!
//! The oracle never sees `l_out`: it takes the input of block `L + 1`'s
//! first attention matmul, dumped out of the graph (`attn_norm(l_out-L)`,
//! that is `rms_norm(l_out-L) * w_attn_norm`), divides out the attention
//! norm's weight read through llama.cpp's own GGUF reader, and applies
//! layer `L + d`'s router input norm weight (the norm llama.cpp's builder
//! feeds the router: `ffn_norm`, or `post_attention_norm` in glm4moe), the
//! router matrix, the family's gating, selection bias and groups, in f64,
//! as this file writes them from llama.cpp's `build_moe_ffn`.
//!
//! Each family runs on the host path and on the device path (`--reduce
//! device`; on CPU the device is the CPU backend), where the guesses are
//! ranked by a ggml graph on `l_out`'s backend and only the top-N crosses:
//! the same oracle holds both, grouped routing included (the device graph
//! chooses the groups as llama.cpp's grouped selection does).

use fixtures::llama_gguf::LlamaGguf;
use fixtures::oracle::matvec;
use runfiles::trace::TraceRow;
use synth::Preset;
use worker::collect::device::Reduce;
use worker::collect::{CollectOptions, Collector};

const N_CTX: u32 = 48;
const N_CHUNKS: u32 = 3;

/// How a family routes, from llama.cpp's builders.
struct Family {
    sigmoid: bool,
    /// `(n_group, n_group_used)`.
    groups: Option<(usize, usize)>,
    moe_layers: Vec<u32>,
    /// The norm whose output the router reads.
    router_norm: &'static str,
    /// A weight of block `i` whose matmul reads `attn_norm(block input)`.
    attn_weight: &'static str,
}

fn family(preset: Preset) -> Family {
    match preset {
        Preset::Tiny => Family {
            sigmoid: false,
            groups: None,
            moe_layers: vec![0, 1, 2],
            router_norm: "ffn_norm",
            attn_weight: "attn_q",
        },
        Preset::TinyAlt => Family {
            sigmoid: true,
            groups: None,
            moe_layers: vec![1, 2, 3],
            router_norm: "post_attention_norm",
            attn_weight: "attn_q",
        },
        Preset::Deepseek2 => Family {
            sigmoid: true,
            groups: Some((4, 2)),
            moe_layers: vec![1, 2, 3],
            router_norm: "ffn_norm",
            attn_weight: "attn_q_a",
        },
        other => panic!("no family entry for {other:?}"),
    }
}

/// The oracle's ranking of one state under block `target`'s router:
/// (expert ids best first, their probabilities, their ranking keys).
fn oracle(
    g: &LlamaGguf,
    f: &Family,
    target: u32,
    u: &[f64],
    n_expert: usize,
) -> (Vec<usize>, Vec<f64>, Vec<(bool, f64)>) {
    let router = g
        .tensor_as_f32(&format!("blk.{target}.ffn_gate_inp.weight"))
        .unwrap();
    let mut logits = matvec(&router.data, u.len(), 0, n_expert, u);
    if let Some(b) = g.f32_tensor(&format!("blk.{target}.ffn_gate_inp.bias")) {
        logits
            .iter_mut()
            .zip(&b.data)
            .for_each(|(l, b)| *l += *b as f64);
    }
    let probs: Vec<f64> = if f.sigmoid {
        logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect()
    } else {
        let m = logits.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    };
    let score: Vec<f64> = match g.f32_tensor(&format!("blk.{target}.exp_probs_b.bias")) {
        Some(b) => probs
            .iter()
            .zip(&b.data)
            .map(|(p, b)| p + *b as f64)
            .collect(),
        None => probs.clone(),
    };
    let mut allowed = vec![true; n_expert];
    if let Some((n_group, used)) = f.groups {
        let size = n_expert / n_group;
        let mut groups: Vec<(f64, usize)> = (0..n_group)
            .map(|gi| {
                let mut s: Vec<f64> = score[gi * size..(gi + 1) * size].to_vec();
                s.sort_by(|a, b| b.total_cmp(a));
                (s[0] + s[1], gi)
            })
            .collect();
        groups.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let chosen: Vec<usize> = groups[..used].iter().map(|x| x.1).collect();
        for (e, a) in allowed.iter_mut().enumerate() {
            *a = chosen.contains(&(e / size));
        }
    }
    let key: Vec<(bool, f64)> = (0..n_expert).map(|e| (allowed[e], score[e])).collect();
    let mut order: Vec<usize> = (0..n_expert).collect();
    order.sort_by(|&a, &b| {
        key[b]
            .0
            .cmp(&key[a].0)
            .then(key[b].1.total_cmp(&key[a].1))
            .then(a.cmp(&b))
    });
    let p = order.iter().map(|&e| probs[e]).collect();
    (order, p, key)
}

fn check(preset: Preset, reduce: Reduce) {
    let f = family(preset);
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), preset);
    let chunks = fixtures::chunks(N_CHUNKS, N_CTX);
    let index = fixtures::write_corpus(dir.path(), &chunks, N_CTX);
    let attn = |block: u32| format!("blk.{block}.{}.weight", f.attn_weight);
    let opts = CollectOptions {
        n_ubatch: 32,
        threads: 1,
        trace_every: 1,
        trace_top_n: 1000,
        trace_lookahead: vec![1, 2],
        f32_kv: true,
        flash_attn: false,
        decode_tokens: 3,
        decode_prompt: 8,
        dump_inputs: f.moe_layers.iter().map(|&l| attn(l + 1)).collect(),
        reduce,
        ..Default::default()
    };
    let mut collector = Collector::load(&model, opts.clone()).unwrap();
    let c = collector.run(&index, &chunks, &mut |_, _| {}).unwrap();
    if reduce == Reduce::Device {
        // Which path ranked: the device's f32 softmax or sigmoid rounds
        // differently from the host's, so some gating value differs in its
        // last bits (grouped routing too: the device ranks the groups).
        let host = CollectOptions {
            reduce: Reduce::Host,
            ..opts
        };
        let h = Collector::load(&model, host)
            .unwrap()
            .run(&index, &chunks, &mut |_, _| {})
            .unwrap();
        let bits = |rows: &[TraceRow]| -> Vec<u32> {
            rows.iter()
                .flat_map(|r| {
                    r.lookahead
                        .iter()
                        .flat_map(|a| a.probs.iter().map(|p| p.to_bits()))
                })
                .collect()
        };
        let (dev, hst) = (bits(&c.trace), bits(&h.trace));
        assert_eq!(dev.len(), hst.len(), "{preset:?}: guesses per path");
        let differ = dev.iter().zip(&hst).filter(|(a, b)| a != b).count();
        assert!(differ > 0, "{preset:?}: the device path did not rank");
    }
    let shape = collector.shape().clone();
    assert_eq!(shape.moe_layers, f.moe_layers, "{preset:?}");
    let n_expert = shape.n_expert as usize;
    let g = LlamaGguf::open(&model).unwrap();
    let last = *f.moe_layers.last().unwrap();

    let (mut compared, mut swapped, mut guesses) = (0usize, 0usize, 0usize);
    for row in &c.trace {
        let want: Vec<u8> = [1u8, 2]
            .into_iter()
            .filter(|&d| row.layer + u32::from(d) <= last)
            .collect();
        let got: Vec<u8> = row.lookahead.iter().map(|a| a.distance).collect();
        assert_eq!(
            got, want,
            "{preset:?} layer {}: distances guessed",
            row.layer
        );
        if want.is_empty() {
            continue;
        }
        let next = row.layer + 1;
        let a_norm = g
            .f32_tensor(&format!("blk.{next}.attn_norm.weight"))
            .unwrap();
        let dump = &c.dumps[&(attn(next), row.chunk)];
        let n_embd = a_norm.data.len();
        let a = &dump[row.pos as usize * n_embd..(row.pos as usize + 1) * n_embd];
        // rms_norm(l_out-L), from the attention input of block L + 1.
        let normed: Vec<f64> = a
            .iter()
            .zip(&a_norm.data)
            .map(|(&v, &w)| f64::from(v) / f64::from(w))
            .collect();
        for guess in &row.lookahead {
            let target = row.layer + u32::from(guess.distance);
            let w = g
                .f32_tensor(&format!("blk.{target}.{}.weight", f.router_norm))
                .unwrap();
            let u: Vec<f64> = normed
                .iter()
                .zip(&w.data)
                .map(|(x, w)| x * f64::from(*w))
                .collect();
            let (order, probs, key) = oracle(&g, &f, target, &u, n_expert);
            assert_eq!(guess.ids.len(), n_expert, "the full ranking is recorded");
            guesses += 1;
            for (i, (&id, &p)) in guess.ids.iter().zip(&guess.probs).enumerate() {
                let (want_id, got_id) = (order[i], id as usize);
                compared += 1;
                let what = format!(
                    "{preset:?} chunk {} pos {} layer {} d {} rank {i}",
                    row.chunk, row.pos, row.layer, guess.distance
                );
                if got_id != want_id {
                    // Only a near-tie may swap: same group side, scores within 1e-5.
                    let (kg, kw) = (key[got_id], key[want_id]);
                    assert!(
                        kg.0 == kw.0 && (kg.1 - kw.1).abs() <= 1e-5,
                        "{what}: expert {got_id} {kg:?}, oracle {want_id} {kw:?}"
                    );
                    swapped += 1;
                }
                let want_p = probs[order.iter().position(|&e| e == got_id).unwrap()];
                assert!(
                    (f64::from(p) - want_p).abs() <= 1e-5 + 1e-4 * want_p.abs(),
                    "{what}: probability {p}, oracle {want_p}"
                );
            }
        }
    }
    assert!(guesses > 0, "{preset:?}: no guess compared");
    assert!(
        swapped * 1000 <= compared,
        "{preset:?}: {swapped} of {compared} ranks swapped"
    );
    check_decode(preset, &c.decode_trace, last);
}

/// Decode traces carry the guesses too: every generated token's row of a
/// layer with a MoE layer `d` ahead, and none past the last.
fn check_decode(preset: Preset, rows: &[TraceRow], last: u32) {
    assert!(!rows.is_empty(), "{preset:?}: no decode trace");
    for r in rows {
        let want: Vec<u8> = [1u8, 2]
            .into_iter()
            .filter(|&d| r.layer + u32::from(d) <= last)
            .collect();
        let got: Vec<u8> = r.lookahead.iter().map(|a| a.distance).collect();
        assert_eq!(got, want, "{preset:?} decode layer {}", r.layer);
        for a in &r.lookahead {
            let mut ids = a.ids.clone();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), a.ids.len(), "distinct guesses");
        }
    }
}

#[test]
fn softmax_qwen3moe_lookahead_matches_the_oracle() {
    check(Preset::Tiny, Reduce::Host);
}

#[test]
fn softmax_qwen3moe_device_lookahead_matches_the_oracle() {
    check(Preset::Tiny, Reduce::Device);
}

#[test]
fn sigmoid_with_bias_glm4moe_lookahead_matches_the_oracle() {
    check(Preset::TinyAlt, Reduce::Host);
}

#[test]
fn sigmoid_with_bias_glm4moe_device_lookahead_matches_the_oracle() {
    check(Preset::TinyAlt, Reduce::Device);
}

#[test]
fn grouped_deepseek2_lookahead_matches_the_oracle() {
    check(Preset::Deepseek2, Reduce::Host);
}

#[test]
fn grouped_deepseek2_device_run_lookahead_matches_the_oracle() {
    check(Preset::Deepseek2, Reduce::Device);
}
