//! The held-out split by document group: every document of a group lands on
//! the same side, so near-identical documents of one task or URL cannot leak.

use super::doc::Doc;
use super::error::CorpusError;
use numbers::Split;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// How far a domain's held-out share may exceed its configured fraction
/// when no group fits the fraction's budget: the smallest group is held out
/// only when it holds at most `HELDOUT_BOUND_FACTOR x fraction` of the
/// domain's tokens; otherwise the corpus is refused with the group sizes.
pub const HELDOUT_BOUND_FACTOR: f64 = 2.0;

/// Sets `split` on every document. Per domain, groups are visited in an order
/// fixed by a hash of (seed, domain, group); a group is held out when that
/// keeps the held-out tokens within `fractions[domain]` of the domain's
/// tokens. With a positive fraction and two or more groups at least one group
/// is held out; the fit side always keeps at least one group. When no group
/// fits, the smallest is held out if that stays within
/// [`HELDOUT_BOUND_FACTOR`] times the fraction, else the split is refused
/// ([`CorpusError::HeldoutGroups`], naming `names[domain]` and its groups).
pub fn assign(
    docs: &mut [Doc],
    names: &[String],
    fractions: &[f64],
    seed: u64,
) -> Result<(), CorpusError> {
    let mut by_domain: BTreeMap<u16, BTreeMap<&str, u64>> = BTreeMap::new();
    for d in docs.iter() {
        *by_domain
            .entry(d.domain)
            .or_default()
            .entry(&d.group)
            .or_default() += d.tokens.len() as u64;
    }
    let mut held: BTreeSet<(u16, String)> = BTreeSet::new();
    for (domain, groups) in &by_domain {
        let fraction = fractions.get(*domain as usize).copied().unwrap_or(0.0);
        if fraction <= 0.0 || groups.len() < 2 {
            continue;
        }
        let total: u64 = groups.values().sum();
        let budget = fraction * total as f64;
        let mut order: Vec<(&str, u64)> = groups.iter().map(|(g, t)| (*g, *t)).collect();
        order.sort_by_key(|(g, _)| rank(seed, *domain, g));
        let mut taken = 0u64;
        let mut chosen = Vec::new();
        for (g, t) in &order {
            if chosen.len() + 1 < order.len() && (taken + t) as f64 <= budget {
                taken += t;
                chosen.push(*g);
            }
        }
        if chosen.is_empty() {
            let (g, t) = *order
                .iter()
                .min_by_key(|(_, t)| *t)
                .expect("two or more groups");
            if t as f64 > HELDOUT_BOUND_FACTOR * budget {
                return Err(refusal(names, *domain, fraction, total, &order));
            }
            chosen.push(g);
        }
        for g in chosen {
            held.insert((*domain, g.to_string()));
        }
    }
    for d in docs.iter_mut() {
        d.split = if held.contains(&(d.domain, d.group.clone())) {
            Split::Heldout
        } else {
            Split::Fit
        };
    }
    Ok(())
}

/// The error for a domain none of whose groups fits within the bound:
/// its largest groups with their token counts, largest first.
fn refusal(
    names: &[String],
    domain: u16,
    fraction: f64,
    total: u64,
    groups: &[(&str, u64)],
) -> CorpusError {
    const SHOWN: usize = 10;
    let mut sizes: Vec<(&str, u64)> = groups.to_vec();
    sizes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut listed: Vec<String> = sizes
        .iter()
        .take(SHOWN)
        .map(|(g, t)| format!("{g:?}: {t}"))
        .collect();
    if sizes.len() > SHOWN {
        listed.push(format!("and {} more", sizes.len() - SHOWN));
    }
    CorpusError::HeldoutGroups {
        domain: names
            .get(domain as usize)
            .cloned()
            .unwrap_or_else(|| domain.to_string()),
        fraction,
        bound: HELDOUT_BOUND_FACTOR * fraction,
        smallest: sizes.last().map_or(0, |s| s.1) as f64 / total.max(1) as f64,
        total,
        groups: listed.join(", "),
    }
}

