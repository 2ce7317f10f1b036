//! The values a partial may hold, checked before a coordinator accepts it,
//! so that whatever it accepts merges, verifies and renders:
//!
//! - every sum within a per-token budget ([`Budget`]): any merge of partials
//!   of disjoint tokens of one corpus then stays inside the exact
//!   accumulator's range, so one partial cannot make every later merge fail;
//! - the bounds the counts and the gating imply: probabilities in `[0, n]`
//!   (summing to `n` per layer under softmax), norms, weights and squares
//!   not negative, nothing routed to an expert that was never selected and
//!   something routed to one that was, Cauchy-Schwarz per expert;
//! - importance-matrix entries of consistent lengths, squares not negative,
//!   no sum (of squares or of values) for a matrix that saw no row, and
//!   each sum within what its rows allow: every matmul input value is at
//!   most [`MAX_ACTIVATION`] in magnitude, so a column's sum of squares is
//!   at most `count * MAX_ACTIVATION^2` and its sum at most
//!   `count * MAX_ACTIVATION` (which also keeps every value of the f32
//!   imatrix file finite);
//! - tensor and backend names short and printable, in bounded numbers;
//!   importance-matrix names short enough for llama.cpp's loader
//!   ([`gguf::model_weights::MAX_ENTRY_NAME`]).
//!
//! What a partial must *equal* (its chunks, tokens per group, shape, the
//! importance matrix's token counts) depends on the corpus and is checked by
//! the coordinator's acceptance; this module needs only the partial and the
//! corpus's size.

use crate::exact::{per_token_limit, ExactSum, FRACTION_BITS};
use crate::packed::BlockBounds;
use crate::partial::{ImatrixColumn, Partial, SumsCheck};
use crate::peer_text::peer_text;
use crate::stats::{cauchy_schwarz_margin, ExpertAccum, LayerAccum, SUM_NAMES};
use rayon::prelude::*;

/// Relative tolerance of `sum(prob_sum) == n_tokens` under softmax gating.
pub const PROB_SUM_RTOL: f64 = 1e-6;

/// Longest tensor or backend name a partial may carry.
pub const MAX_LABEL_CHARS: usize = 128;

/// Most importance-matrix entries, non-finite drop entries and backends a
/// partial may list (a 48-layer model has a few hundred weight tensors).
pub const MAX_ENTRIES: usize = 1 << 16;

/// Most backends a partial may name.
pub const MAX_BACKENDS: usize = 16;

/// Largest magnitude of one matmul input value an importance matrix may
/// have summed: 2^16, just above f16's largest finite value (65,504).
/// llama.cpp's GPU backends multiply with f16 activations (and its
/// quantised CPU paths scale them by f16 factors), where a larger value is
/// already infinite, so no honest measurement holds one (honest values are
/// near 1); a sum of squares of 7.2e16 over a few thousand rows is refused.
pub const MAX_ACTIVATION: u64 = 1 << 16;

/// The largest magnitude, on the exact grid, of a sum of `count` values
/// each at most [`MAX_ACTIVATION`] (`squares`: of their squares).
pub fn imatrix_sum_limit(count: u64, squares: bool) -> u128 {
    let per_row = if squares {
        u128::from(MAX_ACTIVATION * MAX_ACTIVATION)
    } else {
        u128::from(MAX_ACTIVATION)
    };
    (per_row * u128::from(count)).saturating_mul(1u128 << FRACTION_BITS)
}

/// How large a partial's sums and counters may be, per token it measured,
/// so that the partials of a whole corpus always merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Largest magnitude of an exact sum per token, on the grid.
    sums: u128,
    /// Largest counter (rows, drops, bytes) per token.
    counts: u64,
}

impl Budget {
    /// The budget for partials of a corpus of `total_tokens` tokens (all
    /// splits): honest values stay far below it (about 4.6e11 per token at
    /// 10M tokens), and partials covering at most `total_tokens` together
    /// can never overflow a sum or a 64-bit counter.
    pub fn for_corpus(total_tokens: u64) -> Budget {
        Budget {
            sums: per_token_limit(total_tokens),
            counts: u64::MAX / total_tokens.max(1),
        }
    }

    fn sum_ok(&self, s: ExactSum, tokens: u64) -> bool {
        s.within(self.sums, tokens)
    }

