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

use numbers::exact::ExactSum;
use numbers::imatrix::{Imatrix, ImatrixEntry};
use numbers::partial::Partial;
use numbers::splitmix::SplitMix64;
use numbers::stats::{ExpertAccum, MoeShape};
use numbers::{ChunkId, ChunkRange, Gating, Split};
use rayon::prelude::*;
use runfiles::corpus::{Chunk, Span};

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
/// Tokens per chunk.
pub const CHUNK_TOKENS: u32 = 2048;
/// The (split, domain) groups of every partial.
pub const GROUPS: [(Split, &str); 4] = [
    (Split::Fit, "code"),
    (Split::Fit, "chat"),
    (Split::Heldout, "code"),
    (Split::Heldout, "chat"),
];

/// Tokens per (split, domain) per chunk: a quarter of each chunk.
pub const SPAN: u32 = CHUNK_TOKENS / 4;

/// The benches' corpus: `n_chunks` chunks of [`CHUNK_TOKENS`] tokens,
/// [`SPAN`] for each group of [`GROUPS`] (domain 0 `code`, 1 `chat`), as
/// every realistic partial claims.
pub fn chunks(n_chunks: u32) -> Vec<Chunk> {
    (0..n_chunks)
        .map(|id| Chunk {
            id: ChunkId(id),
            tokens: vec![0; CHUNK_TOKENS as usize],
            spans: (0..4u32)
                .map(|g| Span {
                    start: g * SPAN,
                    len: SPAN,
                    split: GROUPS[g as usize].0,
                    domain: (g % 2) as u16,
                    doc: id * 4 + g,
                    group: g,
                })
                .collect(),
            images: Vec::new(),
        })
        .collect()
}

