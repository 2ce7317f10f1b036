//! A host kernel compiled for the CPU it runs on: the lookahead's router
//! product (`collect/lookahead.rs`) is written in safe Rust, and this module
//! picks at run time a copy built with AVX2 and fused multiply-adds when the
//! CPU has them (the portable build only assumes SSE2). The feature check
//! and the call are the only unsafe code; the kernel itself is safe.

/// Tokens whose dot products are computed together: one pass over a router
/// row serves this many tokens (the inner loop is two AVX vectors).
pub const BLOCK: usize = 16;

/// Router rows computed together: each loaded slice of the block's states
/// feeds this many rows, so `ROWS x BLOCK` sums are independent chains.
const ROWS: usize = 4;

/// `logits[e * BLOCK + j] = sum_i w[e][i] * xt[i * BLOCK + j]` for every
/// router row `e`: [`ROWS`] rows at a time, each read once for the block's
/// tokens, the inner loop over the block's lanes. With AVX2 and FMA (checked
/// at run time) the sums are fused multiply-adds in 8-wide vectors; the
/// portable build would otherwise use 4-wide SSE2 with separate adds.
pub fn block_product(weight: &[f32], xt: &[f32], n: usize, logits: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features `matmul_rows_fma` is compiled for.
        return unsafe { matmul_rows_fma(weight, xt, n, logits) };
    }
    matmul_rows::<false>(weight, xt, n, logits);
}

/// [`matmul_rows`] compiled for AVX2 with fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn matmul_rows_fma(weight: &[f32], xt: &[f32], n: usize, logits: &mut [f32]) {
    matmul_rows::<true>(weight, xt, n, logits);
}

/// The product of [`block_product`]; `FMA`: accumulate with `mul_add` (only
/// where the target has it: elsewhere it is a slow library call).
#[inline(always)]
fn matmul_rows<const FMA: bool>(weight: &[f32], xt: &[f32], n: usize, logits: &mut [f32]) {
    let mac = |acc: f32, w: f32, x: f32| if FMA { w.mul_add(x, acc) } else { acc + w * x };
    let rows = weight.chunks_exact(n);
    let whole = rows.len() / ROWS * ROWS;
    let (head, tail) = logits.split_at_mut(whole * BLOCK);
    for (group, out) in weight
        .chunks_exact(n * ROWS)
        .zip(head.chunks_exact_mut(BLOCK * ROWS))
    {
        let mut acc = [[0f32; BLOCK]; ROWS];
        for (i, x) in xt.chunks_exact(BLOCK).enumerate() {
            for (r, acc) in acc.iter_mut().enumerate() {
                let w = group[r * n + i];
                for j in 0..BLOCK {
                    acc[j] = mac(acc[j], w, x[j]);
                }
            }
        }
        for (o, acc) in out.chunks_exact_mut(BLOCK).zip(&acc) {
            o.copy_from_slice(acc);
        }
    }
    for (row, out) in weight[whole * n..]
        .chunks_exact(n)
        .zip(tail.chunks_exact_mut(BLOCK))
    {
        let mut acc = [0f32; BLOCK];
        for (&w, x) in row.iter().zip(xt.chunks_exact(BLOCK)) {
            for j in 0..BLOCK {
                acc[j] = mac(acc[j], w, x[j]);
            }
        }
        out.copy_from_slice(&acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blocked_product_equals_plain_dot_products() {
        // Rows in whole groups of ROWS and a remainder.
        let (n, n_expert) = (5, ROWS + 3);
        let weight: Vec<f32> = (0..n * n_expert).map(|i| i as f32 * 0.5 - 3.0).collect();
        let states: Vec<Vec<f32>> = (0..BLOCK)
            .map(|j| (0..n).map(|i| (i * j) as f32 - 1.0).collect())
            .collect();
        let mut xt = vec![0f32; n * BLOCK];
        for (j, x) in states.iter().enumerate() {
            for i in 0..n {
                xt[i * BLOCK + j] = x[i];
            }
        }
        let mut logits = vec![0f32; BLOCK * n_expert];
        block_product(&weight, &xt, n, &mut logits);
        for e in 0..n_expert {
            for (j, x) in states.iter().enumerate() {
                let want: f64 = (0..n)
                    .map(|i| f64::from(weight[e * n + i]) * f64::from(x[i]))
                    .sum();
                let got = f64::from(logits[e * BLOCK + j]);
                // Fused or separate rounding: within a few f32 ulps of the sum.
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "expert {e} token {j}: {got} vs {want}"
                );
            }
        }
    }
}
