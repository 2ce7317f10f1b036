//! The figures an eval partial may hold, checked before a coordinator
//! accepts it (from a worker or read back on resume), so whatever it
//! accepts merges, summarises and reads back:
//!
//! - every per-position KL finite and at least `-`[`KL_ROUNDING`] (KL is
//!   never negative; rounding may leave a hair below 0), positions sorted
//!   and each scored once;
//! - the per-(chunk, group) sums are exactly the sums of their positions'
//!   KL values (and squares), so a bound on the positions bounds them;
//! - counts within their ranges: same top-1 at most the positions, the
//!   probability change within `[-n, n]` and its square within `[0, n]`,
//!   negative log likelihoods and KL squares not negative;
//! - every sum within the per-position budget of the corpus
//!   ([`crate::exact::per_token_limit`]), so no merge of accepted partials
//!   leaves the exact accumulator's range;
//! - backend names short and printable, in bounded numbers;
//! - generation figures (each candidate's and the noise floor's) only with
//!   a generation job, each a prompt and a matched prefix no longer than
//!   the continuation.
//!
//! Which positions and groups a lease holds depends on the corpus and is
//! checked by the coordinator's acceptance against its chunks.

use super::generation::Generation;
use super::partial::{ChunkSums, EvalPartial, Group, TokenKl};
use crate::exact::{per_token_limit, ExactSum};
use crate::partial_check::{label_ok, MAX_BACKENDS, MAX_LABEL_CHARS};
use crate::peer_text::peer_text;
use std::collections::BTreeMap;

/// How far below 0 a per-position KL (or a sum of negative log
/// likelihoods, per position) may be from rounding, in nats: a device
/// compare sums a row's terms in f32 (`worker::eval::device`), whose
/// rounding over a large vocabulary reaches 1e-6 and more; 1e-4 is far
/// below any KL a budget or a comparison is decided on.
pub const KL_ROUNDING: f64 = 1e-4;

/// Whether the figures of `p` are possible for a corpus of
/// `corpus_tokens` tokens (see the module doc); why not otherwise, naming
/// the candidate, the figure and where.
pub fn check_figures(p: &EvalPartial, corpus_tokens: u64) -> Result<(), String> {
    check_backends(&p.backends)?;
    let limit = per_token_limit(corpus_tokens);
    for (g, b) in &p.base {
        let at = format!("base model, {}", group_name(g));
        in_budget(b.nll, limit, b.n, &format!("{at}: NLL sum"))?;
        not_below(b.nll, b.n, &format!("{at}: NLL sum"))?;
    }
    check_generations(&p.noise, p.generate.0).map_err(|e| format!("noise floor: {e}"))?;
    for c in &p.candidates {
        let name = peer_text(&c.name);
        check_tokens(&c.tokens).map_err(|e| format!("candidate {name}: {e}"))?;
        check_generations(&c.generations, p.generate.0)
            .map_err(|e| format!("candidate {name}: {e}"))?;
        for (g, s) in &c.groups {
            let at = format!("candidate {name}, {}", group_name(g));
            let sums = [
                (s.kl, "KL sum"),
                (s.kl_sq, "KL squared sum"),
                (s.nll, "NLL sum"),
            ];
            check_counts_and_sums(&at, s.n, s.top1_same, sums, s.dprob, limit)?;
        }
        let by_chunk = token_sums(&c.tokens).map_err(|e| format!("candidate {name}: {e}"))?;
        for (key @ (chunk, cluster, g), s) in &c.chunks {
            let at = format!(
                "candidate {name}, chunk {chunk} cluster {cluster}, {}",
                group_name(g)
            );
            check_chunk(s, &at, limit)?;
            let (n, kl) = by_chunk.get(key).copied().unwrap_or_default();
            if (n, kl) != (s.n, s.kl) {
                return Err(format!(
                    "{at}: sums of {} positions with KL sum {}, its per-position values are {n} with KL sum {}",
                    s.n,
                    s.kl.to_f64(),
                    kl.to_f64()
                ));
            }
        }
        if let Some((chunk, cluster, g)) = by_chunk.keys().find(|k| !c.chunks.contains_key(*k)) {
            return Err(format!(
                "candidate {name}: per-position KL of chunk {chunk} cluster {cluster}, {} without its chunk's sums",
                group_name(g)
            ));
        }
        let mut squares: BTreeMap<Group, ExactSum> = BTreeMap::new();
        for t in &c.tokens {
            squares
                .entry(t.group)
                .or_default()
                .add_f64(t.kl * t.kl)
                .map_err(|e| format!("candidate {name}: KL squared: {e}"))?;
        }
        for (g, s) in &c.groups {
            if squares.get(g).copied().unwrap_or_default() != s.kl_sq {
                return Err(format!(
                    "candidate {name}, {}: KL squared sum {} is not the sum of its positions' squares",
                    group_name(g),
                    s.kl_sq.to_f64()
                ));
            }
        }
    }
    Ok(())
}

