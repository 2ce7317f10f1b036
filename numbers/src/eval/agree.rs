//! Comparing two workers' eval partials of the same chunks (an eval lease
//! sampled for a second opinion): bitwise when both ran on the same
//! backends (a chunk's logits are the same there, and every sum is
//! exact); otherwise the same positions, groups, candidates and counts,
//! and every figure within its stated tolerance:
//!
//! - per-position KL and each per-position mean of a sum (KL, NLL, the
//!   probability change) within [`ABS_TOLERANCE`] plus [`REL_TOLERANCE`]
//!   of its size;
//! - same top-1 positions within [`TOP1_TOLERANCE`] of the positions
//!   (near-ties may rank differently on another backend);
//! - generations: not compared (greedy continuations of another backend
//!   may part at a near-tie and never meet again).

use super::partial::{EvalPartial, TokenKl};
use crate::exact::ExactSum;
use crate::peer_text::peer_text;

/// Absolute tolerance of a per-position figure across backends, in nats
/// (or probability, for the probability change).
pub const ABS_TOLERANCE: f64 = 1e-3;

/// Relative tolerance of a per-position figure across backends.
pub const REL_TOLERANCE: f64 = 1e-2;

/// Share of positions whose top-1 agreement may differ across backends.
pub const TOP1_TOLERANCE: f64 = 0.01;

/// Whether `b` agrees with `a` (see the module doc); the error names the
/// first difference.
pub fn agree(a: &EvalPartial, b: &EvalPartial) -> Result<(), String> {
    if a.backends == b.backends {
        return match a == b {
            true => Ok(()),
            false => Err(format!(
                "the eval partials of one backend differ ({})",
                first_difference(a, b).unwrap_or_else(|| "in their bytes".into())
            )),
        };
    }
    if let Some(d) = structure_difference(a, b) {
        return Err(d);
    }
    for (ca, cb) in a.candidates.iter().zip(&b.candidates) {
        let name = peer_text(&ca.name);
        for (ta, tb) in ca.tokens.iter().zip(&cb.tokens) {
            if !close(ta.kl, tb.kl) {
                return Err(format!(
                    "candidate {name}, chunk {} position {}: KL {} and {}",
                    ta.chunk, ta.pos, ta.kl, tb.kl
                ));
            }
        }
        for ((key, sa), sb) in ca.chunks.iter().zip(cb.chunks.values()) {
            let n = sa.n.max(1) as f64;
            let mean = |s: ExactSum| s.to_f64() / n;
            for (what, x, y) in [
                ("NLL", sa.nll, sb.nll),
                ("base NLL", sa.nll_base, sb.nll_base),
                ("probability change", sa.dprob, sb.dprob),
            ] {
                if !close(mean(x), mean(y)) {
                    return Err(format!(
                        "candidate {name}, chunk {}: mean {what} {} and {}",
                        key.0,
                        mean(x),
                        mean(y)
                    ));
                }
            }
            let top1 = sa.top1_same.abs_diff(sb.top1_same) as f64;
            if top1 > (TOP1_TOLERANCE * n).max(1.0) {
                return Err(format!(
                    "candidate {name}, chunk {}: same top-1 at {} and {} of {} positions",
                    key.0, sa.top1_same, sb.top1_same, sa.n
                ));
            }
        }
    }
    Ok(())
}

/// Whether two per-position figures agree within the tolerances.
fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= ABS_TOLERANCE + REL_TOLERANCE * x.abs().max(y.abs())
}

