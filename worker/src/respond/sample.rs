//! Choosing the next token of a response from its logits row: greedy (the
//! first of equal maxima) or sampled at a temperature within the nucleus
//! `top_p`, with a ChaCha8 generator seeded from the run's seed, the
//! prompt's SHA-256 and the sample number only, so a response is the same
//! whichever worker or lease computes it. Each choice also scores the token
//! under the model at temperature 1 (for the perplexity filter), from the
//! row's figures of [`super::row`].

use super::row;
use protocol::wire::Sampling;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

/// Domain-separation label of a response's seed.
const SEED_LABEL: &[u8] = b"moe-census response seed v1\0";

/// The sampler of one response.
pub struct Sampler {
    temperature: f64,
    top_p: f64,
    rng: ChaCha8Rng,
}

/// A chosen token and its `-ln p` under the model at temperature 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    /// The token id.
    pub token: i32,
    /// Its negative log-probability.
    pub nll: f64,
}

impl Sampler {
    /// The sampler of response `sample` of the prompt whose SHA-256 is
    /// `prompt_sha256`.
    pub fn new(s: &Sampling, prompt_sha256: &str, sample: u32) -> Sampler {
        let mut h = Sha256::new();
        h.update(SEED_LABEL);
        h.update(s.seed.to_le_bytes());
        h.update(prompt_sha256.as_bytes());
        h.update(sample.to_le_bytes());
        Sampler {
            temperature: s.temperature(),
            top_p: s.top_p(),
            rng: ChaCha8Rng::from_seed(h.finalize().into()),
        }
    }

    /// The next token after `logits`.
    pub fn choose(&mut self, logits: &[f32]) -> Choice {
        let f = row::figures(logits);
        let token = if self.temperature == 0.0 {
            f.argmax
        } else {
            self.draw(logits, f64::from(f.max))
        };
        Choice {
            token: token as i32,
            nll: (f.log_sum_exp - logits[token] as f64).max(0.0),
        }
    }

    /// A draw at the temperature from the smallest set of most likely
    /// tokens (ties by id) whose probability reaches `top_p`.
    fn draw(&mut self, logits: &[f32], max: f64) -> usize {
        let t = self.temperature;
        let mut p: Vec<(usize, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i, ((l as f64 - max) / t).exp()))
            .collect();
        let z: f64 = p.iter().map(|x| x.1).sum();
        p.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut kept = 0.0;
        let mut n = 0;
        for (_, w) in &p {
            kept += w / z;
            n += 1;
            if kept >= self.top_p {
                break;
            }
        }
        let nucleus = &p[..n];
        let mass: f64 = nucleus.iter().map(|x| x.1).sum();
        let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * mass;
        let mut acc = 0.0;
        for &(i, w) in nucleus {
            acc += w;
            if u < acc {
                return i;
            }
        }
        nucleus[n - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f64, top_p: f64, seed: u64) -> Sampling {
        Sampling {
            max_tokens: 4,
            n: 1,
            seed,
            temperature_bits: temperature.to_bits(),
            top_p_bits: top_p.to_bits(),
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_scores_it() {
        let mut s = Sampler::new(&sampling(0.0, 1.0, 0), "p", 0);
        let c = s.choose(&[0.0, 2.0, 2.0, -1.0]);
        assert_eq!(c.token, 1);
        let z: f64 = [0.0f64, 2.0, 2.0, -1.0].iter().map(|l| l.exp()).sum();
        assert!((c.nll - (z.ln() - 2.0)).abs() < 1e-6, "{c:?}");
    }

    #[test]
    fn draws_follow_the_seed_and_the_nucleus() {
        let logits = [1.0f32, 0.5, 0.0, -3.0];
        let draws = |seed, prompt: &str, sample| {
            let mut s = Sampler::new(&sampling(0.8, 1.0, seed), prompt, sample);
            (0..64).map(|_| s.choose(&logits).token).collect::<Vec<_>>()
        };
        assert_eq!(draws(3, "p", 0), draws(3, "p", 0));
        assert_ne!(draws(3, "p", 0), draws(4, "p", 0));
        assert_ne!(draws(3, "p", 0), draws(3, "q", 0));
        assert_ne!(draws(3, "p", 0), draws(3, "p", 1));
        // A nucleus of 0.5 keeps token 0 alone (its probability is above it).
        let mut s = Sampler::new(&sampling(0.8, 0.5, 3), "p", 0);
        assert!((0..64).all(|_| s.choose(&logits).token == 0));
        // Over many draws each of the three likely tokens comes up.
        let all = draws(3, "p", 0);
        assert!((0..3).all(|t| all.contains(&t)), "{all:?}");
    }
}