    fn count_ok(&self, n: u64, tokens: u64) -> bool {
        u128::from(n) <= u128::from(self.counts) * u128::from(tokens)
    }
}

/// Checks every value of `p` against the module's rules; the error names
/// the first value that breaks one (peer text escaped).
pub fn check_values(p: &Partial, budget: &Budget) -> Result<(), String> {
    check_header_values(p, budget)?.check_decoded(p)
}

/// Every check of [`check_values`] but those of the importance matrix's
/// sums, on a partial whose importance-matrix sums may be empty (a
/// [`crate::partial::PackedPartial`]'s header): the returned
/// [`ImatrixSums`] checks those sums, as they are unpacked
/// ([`crate::partial::PackedPartial::parse_checked`]) or decoded.
pub fn check_header_values(p: &Partial, budget: &Budget) -> Result<ImatrixSums, String> {
    let tokens = p
        .experts
        .groups
        .values()
        .fold(0u64, |n, g| n.saturating_add(g.n_tokens));
    experts(&p.experts, budget, p.nonfinite_drops.is_empty())?;
    imatrix(p, tokens, budget)?;
    labels(p)?;
    for (name, &n) in &p.nonfinite_drops {
        if !budget.count_ok(n, tokens) {
            return Err(format!(
                "{n} non-finite drops of {} in {tokens} tokens",
                peer_text(name)
            ));
        }
    }
    let layers = p.experts.shape.moe_layers.len() as u64;
    if p.trace_tokens > tokens || p.trace_tokens.checked_mul(layers) != Some(p.trace_rows) {
        return Err(format!(
            "{} trace rows for {} traced tokens x {layers} MoE layers (of {tokens} tokens)",
            p.trace_rows, p.trace_tokens
        ));
    }
    let b = &p.backend_to_host;
    if !budget.count_ok(b.tokens, tokens) || !budget.count_ok(b.bytes, tokens) {
        return Err(format!(
            "backend-to-host figures of {} tokens and {} bytes for {tokens} tokens",
            b.tokens, b.bytes
        ));
    }
    chunk_stats(p)?;
    Ok(ImatrixSums {
        tokens,
        bound: budget.sums.saturating_mul(u128::from(tokens)),
    })
}

/// The rules of a partial's importance-matrix sums: within the budget of
/// its tokens, sums of squares not negative, and no sum for a matrix that
/// saw no row ([`check_header_values`] makes it).
#[derive(Clone, Copy, Debug)]
pub struct ImatrixSums {
    tokens: u64,
    /// Largest magnitude a sum may have ([`Budget`] for the tokens).
    bound: u128,
}

impl ImatrixSums {
    /// Checks the decoded importance-matrix sums of `p` (whose other
    /// values made this), tensor by tensor on the cores; the first failing
    /// tensor in name order is the one named, as a serial scan would.
    pub fn check_decoded(&self, p: &Partial) -> Result<(), String> {
        let checked: Vec<Result<(), String>> = p
            .imatrix
            .entries
            .par_iter()
            .map(|(name, e)| {
                imatrix_lengths(name, e)?;
                for (squares, column) in [(true, &e.in_sum2), (false, &e.in_sum)] {
                    let of = ImatrixColumn {
                        name,
                        entry: e,
                        squares,
                    };
                    for (b, values) in column.chunks(crate::packed::BLOCK).enumerate() {
                        self.block(of, b * crate::packed::BLOCK, values)?;
                    }
                }
                Ok(())
            })
            .collect();
        checked.into_iter().collect()
    }
}

impl SumsCheck for ImatrixSums {
    /// A block needs its sums checked unless its header shows they pass:
    /// none above the bound, none negative in a column of squares, and
    /// each matrix it touches saw rows (or the block is zeros).
    fn needs_values(
        &self,
        c: ImatrixColumn<'_>,
        start: usize,
        len: usize,
        bounds: BlockBounds,
    ) -> bool {
        if bounds.max_magnitude == 0 {
            return false;
        }
        let n_in = c.entry.n_in.max(1) as usize;
        let touched = start / n_in..=(start + len.max(1) - 1) / n_in;
        let passes = bounds.max_magnitude <= self.bound
            && !(c.squares && bounds.signed)
            && c.entry.counts.get(touched).is_some_and(|counts| {
                counts
                    .iter()
                    .all(|&n| n != 0 && bounds.max_magnitude <= imatrix_sum_limit(n, c.squares))
            });
        !passes
    }

