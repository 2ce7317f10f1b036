//! SplitMix64 (Steele, Lea and Flood; Vigna's reference constants): the one
//! small, seedable generator every crate uses for deterministic test data
//! (generated models, synthetic traces), so a seed means the same stream
//! everywhere.

/// A SplitMix64 stream.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose state starts at `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// A generator for `seed`, decorrelated per `stream` (e.g. a tensor name)
    /// by an FNV-1a hash of the stream's bytes.
    pub fn for_stream(seed: u64, stream: &str) -> SplitMix64 {
        let h = stream.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        SplitMix64(seed ^ h)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (multiply-shift on the high 32 bits).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// Uniform in `[-1, 1)` with 24 random bits.
    pub fn symmetric_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_stream() {
        // Seed 1234567: the published SplitMix64 test vector.
        let mut r = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn streams_differ_and_draws_stay_in_range() {
        let mut a = SplitMix64::for_stream(7, "a");
        let mut b = SplitMix64::for_stream(7, "b");
        assert_ne!(a.next_u64(), b.next_u64());
        for _ in 0..10_000 {
            let u = a.unit();
            assert!((0.0..1.0).contains(&u));
            assert!(a.below(10) < 10);
            let s = a.symmetric_f32();
            assert!((-1.0..1.0).contains(&s));
        }
    }
}
