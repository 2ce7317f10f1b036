//! Per-layer cache capacities as the user gives them: a number of experts or
//! a fraction of a layer's (kept) experts.

use serde::Serialize;
use std::fmt;

/// A per-layer capacity: a number of experts, or a fraction of the layer's
/// experts (the kept ones under a keep map).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Capacity {
    /// That many experts.
    Experts(usize),
    /// That fraction of the layer's experts, rounded, at least 1.
    Fraction(f64),
}

impl Capacity {
    /// Parses `64` (experts), `0.25` or `25%` (fraction).
    pub fn parse(s: &str) -> Result<Capacity, String> {
        let bad = || {
            format!("capacity {s:?} is neither a number of experts nor a fraction in (0, 1] such as 0.25 or 25%")
        };
        if let Some(pct) = s.strip_suffix('%') {
            let f: f64 = pct.trim().parse().map_err(|_| bad())?;
            return Capacity::fraction(f / 100.0).ok_or_else(bad);
        }
        if s.contains('.') {
            let f: f64 = s.trim().parse().map_err(|_| bad())?;
            return Capacity::fraction(f).ok_or_else(bad);
        }
        s.trim().parse().map(Capacity::Experts).map_err(|_| bad())
    }

    fn fraction(f: f64) -> Option<Capacity> {
        (f > 0.0 && f <= 1.0).then_some(Capacity::Fraction(f))
    }

    /// Resident experts for a layer of `experts` experts.
    pub fn resolve(self, experts: usize) -> usize {
        match self {
            Capacity::Experts(c) => c,
            Capacity::Fraction(f) => {
                ((f * experts as f64).round() as usize).clamp(1, experts.max(1))
            }
        }
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capacity::Experts(c) => write!(f, "{c}"),
            Capacity::Fraction(x) => write!(f, "{x}"),
        }
    }
}
