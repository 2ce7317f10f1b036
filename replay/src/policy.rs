//! The cache policies by name, their parameters, and one entry point that
//! replays a layer's steps through any of them.

use super::ema::{Credit, LazyEma};
use super::scored::{self, Belady, Lfu};
use super::steps::Steps;
use super::{lru, pinned, Counts};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A cache replacement policy (DESIGN section 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Evict the least recently used expert.
    Lru,
    /// Evict the least often used expert (uses counted over the whole trace).
    Lfu,
    /// Evict the smallest EMA of uses (credit 1 per use, decay per step).
    Ema,
    /// EMA that also credits the experts ranked just after the used ones.
    NearPickEma,
    /// EMA with the router probability as credit.
    RouterEma,
    /// EMA with `1 / rank` in the router's top-N as credit.
    InverseRouterEma,
    /// Evict the expert whose next use is farthest (needs the future).
    Belady,
    /// Pin the experts with the most fit-split traffic; evict nothing.
    Static,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 8] = [
        Policy::Lru,
        Policy::Lfu,
        Policy::Ema,
        Policy::NearPickEma,
        Policy::RouterEma,
        Policy::InverseRouterEma,
        Policy::Belady,
        Policy::Static,
    ];

    /// The command-line and file name.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Lfu => "lfu",
            Policy::Ema => "ema",
            Policy::NearPickEma => "near_pick_ema",
            Policy::RouterEma => "router_ema",
            Policy::InverseRouterEma => "inverse_router_ema",
            Policy::Belady => "belady",
            Policy::Static => "static",
        }
    }

    /// Parses a policy name.
    pub fn parse(s: &str) -> Result<Policy, String> {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Policy::ALL.iter().map(|p| p.as_str()).collect();
                format!(
                    "unknown replay policy {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Policy parameters, the same for every layer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyParams {
    /// EMA decay per step.
    pub ema_decay: f64,
    /// Near picks per token for `near_pick_ema`.
    pub near_pick_n: usize,
    /// Credit of one near pick (a use earns 1).
    pub near_pick_credit: f64,
}

impl Default for PolicyParams {
    fn default() -> Self {
        PolicyParams {
            ema_decay: 0.99,
            near_pick_n: 4,
            near_pick_credit: 0.5,
        }
    }
}

/// One cache a layer's steps are replayed through: its policy, its
/// capacity in experts, the policy's parameters and the layer's requests
/// per expert on the fit split (which only `static` reads).
#[derive(Clone, Copy, Debug)]
pub struct Cache<'a> {
    /// The eviction policy.
    pub policy: Policy,
    /// Resident experts.
    pub capacity: usize,
    /// The policy's parameters.
    pub params: &'a PolicyParams,
    /// Fit-split requests per expert (empty: `static` pins the lowest ids).
    pub fit: &'a [u64],
}

impl<'a> Cache<'a> {
    /// The cache of `policy` (with `params`) holding `capacity` experts,
    /// `static` pinning by `fit`.
    pub fn new(
        policy: Policy,
        capacity: usize,
        params: &'a PolicyParams,
        fit: &'a [u64],
    ) -> Cache<'a> {
        Cache {
            policy,
            capacity,
            params,
            fit,
        }
    }
}

/// Replays one layer's steps through `policy` with `capacity` resident
/// experts; `fit` is the layer's requests per expert on the fit split, which
/// only `static` reads (empty: it pins the lowest ids).
pub fn simulate(
    policy: Policy,
    steps: &Steps,
    capacity: usize,
    params: &PolicyParams,
    fit: &[u64],
) -> Counts {
    if capacity == 0 {
        return Counts {
            requests: steps.requests(),
            misses: steps.requests(),
            overflow_steps: steps.overflow_steps(0),
        };
    }
    let ema = |credit, near| LazyEma::new(params.ema_decay, credit, near);
    match policy {
        Policy::Lru => lru::simulate(steps, capacity),
        Policy::Lfu => scored::simulate(steps, capacity, &mut Lfu::default()),
        Policy::Ema => scored::simulate(steps, capacity, &mut ema(Credit::Uses, 0.0)),
        Policy::NearPickEma => scored::simulate(
            steps,
            capacity,
            &mut ema(Credit::Uses, params.near_pick_credit),
        ),
        Policy::RouterEma => scored::simulate(steps, capacity, &mut ema(Credit::RouterProb, 0.0)),
        Policy::InverseRouterEma => {
            scored::simulate(steps, capacity, &mut ema(Credit::InverseRank, 0.0))
        }
        Policy::Belady => scored::simulate(steps, capacity, &mut Belady::new(steps)),
        Policy::Static => pinned::simulate(steps, capacity, fit),
    }
}
