//! A seeded byte mutator for property tests of decoders: from valid inputs
//! it makes inputs that are almost valid (flipped bits, length-like bytes
//! set to huge varint prefixes, truncations, duplications, insertions), the
//! kind that reach deep into a decoder before failing. Deterministic for a
//! seed, so a failure reproduces.

/// The project's one seeded generator, here picking mutations.
pub use numbers::splitmix::SplitMix64 as Rng;

/// `n` random bytes from `rng`.
pub fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

/// Applies one to four random mutations to a copy of `input`.
pub fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = out.len().max(1);
        let at = rng.below(len).min(out.len());
        match rng.below(8) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                // A byte that announces a long varint (bincode: 0xfb..0xfe),
                // followed by huge little-endian lengths.
                let i = rng.below(out.len());
                out[i] = 0xfb + rng.below(4) as u8;
                let end = (i + 9).min(out.len());
                for b in &mut out[i + 1..end] {
                    *b = 0xff - rng.below(3) as u8;
                }
            }
            2 => out.truncate(at),
            3 => {
                let n = 1 + rng.below(16);
                let bytes = random_bytes(rng, n);
                out.splice(at..at, bytes);
            }
            4 if !out.is_empty() => {
                let n = rng.below(out.len() - at + 1).min(64);
                out.drain(at..at + n);
            }
            5 => {
                let n = rng.below(out.len() - at + 1).min(256);
                let copy: Vec<u8> = out[at..at + n].to_vec();
                out.splice(at..at, copy);
            }
            6 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = [0, 0x7f, 0x80, 0xff, b'"', b'\n', b'[', b'{'][rng.below(8)];
            }
            _ => {
                let n = rng.below(700);
                let extra = random_bytes(rng, n);
                out.extend_from_slice(&extra);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_deterministic_per_seed_and_change_the_input() {
        let input: Vec<u8> = (0..200u8).collect();
        let a: Vec<Vec<u8>> = (0..50)
            .scan(Rng::new(7), |r, _| Some(mutate(r, &input)))
            .collect();
        let b: Vec<Vec<u8>> = (0..50)
            .scan(Rng::new(7), |r, _| Some(mutate(r, &input)))
            .collect();
        assert_eq!(a, b);
        assert!(a.iter().filter(|m| **m != input).count() >= 45);
    }
}