fn rank(seed: u64, domain: u16, group: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(domain.to_le_bytes());
    h.update(group.as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(domain: u16, group: &str, n: usize) -> Doc {
        Doc {
            index: 0,
            domain,
            at: format!("{group}/{n}"),
            group: group.into(),
            chars: n as u64,
            tokens: vec![1; n],
            images: Vec::new(),
            split: Split::Fit,
        }
    }

    #[test]
    fn groups_never_straddle_and_fraction_is_respected() {
        let mut docs: Vec<Doc> = (0..200)
            .map(|i| doc((i % 2) as u16, &format!("g{}", i % 37), 10 + i % 7))
            .collect();
        assign(&mut docs, &names(2), &[0.25, 0.0], 3).unwrap();
        let mut side: BTreeMap<(u16, String), Split> = BTreeMap::new();
        for d in &docs {
            let s = side.entry((d.domain, d.group.clone())).or_insert(d.split);
            assert_eq!(*s, d.split, "group {} straddles the split", d.group);
        }
        let tokens = |dom: u16, s: Split| -> usize {
            docs.iter()
                .filter(|d| d.domain == dom && d.split == s)
                .map(|d| d.tokens.len())
                .sum()
        };
        let (h, f) = (tokens(0, Split::Heldout), tokens(0, Split::Fit));
        let frac = h as f64 / (h + f) as f64;
        assert!(frac > 0.15 && frac <= 0.25, "held-out fraction {frac}");
        assert_eq!(tokens(1, Split::Heldout), 0);
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("dom{i}")).collect()
    }

    fn held_tokens(docs: &[Doc]) -> usize {
        docs.iter()
            .filter(|d| d.split == Split::Heldout)
            .map(|d| d.tokens.len())
            .sum()
    }

    #[test]
    fn a_small_group_is_held_out_when_none_fits_and_a_large_one_refused() {
        // Two groups of 100 at 0.4: the budget is 80, the smaller group is
        // half the domain, within twice the fraction: held out.
        let mut docs = vec![doc(0, "a", 100), doc(0, "b", 100)];
        assign(&mut docs, &names(1), &[0.4], 0).unwrap();
        assert_eq!(held_tokens(&docs), 100);
        // At 0.1 half the domain is past the bound (20%): refused, naming
        // the domain and the group sizes.
        let err = assign(&mut docs, &names(1), &[0.1], 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"dom0\""), "{err}");
        assert!(
            err.contains("\"a\": 100") && err.contains("\"b\": 100"),
            "{err}"
        );
    }

    #[test]
    fn groups_of_900k_60k_40k_at_two_percent_never_hold_out_more_than_the_bound() {
        // Groups sized in tokens (one token a position); at 0.02 no group
        // fits the 20k budget, and 40k is exactly the bound (2 x 2%).
        let sizes = [("big", 900_000), ("mid", 60_000), ("small", 40_000)];
        for seed in 0..64 {
            let mut docs: Vec<Doc> = sizes.iter().map(|(g, n)| doc(0, g, *n)).collect();
            assign(&mut docs, &names(1), &[0.02], seed).unwrap();
            assert_eq!(held_tokens(&docs), 40_000, "seed {seed}");
            assert!(docs
                .iter()
                .all(|d| (d.split == Split::Heldout) == (d.group == "small")));
        }
        // With the smallest at 45k (4.5%) nothing fits the bound: refused,
        // under every seed, with the three sizes in the message.
        let sizes = [("big", 900_000), ("mid", 60_000), ("small", 45_000)];
        for seed in 0..64 {
            let mut docs: Vec<Doc> = sizes.iter().map(|(g, n)| doc(0, g, *n)).collect();
            let err = assign(&mut docs, &names(1), &[0.02], seed)
                .unwrap_err()
                .to_string();
            for s in [
                "\"big\": 900000",
                "\"mid\": 60000",
                "\"small\": 45000",
                "dom0",
            ] {
                assert!(err.contains(s), "seed {seed}: {err}");
            }
        }
    }
}