/// Generations of continuations of `new_tokens` (none without a job):
/// each possible ([`Generation::check`]).
fn check_generations(gens: &BTreeMap<u32, Generation>, new_tokens: u32) -> Result<(), String> {
    if new_tokens == 0 && !gens.is_empty() {
        return Err(format!(
            "{} generations, but the partial generated no tokens",
            gens.len()
        ));
    }
    for (id, g) in gens {
        g.check(new_tokens)
            .map_err(|e| format!("generation prompt {id}: {e}"))?;
    }
    Ok(())
}

/// A group as errors name it.
fn group_name(g: &Group) -> String {
    format!("{} domain {} {:?}", g.split, g.domain, g.modality)
}

/// At most [`MAX_BACKENDS`] names, each 1 to [`MAX_LABEL_CHARS`] printable
/// characters.
fn check_backends(backends: &[String]) -> Result<(), String> {
    if backends.len() > MAX_BACKENDS {
        return Err(format!(
            "eval partial names {} backends (at most {MAX_BACKENDS})",
            backends.len()
        ));
    }
    match backends.iter().find(|b| !label_ok(b)) {
        Some(b) => Err(format!(
            "backend name \"{}\" ({} bytes) is not 1 to {MAX_LABEL_CHARS} printable characters",
            crate::peer_text::escape_peer_text(b, 32),
            b.len()
        )),
        None => Ok(()),
    }
}

/// Positions sorted by (chunk, position), each once, with a finite KL of
/// at least `-KL_ROUNDING`.
fn check_tokens(tokens: &[TokenKl]) -> Result<(), String> {
    for t in tokens {
        let at = format!("chunk {} position {}", t.chunk, t.pos);
        if t.kl.is_nan() {
            return Err(format!("per-position KL is NaN at {at}"));
        }
        if t.kl.is_infinite() {
            return Err(format!("per-position KL is infinite ({}) at {at}", t.kl));
        }
        if t.kl < -KL_ROUNDING {
            return Err(format!(
                "per-position KL is negative ({}) at {at}; KL is at least 0",
                t.kl
            ));
        }
    }
    if let Some(w) = tokens
        .windows(2)
        .find(|w| (w[0].chunk, w[0].pos) >= (w[1].chunk, w[1].pos))
    {
        return Err(format!(
            "per-position KL of chunk {} position {} is not sorted or listed twice",
            w[1].chunk, w[1].pos
        ));
    }
    Ok(())
}

/// Positions and exact KL sum, by (chunk, cluster, group).
type TokenSums = BTreeMap<super::CellKey, (u64, ExactSum)>;

/// Positions and exact KL sum per (chunk, cluster, group) of `tokens`.
fn token_sums(tokens: &[TokenKl]) -> Result<TokenSums, String> {
    let mut out = TokenSums::new();
    for t in tokens {
        let e = out.entry((t.chunk, t.cluster, t.group)).or_default();
        e.0 += 1;
        e.1.add_f64(t.kl).map_err(|e| {
            format!(
                "per-position KL at chunk {} position {}: {e}",
                t.chunk, t.pos
            )
        })?;
    }
    Ok(out)
}

/// What a group's and a chunk's sums share: same top-1 at most `n`, each
/// KL or NLL sum within the per-position budget and not below 0, the
/// probability change sum within [-n, n].
fn check_counts_and_sums(
    at: &str,
    n: u64,
    top1_same: u64,
    sums: [(ExactSum, &str); 3],
    dprob: ExactSum,
    limit: u128,
) -> Result<(), String> {
    if top1_same > n {
        return Err(format!("{at}: same top-1 at {top1_same} of {n} positions"));
    }
    for (sum, what) in sums {
        in_budget(sum, limit, n, &format!("{at}: {what}"))?;
        not_below(sum, n, &format!("{at}: {what}"))?;
    }
    within_n(dprob, n, &format!("{at}: probability change sum"))
}

