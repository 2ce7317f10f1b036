//! The comparisons of one micro-batch: every scored row of the base
//! model's logits against the same row of each candidate's, split over
//! threads while llama.cpp's threads wait for the next decode.
//!
//! The rows are cut into contiguous runs, one per thread, and the results
//! come back in row order, each row computed by the same code whatever the
//! split: the figures, and so the partial, are identical bit for bit for
//! any number of threads.

use super::metrics::{self, BaseRow, Compared};

/// A scored row of a micro-batch.
#[derive(Clone, Copy, Debug)]
pub struct ScoredRow {
    /// Row in the micro-batch's logits.
    pub row: usize,
    /// The actual next token (checked to be in the vocabulary).
    pub next: usize,
}

/// What one scored row gives: the base model's NLL and one comparison per
/// candidate, in candidate order.
pub struct RowResult {
    /// The base model's negative log likelihood of the next token.
    pub nll_base: f64,
    /// One comparison per candidate.
    pub candidates: Vec<Compared>,
}

/// Compares `rows` of `base` (one micro-batch of logits, `n_vocab` per row)
/// with the same rows of every candidate's logits, on up to `threads`
/// threads; the results are in the order of `rows`.
pub fn compare_rows(
    base: &[f32],
    candidates: &[&[f32]],
    rows: &[ScoredRow],
    n_vocab: usize,
    threads: usize,
) -> Vec<RowResult> {
    let per_thread = rows.len().div_ceil(threads.max(1)).max(1);
    let mut parts = rows.chunks(per_thread);
    let Some(first) = parts.next() else {
        return Vec::new();
    };
    let run = |part: &[ScoredRow]| compare_part(base, candidates, part, n_vocab);
    std::thread::scope(|s| {
        let others: Vec<_> = parts.map(|part| s.spawn(move || run(part))).collect();
        let mut out = run(first);
        for h in others {
            match h.join() {
                Ok(part) => out.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

/// The rows of one thread, with its own scratch buffers.
fn compare_part(
    base: &[f32],
    candidates: &[&[f32]],
    rows: &[ScoredRow],
    n_vocab: usize,
) -> Vec<RowResult> {
    let (mut probs, mut exps) = (Vec::with_capacity(n_vocab), Vec::with_capacity(n_vocab));
    let range = |r: usize| r * n_vocab..(r + 1) * n_vocab;
    rows.iter()
        .map(|sr| {
            let b = BaseRow::new(&base[range(sr.row)], &mut probs);
            RowResult {
                nll_base: b.nll(sr.next),
                candidates: candidates
                    .iter()
                    .map(|c| metrics::compare(&b, &c[range(sr.row)], sr.next, &mut exps))
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_number_of_threads_gives_the_same_results_in_row_order() {
        let n_vocab = 97;
        let n_rows = 23;
        let logits = |seed: usize| -> Vec<f32> {
            (0..n_rows * n_vocab)
                .map(|i| ((i * 7919 + seed * 104_729) % 1013) as f32 * 0.01 - 5.0)
                .collect()
        };
        let (base, c1, c2) = (logits(0), logits(1), logits(2));
        let rows: Vec<ScoredRow> = (0..n_rows)
            .filter(|r| r % 4 != 1)
            .map(|row| ScoredRow {
                row,
                next: (row * 13) % n_vocab,
            })
            .collect();
        let key = |rs: Vec<RowResult>| -> Vec<(u64, Vec<u64>)> {
            rs.into_iter()
                .map(|r| {
                    let kls = r.candidates.iter().map(|c| c.kl.to_bits()).collect();
                    (r.nll_base.to_bits(), kls)
                })
                .collect()
        };
        let one = key(compare_rows(&base, &[&c1, &c2], &rows, n_vocab, 1));
        assert_eq!(one.len(), rows.len());
        for threads in [2, 3, 7, 64] {
            let many = key(compare_rows(&base, &[&c1, &c2], &rows, n_vocab, threads));
            assert_eq!(many, one, "{threads} threads");
        }
        // Row order: the first result is the first scored row's.
        let mut probs = Vec::new();
        let first = BaseRow::new(&base[..n_vocab], &mut probs).nll(rows[0].next);
        assert_eq!(one[0].0, first.to_bits());
    }
}
