//! The balanced schedule: documents are interleaved so that every prefix of
//! the packed chunks keeps each domain's share of tokens close to its share
//! of the whole corpus. Stopping a run early still gives a balanced sample.

use runfiles::corpus::Chunk;
use sha2::{Digest, Sha256};

/// Sorts a stream's documents by a hash of (seed, key), so a prefix samples
/// the whole domain instead of the start of its first file.
pub fn shuffle(docs: &mut [usize], key: impl Fn(usize) -> String, seed: u64) {
    docs.sort_by_cached_key(|&d| {
        let mut h = Sha256::new();
        h.update(seed.to_le_bytes());
        h.update(key(d).as_bytes());
        <[u8; 32]>::from(h.finalize())
    });
}

/// Merges streams of documents (indices, with token lengths `len`) into one
/// order. Each step takes the next document of the stream that is furthest
/// behind: the smallest `(emitted + half the next document) / stream total`,
/// ties to the lower stream, so all streams advance at the same pace.
pub fn interleave(streams: &[Vec<usize>], len: impl Fn(usize) -> u64) -> Vec<usize> {
    let totals: Vec<u64> = streams
        .iter()
        .map(|s| s.iter().map(|&d| len(d)).sum())
        .collect();
    let mut next = vec![0usize; streams.len()];
    let mut emitted = vec![0u64; streams.len()];
    let mut out = Vec::with_capacity(streams.iter().map(Vec::len).sum());
    loop {
        let pick = (0..streams.len())
            .filter(|&s| next[s] < streams[s].len())
            .min_by(|&a, &b| {
                let key = |s: usize| {
                    let l = len(streams[s][next[s]]) as f64;
                    (emitted[s] as f64 + l / 2.0) / totals[s].max(1) as f64
                };
                key(a).total_cmp(&key(b)).then(a.cmp(&b))
            });
        let Some(s) = pick else { break };
        let d = streams[s][next[s]];
        next[s] += 1;
        emitted[s] += len(d);
        out.push(d);
    }
    out
}

/// For each prefix of the schedule (chunks `0..=i`), the largest absolute
/// difference between a domain's share of the prefix's tokens and `mix`.
pub fn prefix_deviations(chunks: &[Chunk], mix: &[f64]) -> Vec<f64> {
    let mut tokens = vec![0u64; mix.len()];
    let mut total = 0u64;
    chunks
        .iter()
        .map(|c| {
            for s in &c.spans {
                tokens[s.domain as usize] += u64::from(s.len);
                total += u64::from(s.len);
            }
            mix.iter()
                .zip(&tokens)
                .map(|(m, &t)| (t as f64 / total.max(1) as f64 - m).abs())
                .fold(0.0, f64::max)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::{pack, Piece};
    use numbers::Split;

    #[test]
    fn interleaving_keeps_prefixes_near_the_mix() {
        // Domain 0: 90 docs of 30 tokens; domain 1: 10 docs of 90 tokens.
        let lens: Vec<u64> = (0..100).map(|i| if i < 90 { 30 } else { 90 }).collect();
        let streams = vec![(0..90).collect::<Vec<_>>(), (90..100).collect()];
        let order = interleave(&streams, |d| lens[d]);
        assert_eq!(order.len(), 100);
        let toks: Vec<Vec<i32>> = lens.iter().map(|&l| vec![0; l as usize]).collect();
        let chunks = pack(
            order.iter().map(|&d| Piece {
                tokens: toks[d].as_slice(),
                images: &[],
                split: Split::Fit,
                domain: u16::from(d >= 90),
                doc: d as u32,
                group: d as u32,
            }),
            256,
        );
        let dev = prefix_deviations(&chunks, &[0.75, 0.25]);
        assert!(dev[dev.len() / 10..].iter().all(|&d| d < 0.1), "{dev:?}");
        assert!(dev.last().unwrap().abs() < 1e-12);
    }

    #[test]
    fn shuffle_is_deterministic_and_seeded() {
        let mut a: Vec<usize> = (0..50).collect();
        let mut b = a.clone();
        shuffle(&mut a, |d| d.to_string(), 1);
        shuffle(&mut b, |d| d.to_string(), 1);
        assert_eq!(a, b);
        shuffle(&mut b, |d| d.to_string(), 2);
        assert_ne!(a, b);
    }
}
