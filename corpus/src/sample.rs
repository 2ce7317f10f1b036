//! `[corpus] shares = "sample"`: target shares achieved in the model's
//! tokens. After tokenizing, the held-out split and duplicate removal,
//! each calibration domain's fit split keeps whole groups, in an order
//! fixed by the seed, until its fit tokens come as near as whole groups
//! allow to its target share of the total that the scarcest domain
//! (relative to its target) allows; the documents left out are dropped as
//! `over_share`. The held-out split is left as it is: a fraction of each
//! domain, as configured.

use super::doc::Doc;
use numbers::Split;
use runfiles::manifest::Dropped;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// The rule name of a document left out to reach the shares.
pub const OVER_SHARE: &str = "over_share";

/// What sampling leaves out of the fit split.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeftOut {
    /// Per document of `docs` (same order): left out over its domain's share.
    pub docs: Vec<bool>,
    /// Per domain: documents and tokens left out.
    pub per_domain: Vec<(u64, u64)>,
}

/// Chooses the fit documents to leave out so that every domain's fit tokens
/// reach its share of `targets` (one per domain, all set; otherwise nothing
/// is left out). `skip[i]` marks documents already dropped (duplicates),
/// which neither count nor are chosen.
///
/// With `F[d]` the fit tokens of domain `d` and `t[d]` its target, the
/// scarcest domain allows a fit total of `T = min_d F[d] / t[d]`; domain
/// `d`'s quota is `Q[d] = t[d] * T` (all of the scarcest domain). Its
/// groups are visited in the order of a hash of (seed, domain, group), and
/// a group is kept when that brings the kept tokens no further from
/// `Q[d]` than leaving it out (so each domain ends within half its largest
/// skipped group of its quota).
pub fn choose(
    docs: &[Doc],
    skip: &[bool],
    n_domains: usize,
    targets: &[Option<f64>],
    seed: u64,
) -> LeftOut {
    let mut out = LeftOut {
        docs: vec![false; docs.len()],
        per_domain: vec![(0, 0); n_domains],
    };
    let Some(targets) = targets
        .iter()
        .map(|t| t.filter(|t| *t > 0.0))
        .collect::<Option<Vec<f64>>>()
    else {
        return out;
    };
    let fit = |i: usize| docs[i].split == Split::Fit && !skip.get(i).copied().unwrap_or(false);
    let mut groups: Vec<BTreeMap<&str, u64>> = vec![BTreeMap::new(); n_domains];
    for (_, d) in docs.iter().enumerate().filter(|(i, _)| fit(*i)) {
        *groups[d.domain as usize].entry(&d.group).or_default() += d.tokens.len() as u64;
    }
    let fit_tokens: Vec<u64> = groups.iter().map(|g| g.values().sum()).collect();
    let total = fit_tokens
        .iter()
        .zip(&targets)
        .map(|(&f, t)| f as f64 / t)
        .fold(f64::INFINITY, f64::min);
    if !total.is_finite() {
        return out;
    }
    let mut dropped: BTreeSet<(u16, &str)> = BTreeSet::new();
    for (domain, g) in groups.iter().enumerate() {
        let quota = targets[domain] * total;
        let mut order: Vec<(&str, u64)> = g.iter().map(|(name, t)| (*name, *t)).collect();
        order.sort_by_key(|(name, _)| rank(seed, domain as u16, name));
        let mut kept = 0u64;
        for (name, t) in order {
            let after = (kept + t) as f64 - quota;
            if after <= quota - kept as f64 {
                kept += t;
            } else {
                dropped.insert((domain as u16, name));
            }
        }
    }
    for (i, d) in docs.iter().enumerate() {
        if fit(i) && dropped.contains(&(d.domain, d.group.as_str())) {
            out.docs[i] = true;
            let c = &mut out.per_domain[d.domain as usize];
            c.0 += 1;
            c.1 += d.tokens.len() as u64;
        }
    }
    out
}

