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
    compare_split(base, BaseAt::SameRow, candidates, rows, n_vocab, threads)
}

/// [`compare_rows`] with the base model's rows kept apart: `kept` holds the
/// scored rows one after another, in the order of `rows` (what
/// [`super::kept`] gives back), `candidate` one micro-batch's logits. Each
/// row is computed by the same code, so the figures are those of
/// [`compare_rows`] bit for bit.
pub fn compare_kept(
    kept: &[f32],
    candidate: &[f32],
    rows: &[ScoredRow],
    n_vocab: usize,
    threads: usize,
) -> Vec<RowResult> {
    compare_split(kept, BaseAt::Kept, &[candidate], rows, n_vocab, threads)
}

/// Where the base row of the `i`-th scored row `sr` lies in the base logits.
#[derive(Clone, Copy)]
enum BaseAt {
    /// At row `sr.row`, like the candidates'.
    SameRow,
    /// At row `i`: only the scored rows are kept.
    Kept,
}

fn compare_split(
    base: &[f32],
    at: BaseAt,
    candidates: &[&[f32]],
    rows: &[ScoredRow],
    n_vocab: usize,
    threads: usize,
) -> Vec<RowResult> {
    let per_thread = rows.len().div_ceil(threads.max(1)).max(1);
    let mut parts = rows.chunks(per_thread).enumerate();
    let Some(first) = parts.next() else {
        return Vec::new();
    };
    let run = |(k, part): (usize, &[ScoredRow])| {
        compare_part(base, at, k * per_thread, candidates, part, n_vocab)
    };
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

/// The rows of one thread (the first is scored row `first` of the
/// micro-batch), with its own scratch buffers.
fn compare_part(
    base: &[f32],
    at: BaseAt,
    first: usize,
    candidates: &[&[f32]],
    rows: &[ScoredRow],
    n_vocab: usize,
) -> Vec<RowResult> {
    let (mut probs, mut exps) = (Vec::with_capacity(n_vocab), Vec::with_capacity(n_vocab));
    let range = |r: usize| r * n_vocab..(r + 1) * n_vocab;
    rows.iter()
        .enumerate()
        .map(|(i, sr)| {
            let base_row = match at {
                BaseAt::SameRow => sr.row,
                BaseAt::Kept => first + i,
            };
            let b = BaseRow::new(&base[range(base_row)], &mut probs);
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

    #[test]
    fn kept_base_rows_give_the_same_figures_as_rows_in_place() {
        let n_vocab = 31;
        let n_rows = 9;
        let logits = |seed: usize| -> Vec<f32> {
            (0..n_rows * n_vocab)
                .map(|i| ((i * 104_729 + seed * 7919) % 997) as f32 * 0.02 - 9.0)
                .collect()
        };
        let (base, cand) = (logits(3), logits(4));
        let rows: Vec<ScoredRow> = [1, 2, 5, 8]
            .into_iter()
            .map(|row| ScoredRow { row, next: row * 3 })
            .collect();
        let kept: Vec<f32> = rows
            .iter()
            .flat_map(|r| base[r.row * n_vocab..(r.row + 1) * n_vocab].iter().copied())
            .collect();
        let bits = |rs: Vec<RowResult>| -> Vec<(u64, u64, u64)> {
            rs.iter()
                .map(|r| {
                    let c = &r.candidates[0];
                    (r.nll_base.to_bits(), c.kl.to_bits(), c.dprob.to_bits())
                })
                .collect()
        };
        let in_place = bits(compare_rows(&base, &[&cand], &rows, n_vocab, 1));
        for threads in [1, 3] {
            assert_eq!(
                bits(compare_kept(&kept, &cand, &rows, n_vocab, threads)),
                in_place
            );
        }
        assert!(in_place.iter().any(|r| f64::from_bits(r.1) > 0.0));
    }
}
