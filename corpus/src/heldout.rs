//! The held-out split by document group: every document of a group lands on
//! the same side, so near-identical documents of one task or URL cannot leak.
//! Groups are chosen without regard to their size, and a domain's held-out
//! share stays within [`SHARE_BOUNDS`] of its fraction, before and after
//! duplicate removal ([`check_shares`]), or the corpus is refused.

use super::doc::Doc;
use super::error::CorpusError;
use numbers::Split;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// The held-out share a domain may have, as multiples of its fraction:
/// at least half of it and at most twice it.
pub const SHARE_BOUNDS: (f64, f64) = (0.5, 2.0);

/// How many random windows [`assign`] tries per domain before it falls back
/// to the smallest group alone.
const ATTEMPTS: u64 = 64;

/// Sets `split` on every document. Per domain with a positive fraction
/// `f = fractions[domain]`: the groups are laid in a random order (a hash
/// of seed, domain, attempt and group) around a circle of the domain's
/// tokens, a window of `f` of the circle starts at a random point, and a
/// group is held out when its midpoint falls inside the window. Every group
/// is held out with probability `f` whatever its size (the start is
/// uniform). The first attempt that holds out a share within
/// [`SHARE_BOUNDS`] and keeps a group on each side is taken; when none of
/// [`ATTEMPTS`] does, the smallest group alone, if its share is within the
/// bounds (the only choice a coarse domain leaves). Refused: a domain with
/// fewer than two groups ([`CorpusError::HeldoutOneGroup`]) and one with no
/// choice within the bounds ([`CorpusError::HeldoutShare`]).
pub fn assign(
    docs: &mut [Doc],
    names: &[String],
    fractions: &[f64],
    seed: u64,
) -> Result<(), CorpusError> {
    let mut held: BTreeSet<(u16, String)> = BTreeSet::new();
    for (domain, groups) in group_tokens(docs.iter()) {
        let fraction = fractions.get(domain as usize).copied().unwrap_or(0.0);
        if fraction <= 0.0 {
            continue;
        }
        if groups.len() < 2 {
            return Err(CorpusError::HeldoutOneGroup {
                domain: name(names, domain),
                fraction,
                groups: groups.keys().map(|g| format!("{g:?}")).collect(),
            });
        }
        let chosen = choose(&groups, fraction, seed, domain)
            .ok_or_else(|| refusal(names, domain, fraction, "by the split", &groups, &[]))?;
        held.extend(chosen.into_iter().map(|g| (domain, g.to_string())));
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

/// Refuses a domain whose held-out share of the documents kept after
/// duplicate removal (`docs`) has left [`SHARE_BOUNDS`] of its fraction,
/// naming its held-out groups and the largest groups with their tokens.
pub fn check_shares<'a, I>(docs: I, names: &[String], fractions: &[f64]) -> Result<(), CorpusError>
where
    I: IntoIterator<Item = &'a Doc> + Clone,
{
    for (domain, groups) in group_tokens(docs.clone()) {
        let fraction = fractions.get(domain as usize).copied().unwrap_or(0.0);
        if fraction <= 0.0 {
            continue;
        }
        let held: BTreeSet<&str> = docs
            .clone()
            .into_iter()
            .filter(|d| d.domain == domain && d.split == Split::Heldout)
            .map(|d| d.group.as_str())
            .collect();
        let held: Vec<&str> = held.into_iter().collect();
        if !within(share(&groups, &held), fraction) {
            let what = "after duplicate removal";
            return Err(refusal(names, domain, fraction, what, &groups, &held));
        }
    }
    Ok(())
}

/// Tokens per group, per domain.
fn group_tokens<'a>(
    docs: impl IntoIterator<Item = &'a Doc>,
) -> BTreeMap<u16, BTreeMap<&'a str, u64>> {
    let mut by_domain: BTreeMap<u16, BTreeMap<&str, u64>> = BTreeMap::new();
    for d in docs {
        *by_domain
            .entry(d.domain)
            .or_default()
            .entry(&d.group)
            .or_default() += d.tokens.len() as u64;
    }
    by_domain
}

/// The held-out groups of one domain, or `None` when no choice is within
/// the bounds (see [`assign`]).
fn choose<'a>(
    groups: &BTreeMap<&'a str, u64>,
    fraction: f64,
    seed: u64,
    domain: u16,
) -> Option<Vec<&'a str>> {
    let total: u64 = groups.values().sum();
    let valid = |held: &[&str]| {
        !held.is_empty() && held.len() < groups.len() && within(share(groups, held), fraction)
    };
    for attempt in 0..ATTEMPTS {
        let mut order: Vec<(&str, u64)> = groups.iter().map(|(g, t)| (*g, *t)).collect();
        order.sort_by_cached_key(|(g, _)| rank(seed, domain, attempt, g.as_bytes()));
        let start = unit(rank(seed, domain, attempt, b"")) * total as f64;
        let window = fraction * total as f64;
        let mut at = 0u64;
        let mut held = Vec::new();
        for (g, t) in order {
            let mid = at as f64 + t as f64 / 2.0;
            if (mid - start).rem_euclid(total.max(1) as f64) < window {
                held.push(g);
            }
            at += t;
        }
        if valid(&held) {
            return Some(held);
        }
    }
    let smallest = groups
        .iter()
        .min_by_key(|(g, t)| (**t, **g))
        .map(|(g, _)| *g);
    smallest.map(|g| vec![g]).filter(|held| valid(held))
}

