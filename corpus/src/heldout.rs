//! The held-out split by document group: every document of a group lands on
//! the same side, so near-identical documents of one task or URL cannot leak.

use super::doc::Doc;
use common::Split;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Sets `split` on every document. Per domain, groups are visited in an order
/// fixed by a hash of (seed, domain, group); a group is held out when that
/// keeps the held-out tokens within `fractions[domain]` of the domain's
/// tokens. With a positive fraction and two or more groups at least one group
/// is held out; the fit side always keeps at least one group.
pub fn assign(docs: &mut [Doc], fractions: &[f64], seed: u64) {
    let mut by_domain: BTreeMap<u16, BTreeMap<&str, u64>> = BTreeMap::new();
    for d in docs.iter() {
        *by_domain
            .entry(d.domain)
            .or_default()
            .entry(&d.group)
            .or_default() += d.tokens.len() as u64;
    }
    let mut held: BTreeMap<(u16, String), ()> = BTreeMap::new();
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
            chosen.push(order[0].0);
        }
        for g in chosen {
            held.insert((*domain, g.to_string()), ());
        }
    }
    for d in docs.iter_mut() {
        d.split = if held.contains_key(&(d.domain, d.group.clone())) {
            Split::Heldout
        } else {
            Split::Fit
        };
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
        assign(&mut docs, &[0.25, 0.0], 3);
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

    #[test]
    fn a_small_domain_still_holds_out_one_group_and_keeps_one_fit() {
        let mut docs = vec![doc(0, "a", 100), doc(0, "b", 100)];
        assign(&mut docs, &[0.1], 0);
        assert_eq!(docs.iter().filter(|d| d.split == Split::Heldout).count(), 1);
        let mut docs = vec![doc(0, "a", 1), doc(0, "b", 1)];
        assign(&mut docs, &[1.0], 0);
        assert_eq!(docs.iter().filter(|d| d.split == Split::Heldout).count(), 1);
    }
}
