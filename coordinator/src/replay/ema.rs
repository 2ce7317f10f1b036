//! Lazy exponential moving averages for the EMA policies.
//!
//! The eager score decays every expert by `d` each step and then adds the
//! step's credits. The lazy score stores `S = sum credit * d^-step` instead,
//! which orders experts the same way and changes only for the credited ones.
//! The factor `d^-step` grows without bound, so when it passes [`BOUND`] every
//! `S` and the factor are multiplied by [`SHRINK`] before the step's credits
//! are added. Both are powers of two: the rescale is exact and never changes
//! the order of two scores.

use super::steps::Steps;
use super::tree::Key;
use super::Scorer;

/// Rescale when the factor grows past 2^200.
pub const BOUND: f64 = f64::from_bits((1023 + 200) << 52);
/// The rescale multiplies every score by 2^-200.
pub const SHRINK: f64 = f64::from_bits((1023 - 200) << 52);

/// Which number of a request is its credit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credit {
    /// 1 per use (`ema`, `near_pick_ema`).
    Uses,
    /// The router probability (`router_ema`).
    RouterProb,
    /// `1 / rank` in the router's top-N (`inverse_router_ema`).
    InverseRank,
}

impl Credit {
    /// The credit of request `i` of `steps`.
    #[inline]
    pub fn of(self, steps: &Steps, i: usize) -> f64 {
        f64::from(match self {
            Credit::Uses => steps.uses[i],
            Credit::RouterProb => steps.prob[i],
            Credit::InverseRank => steps.inv_rank[i],
        })
    }
}

/// Lazy EMA scores of every expert.
pub struct LazyEma {
    credit: Credit,
    near_credit: f64,
    inv_decay: f64,
    factor: f64,
    keys: Vec<Key>,
    /// How many times the scores were rescaled.
    pub rescales: u32,
}

impl LazyEma {
    /// Scores for `n_expert` experts with decay `decay` per step; near picks
    /// earn `near_credit` per pick (0: near picks are ignored).
    pub fn new(n_expert: usize, decay: f64, credit: Credit, near_credit: f64) -> LazyEma {
        LazyEma {
            credit,
            near_credit,
            inv_decay: 1.0 / decay,
            factor: 1.0,
            keys: vec![Key { p: 0.0, tie: 0 }; n_expert],
            rescales: 0,
        }
    }
}

impl Scorer for LazyEma {
    const MONOTONE: bool = true;

    #[inline]
    fn begin_step(&mut self, _s: usize) -> Option<f64> {
        self.factor *= self.inv_decay;
        if self.factor <= BOUND {
            return None;
        }
        self.factor *= SHRINK;
        for k in &mut self.keys {
            k.p *= SHRINK;
        }
        self.rescales += 1;
        Some(SHRINK)
    }

    #[inline]
    fn request(&mut self, steps: &Steps, i: usize, s: usize) {
        let e = steps.expert[i];
        let k = &mut self.keys[e as usize];
        k.p += self.credit.of(steps, i) * self.factor;
        k.tie = Key::tie(s, e);
    }

    #[inline]
    fn near(&mut self, steps: &Steps, j: usize) -> bool {
        if self.near_credit == 0.0 {
            return false;
        }
        let e = steps.near[j] as usize;
        self.keys[e].p += self.near_credit * f64::from(steps.near_uses[j]) * self.factor;
        true
    }

    #[inline]
    fn key(&self, e: usize) -> Key {
        self.keys[e]
    }
}