/// Marks the fit documents `choose` leaves out under `[corpus] shares =
/// "sample"` as dropped by [`OVER_SHARE`] in `drops` (the duplicate rules'
/// drops, one per document of `docs`), and returns each domain's documents
/// and tokens left out; under `"verify"` nothing changes.
pub fn apply(
    c: &config::CorpusConfig,
    names: &[String],
    docs: &[Doc],
    drops: &mut [Option<Dropped>],
) -> Vec<(u64, u64)> {
    if c.shares != config::SharesMode::Sample {
        return vec![(0, 0); names.len()];
    }
    let skip: Vec<bool> = drops.iter().map(Option::is_some).collect();
    let targets: Vec<Option<f64>> = c.domains.iter().map(|d| d.target_share).collect();
    let left = choose(docs, &skip, names.len(), &targets, c.seed);
    for ((d, out), drop) in docs.iter().zip(&left.docs).zip(drops.iter_mut()) {
        if *out {
            *drop = Some(Dropped {
                at: d.at.clone(),
                domain: names[d.domain as usize].clone(),
                rule: OVER_SHARE.into(),
                duplicate_of: String::new(),
                overlap: 0.0,
            });
        }
    }
    left.per_domain
}

/// A group's place in its domain's order: a hash of (seed, domain, group).
fn rank(seed: u64, domain: u16, group: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"over_share\0");
    h.update(seed.to_le_bytes());
    h.update(domain.to_le_bytes());
    h.update(group.as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_reached_by_whole_groups_within_half_a_group() {
        // Domain 0: 100 groups of 10 fit tokens (1000); domain 1: 10 groups
        // of 30 (300) and a held-out group; targets 50/50: domain 1 is the
        // scarcest, so domain 0 keeps 300 of its 1000.
        let mut docs: Vec<Doc> = (0..100)
            .map(|g| Doc::filler(0, &format!("a{g}"), 10, Split::Fit))
            .collect();
        docs.extend((0..10).map(|g| Doc::filler(1, &format!("b{g}"), 30, Split::Fit)));
        docs.push(Doc::filler(0, "held", 50, Split::Heldout));
        let skip = vec![false; docs.len()];
        let left = choose(&docs, &skip, 2, &[Some(0.5), Some(0.5)], 7);
        let kept = |domain: u16| -> u64 {
            docs.iter()
                .zip(&left.docs)
                .filter(|(d, out)| d.domain == domain && d.split == Split::Fit && !**out)
                .map(|(d, _)| d.tokens.len() as u64)
                .sum()
        };
        assert_eq!((kept(0), kept(1)), (300, 300));
        assert_eq!(left.per_domain, vec![(70, 700), (0, 0)]);
        assert!(!left.docs[110], "the held-out split is left as it is");
        // Another seed leaves out other groups, as many.
        let other = choose(&docs, &skip, 2, &[Some(0.5), Some(0.5)], 8);
        assert_ne!(other.docs, left.docs);
        assert_eq!(other.per_domain, left.per_domain);
        // Without targets nothing is left out.
        assert_eq!(
            choose(&docs, &skip, 2, &[None, None], 7),
            LeftOut {
                docs: vec![false; docs.len()],
                per_domain: vec![(0, 0); 2],
            }
        );
    }

    #[test]
    fn documents_already_dropped_neither_count_nor_are_chosen() {
        let docs = vec![
            Doc::filler(0, "a", 100, Split::Fit),
            Doc::filler(0, "b", 100, Split::Fit),
            Doc::filler(1, "c", 100, Split::Fit),
        ];
        // Without the skip domain 0 would keep 100 of 200; with "b"
        // dropped as a duplicate it keeps its remaining 100.
        let left = choose(&docs, &[false, true, false], 2, &[Some(0.5), Some(0.5)], 0);
        assert_eq!(left.docs, vec![false, false, false]);
    }
}
