//! The `static` policy: per layer, the `C` experts with the most traffic on
//! the fit split are pinned and never evicted; every other request loads its
//! expert for the step and drops it (a miss each time). The hot list of a
//! deployment that cannot afford to swap, and the anchors' question: does a
//! list fitted on one half of the data serve the other?

use super::steps::Steps;
use super::Counts;

/// The `capacity` experts of a layer with the most `fit` traffic (requests
/// per expert id; ties and ids past `fit`'s end go to the lower id).
pub fn pinned(fit: &[u64], n_expert: usize, capacity: usize) -> Vec<bool> {
    let traffic = |e: usize| fit.get(e).copied().unwrap_or(0);
    let mut order: Vec<usize> = (0..n_expert).collect();
    order.sort_by(|&a, &b| traffic(b).cmp(&traffic(a)).then(a.cmp(&b)));
    let mut out = vec![false; n_expert];
    for &e in order.iter().take(capacity) {
        out[e] = true;
    }
    out
}

/// Replays `steps` against the experts [`pinned`] from `fit`.
pub fn simulate(steps: &Steps, capacity: usize, fit: &[u64]) -> Counts {
    let resident = pinned(fit, steps.n_expert, capacity);
    let misses = steps
        .expert
        .iter()
        .filter(|&&e| !resident[e as usize])
        .count() as u64;
    Counts {
        requests: steps.requests(),
        misses,
        overflow_steps: steps.overflow_steps(capacity),
    }
}

/// Requests per expert of `steps`: the fit traffic [`simulate`] pins by.
pub fn traffic(steps: &Steps) -> Vec<u64> {
    let mut out = vec![0u64; steps.n_expert];
    for &e in &steps.expert {
        out[e as usize] += 1;
    }
    out
}