/// The share of the domain's tokens (`groups`) that `held` holds.
fn share(groups: &BTreeMap<&str, u64>, held: &[&str]) -> f64 {
    let total: u64 = groups.values().sum();
    let taken: u64 = held.iter().filter_map(|g| groups.get(g)).sum();
    taken as f64 / total.max(1) as f64
}

/// Whether a held-out share is within [`SHARE_BOUNDS`] of `fraction`.
fn within(share: f64, fraction: f64) -> bool {
    share >= SHARE_BOUNDS.0 * fraction && share <= SHARE_BOUNDS.1 * fraction
}

fn name(names: &[String], domain: u16) -> String {
    names
        .get(domain as usize)
        .cloned()
        .unwrap_or_else(|| domain.to_string())
}

/// The error for a domain whose held-out share is outside the bounds
/// `when` (by the split, after duplicate removal): its held-out groups and
/// its largest groups with their token counts, largest first.
fn refusal(
    names: &[String],
    domain: u16,
    fraction: f64,
    when: &'static str,
    groups: &BTreeMap<&str, u64>,
    held: &[&str],
) -> CorpusError {
    const SHOWN: usize = 10;
    let list = |mut sizes: Vec<(&str, u64)>| {
        sizes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut listed: Vec<String> = sizes
            .iter()
            .take(SHOWN)
            .map(|(g, t)| format!("{g:?}: {t}"))
            .collect();
        if sizes.len() > SHOWN {
            listed.push(format!("and {} more", sizes.len() - SHOWN));
        }
        listed.join(", ")
    };
    let all: Vec<(&str, u64)> = groups.iter().map(|(g, t)| (*g, *t)).collect();
    let of_held: Vec<(&str, u64)> = all
        .iter()
        .copied()
        .filter(|(g, _)| held.contains(g))
        .collect();
    CorpusError::HeldoutShare {
        domain: name(names, domain),
        fraction,
        when,
        share: share(groups, held),
        bounds: (SHARE_BOUNDS.0 * fraction, SHARE_BOUNDS.1 * fraction),
        total: groups.values().sum(),
        groups: format!(
            "held-out groups: {}; group sizes in tokens, largest first: {}",
            if held.is_empty() {
                "none".into()
            } else {
                list(of_held)
            },
            list(all)
        ),
    }
}

fn rank(seed: u64, domain: u16, attempt: u64, group: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(domain.to_le_bytes());
    h.update(attempt.to_le_bytes());
    h.update(group);
    h.finalize().into()
}

