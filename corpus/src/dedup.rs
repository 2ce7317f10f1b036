//! Near-duplicate detection by token shingles: a document is a near-duplicate
//! of another when enough of the smaller one's `w`-token shingles occur in
//! the other (the overlap coefficient), which also catches a document that
//! contains another.

use rayon::prelude::*;
use std::collections::{HashMap, HashSet};

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

/// Removes shingles found in more than `max_df` of the given sets
/// (boilerplate such as chat markup or a shared system prompt).
pub fn drop_boilerplate(sets: &mut [Vec<u64>], max_df: usize) {
    let mut df: HashMap<u64, usize> = HashMap::new();
    for s in sets.iter() {
        for &h in s {
            *df.entry(h).or_default() += 1;
        }
    }
    let common: HashSet<u64> = df
        .into_iter()
        .filter(|(_, n)| *n > max_df)
        .map(|(h, _)| h)
        .collect();
    if !common.is_empty() {
        for s in sets.iter_mut() {
            s.retain(|h| !common.contains(h));
        }
    }
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
        let mut sets: Vec<Vec<u64>> = (0..5)
            .map(|i| {
                let mut t = prompt.clone();
                t.extend(toks(&format!("question number {i} is about topic {i}")));
                shingles(&t, 3)
            })
            .collect();
        drop_boilerplate(&mut sets, 2);
        let refs: Vec<&[u64]> = sets[1..].iter().map(Vec::as_slice).collect();
        assert!(near_dups(&[&sets[0]], &refs, 0.5)[0].is_none());
        assert!(shingles(&[1, 2], 3).is_empty());
    }
}