    fn block(&self, c: ImatrixColumn<'_>, start: usize, values: &[ExactSum]) -> Result<(), String> {
        let e = c.entry;
        let n_in = e.n_in.max(1) as usize;
        let (mut m, mut col) = (start / n_in, start % n_in);
        for v in values {
            let count = e.counts[m];
            let magnitude = v.0.unsigned_abs();
            let ok = magnitude <= self.bound
                && magnitude <= imatrix_sum_limit(count, c.squares)
                && (count != 0 || v.is_zero())
                && (!c.squares || non_negative(*v));
            if !ok {
                let what = if c.squares { "sum of squares" } else { "sum" };
                return Err(format!(
                    "importance matrix {}: matrix {m} column {col}: {what} {} over {count} rows of {} tokens (each input at most {MAX_ACTIVATION} in magnitude)",
                    peer_text(c.name),
                    v.to_f64(),
                    self.tokens
                ));
            }
            col += 1;
            if col == n_in {
                (m, col) = (m + 1, 0);
            }
        }
        Ok(())
    }

    /// The rules depend on the column's kind, the tensor's row length and
    /// its counts, and nothing else.
    fn same_rules(&self, source: ImatrixColumn<'_>, copy: ImatrixColumn<'_>) -> bool {
        source.squares == copy.squares
            && source.entry.n_in == copy.entry.n_in
            && source.entry.counts == copy.entry.counts
    }
}

/// Whether a sum is one of the statistics that are never negative.
fn non_negative(s: ExactSum) -> bool {
    s.0 >= 0
}

fn experts(e: &ExpertAccum, budget: &Budget, no_drops: bool) -> Result<(), String> {
    let bounded_probs = e.shape.gating.value_range().1.is_finite();
    for (key, g) in &e.groups {
        let n = g.n_tokens;
        for l in &g.layers {
            let in_layer = |what: String| {
                format!(
                    "group {}/{} layer {}: {what}",
                    key.split,
                    peer_text(&key.domain),
                    l.layer
                )
            };
            let at = |what: String, x: usize| in_layer(format!("expert {x}: {what}"));
            for (name, values) in sums(l) {
                if let Some(x) = values.iter().position(|v| !budget.sum_ok(*v, n)) {
                    let v = values[x].to_f64();
                    return Err(at(
                        format!("{name} {v} beyond what {n} tokens add up to"),
                        x,
                    ));
                }
                let may_be_negative = name == "prob_sum" && !bounded_probs;
                match values.iter().position(|v| !non_negative(*v)) {
                    Some(x) if !may_be_negative => {
                        return Err(at(format!("{name} {} < 0", values[x].to_f64()), x))
                    }
                    _ => {}
                }
            }
            for (name, maxima) in [
                ("output maxima", &l.ean_max),
                ("element maxima", &l.act_max),
            ] {
                if maxima.len() != l.count.len() {
                    return Err(in_layer(format!(
                        "{} {name} for {} experts",
                        maxima.len(),
                        l.count.len()
                    )));
                }
            }
            for x in 0..l.count.len() {
                expert(l, x, n, bounded_probs).map_err(|why| at(why, x))?;
                output_max(l, x).map_err(|why| at(why, x))?;
                element_max(l, x).map_err(|why| at(why, x))?;
            }
            if e.shape.gating.probabilities_sum_to_one() && no_drops {
                prob_total(l, n).map_err(in_layer)?;
            }
        }
    }
    Ok(())
}

fn sums(l: &LayerAccum) -> impl Iterator<Item = (&'static str, &[ExactSum])> {
    SUM_NAMES.into_iter().zip(l.sums().map(Vec::as_slice))
}

