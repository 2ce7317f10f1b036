//! Partials at the real shape (48 MoE layers x 512 experts, top-10, hidden
//! 2,048, expert width 512), with sums shaped like a worker's.
//!
//! A worker adds one f64 sum per chunk to each exact sum (`worker`'s
//! `collect::scratch`), so a sum over `c` chunks has about 53 + log2(c)
//! significant bits; here each chunk's value is `mean * (0.5 + u)` with `u`
//! uniform (53 random bits), and the means spread as a model's do: per input
//! column over 2^-3..2^3 (hidden dimensions differ in scale), per expert by
//! its load (0.25-1.75x). Tensors that read the same input have the same
//! sums, as on a worker (`ffn_gate_exps` and `ffn_up_exps`; `attn_q`,
//! `attn_k`, `attn_v`).

use common::exact::ExactSum;
use common::imatrix::{Imatrix, ImatrixEntry};
use common::partial::{BackendToHost, Partial, PARTIAL_FORMAT_VERSION};
use common::splitmix::SplitMix64;
use common::stats::{ExpertAccum, MoeShape};
use common::{ChunkRange, Gating, Split};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// MoE layers.
pub const LAYERS: u32 = 48;
/// Routed experts per layer.
pub const EXPERTS: u32 = 512;
/// Experts per token.
pub const TOP_K: u32 = 10;
/// Hidden size.
pub const HIDDEN: u32 = 2048;
/// Expert width (the down projection's input).
pub const EXPERT_WIDTH: u32 = 512;
/// The (split, domain) groups of every partial.
pub const GROUPS: [(Split, &str); 4] = [
    (Split::Fit, "code"),
    (Split::Fit, "chat"),
    (Split::Heldout, "code"),
    (Split::Heldout, "chat"),
];

/// An exact sum of `chunks` per-chunk f64 values around `mean`.
fn sum_of_chunks(rng: &mut SplitMix64, mean: f64, chunks: u32) -> ExactSum {
    let mut s = ExactSum::ZERO;
    for _ in 0..chunks {
        s.add_f64(mean * (0.5 + rng.unit()))
            .expect("bench values are in range");
    }
    s
}

/// One input's `in_sum2` and `in_sum` over `n_mat` matrices of `n_in`
/// columns (the sums signed, a tenth of the root mean square per token).
fn input_sums(
    seed: u64,
    name: &str,
    n_in: u32,
    n_mat: u32,
    chunks: u32,
    tokens: f64,
) -> (Vec<ExactSum>, Vec<ExactSum>) {
    let mut rng = SplitMix64::for_stream(seed, name);
    let column: Vec<f64> = (0..n_in)
        .map(|_| 2f64.powf(6.0 * rng.unit() - 3.0))
        .collect();
    let load: Vec<f64> = (0..n_mat).map(|_| 0.25 + 1.5 * rng.unit()).collect();
    let cells = (n_in * n_mat) as usize;
    let (mut sum2, mut sum) = (Vec::with_capacity(cells), Vec::with_capacity(cells));
    for l in &load {
        for c in &column {
            sum2.push(sum_of_chunks(&mut rng, c * l * tokens, chunks));
            let sign = if rng.unit() < 0.5 { -1.0 } else { 1.0 };
            let mean = sign * 0.1 * c.sqrt() * l * tokens;
            sum.push(sum_of_chunks(&mut rng, mean, chunks));
        }
    }
    (sum2, sum)
}

