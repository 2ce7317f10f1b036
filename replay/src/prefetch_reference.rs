//! The oracle of prefetch replay's tests (here and on the quickstart's
//! traces in `tests/`): an eager, obviously-correct replay written apart
//! from [`crate::prefetch`]: every score of every expert updated every
//! step, next uses looked up in each expert's list of steps, and the
//! resident set after each phase the phase's experts first, then the
//! highest-scored others, cut to the capacity. O(experts) per step: for
//! small traces only.

use super::prefetch::{Prefetch, PrefetchCounts};
use super::steps::Steps;
use super::{Cache, Policy, PolicyParams};
use std::cmp::Ordering;

/// The eager reference of [`crate::prefetch::simulate`], rule for rule.
pub fn eager(cache: Cache<'_>, steps: &Steps, pf: &Prefetch) -> PrefetchCounts {
    let (policy, capacity, params, fit) = (cache.policy, cache.capacity, cache.params, cache.fit);
    let n = steps.n_expert;
    let len = steps.len();
    let mut out = PrefetchCounts::default();
    out.demand.requests = steps.requests();
    let list = |s: usize| -> Vec<usize> {
        let all = &pf.expert[pf.start[s] as usize..pf.start[s + 1] as usize];
        all.iter().take(capacity).map(|&e| e as usize).collect()
    };
    // Per expert, the steps that request it, ascending: its next use at or
    // after `s` is the first of them not before `s`.
    let mut uses = vec![Vec::new(); n];
    for u in 0..len {
        for &e in &steps.expert[steps.range(u)] {
            uses[e as usize].push(u);
        }
    }
    let next_from = |s: usize, e: usize| {
        let at = uses[e].partition_point(|&u| u < s);
        uses[e].get(at).copied().unwrap_or(len)
    };
    if capacity == 0 {
        // Nothing is ever resident and nothing is prefetched.
        out.demand.misses = steps.requests();
        out.demand.overflow_steps = (0..len).filter(|&s| !steps.range(s).is_empty()).count() as u64;
        return out;
    }
    if policy == Policy::Static {
        // The pinned set: most fit traffic first, the lower id on a tie.
        let traffic = |e: usize| fit.get(e).copied().unwrap_or(0);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| traffic(b).cmp(&traffic(a)).then(a.cmp(&b)));
        let pinned: Vec<usize> = order.into_iter().take(capacity).collect();
        for s in 0..len {
            let d: Vec<usize> = steps.expert[steps.range(s)]
                .iter()
                .map(|&e| e as usize)
                .collect();
            if d.len() > capacity {
                out.demand.overflow_steps += 1;
            }
            let loaded: Vec<usize> = list(s)
                .into_iter()
                .filter(|e| !pinned.contains(e))
                .collect();
            out.loads += loaded.len() as u64;
            for e in &d {
                if pinned.contains(e) {
                    continue;
                }
                if loaded.contains(e) {
                    out.useful += 1;
                } else {
                    out.demand.misses += 1;
                }
            }
            out.wasted += loaded.iter().filter(|e| !d.contains(e)).count() as u64;
        }
        return out;
    }
    let mut score = vec![0f64; n];
    let mut tie = vec![0u64; n];
    let mut fresh = vec![false; n];
    let mut resident: Vec<usize> = Vec::new();
    let mut clock = 0u64;
    // Keeps the first `capacity` of `union` by (in `first`, score, tie, id),
    // largest first; counts the fresh ones dropped as wasted.
    let keep = |union: Vec<usize>,
                first: &[usize],
                score: &[f64],
                tie: &[u64],
                fresh: &mut [bool],
                wasted: &mut u64|
     -> Vec<usize> {
        let mut union = union;
        union.sort_by(|&a, &b| {
            let key = |e: usize| (first.contains(&e), score[e], tie[e], e);
            let (ka, kb) = (key(a), key(b));
            kb.0.cmp(&ka.0)
                .then(kb.1.partial_cmp(&ka.1).unwrap_or(Ordering::Equal))
                .then(kb.2.cmp(&ka.2))
                .then(kb.3.cmp(&ka.3))
        });
        for &e in &union[capacity.min(union.len())..] {
            *wasted += u64::from(std::mem::take(&mut fresh[e]));
        }
        union.truncate(capacity);
        union
    };
    for s in 0..len {
        let ema = matches!(
            policy,
            Policy::Ema | Policy::NearPickEma | Policy::RouterEma | Policy::InverseRouterEma
        );
        if ema {
            for x in score.iter_mut() {
                *x *= params.ema_decay;
            }
        }
        // Prefetch phase.
        let p = list(s);
        for &e in &p {
            if policy == Policy::Lru {
                clock += 1;
                score[e] = clock as f64;
            }
            if !resident.contains(&e) {
                out.loads += 1;
                fresh[e] = true;
                resident.push(e);
            }
        }
        if policy == Policy::Belady {
            for (e, v) in score.iter_mut().enumerate().take(n) {
                *v = -(next_from(s, e) as f64);
            }
        }
        resident = keep(resident, &p, &score, &tie, &mut fresh, &mut out.wasted);
        // Demand phase.
        let r = steps.range(s);
        let d: Vec<usize> = steps.expert[r.clone()]
            .iter()
            .map(|&e| e as usize)
            .collect();
        if d.len() > capacity {
            out.demand.overflow_steps += 1;
        }
        ema_credit(policy, params, steps, s, &mut score);
        for (i, &e) in r.zip(&d) {
            match policy {
                Policy::Lru => {
                    clock += 1;
                    score[e] = clock as f64;
                }
                Policy::Lfu => score[e] += f64::from(steps.uses[i]),
                _ => {}
            }
            if policy != Policy::Lru {
                tie[e] = ((s as u64) << 16) | e as u64;
            }
            if resident.contains(&e) {
                out.useful += u64::from(std::mem::take(&mut fresh[e]));
            } else {
                out.demand.misses += 1;
                resident.push(e);
            }
        }
        if policy == Policy::Belady {
            for (e, v) in score.iter_mut().enumerate().take(n) {
                *v = -(next_from(s + 1, e) as f64);
            }
        }
        resident = keep(resident, &d, &score, &tie, &mut fresh, &mut out.wasted);
    }
    out.wasted += fresh.iter().filter(|&&f| f).count() as u64;
    out
}

/// Adds the EMA policies' credit for step `s` to `score`: each request's
/// uses, router probability or inverse rank, and `near_pick_ema`'s near
/// picks; nothing for the other policies. The demand replay's reference
/// credits the same way.
pub(crate) fn ema_credit(
    policy: Policy,
    params: &PolicyParams,
    steps: &Steps,
    s: usize,
    score: &mut [f64],
) {
    let credit = match policy {
        Policy::Ema | Policy::NearPickEma => &steps.uses,
        Policy::RouterEma => &steps.prob,
        Policy::InverseRouterEma => &steps.inv_rank,
        _ => return,
    };
    for i in steps.range(s) {
        score[steps.expert[i] as usize] += f64::from(credit[i]);
    }
    if policy == Policy::NearPickEma {
        for j in steps.near_range(s) {
            score[steps.near[j] as usize] +=
                params.near_pick_credit * f64::from(steps.near_uses[j]);
        }
    }
}