/// The bounds one expert's counts imply.
fn expert(l: &LayerAccum, x: usize, n: u64, bounded_probs: bool) -> Result<(), String> {
    let c = l.count[x];
    if bounded_probs {
        let p = l.prob_sum[x].to_f64();
        if p > n as f64 * (1.0 + PROB_SUM_RTOL) {
            return Err(format!(
                "prob_sum {p} above its {n} tokens (probabilities are at most 1)"
            ));
        }
    }
    if c == 0 {
        // Every sum after `prob_sum` adds over routed tokens only.
        if let Some((name, v)) = sums(l)
            .skip(1)
            .map(|(k, v)| (k, v[x]))
            .find(|(_, v)| !v.is_zero())
        {
            return Err(format!(
                "{name} {} for an expert no token selected",
                v.to_f64()
            ));
        }
        return Ok(());
    }
    if l.reap_l2_sum[x].is_zero() {
        return Err(format!("{c} tokens selected it, but reap_l2_sum is 0"));
    }
    let (sum, sq) = (l.reap_l2_sum[x].to_f64(), l.reap_l2_sq_sum[x].to_f64());
    let margin = cauchy_schwarz_margin(sum, sq, c);
    if margin < -1.0 {
        return Err(format!(
            "reap_l2_sq_sum {sq} below reap_l2_sum^2 / count = {} (Cauchy-Schwarz)",
            sum * sum / c as f64
        ));
    }
    Ok(())
}

/// An expert's largest output norm: a norm (finite, not negative), zero
/// for an expert no token selected, and otherwise between the mean and the
/// sum of the norms `ean_sum` adds up (within rounding).
fn output_max(l: &LayerAccum, x: usize) -> Result<(), String> {
    let (m, c, sum) = (l.ean_max[x], l.count[x], l.ean_sum[x].to_f64());
    if !(m.is_finite() && m >= 0.0) {
        return Err(format!("ean_max {m} is not a norm"));
    }
    if c == 0 && m != 0.0 {
        return Err(format!("ean_max {m} for an expert no token selected"));
    }
    let slack = 1e-9 * sum.abs() + f64::MIN_POSITIVE;
    if m > sum + slack {
        return Err(format!(
            "ean_max {m} above ean_sum {sum}, the sum of the norms"
        ));
    }
    if m * c as f64 + slack < sum {
        return Err(format!(
            "ean_max {m} below ean_sum / count = {}, the mean of the norms",
            sum / c as f64
        ));
    }
    Ok(())
}

/// Relative slack of `act_max <= ean_max`: an element is at most its
/// row's norm, but a device path's f32 norm may round a little below it.
pub const ELEMENT_MAX_RTOL: f64 = 1e-6;

/// An expert's largest output element: finite and not negative (the
/// maximum starts at 0), zero for an expert no token selected, and at most
/// the largest output norm (an element of a row is at most the row's norm).
fn element_max(l: &LayerAccum, x: usize) -> Result<(), String> {
    let (a, m, c) = (l.act_max[x], l.ean_max[x], l.count[x]);
    if !(a.is_finite() && a >= 0.0) {
        return Err(format!(
            "act_max {a} is not a maximum from 0 of finite values"
        ));
    }
    if c == 0 && a != 0.0 {
        return Err(format!("act_max {a} for an expert no token selected"));
    }
    if a > m * (1.0 + ELEMENT_MAX_RTOL) {
        return Err(format!(
            "act_max {a} above ean_max {m}: an element exceeds its row's norm"
        ));
    }
    Ok(())
}

/// Under softmax gating each token's probabilities sum to 1.
fn prob_total(l: &LayerAccum, n: u64) -> Result<(), String> {
    let total: f64 = l.prob_sum.iter().map(|p| p.to_f64()).sum();
    if (total - n as f64).abs() > PROB_SUM_RTOL * (n as f64).max(1.0) {
        return Err(format!(
            "sum(prob_sum) = {total} for {n} tokens (softmax probabilities sum to 1)"
        ));
    }
    Ok(())
}

fn imatrix(p: &Partial, tokens: u64, budget: &Budget) -> Result<(), String> {
    let im = &p.imatrix;
    if im.entries.len() > MAX_ENTRIES {
        return Err(format!(
            "{} importance-matrix entries (at most {MAX_ENTRIES})",
            im.entries.len()
        ));
    }
    for (name, e) in &im.entries {
        imatrix_counts(name, e, tokens, budget)?;
    }
    Ok(())
}

