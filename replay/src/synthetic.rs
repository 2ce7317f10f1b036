//! Synthetic router traces for tests and the replay benchmark: skewed expert
//! popularity (a per-layer permutation of ids, low ranks drawn more often)
//! and temporal locality (a slot often repeats the previous token's expert).

use super::trace_io::RawLayer;
use numbers::splitmix::SplitMix64;

/// The shape of a synthetic trace layer.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Experts per layer.
    pub n_expert: usize,
    /// Selected experts per token.
    pub k: usize,
    /// Router top-N width.
    pub n: usize,
    /// Tokens.
    pub tokens: usize,
    /// Tokens per chunk.
    pub chunk_len: usize,
    /// Popularity skew: rank `floor(n_expert * u^skew)`; 1 is uniform.
    pub skew: f64,
    /// Chance that a slot repeats the previous token's expert at that rank.
    pub reuse: f64,
}

impl Shape {
    /// The audited run's shape: 16,384 tokens, top-64 of 512 experts, top-10.
    pub fn audited() -> Shape {
        Shape {
            n_expert: 512,
            k: 10,
            n: 64,
            tokens: 16_384,
            chunk_len: 2048,
            skew: 2.5,
            reuse: 0.3,
        }
    }
}

/// One synthetic layer; the selected experts are the first `k` of the top-N.
pub fn raw_layer(shape: &Shape, seed: u64) -> RawLayer {
    let Shape {
        n_expert,
        k,
        n,
        tokens,
        ..
    } = *shape;
    assert!(
        n <= n_expert && k <= n,
        "synthetic shape needs k <= n <= n_expert"
    );
    let mut rng = SplitMix64::new(seed);
    let mut perm: Vec<u16> = (0..n_expert as u16).collect();
    for i in (1..n_expert).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let mut out = RawLayer {
        k,
        n,
        chunk: Vec::with_capacity(tokens),
        selected: Vec::with_capacity(tokens * k),
        topn: Vec::with_capacity(tokens * n),
        topn_prob: Vec::with_capacity(tokens * n),
        ..RawLayer::default()
    };
    let mut stamp = vec![0u32; n_expert];
    let mut prev = vec![0u16; n];
    let mut probs = vec![0f32; n];
    for t in 0..tokens {
        let mark = t as u32 + 1;
        let start = out.topn.len();
        for &before in &prev {
            let e = loop {
                let e = if t > 0 && rng.unit() < shape.reuse {
                    before
                } else {
                    perm[((n_expert as f64) * rng.unit().powf(shape.skew)) as usize % n_expert]
                };
                if stamp[e as usize] != mark {
                    break e;
                }
                // Taken already: fall back to a uniform draw.
                let u = perm[rng.below(n_expert)];
                if stamp[u as usize] != mark {
                    break u;
                }
            };
            stamp[e as usize] = mark;
            out.topn.push(e);
        }
        prev.copy_from_slice(&out.topn[start..]);
        let mut total = 0.0;
        for p in probs.iter_mut() {
            *p = (rng.unit() as f32 + 0.01).powi(3);
            total += *p;
        }
        probs.sort_by(|a, b| b.total_cmp(a));
        out.topn_prob.extend(probs.iter().map(|p| p / total));
        out.selected.extend_from_slice(&out.topn[start..start + k]);
        out.chunk.push((t / shape.chunk_len.max(1)) as u32);
        out.pos.push((t % shape.chunk_len.max(1)) as u32);
    }
    out
}