/// What must be equal whatever the backend: chunks, model, corpus,
/// settings, positions and their groups, candidates, counts.
fn structure_difference(a: &EvalPartial, b: &EvalPartial) -> Option<String> {
    let same =
        |what: &str, equal: bool| (!equal).then(|| format!("the eval partials differ in {what}"));
    same("chunks", a.chunks == b.chunks)
        .or_else(|| same("base model", a.base_sha256 == b.base_sha256))
        .or_else(|| same("corpus", a.corpus_sha256 == b.corpus_sha256))
        .or_else(|| {
            same(
                "settings",
                (a.skip_first, &a.splits, a.generate) == (b.skip_first, &b.splits, b.generate),
            )
        })
        .or_else(|| {
            let counts =
                |p: &EvalPartial| p.base.iter().map(|(g, s)| (*g, s.n)).collect::<Vec<_>>();
            same("scored positions per group", counts(a) == counts(b))
        })
        .or_else(|| {
            let ids = |p: &EvalPartial| {
                p.candidates
                    .iter()
                    .map(|c| (c.name.clone(), c.sha256.clone(), c.k))
                    .collect::<Vec<_>>()
            };
            same("candidates", ids(a) == ids(b))
        })
        .or_else(|| {
            let at = |t: &TokenKl| (t.chunk, t.pos, t.group);
            let positions = |p: &EvalPartial| {
                p.candidates
                    .iter()
                    .map(|c| {
                        (
                            c.tokens.iter().map(at).collect::<Vec<_>>(),
                            c.chunks.keys().copied().collect::<Vec<_>>(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            same("positions scored", positions(a) == positions(b))
        })
}

/// The first per-position KL that differs, if any (the common case of a
/// forged figure).
fn first_difference(a: &EvalPartial, b: &EvalPartial) -> Option<String> {
    if let Some(d) = structure_difference(a, b) {
        return Some(d);
    }
    for (ca, cb) in a.candidates.iter().zip(&b.candidates) {
        if let Some((ta, tb)) = ca
            .tokens
            .iter()
            .zip(&cb.tokens)
            .find(|(x, y)| x.kl.to_bits() != y.kl.to_bits())
        {
            return Some(format!(
                "candidate {}, chunk {} position {}: KL {} and {}",
                peer_text(&ca.name),
                ta.chunk,
                ta.pos,
                ta.kl,
                tb.kl
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::bounds::tests::partial;

    fn honest() -> EvalPartial {
        partial(&[(0, 1, 0.25), (0, 2, 0.0), (1, 0, 1.5)])
    }

    #[test]
    fn one_backend_agrees_only_bitwise_and_names_the_first_kl() {
        agree(&honest(), &honest()).unwrap();
        let zero = partial(&[(0, 1, 0.0), (0, 2, 0.0), (1, 0, 0.0)]);
        let e = agree(&honest(), &zero).unwrap_err();
        assert!(e.contains("chunk 0 position 1: KL 0.25 and 0"), "{e}");
        let nudged = partial(&[(0, 1, 0.25 + 1e-12), (0, 2, 0.0), (1, 0, 1.5)]);
        assert!(agree(&honest(), &nudged).is_err());
    }

    #[test]
    fn other_backends_agree_within_the_stated_tolerances() {
        let mut other = partial(&[(0, 1, 0.2501), (0, 2, 0.0002), (1, 0, 1.51)]);
        other.backends = vec!["cuda".into()];
        agree(&honest(), &other).unwrap();
        let mut far = partial(&[(0, 1, 0.25), (0, 2, 0.0), (1, 0, 1.6)]);
        far.backends = vec!["cuda".into()];
        let e = agree(&honest(), &far).unwrap_err();
        assert!(e.contains("chunk 1 position 0: KL 1.5 and 1.6"), "{e}");
        let mut zero = partial(&[(0, 1, 0.0), (0, 2, 0.0), (1, 0, 0.0)]);
        zero.backends = vec!["cuda".into()];
        assert!(agree(&honest(), &zero).is_err());
        let mut fewer = partial(&[(0, 1, 0.25), (1, 0, 1.5)]);
        fewer.backends = vec!["cuda".into()];
        let e = agree(&honest(), &fewer).unwrap_err();
        assert!(e.contains("scored positions"), "{e}");
        let mut top1 = honest();
        top1.backends = vec!["cuda".into()];
        top1.candidates[0]
            .chunks
            .values_mut()
            .next()
            .unwrap()
            .top1_same = 0;
        let e = agree(&honest(), &top1).unwrap_err();
        assert!(e.contains("same top-1 at 2 and 0"), "{e}");
    }
}