/// One importance-matrix tensor's count vector: one count per matrix, each
/// within the budget.
fn imatrix_counts(
    name: &str,
    e: &crate::imatrix::ImatrixEntry,
    tokens: u64,
    budget: &Budget,
) -> Result<(), String> {
    if e.counts.len() as u64 != u64::from(e.n_mat) {
        return Err(lengths_error(name, e));
    }
    match e.counts.iter().position(|&c| !budget.count_ok(c, tokens)) {
        Some(m) => Err(format!(
            "importance matrix {}: matrix {m} counts {} rows in {tokens} tokens",
            peer_text(name),
            e.counts[m]
        )),
        None => Ok(()),
    }
}

/// A decoded tensor's sums: `n_in x n_mat` of each.
fn imatrix_lengths(name: &str, e: &crate::imatrix::ImatrixEntry) -> Result<(), String> {
    let cells = u64::from(e.n_in) * u64::from(e.n_mat);
    if e.sums().iter().any(|s| s.len() as u64 != cells) {
        return Err(lengths_error(name, e));
    }
    Ok(())
}

fn lengths_error(name: &str, e: &crate::imatrix::ImatrixEntry) -> String {
    format!(
        "importance matrix {}: {} counts, {} sums of squares and {} sums for [{}, {}]",
        peer_text(name),
        e.counts.len(),
        e.in_sum2.len(),
        e.in_sum.len(),
        e.n_in,
        e.n_mat
    )
}

/// A tensor or backend name: 1 to [`MAX_LABEL_CHARS`] printable ASCII
/// characters, none of which would break a Markdown table or an escape.
pub fn label_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL_CHARS
        && s.bytes()
            .all(|b| (b.is_ascii_graphic() || b == b' ') && !b"|\\`<>".contains(&b))
}

fn labels(p: &Partial) -> Result<(), String> {
    if p.backends.len() > MAX_BACKENDS || p.nonfinite_drops.len() > MAX_ENTRIES {
        return Err(format!(
            "{} backends and {} non-finite drop entries (at most {MAX_BACKENDS} and {MAX_ENTRIES})",
            p.backends.len(),
            p.nonfinite_drops.len()
        ));
    }
    let names = p
        .backends
        .iter()
        .map(|b| ("backend", b))
        .chain(
            p.imatrix
                .entries
                .keys()
                .map(|n| ("importance-matrix tensor", n)),
        )
        .chain(
            p.nonfinite_drops
                .keys()
                .map(|n| ("non-finite drop tensor", n)),
        );
    if let Some(name) = p
        .imatrix
        .entries
        .keys()
        .find(|n| n.len() > gguf::model_weights::MAX_ENTRY_NAME)
    {
        return Err(format!(
            "importance-matrix tensor name \"{}\" has {} characters; llama.cpp reads at most {} in an imatrix file",
            peer_text(name),
            name.len(),
            gguf::model_weights::MAX_ENTRY_NAME
        ));
    }
    for (what, name) in names {
        if !label_ok(name) {
            return Err(format!(
                "{what} name \"{}\" is not 1-{MAX_LABEL_CHARS} printable characters",
                peer_text(name)
            ));
        }
    }
    Ok(())
}

/// Per-chunk fit statistics: lengths of the shape, finite values, counts
/// at most the chunk's tokens.
fn chunk_stats(p: &Partial) -> Result<(), String> {
    let shape = &p.experts.shape;
    let cells = shape.moe_layers.len() * shape.n_expert as usize;
    for c in &p.chunk_stats {
        let at = |why: String| format!("per-chunk statistics of chunk {}: {why}", c.chunk);
        let lens = [c.count.len(), c.reap_l2_sum.len(), c.reap_l2_sq_sum.len()];
        if lens.iter().any(|&l| l != cells) {
            return Err(at(format!("lengths {lens:?}, the shape has {cells} cells")));
        }
        if let Some(i) = c.count.iter().position(|&n| n > c.n_tokens) {
            return Err(at(format!(
                "cell {i} counted {} times in {} tokens",
                c.count[i], c.n_tokens
            )));
        }
        let floats = c.reap_l2_sum.iter().chain(&c.reap_l2_sq_sum);
        if let Some(v) = floats.into_iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
            return Err(at(format!("value {v} is not a finite non-negative sum")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
