//! Caches that evict the resident expert with the smallest score: LFU, the
//! EMA family and Belady, all on one [`Tree`] of cache slots.
//!
//! A step first credits its experts, then loads its misses. A load takes a
//! free slot, else evicts the smallest-key resident that the step does not
//! use (those are pinned for the rest of the step). When a step needs more
//! experts than the capacity, the cache keeps the largest-key ones of the step.
//!
//! For scorers whose keys only grow ([`Scorer::MONOTONE`]: LFU, EMA), a hit
//! only updates the score; the tree keeps a stale, smaller snapshot that is
//! refreshed when it reaches the root. The root's snapshot is a lower bound
//! of every resident's key, so a root whose snapshot is current is the true
//! minimum.

use super::steps::Steps;
use super::tree::{Key, Tree};
use super::Counts;

/// How a policy scores experts.
pub trait Scorer {
    /// Whether keys only grow, so the tree may hold stale snapshots.
    const MONOTONE: bool;
    /// Starts step `s`; returns the factor every key was multiplied by, if
    /// the scorer rescaled (an exact power of two, so the order is kept).
    fn begin_step(&mut self, s: usize) -> Option<f64>;
    /// Credits request `i` (an index into the step arrays) of step `s`.
    fn request(&mut self, steps: &Steps, i: usize, s: usize);
    /// Credits near pick `j` (an index into the near arrays).
    fn near(&mut self, steps: &Steps, j: usize);
    /// The current key of expert `e`.
    fn key(&self, e: usize) -> Key;
}

const NO_SLOT: u32 = u32::MAX;

/// Replays `steps` through a cache of `capacity` experts scored by `scorer`.
pub fn simulate<S: Scorer>(steps: &Steps, capacity: usize, scorer: &mut S) -> Counts {
    let n = steps.n_expert;
    let mut tree = Tree::new(capacity);
    let mut slot_of = vec![NO_SLOT; n];
    let mut slot_expert = vec![NO_SLOT; capacity];
    let mut stamp = vec![0u32; n];
    let mut missed: Vec<u16> = Vec::with_capacity(64);
    let mut pinned: Vec<usize> = Vec::with_capacity(64);
    let mut misses = 0u64;
    let mut overflow_steps = 0u64;
    for s in 0..steps.len() {
        if let Some(scale) = scorer.begin_step(s) {
            tree.map_keys(|k| Key {
                p: k.p * scale,
                tie: k.tie,
            });
        }
        let mark = s as u32 + 1;
        let r = steps.range(s);
        if r.len() > capacity {
            overflow_steps += 1;
        }
        for i in r {
            let e = steps.expert[i];
            scorer.request(steps, i, s);
            stamp[e as usize] = mark;
            let slot = slot_of[e as usize];
            if slot == NO_SLOT {
                missed.push(e);
            } else if !S::MONOTONE {
                tree.set(slot as usize, scorer.key(e as usize));
            }
        }
        for j in steps.near_range(s) {
            scorer.near(steps, j);
        }
        misses += missed.len() as u64;
        for &e in &missed {
            let e = e as usize;
            loop {
                let (w, snap) = tree.min();
                let ex = slot_expert[w];
                if ex != NO_SLOT {
                    let ex = ex as usize;
                    if snap == Key::PINNED {
                        keep_best_of_step(scorer, &mut slot_of, &mut slot_expert, e);
                        break;
                    }
                    if stamp[ex] == mark {
                        tree.set(w, Key::PINNED);
                        pinned.push(w);
                        continue;
                    }
                    if S::MONOTONE {
                        let current = scorer.key(ex);
                        if snap.lt(current) {
                            tree.set(w, current);
                            continue;
                        }
                    }
                    slot_of[ex] = NO_SLOT;
                }
                slot_expert[w] = e as u32;
                slot_of[e] = w as u32;
                tree.set(w, Key::PINNED);
                pinned.push(w);
                break;
            }
        }
        for w in pinned.drain(..) {
            tree.set(w, scorer.key(slot_expert[w] as usize));
        }
        missed.clear();
    }
    Counts {
        requests: steps.requests(),
        misses,
        overflow_steps,
    }
}

/// Every slot holds an expert of the current step: `e` replaces the
/// smallest-key one if its own key is larger, else it is not kept.
fn keep_best_of_step<S: Scorer>(
    scorer: &S,
    slot_of: &mut [u32],
    slot_expert: &mut [u32],
    e: usize,
) {
    let (w, worst) = slot_expert
        .iter()
        .enumerate()
        .map(|(w, &x)| (w, x as usize))
        .min_by(|a, b| {
            if scorer.key(a.1).lt(scorer.key(b.1)) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        })
        .expect("capacity is at least 1");
    if scorer.key(worst).lt(scorer.key(e)) {
        slot_of[worst] = NO_SLOT;
        slot_expert[w] = e as u32;
        slot_of[e] = w as u32;
    }
}

/// LFU: the score is the number of uses so far (kept for evicted experts too).
pub struct Lfu {
    keys: Vec<Key>,
}

impl Lfu {
    /// Scores for `n_expert` experts, all unused.
    pub fn new(n_expert: usize) -> Lfu {
        Lfu {
            keys: vec![Key { p: 0.0, tie: 0 }; n_expert],
        }
    }
}

impl Scorer for Lfu {
    const MONOTONE: bool = true;

    fn begin_step(&mut self, _s: usize) -> Option<f64> {
        None
    }

    #[inline]
    fn request(&mut self, steps: &Steps, i: usize, s: usize) {
        let e = steps.expert[i];
        let k = &mut self.keys[e as usize];
        k.p += f64::from(steps.uses[i]);
        k.tie = Key::tie(s, e);
    }

    fn near(&mut self, _steps: &Steps, _j: usize) {}

    #[inline]
    fn key(&self, e: usize) -> Key {
        self.keys[e]
    }
}

/// Belady's MIN: the score is minus the step of the next use, so the expert
/// used farthest in the future (or never again) is evicted first.
pub struct Belady {
    next_use: Vec<u32>,
    keys: Vec<Key>,
}

impl Belady {
    /// Scores for the requests of `steps`.
    pub fn new(steps: &Steps) -> Belady {
        Belady {
            next_use: steps.next_use(),
            keys: vec![Key { p: 0.0, tie: 0 }; steps.n_expert],
        }
    }
}

impl Scorer for Belady {
    const MONOTONE: bool = false;

    fn begin_step(&mut self, _s: usize) -> Option<f64> {
        None
    }

    #[inline]
    fn request(&mut self, steps: &Steps, i: usize, s: usize) {
        let e = steps.expert[i];
        self.keys[e as usize] = Key {
            p: -f64::from(self.next_use[i]),
            tie: Key::tie(s, e),
        };
    }

    fn near(&mut self, _steps: &Steps, _j: usize) {}

    #[inline]
    fn key(&self, e: usize) -> Key {
        self.keys[e]
    }
}
