//! The compact trace encoding (f16 probabilities) against the f32 one: the
//! same routing replayed from both kinds of parts must give identical misses
//! for every policy that reads only ids and ranks, and misses within 0.1%
//! for the one that reads probabilities (`router_ema`).

use super::capacity::Capacity;
use super::results::{Mode, TraceKind};
use super::{replay_run, Policy, ReplayArgs};
use numbers::Split;
use runfiles::trace::{write_part_as, Encoding, TraceRow};

const N_EXPERT: usize = 64;
const K: usize = 6;
const TOP_N: usize = 16;

/// Routing with temporal locality: each token's logits are a per-expert
/// bias, a slowly drifting context and noise; a softmax gives probabilities.
fn rows(tokens: u32) -> Vec<TraceRow> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let mut out = Vec::new();
    for layer in [1u32, 4, 7] {
        let bias: Vec<f64> = (0..N_EXPERT).map(|_| 3.0 * uniform()).collect();
        let mut context = vec![0f64; N_EXPERT];
        for t in 0..tokens {
            for c in &mut context {
                *c = 0.9 * *c + 1.5 * uniform();
            }
            let logits: Vec<f64> = (0..N_EXPERT)
                .map(|e| bias[e] + context[e] + 0.5 * uniform())
                .collect();
            let max = logits.iter().copied().fold(f64::MIN, f64::max);
            let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
            let probs: Vec<f32> = logits
                .iter()
                .map(|l| ((l - max).exp() / z) as f32)
                .collect();
            let mut order: Vec<u16> = (0..N_EXPERT as u16).collect();
            order.sort_by(|&a, &b| {
                probs[b as usize]
                    .total_cmp(&probs[a as usize])
                    .then(a.cmp(&b))
            });
            out.push(TraceRow {
                split: if (t / 512) % 4 == 3 {
                    Split::Heldout
                } else {
                    Split::Fit
                },
                domain: "web".into(),
                chunk: t / 1024,
                pos: t % 1024,
                token_id: (t % 97) as i32,
                layer,
                selected: order[..K].to_vec(),
                selected_weight: order[..K].iter().map(|&e| probs[e as usize]).collect(),
                topn_id: order[..TOP_N].to_vec(),
                topn_prob: order[..TOP_N].iter().map(|&e| probs[e as usize]).collect(),
                lookahead: Vec::new(),
            });
        }
    }
    out
}

fn write_run(dir: &std::path::Path, rows: &[TraceRow], encoding: Encoding) {
    std::fs::create_dir_all(dir.join("trace")).unwrap();
    let bytes = write_part_as(&mut rows.to_vec(), K, TOP_N, encoding).unwrap();
    std::fs::write(dir.join("trace/part-0.parquet"), bytes).unwrap();
    let saliency = format!(
        r#"{{"n_expert": {N_EXPERT}, "n_expert_used": {K}, "gating": "softmax", "trace_tokens_written": 0, "nonfinite_drops": 0, "splits": {{}}}}"#
    );
    std::fs::write(dir.join("saliency.json"), saliency).unwrap();
}

#[test]
fn compact_parts_replay_like_full_precision_parts() {
    let rows = rows(4096);
    let (full, compact) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_run(full.path(), &rows, Encoding::Full);
    write_run(compact.path(), &rows, Encoding::Compact);
    let full_bytes = std::fs::metadata(full.path().join("trace/part-0.parquet")).unwrap();
    let compact_bytes = std::fs::metadata(compact.path().join("trace/part-0.parquet")).unwrap();
    assert!(compact_bytes.len() < full_bytes.len());
    let replay = |dir: &std::path::Path| {
        let args = ReplayArgs {
            capacity: ["8", "16", "32"]
                .map(|c| Capacity::parse(c).unwrap())
                .to_vec(),
            mode: vec![Mode::Token, Mode::Ubatch],
            ubatch: 64,
            ..ReplayArgs::for_run(dir.to_str().unwrap())
        };
        replay_run(&args).unwrap()
    };
    let (a, b) = (replay(full.path()), replay(compact.path()));
    let mut router_cells = 0;
    for split in Split::ALL {
        for mode in [Mode::Token, Mode::Ubatch] {
            for policy in Policy::ALL {
                for cap in ["8", "16", "32"] {
                    let get = |r: &super::ReplayReport| {
                        r.row(split, TraceKind::Prefill, mode, policy, cap, "none")
                            .unwrap_or_else(|| panic!("no row {split} {mode:?} {policy} {cap}"))
                            .clone()
                    };
                    let (x, y) = (get(&a), get(&b));
                    assert_eq!((x.tokens, x.requests), (y.tokens, y.requests));
                    assert!(x.misses > 0, "{split} {mode:?} {policy} {cap}: no misses");
                    if policy == Policy::RouterEma {
                        let diff = x.misses.abs_diff(y.misses) as f64;
                        assert!(
                            diff <= 0.001 * x.misses as f64,
                            "router_ema {split} {mode:?} cap {cap}: {} vs {} misses",
                            x.misses,
                            y.misses
                        );
                        router_cells += 1;
                    } else {
                        assert_eq!(
                            x.misses, y.misses,
                            "{policy} {split} {mode:?} cap {cap}: f32 vs f16 parts"
                        );
                        let per_layer = |r: &super::results::ResultRow| {
                            r.per_layer.iter().map(|l| l.misses).collect::<Vec<_>>()
                        };
                        assert_eq!(per_layer(&x), per_layer(&y));
                    }
                }
            }
        }
    }
    assert_eq!(router_cells, 2 * 2 * 3);
}