/// The importance matrix of a lease of `chunks` chunks of 2,048 tokens.
pub fn imatrix(seed: u64, chunks: u32) -> Imatrix {
    let routed = 2048.0 * f64::from(TOP_K) / f64::from(EXPERTS);
    let layers: Vec<Vec<(String, ImatrixEntry)>> = (0..LAYERS)
        .into_par_iter()
        .map(|l| {
            type Sums = (Vec<ExactSum>, Vec<ExactSum>);
            let entry =
                |n_in: u32, n_mat: u32, (in_sum2, in_sum): Sums, per_mat: u64| ImatrixEntry {
                    n_in,
                    n_mat,
                    in_sum2,
                    in_sum,
                    counts: vec![per_mat * u64::from(chunks); n_mat as usize],
                };
            let experts_in = input_sums(
                seed,
                &format!("{l}.moe_in"),
                HIDDEN,
                EXPERTS,
                chunks,
                routed,
            );
            let down_in = input_sums(
                seed,
                &format!("{l}.down_in"),
                EXPERT_WIDTH,
                EXPERTS,
                chunks,
                routed,
            );
            let router = input_sums(seed, &format!("{l}.router"), HIDDEN, 1, chunks, 2048.0);
            let attn = input_sums(seed, &format!("{l}.attn"), HIDDEN, 1, chunks, 2048.0);
            let attn_out = input_sums(seed, &format!("{l}.attn_out"), HIDDEN, 1, chunks, 2048.0);
            let per_expert = 2048 * u64::from(TOP_K) / u64::from(EXPERTS);
            let name = |t: &str| format!("blk.{l}.{t}.weight");
            vec![
                (
                    name("ffn_gate_exps"),
                    entry(HIDDEN, EXPERTS, experts_in.clone(), per_expert),
                ),
                (
                    name("ffn_up_exps"),
                    entry(HIDDEN, EXPERTS, experts_in, per_expert),
                ),
                (
                    name("ffn_down_exps"),
                    entry(EXPERT_WIDTH, EXPERTS, down_in, per_expert),
                ),
                (name("ffn_gate_inp"), entry(HIDDEN, 1, router, 2048)),
                (name("attn_q"), entry(HIDDEN, 1, attn.clone(), 2048)),
                (name("attn_k"), entry(HIDDEN, 1, attn.clone(), 2048)),
                (name("attn_v"), entry(HIDDEN, 1, attn, 2048)),
                (name("attn_output"), entry(HIDDEN, 1, attn_out, 2048)),
            ]
        })
        .collect();
    Imatrix {
        entries: layers.into_iter().flatten().collect(),
        chunk_count: u64::from(chunks),
        chunk_size: 2048,
    }
}

/// REAP statistics with `tokens` tokens in each group of [`GROUPS`]:
/// counts pair up around `tokens * k / n_expert` so that every layer's
/// `sum(count)` is `tokens * k`, as acceptance demands (`tokens` a multiple
/// of 256, so that `tokens * 10 / 512` is whole).
pub fn experts(seed: u64, tokens: u64, chunks: u32) -> ExpertAccum {
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let mut experts = ExpertAccum::new(MoeShape {
        n_expert: EXPERTS,
        n_expert_used: TOP_K,
        gating: Gating::Softmax,
        moe_layers: (0..LAYERS).collect(),
        routing: common::routing::Routing::default(),
    });
    let per_expert = tokens * u64::from(TOP_K) / u64::from(EXPERTS);
    for (split, domain) in GROUPS {
        let g = experts.group_mut(split, domain);
        g.n_tokens = tokens;
        for l in &mut g.layers {
            for e in 0..EXPERTS as usize {
                let d = (rng.next_u64() % per_expert.max(1)) / 2;
                l.count[e] = if e % 2 == 0 {
                    per_expert + d
                } else {
                    2 * per_expert - l.count[e - 1]
                };
                let load = l.count[e] as f64 / f64::from(chunks);
                for (v, mean) in l.sums_mut().into_iter().zip([0.002, 0.1, 5.0, 0.5, 0.25]) {
                    v[e] = sum_of_chunks(&mut rng, mean * load, chunks);
                }
            }
        }
    }
    experts
}

/// A partial over `ranges` whose sums stand for `chunks` chunks.
pub fn partial(experts: ExpertAccum, imatrix: Imatrix, ranges: Vec<ChunkRange>) -> Partial {
    Partial {
        format_version: PARTIAL_FORMAT_VERSION,
        model_sha256: "bench-model".into(),
        corpus_sha256: "bench-corpus".into(),
        backends: vec!["cuda:bench".into()],
        chunks: ranges,
        experts,
        imatrix,
        nonfinite_drops: BTreeMap::new(),
        trace_tokens: 0,
        trace_rows: 0,
        trace_parts: Vec::new(),
        chunk_stats: Vec::new(),
        backend_to_host: BackendToHost::default(),
    }
}