/// The ranges of one chunk's sums in one group.
fn check_chunk(s: &ChunkSums, at: &str, limit: u128) -> Result<(), String> {
    let sums = [
        (s.kl, "KL sum"),
        (s.nll_base, "base NLL sum"),
        (s.nll, "NLL sum"),
    ];
    check_counts_and_sums(at, s.n, s.top1_same, sums, s.dprob, limit)?;
    if s.dprob_sq.0 < 0 || s.dprob_sq.to_f64() > s.n as f64 * (1.0 + 1e-9) {
        return Err(format!(
            "{at}: sum of squared probability changes {} outside [0, {}]",
            s.dprob_sq.to_f64(),
            s.n
        ));
    }
    Ok(())
}

/// A sum within the corpus's per-position budget times its positions.
fn in_budget(sum: ExactSum, limit: u128, n: u64, what: &str) -> Result<(), String> {
    match sum.within(limit, n) {
        true => Ok(()),
        false => Err(format!(
            "{what} {} over {n} positions is beyond what the corpus's positions can hold",
            sum.to_f64()
        )),
    }
}

/// A sum of values that are never negative: at least `-KL_ROUNDING` per
/// position.
fn not_below(sum: ExactSum, n: u64, what: &str) -> Result<(), String> {
    let v = sum.to_f64();
    match v >= -KL_ROUNDING * n as f64 {
        true => Ok(()),
        false => Err(format!("{what} is negative ({v}) over {n} positions")),
    }
}

