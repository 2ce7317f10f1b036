//! A seeded byte mutator for property tests of decoders: from valid inputs
//! it makes inputs that are almost valid (flipped bits, length-like bytes
//! set to huge varint prefixes, truncations, duplications, insertions), the
//! kind that reach deep into a decoder before failing. Deterministic for a
//! seed, so a failure reproduces.

/// A xorshift64* generator: small, seeded, good enough to pick mutations.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (0 is mapped to a fixed non-zero state).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
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
                let bytes = rng.bytes(n);
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
                let extra = rng.bytes(n);
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