/// An exact sum of `chunks` per-chunk f64 values around `mean`.
fn sum_of_chunks(rng: &mut SplitMix64, mean: f64, chunks: u32) -> ExactSum {
    let mut s = ExactSum::ZERO;
    for _ in 0..chunks {
        add(&mut s, mean * (0.5 + rng.unit()));
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

/// The importance matrix of a lease of `chunks` chunks of [`CHUNK_TOKENS`]
/// tokens whose fit split is `experts`' fit groups: a dense weight counts
/// the fit tokens, a stacked expert weight each expert's fit `count`, as
/// acceptance checks.
pub fn imatrix(seed: u64, chunks: u32, experts: &ExpertAccum) -> Imatrix {
    let fit: Vec<_> = experts
        .groups
        .iter()
        .filter(|(k, _)| k.split == Split::Fit)
        .map(|(_, g)| g)
        .collect();
    let fit_tokens: u64 = fit.iter().map(|g| g.n_tokens).sum();
    let expert_counts = |l: usize| -> Vec<u64> {
        (0..EXPERTS as usize)
            .map(|e| fit.iter().map(|g| g.layers[l].count[e]).sum())
            .collect()
    };
    let chunk_fit = fit_tokens as f64 / f64::from(chunks);
    let routed = chunk_fit * f64::from(TOP_K) / f64::from(EXPERTS);
    let layers: Vec<Vec<(String, ImatrixEntry)>> = (0..LAYERS)
        .into_par_iter()
        .map(|l| {
            type Columns = (Vec<ExactSum>, Vec<ExactSum>);
            let entry = |n_in: u32, n_mat: u32, (in_sum2, in_sum): Columns, counts: Vec<u64>| {
                ImatrixEntry {
                    n_in,
                    n_mat,
                    in_sum2: in_sum2.into(),
                    in_sum: in_sum.into(),
                    counts,
                }
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
            let dense =
                |what: &str| input_sums(seed, &format!("{l}.{what}"), HIDDEN, 1, chunks, chunk_fit);
            let (router, attn, attn_out) = (dense("router"), dense("attn"), dense("attn_out"));
            let routed_counts = expert_counts(l as usize);
            let name = |t: &str| format!("blk.{l}.{t}.weight");
            vec![
                (
                    name("ffn_gate_exps"),
                    entry(HIDDEN, EXPERTS, experts_in.clone(), routed_counts.clone()),
                ),
                (
                    name("ffn_up_exps"),
                    entry(HIDDEN, EXPERTS, experts_in, routed_counts.clone()),
                ),
                (
                    name("ffn_down_exps"),
                    entry(EXPERT_WIDTH, EXPERTS, down_in, routed_counts),
                ),
                (
                    name("ffn_gate_inp"),
                    entry(HIDDEN, 1, router, vec![fit_tokens]),
                ),
                (
                    name("attn_q"),
                    entry(HIDDEN, 1, attn.clone(), vec![fit_tokens]),
                ),
                (
                    name("attn_k"),
                    entry(HIDDEN, 1, attn.clone(), vec![fit_tokens]),
                ),
                (name("attn_v"), entry(HIDDEN, 1, attn, vec![fit_tokens])),
                (
                    name("attn_output"),
                    entry(HIDDEN, 1, attn_out, vec![fit_tokens]),
                ),
            ]
        })
        .collect();
    Imatrix {
        entries: layers.into_iter().flatten().collect(),
        chunk_count: u64::from(chunks),
        chunk_size: CHUNK_TOKENS,
    }
}

/// REAP statistics with `tokens` tokens in each group of [`GROUPS`]:
/// counts pair up around `tokens * k / n_expert` so that every layer's
/// `sum(count)` is `tokens * k`, as acceptance demands (`tokens` a multiple
/// of 256, so that `tokens * 10 / 512` is whole). Each chunk's values obey
/// what acceptance checks of a real worker's: the chunk's probabilities sum
/// to its tokens over the experts (softmax), and its `reap_l2_sq_sum` lies
/// above `reap_l2_sum^2 / count` (Cauchy-Schwarz; sums over chunks keep it).
pub fn experts(seed: u64, tokens: u64, chunks: u32) -> ExpertAccum {
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let mut experts = ExpertAccum::new(MoeShape {
        n_expert: EXPERTS,
        n_expert_used: TOP_K,
        gating: Gating::Softmax,
        moe_layers: (0..LAYERS).collect(),
        routing: numbers::routing::Routing::default(),
    });
    let per_expert = tokens * u64::from(TOP_K) / u64::from(EXPERTS);
    let chunk_tokens = tokens as f64 / f64::from(chunks);
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
            }
            // Routed tokens of each expert per chunk.
            let load: Vec<f64> = l
                .count
                .iter()
                .map(|&c| c as f64 / f64::from(chunks))
                .collect();
            for _ in 0..chunks {
                let raw: Vec<f64> = load.iter().map(|n| n * (0.5 + rng.unit())).collect();
                let total: f64 = raw.iter().sum();
                for (p, r) in l.prob_sum.iter_mut().zip(&raw) {
                    add(p, r * chunk_tokens / total);
                }
                for (e, &n) in load.iter().enumerate() {
                    add(&mut l.weight_sum[e], 0.1 * n * (0.5 + rng.unit()));
                    add(&mut l.ean_sum[e], 5.0 * n * (0.5 + rng.unit()));
                    let l2 = 0.5 * n * (0.5 + rng.unit());
                    add(&mut l.reap_l2_sum[e], l2);
                    add(&mut l.reap_l2_sq_sum[e], l2 * l2 / n * (1.5 + rng.unit()));
                }
            }
        }
    }
    experts
}

fn add(sum: &mut ExactSum, v: f64) {
    sum.add_f64(v).expect("bench values are in range");
}

/// A partial over `ranges` whose sums stand for `chunks` chunks.
pub fn partial(experts: ExpertAccum, imatrix: Imatrix, ranges: Vec<ChunkRange>) -> Partial {
    Partial::new(
        "bench-model".into(),
        "bench-corpus".into(),
        "cuda:bench".into(),
        ranges,
        experts,
        imatrix,
    )
}
