//! An eager, obviously-correct replay used as the tests' oracle: every score
//! of every expert is updated every step (EMA decays all of them), next uses
//! are found by scanning forward, and the resident set after a step is the
//! step's experts first, then the highest-scored others, cut to the capacity.

use super::policy::{Policy, PolicyParams};
use super::prefetch_reference::ema_credit;
use super::steps::Steps;
use super::Counts;
use std::cmp::Ordering;

pub fn eager(policy: Policy, steps: &Steps, capacity: usize, params: &PolicyParams) -> Counts {
    if policy == Policy::Static {
        return eager_static(steps, capacity, &[]);
    }
    let n = steps.n_expert;
    let len = steps.len();
    let mut score = vec![0f64; n];
    let mut tie = vec![0u64; n];
    let mut resident: Vec<usize> = Vec::new();
    let mut counts = Counts {
        requests: steps.requests(),
        ..Counts::default()
    };
    let next_after = |s: usize, e: usize| {
        (s + 1..len)
            .find(|&u| steps.expert[steps.range(u)].contains(&(e as u16)))
            .unwrap_or(len)
    };
    for s in 0..len {
        let r = steps.range(s);
        let d: Vec<usize> = steps.expert[r.clone()]
            .iter()
            .map(|&e| e as usize)
            .collect();
        if matches!(
            policy,
            Policy::Ema | Policy::NearPickEma | Policy::RouterEma | Policy::InverseRouterEma
        ) {
            for x in score.iter_mut() {
                *x *= params.ema_decay;
            }
        }
        ema_credit(policy, params, steps, s, &mut score);
        for (pos, i) in r.enumerate() {
            let e = steps.expert[i] as usize;
            match policy {
                Policy::Lru => {
                    score[e] = s as f64;
                    tie[e] = pos as u64;
                }
                Policy::Lfu => score[e] += f64::from(steps.uses[i]),
                Policy::Belady => score[e] = -(next_after(s, e) as f64),
                _ => {}
            }
            if policy != Policy::Lru {
                tie[e] = ((s as u64) << 16) | e as u64;
            }
        }
        counts.misses += d.iter().filter(|e| !resident.contains(e)).count() as u64;
        if d.len() > capacity {
            counts.overflow_steps += 1;
        }
        let mut union = resident.clone();
        union.extend(d.iter().filter(|e| !resident.contains(e)));
        // Keep first: the step's experts, then the larger score, then the larger tie.
        union.sort_by(|&a, &b| {
            let key = |e: usize| (d.contains(&e), score[e], tie[e]);
            let (ka, kb) = (key(a), key(b));
            kb.0.cmp(&ka.0)
                .then(kb.1.partial_cmp(&ka.1).unwrap_or(Ordering::Equal))
                .then(kb.2.cmp(&ka.2))
        });
        union.truncate(capacity);
        resident = union;
    }
    counts
}

/// `static` the slow way: pick the pinned experts one at a time (the most
/// fit traffic left, the lowest id on a tie; no traffic past `fit`'s end),
/// then every request of a step outside them is a miss.
pub fn eager_static(steps: &Steps, capacity: usize, fit: &[u64]) -> Counts {
    let mut pinned: Vec<usize> = Vec::new();
    while pinned.len() < capacity.min(steps.n_expert) {
        let mut best: Option<usize> = None;
        for e in 0..steps.n_expert {
            let t = |e: usize| if e < fit.len() { fit[e] } else { 0 };
            if !pinned.contains(&e) && best.is_none_or(|b| t(e) > t(b)) {
                best = Some(e);
            }
        }
        pinned.push(best.unwrap());
    }
    let mut counts = Counts {
        requests: steps.requests(),
        ..Counts::default()
    };
    for s in 0..steps.len() {
        let d = &steps.expert[steps.range(s)];
        counts.misses += d
            .iter()
            .filter(|&&e| !pinned.contains(&(e as usize)))
            .count() as u64;
        if d.len() > capacity {
            counts.overflow_steps += 1;
        }
    }
    counts
}

/// The fewest misses any demand cache of `capacity` can have on `steps`
/// (every step's experts resident after it, when they fit), by search over
/// every resident set.
pub fn optimum(steps: &Steps, capacity: usize) -> u64 {
    use std::collections::HashMap;
    let mut best: HashMap<u64, u64> = HashMap::from([(0, 0)]);
    for s in 0..steps.len() {
        let d: u64 = steps.expert[steps.range(s)]
            .iter()
            .fold(0, |m, &e| m | 1 << e);
        let mut next: HashMap<u64, u64> = HashMap::new();
        for (&r, &cost) in &best {
            let cost = cost + u64::from((d & !r).count_ones());
            let pool = r | d;
            // Every subset of the pool that holds the step (or is full of it).
            let mut sub = pool;
            loop {
                let size = sub.count_ones() as usize;
                let holds = if d.count_ones() as usize <= capacity {
                    sub & d == d
                } else {
                    sub & !d == 0 && size == capacity
                };
                if holds && size <= capacity {
                    let e = next.entry(sub).or_insert(u64::MAX);
                    *e = (*e).min(cost);
                }
                if sub == 0 {
                    break;
                }
                sub = (sub - 1) & pool;
            }
        }
        best = next;
    }
    best.values().copied().min().unwrap_or(0)
}
