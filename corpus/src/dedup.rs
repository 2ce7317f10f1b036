//! Duplicate detection. Exact copies by a hash of the token sequence
//! ([`exact_key`]); near-duplicates by token shingles: a document is a
//! near-duplicate of another when enough of the smaller one's `w`-token
//! shingles occur in the other (the overlap coefficient), which also catches
//! a document that contains another.
//!
//! Shingles found in many documents are boilerplate (a shared system prompt,
//! chat markup) and are left out of the comparison ([`strip_boilerplate`]),
//! except for documents that are mostly such shingles: those are compared
//! on all their shingles in a family pass, so removing boilerplate never
//! empties a document nor hides a family of near copies (whose shared text
//! is common only because the family is large). A containment pass
//! ([`strip_common_to`]) counts boilerplate among the references (held-out
//! and eval-set documents) alone, so a reference contained in any number of
//! longer documents is still found in each.

use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};

/// The share of a document's shingles that are boilerplate-frequency at
/// which it is "mostly common" and compared on its whole set (the family
/// pass).
pub const FAMILY_OVERLAP: f64 = 0.8;

/// The identity of a token sequence for the exact-duplicate pass: SHA-256
/// of its length and tokens (little-endian).
pub fn exact_key(tokens: &[i32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

/// The sorted, distinct hashes of every `w`-token window (none if shorter).
pub fn shingles(tokens: &[i32], w: usize) -> Vec<u64> {
    if w == 0 || tokens.len() < w {
        return Vec::new();
    }
    let mut out: Vec<u64> = tokens.windows(w).map(hash).collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn hash(window: &[i32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &t in window {
        h = (h ^ t as u32 as u64).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h
}

/// Boilerplate-free shingle sets: each set without the shingles found in
/// more than `max_df` of the sets, and whether a set is mostly such shingles
/// (at least [`FAMILY_OVERLAP`] of it, an emptied set included): those are
/// compared on their whole sets in the family pass instead.
pub struct Stripped {
    /// The sets without boilerplate shingles.
    pub sets: Vec<Vec<u64>>,
    /// Whether each set is mostly boilerplate-frequency shingles.
    pub mostly_common: Vec<bool>,
}

/// Strips the shingles found in more than `max_df` of `sets` (boilerplate
/// such as chat markup or a shared system prompt), and marks the sets that
/// are mostly such shingles.
pub fn strip_boilerplate(sets: &[Vec<u64>], max_df: usize) -> Stripped {
    let mut df: HashMap<u64, usize> = HashMap::new();
    for s in sets {
        for &h in s {
            *df.entry(h).or_default() += 1;
        }
    }
    let common: HashSet<u64> = df
        .into_iter()
        .filter(|(_, n)| *n > max_df)
        .map(|(h, _)| h)
        .collect();
    let (sets, mostly_common) = sets
        .par_iter()
        .map(|s| {
            let kept: Vec<u64> = s.iter().copied().filter(|h| !common.contains(h)).collect();
            let common_share = 1.0 - kept.len() as f64 / s.len().max(1) as f64;
            let mostly = !s.is_empty() && common_share >= FAMILY_OVERLAP;
            (kept, mostly)
        })
        .unzip();
    Stripped {
        sets,
        mostly_common,
    }
}

/// `sets` without the shingles found in more than `max_df` of the sets at
/// `refs` (the references: held-out and eval-set documents). A template
/// shared by many references is left out; text common only because many
/// candidates contain one reference is kept, so each of them still matches
/// it however large the family (the containment pass).
pub fn strip_common_to(sets: &[Vec<u64>], refs: &[usize], max_df: usize) -> Vec<Vec<u64>> {
    let mut df: HashMap<u64, usize> = HashMap::new();
    for &r in refs {
        for &h in &sets[r] {
            *df.entry(h).or_default() += 1;
        }
    }
    sets.par_iter()
        .map(|s| {
            s.iter()
                .copied()
                .filter(|h| df.get(h).is_none_or(|&n| n <= max_df))
                .collect()
        })
        .collect()
}

/// A near-duplicate found: which reference, and the overlap coefficient.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Match {
    /// Index into the references.
    pub reference: usize,
    /// `|A ∩ B| / min(|A|, |B|)`.
    pub overlap: f64,
}

/// For every candidate set, the reference it overlaps most, if that overlap
/// reaches `threshold`. Empty sets never match.
pub fn near_dups(
    candidates: &[&[u64]],
    references: &[&[u64]],
    threshold: f64,
) -> Vec<Option<Match>> {
    let mut index: HashMap<u64, Vec<u32>> = HashMap::new();
    for (r, set) in references.iter().enumerate() {
        for &h in set.iter() {
            index.entry(h).or_default().push(r as u32);
        }
    }
    candidates
        .par_iter()
        .map(|set| {
            if set.is_empty() {
                return None;
            }
            let mut hits: HashMap<u32, usize> = HashMap::new();
            for h in set.iter() {
                for &r in index.get(h).into_iter().flatten() {
                    *hits.entry(r).or_default() += 1;
                }
            }
            hits.into_iter()
                .map(|(r, n)| {
                    let smaller = set.len().min(references[r as usize].len()).max(1);
                    Match {
                        reference: r as usize,
                        overlap: n as f64 / smaller as f64,
                    }
                })
                .filter(|m| m.overlap >= threshold)
                .max_by(|a, b| {
                    a.overlap
                        .total_cmp(&b.overlap)
                        .then(b.reference.cmp(&a.reference))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_of_near_copies_is_mostly_common_and_matches_on_whole_sets() {
        let base: Vec<i32> = (0..120).collect();
        // 30 copies, each with two tokens changed in its own places.
        let sets: Vec<Vec<u64>> = (0..30)
            .map(|i| {
                let mut t = base.clone();
                t[(i * 4) % 120] = 1000 + i as i32;
                t[(i * 7 + 3) % 120] = 2000 + i as i32;
                shingles(&t, 8)
            })
            .collect();
        let stripped = strip_boilerplate(&sets, 16);
        assert!(stripped.mostly_common.iter().all(|&m| m));
        // Stripped sets lost the family: no stripped match at the threshold.
        let refs: Vec<&[u64]> = stripped.sets[1..].iter().map(Vec::as_slice).collect();
        assert!(near_dups(&[&stripped.sets[0]], &refs, 0.5)[0].is_none());
        // Whole sets find it at the threshold.
        let whole: Vec<&[u64]> = sets[1..].iter().map(Vec::as_slice).collect();
        let m = near_dups(&[&sets[0]], &whole, 0.5)[0].unwrap();
        assert!(m.overlap >= 0.8, "{m:?}");
        assert_ne!(exact_key(&base), exact_key(&base[1..]));
        assert_eq!(exact_key(&base), exact_key(&base.clone()));
    }

    fn toks(s: &str) -> Vec<i32> {
        s.split_whitespace()
            .map(|w| w.bytes().map(i32::from).sum::<i32>() * 31 + w.len() as i32)
            .collect()
    }

    #[test]
    fn an_edited_copy_matches_and_an_unrelated_text_does_not() {
        let original = "the router sends every token to a few experts and the experts used most are not always the ones that matter most for the output of the layer";
        let edited = "the router sends every token to a few experts and the experts used most are not always those that matter most for the output of the layer";
        let other = "a cat sleeps in the sun while the garden grows quietly behind the old wooden fence near the river bank today";
        let s = |t: &str| shingles(&toks(t), 4);
        let (a, b, c) = (s(original), s(edited), s(other));
        let found = near_dups(&[&b, &c], &[&a], 0.5);
        assert_eq!(found[0].map(|m| m.reference), Some(0));
        assert!(found[0].unwrap().overlap < 1.0);
        assert_eq!(found[1], None);
    }

    #[test]
    fn containment_counts_and_boilerplate_is_ignored() {
        let body = toks("one two three four five six seven eight nine ten eleven twelve");
        let mut longer = body.clone();
        longer.extend(toks(
            "and a great deal of further text that the short one never had in it at all",
        ));
        let found = near_dups(&[&shingles(&longer, 3)], &[&shingles(&body, 3)], 0.9);
        assert_eq!(found[0].unwrap().overlap, 1.0);

        let prompt = toks("you are a helpful assistant answer briefly");
        let sets: Vec<Vec<u64>> = (0..5)
            .map(|i| {
                let mut t = prompt.clone();
                t.extend(toks(&format!("question number {i} is about topic {i}")));
                shingles(&t, 3)
            })
            .collect();
        let stripped = strip_boilerplate(&sets, 2);
        let refs: Vec<&[u64]> = stripped.sets[1..].iter().map(Vec::as_slice).collect();
        assert!(near_dups(&[&stripped.sets[0]], &refs, 0.5)[0].is_none());
        assert_eq!(stripped.mostly_common, vec![false; 5]);
        assert!(shingles(&[1, 2], 3).is_empty());
    }
}