/// A hash read as a number in [0, 1).
fn unit(hash: [u8; 32]) -> f64 {
    let head = u64::from_le_bytes(hash[..8].try_into().expect("8 bytes"));
    (head >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(domain: u16, group: &str, n: usize) -> Doc {
        Doc::filler(domain, group, n, Split::Fit)
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("dom{i}")).collect()
    }

    fn tokens(docs: &[Doc], dom: u16, s: Split) -> usize {
        docs.iter()
            .filter(|d| d.domain == dom && d.split == s)
            .map(|d| d.tokens.len())
            .sum()
    }

    #[test]
    fn groups_never_straddle_and_the_share_stays_within_the_bounds() {
        for seed in 0..32 {
            let mut docs: Vec<Doc> = (0..200)
                .map(|i| doc((i % 2) as u16, &format!("g{}", i % 37), 10 + i % 7))
                .collect();
            assign(&mut docs, &names(2), &[0.25, 0.0], seed).unwrap();
            let mut side: BTreeMap<(u16, String), Split> = BTreeMap::new();
            for d in &docs {
                let s = side.entry((d.domain, d.group.clone())).or_insert(d.split);
                assert_eq!(*s, d.split, "group {} straddles the split", d.group);
            }
            let (h, f) = (
                tokens(&docs, 0, Split::Heldout),
                tokens(&docs, 0, Split::Fit),
            );
            let frac = h as f64 / (h + f) as f64;
            assert!((0.125..=0.5).contains(&frac), "seed {seed}: {frac}");
            assert_eq!(tokens(&docs, 1, Split::Heldout), 0, "fraction 0: none");
            check_shares(&docs, &names(2), &[0.25, 0.0]).unwrap();
        }
    }

    #[test]
    fn a_domain_with_one_group_is_refused_by_name_unless_its_fraction_is_zero() {
        let mut docs = vec![doc(0, "a", 50), doc(1, "only", 100), doc(1, "only", 30)];
        docs.push(doc(0, "b", 50));
        let err = assign(&mut docs, &names(2), &[0.0, 0.1], 0)
            .unwrap_err()
            .to_string();
        for s in [
            "\"dom1\"",
            "1 document group(s)",
            "\"only\"",
            "group key with more values",
            "more data",
            "heldout_fraction = 0 for this domain",
        ] {
            assert!(err.contains(s), "{s}: {err}");
        }
        // Held out at 0 explicitly: no held-out text, no refusal.
        assign(&mut docs, &names(2), &[0.0, 0.0], 0).unwrap();
        assert!(docs.iter().all(|d| d.split == Split::Fit));
    }

    #[test]
    fn groups_of_900k_60k_40k_at_two_percent_hold_out_the_only_group_within_the_bounds() {
        // At 0.02 the bounds are 1% to 4%: of 900k, 60k and 40k only the
        // 40k group alone (4%) is within them.
        let sizes = [("big", 900_000), ("mid", 60_000), ("small", 40_000)];
        for seed in 0..64 {
            let mut docs: Vec<Doc> = sizes.iter().map(|(g, n)| doc(0, g, *n)).collect();
            assign(&mut docs, &names(1), &[0.02], seed).unwrap();
            assert!(docs
                .iter()
                .all(|d| (d.split == Split::Heldout) == (d.group == "small")));
        }
        // With the smallest at 45k (4.5%) no choice is: refused, under every
        // seed, with the three sizes in the message.
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
                "[1.00%, 4.00%]",
            ] {
                assert!(err.contains(s), "seed {seed}: {err}");
            }
        }
    }

    #[test]
    fn the_choice_of_groups_is_not_biased_by_their_size() {
        // 10 groups of 20k tokens and 100 of 1k at 0.1: over 400 seeds, the
        // share of the large groups' tokens held out and that of the small
        // groups' both track the fraction.
        let mut docs: Vec<Doc> = (0..10).map(|i| doc(0, &format!("L{i}"), 20_000)).collect();
        docs.extend((0..100).map(|i| doc(0, &format!("s{i}"), 1_000)));
        let (mut large, mut small, mut total) = (0usize, 0usize, 0usize);
        let seeds = 400;
        for seed in 0..seeds {
            assign(&mut docs, &names(1), &[0.1], seed).unwrap();
            let held = |prefix: char| -> usize {
                docs.iter()
                    .filter(|d| d.split == Split::Heldout && d.group.starts_with(prefix))
                    .map(|d| d.tokens.len())
                    .sum()
            };
            large += held('L');
            small += held('s');
            total += held('L') + held('s');
        }
        let runs = seeds as f64;
        let large = large as f64 / (runs * 200_000.0);
        let small = small as f64 / (runs * 100_000.0);
        let overall = total as f64 / (runs * 300_000.0);
        println!("held-out share: large groups {large:.4}, small {small:.4}, all {overall:.4}");
        for (what, share) in [("large", large), ("small", small), ("all", overall)] {
            assert!((share - 0.1).abs() < 0.02, "{what} groups: {share}");
        }
    }

    #[test]
    fn a_share_pushed_out_of_the_bounds_after_duplicate_removal_is_refused() {
        // Ten groups of 100 at 0.1: one or two held out (10% or 20%).
        // Dropping every fit group's documents but one's pushes the share
        // past 20%.
        let mut docs: Vec<Doc> = (0..10).map(|i| doc(0, &format!("g{i}"), 100)).collect();
        assign(&mut docs, &names(1), &[0.1], 5).unwrap();
        let held: Vec<String> = docs
            .iter()
            .filter(|d| d.split == Split::Heldout)
            .map(|d| d.group.clone())
            .collect();
        assert!((1..=2).contains(&held.len()), "{held:?}");
        check_shares(&docs, &names(1), &[0.1]).unwrap();
        let mut fit_seen = 0;
        docs.retain(|d| {
            fit_seen += usize::from(d.split == Split::Fit);
            d.split == Split::Heldout || fit_seen == 1
        });
        let share = 100.0 * held.len() as f64 / (held.len() + 1) as f64;
        let err = check_shares(&docs, &names(1), &[0.1])
            .unwrap_err()
            .to_string();
        for s in [
            "\"dom0\"".to_string(),
            "after duplicate removal".into(),
            format!("{share:.2}%"),
            "[5.00%, 20.00%]".into(),
            format!("held-out groups: {:?}: 100", held[0]),
        ] {
            assert!(err.contains(&s), "{s}: {err}");
        }
    }
}
