//! Lazy exponential moving averages for the EMA policies.
//!
//! The eager score decays every expert by `d` each step and then adds the
//! step's credits. The lazy score stores `S = sum credit * d^-step` instead,
//! which orders experts the same way and changes only for the credited ones.
//! The factor `d^-step` grows without bound, so when it passes [`BOUND`] every
//! `S` and the factor are multiplied by [`SHRINK`] before the step's credits
//! are added. Both are powers of two: the rescale is exact and never changes
//! the order of two scores.

use super::ids::IdTable;
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
    /// The credit of every request of `steps`.
    fn of(self, steps: &Steps) -> &[f32] {
        match self {
            Credit::Uses => &steps.uses,
            Credit::RouterProb => &steps.prob,
            Credit::InverseRank => &steps.inv_rank,
        }
    }
}

/// Lazy EMA scores of every expert.
pub struct LazyEma {
    credit: Credit,
    near_credit: f64,
    inv_decay: f64,
    factor: f64,
    keys: IdTable<Key>,
    /// How many times the scores were rescaled.
    pub rescales: u32,
}

impl LazyEma {
    /// Scores for every expert with decay `decay` per step; near picks earn
    /// `near_credit` per pick (0: near picks are ignored).
    pub fn new(decay: f64, credit: Credit, near_credit: f64) -> LazyEma {
        LazyEma {
            credit,
            near_credit,
            inv_decay: 1.0 / decay,
            factor: 1.0,
            keys: IdTable::new(Key::UNSCORED),
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
        for k in self.keys.as_mut_slice() {
            k.p *= SHRINK;
        }
        self.rescales += 1;
        Some(SHRINK)
    }

    fn credits<'s>(&self, steps: &'s Steps) -> &'s [f32] {
        self.credit.of(steps)
    }

    #[inline]
    fn request(&mut self, _i: usize, e: u16, credit: f32, s: usize) {
        let k = self.keys.get_mut(e);
        k.p += f64::from(credit) * self.factor;
        k.tie = Key::tie(s, e);
    }

    fn credits_near(&self) -> bool {
        self.near_credit != 0.0
    }

    #[inline]
    fn near(&mut self, e: u16, uses: f32) -> f64 {
        let k = self.keys.get_mut(e);
        k.p += self.near_credit * f64::from(uses) * self.factor;
        k.p
    }

    #[inline]
    fn key(&self, e: usize) -> Key {
        self.keys.get(e)
    }
}