/// A sum of values in `[-1, 1]` over `n` positions.
fn within_n(sum: ExactSum, n: u64, what: &str) -> Result<(), String> {
    let v = sum.to_f64();
    match v.abs() <= n as f64 * (1.0 + 1e-9) {
        true => Ok(()),
        false => Err(format!("{what} {v} is outside [-{n}, {n}]")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::eval::partial::{BaseSums, CandidateResult, CandidateSums};
    use crate::eval::EVAL_FORMAT_VERSION;
    use crate::split::{ChunkRange, Split};

    const CORPUS_TOKENS: u64 = 1000;

    /// A partial of one candidate over `kl` = (chunk, position, KL) in one
    /// group, its sums added as a worker adds them.
    pub(crate) fn partial(kl: &[(u32, u32, f64)]) -> EvalPartial {
        let g = Group::text(Split::Fit, 0);
        let mut base = BaseSums::default();
        let mut sums = CandidateSums::default();
        let mut chunks: BTreeMap<crate::eval::CellKey, ChunkSums> = BTreeMap::new();
        let mut tokens = Vec::new();
        for &(chunk, pos, v) in kl {
            base.n += 1;
            base.nll.add_f64(2.0).unwrap();
            sums.n += 1;
            sums.top1_same += 1;
            sums.kl.add_f64(v).unwrap();
            sums.kl_sq.add_f64(v * v).unwrap();
            sums.nll.add_f64(2.5).unwrap();
            sums.dprob.add_f64(-0.1).unwrap();
            chunks
                .entry((chunk, 0, g))
                .or_default()
                .add(v, 2.0, 2.5, true, -0.1)
                .unwrap();
            tokens.push(TokenKl {
                chunk,
                pos,
                cluster: 0,
                group: g,
                kl: v,
            });
        }
        EvalPartial {
            format_version: EVAL_FORMAT_VERSION,
            base_sha256: "b".into(),
            corpus_sha256: "k".into(),
            skip_first: 0,
            splits: vec![Split::Fit],
            generate: (0, 0),
            backends: vec!["cpu".into()],
            chunks: vec![ChunkRange { start: 0, end: 2 }],
            base: BTreeMap::from([(g, base)]),
            candidates: vec![CandidateResult {
                name: "frequency_K8".into(),
                sha256: "c".into(),
                k: 8,
                groups: BTreeMap::from([(g, sums)]),
                chunks,
                tokens,
                generations: BTreeMap::new(),
            }],
            noise: BTreeMap::new(),
        }
    }

    fn honest() -> EvalPartial {
        partial(&[(0, 1, 0.25), (0, 2, 0.0), (1, 0, 1.5)])
    }

    #[test]
    fn generation_figures_must_be_possible_and_need_a_job() {
        let gen = |prompt_tokens, matched| Generation {
            domain: 0,
            prompt_tokens,
            matched,
        };
        let mut p = honest();
        p.generate = (4, 1);
        p.candidates[0].generations = [(0, gen(9, 4)), (1, gen(9, 0))].into();
        p.noise = [(0, gen(9, 4)), (1, gen(9, 4))].into();
        check_figures(&p, CORPUS_TOKENS).unwrap();
        let mut longer = p.clone();
        longer.candidates[0].generations.insert(1, gen(9, 5));
        let e = check_figures(&longer, CORPUS_TOKENS).unwrap_err();
        assert!(
            e.contains("candidate frequency_K8: generation prompt 1"),
            "{e}"
        );
        let mut empty = p.clone();
        empty.noise.insert(2, gen(0, 1));
        let e = check_figures(&empty, CORPUS_TOKENS).unwrap_err();
        assert!(e.contains("noise floor: generation prompt 2"), "{e}");
        let mut unasked = p;
        unasked.generate = (0, 0);
        let e = check_figures(&unasked, CORPUS_TOKENS).unwrap_err();
        assert!(e.contains("generated no tokens"), "{e}");
    }

    #[test]
    fn honest_figures_pass_with_a_hair_of_negative_rounding() {
        check_figures(&honest(), CORPUS_TOKENS).unwrap();
        check_figures(&partial(&[(0, 1, -1e-9)]), CORPUS_TOKENS).unwrap();
        check_figures(&partial(&[(0, 1, -5e-5)]), CORPUS_TOKENS).unwrap();
    }

    #[test]
    fn nan_infinite_and_negative_kl_are_refused_by_name() {
        for (v, what) in [
            (f64::NAN, "per-position KL is NaN at chunk 1 position 0"),
            (f64::INFINITY, "per-position KL is infinite"),
            (-0.5, "per-position KL is negative (-0.5)"),
        ] {
            let mut p = honest();
            p.candidates[0].tokens[2].kl = v;
            let e = check_figures(&p, CORPUS_TOKENS).unwrap_err();
            assert!(
                e.contains(what) && e.contains("frequency_K8"),
                "{what}: {e}"
            );
        }
        // Negative with every sum consistent with it is still refused.
        let e = check_figures(&partial(&[(0, 1, -0.5)]), CORPUS_TOKENS).unwrap_err();
        assert!(e.contains("negative"), "{e}");
    }

    #[test]
    fn sums_that_are_not_their_positions_are_refused() {
        type Change = fn(&mut EvalPartial);
        let cases: [(&str, Change); 8] = [
            ("its per-position values are", |p| {
                p.candidates[0].tokens[0].kl = 0.0
            }),
            ("not sorted or listed twice", |p| {
                let t = p.candidates[0].tokens[0];
                p.candidates[0].tokens.insert(0, t);
            }),
            ("same top-1 at 4 of 3 positions", |p| {
                p.candidates[0]
                    .groups
                    .values_mut()
                    .for_each(|s| s.top1_same = 4)
            }),
            ("KL squared sum", |p| {
                p.candidates[0]
                    .groups
                    .values_mut()
                    .for_each(|s| s.kl_sq = ExactSum::ZERO)
            }),
            ("probability change sum", |p| {
                p.candidates[0]
                    .chunks
                    .values_mut()
                    .for_each(|s| s.dprob = ExactSum::from_f64(-9.0).unwrap())
            }),
            ("NLL sum is negative", |p| {
                p.base
                    .values_mut()
                    .for_each(|b| b.nll = ExactSum::from_f64(-1.0).unwrap())
            }),
            ("beyond what the corpus's positions can hold", |p| {
                p.base
                    .values_mut()
                    .for_each(|b| b.nll = ExactSum::from_f64(4e18).unwrap())
            }),
            ("without its chunk's sums", |p| {
                p.candidates[0].chunks.clear()
            }),
        ];
        for (what, change) in cases {
            let mut p = honest();
            change(&mut p);
            let e = check_figures(&p, CORPUS_TOKENS).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
    }

    #[test]
    fn long_or_unprintable_backend_names_and_too_many_are_refused() {
        let mut p = honest();
        p.backends = vec!["\u{1}".repeat(100_000)];
        let e = check_figures(&p, CORPUS_TOKENS).unwrap_err();
        assert!(e.contains("backend name") && e.len() < 1000, "{e}");
        p.backends = (0..17).map(|i| format!("b{i}")).collect();
        let e = check_figures(&p, CORPUS_TOKENS).unwrap_err();
        assert!(e.contains("17 backends"), "{e}");
    }
}
