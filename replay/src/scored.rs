//! Caches that evict the resident expert with the smallest score: LFU, the
//! EMA family and Belady.
//!
//! A step first credits its experts, then loads its misses. A load takes a
//! free slot, else evicts the smallest-key resident that the step does not
//! use (those are pinned for the rest of the step). When a step needs more
//! experts than the capacity, the cache keeps the largest-key ones of the step.
//!
//! Two engines give the same evictions. Up to [`FLAT_MAX`] slots the keys sit
//! in flat per-slot arrays that always hold the current key (a hit is one
//! store) and a step's evictions search them for the minimum, one vectorised
//! scan per step plus one lane per eviction ([`simulate_flat`]): at these
//! sizes contiguous compares beat the unpredictable branches of a tree.
//! Larger caches use a [`Tree`] of slots, O(log C) per update
//! ([`simulate_tree`]).
//!
//! In the tree, for scorers whose keys only grow ([`Scorer::MONOTONE`]: LFU,
//! EMA), a hit only updates the score; the tree keeps a stale, smaller
//! snapshot that is refreshed when it reaches the root. The root's snapshot is
//! a lower bound of every resident's key, so a root whose snapshot is current
//! is the true minimum.

use super::ids::IdTable;
use super::steps::Steps;
use super::tree::{Key, Tree};
use super::Counts;

/// How a policy scores experts.
pub trait Scorer {
    /// Whether keys only grow, so the tree may hold stale snapshots.
    const MONOTONE: bool;
    /// Starts step `s`; returns the factor every key was multiplied by, if
    /// the scorer rescaled (an exact power of two, so the order is kept).
    fn begin_step(&mut self, _s: usize) -> Option<f64> {
        None
    }
    /// The credit of every request (indexed like `steps.expert`), chosen
    /// once per replay so the per-request path does not branch on it.
    fn credits<'s>(&self, steps: &'s Steps) -> &'s [f32] {
        &steps.uses
    }
    /// Credits request `i` of step `s`: expert `e`, with credit `credit`
    /// (its entry of [`Scorer::credits`]).
    fn request(&mut self, i: usize, e: u16, credit: f32, s: usize);
    /// Whether near picks can change a key.
    fn credits_near(&self) -> bool {
        false
    }
    /// Credits a near pick of expert `e`, picked `uses` times in the step;
    /// returns the score of its key afterwards.
    fn near(&mut self, e: u16, _uses: f32) -> f64 {
        self.key(e as usize).p
    }
    /// The current key of expert `e`.
    fn key(&self, e: usize) -> Key;
    /// Expert `e` is loaded ahead of step `s`, unrequested (prefetch
    /// replay): a scorer whose key depends on the future rescores it.
    fn prefetched(&mut self, _e: u16, _s: usize) {}
}

const NO_SLOT: u32 = u32::MAX;

/// The largest capacity replayed on flat slot arrays; larger ones use a tree.
pub const FLAT_MAX: usize = 512;

/// Length of the flat slot arrays: the padded capacity plus a spare slot,
/// rounded up to a power of two.
const SLOTS: usize = 2 * FLAT_MAX;

/// Replays `steps` through a cache of `capacity` experts scored by `scorer`.
pub fn simulate<S: Scorer>(steps: &Steps, capacity: usize, scorer: &mut S) -> Counts {
    if capacity <= FLAT_MAX {
        simulate_flat(steps, capacity, scorer)
    } else {
        simulate_tree(steps, capacity, scorer)
    }
}

/// Slots per block of the vectorisable scans; the key arrays are padded to a
/// multiple with `+inf`.
pub(super) const LANES: usize = 16;

/// The smallest `p` of each lane (slot modulo [`LANES`]): a vectorisable pass.
#[inline]
pub(super) fn lane_minima(p: &[f64]) -> [f64; LANES] {
    let mut acc = [f64::INFINITY; LANES];
    for block in p.chunks_exact(LANES) {
        for (a, &x) in acc.iter_mut().zip(block) {
            *a = if x < *a { x } else { *a };
        }
    }
    acc
}

/// The smallest `p` of lane `lane`.
#[inline]
pub(super) fn lane_min(p: &[f64], lane: usize) -> f64 {
    p[lane..]
        .iter()
        .step_by(LANES)
        .fold(f64::INFINITY, |m, &x| if x < m { x } else { m })
}

/// The slot with the smallest `(p, tie)` and its `p` (`+inf`: every slot is
/// pinned), given the lane minima `acc` of `p` and the tie breaker of a slot.
/// A pairwise reduction finds the least of those; only the lanes holding it
/// (almost always one) are searched for its slot, and tie breakers are read
/// only when several slots hold it. Always inlined: it runs once per eviction
/// and the call alone cost about a tenth of the replay.
#[inline(always)]
pub(super) fn argmin(acc: &[f64; LANES], p: &[f64], tie: impl Fn(usize) -> u64) -> (usize, f64) {
    let mut v = *acc;
    let mut width = LANES / 2;
    while width > 0 {
        for k in 0..width {
            v[k] = if v[k + width] < v[k] {
                v[k + width]
            } else {
                v[k]
            };
        }
        width /= 2;
    }
    let least = v[0];
    if least == f64::INFINITY {
        return (usize::MAX, least);
    }
    let mut lanes = 0u32;
    for (k, &a) in acc.iter().enumerate() {
        lanes |= u32::from(a == least) << k;
    }
    let mut best = usize::MAX;
    let mut best_tie = u64::MAX;
    while lanes != 0 {
        let lane = lanes.trailing_zeros() as usize;
        lanes &= lanes - 1;
        // Which positions of the lane hold `least`, without a branch per
        // slot (where it sits is unpredictable); then their tie breakers.
        let mut hits = 0u64;
        for (k, &x) in p[lane..].iter().step_by(LANES).enumerate() {
            hits |= u64::from(x == least) << k;
        }
        if hits.is_power_of_two() && lanes == 0 && best == usize::MAX {
            // The only slot holding `least`: no tie to break.
            return (lane + hits.trailing_zeros() as usize * LANES, least);
        }
        while hits != 0 {
            let w = lane + hits.trailing_zeros() as usize * LANES;
            hits &= hits - 1;
            let t = tie(w);
            if t < best_tie {
                best = w;
                best_tie = t;
            }
        }
    }
    (best, least)
}

/// [`simulate`] on a flat per-slot array of scores: a pinned or empty slot
/// holds `+inf`, every other resident its current score, and an eviction
/// takes the slot with the smallest `(p, tie)` ([`argmin`]).
pub fn simulate_flat<S: Scorer>(steps: &Steps, capacity: usize, scorer: &mut S) -> Counts {
    if scorer.credits_near() {
        flat::<S, true>(steps, capacity, scorer)
    } else {
        flat::<S, false>(steps, capacity, scorer)
    }
}

/// [`simulate_flat`], compiled apart for scorers with and without near-pick
/// credits (without them the near picks are not read at all).
fn flat<S: Scorer, const NEAR: bool>(steps: &Steps, capacity: usize, scorer: &mut S) -> Counts {
    let padded = capacity.div_ceil(LANES) * LANES;
    // Fixed-size tables keep every index of the per-request loops in bounds
    // by construction: slots below `SLOTS` (a miss pins the spare slot past
    // the padding), expert ids and request positions below 2^16.
    let spare = padded;
    let mut p: Box<[f64; SLOTS]> = Box::new([f64::INFINITY; SLOTS]);
    let mut slot_of = IdTable::new(NO_SLOT);
    let mut missed = IdTable::new(0u16);
    let mut slot_expert = vec![NO_SLOT; capacity];
    let mut filled = 0usize;
    let credits = scorer.credits(steps);
    assert_eq!(credits.len(), steps.expert.len(), "one credit per request");
    let mut misses = 0u64;
    for s in 0..steps.len() {
        if scorer.begin_step(s).is_some() {
            for (w, &e) in slot_expert[..filled].iter().enumerate() {
                p[w] = scorer.key(e as usize).p;
            }
        }
        let r = steps.range(s);
        // Branch-free on hit or miss: a miss pins the spare slot and is
        // written to `missed` whatever happens.
        let mut n_missed = 0usize;
        let requests = steps.expert[r.clone()].iter().zip(&credits[r.clone()]);
        for (i, (&e, &credit)) in (r.start..).zip(requests) {
            scorer.request(i, e, credit, s);
            let slot = slot_of.get(e as usize);
            let miss = slot == NO_SLOT;
            let w = if miss { spare } else { slot as usize };
            p[w % SLOTS] = f64::INFINITY;
            // A step requests distinct experts, so fewer than 2^16.
            *missed.get_mut(n_missed as u16) = e;
            n_missed += usize::from(miss);
        }
        if NEAR {
            // A resident the step requested is pinned (`+inf`) until the
            // step ends, so it keeps `+inf`; any other resident takes its new
            // score at once. A non-resident writes the spare slot, which no
            // scan reads. Branch-free: residency is unpredictable.
            let j = steps.near_range(s);
            for (&e, &uses) in steps.near[j.clone()].iter().zip(&steps.near_uses[j]) {
                let score = scorer.near(e, uses);
                let slot = slot_of.get(e as usize);
                let w = if slot == NO_SLOT {
                    spare
                } else {
                    slot as usize
                } % SLOTS;
                p[w] = if p[w] == f64::INFINITY { p[w] } else { score };
            }
        }
        misses += n_missed as u64;
        let mut acc = None;
        for k in 0..n_missed {
            let e = missed.get(k) as usize;
            let w = if filled < capacity {
                filled += 1;
                filled - 1
            } else {
                // One scan per step; each eviction then refreshes one lane.
                let acc = acc.get_or_insert_with(|| lane_minima(&p[..padded]));
                let (w, least) = argmin(acc, &p[..padded], |w| {
                    scorer.key(slot_expert[w] as usize).tie
                });
                if least == f64::INFINITY {
                    keep_best_of_step(scorer, slot_of.as_mut_slice(), &mut slot_expert, e);
                    continue;
                }
                p[w] = f64::INFINITY;
                acc[w % LANES] = lane_min(&p[..padded], w % LANES);
                *slot_of.get_mut(slot_expert[w] as u16) = NO_SLOT;
                w
            };
            slot_expert[w] = e as u32;
            *slot_of.get_mut(e as u16) = w as u32;
            p[w] = f64::INFINITY;
        }
        for &e in &steps.expert[r] {
            let slot = slot_of.get(e as usize);
            if slot != NO_SLOT {
                p[slot as usize % SLOTS] = scorer.key(e as usize).p;
            }
        }
    }
    Counts {
        requests: steps.requests(),
        misses,
        overflow_steps: steps.overflow_steps(capacity),
    }
}

/// [`simulate`] on a tournament [`Tree`] of slots: O(log C) per update.
pub fn simulate_tree<S: Scorer>(steps: &Steps, capacity: usize, scorer: &mut S) -> Counts {
    let n = steps.n_expert;
    let mut tree = Tree::new(capacity);
    let mut slot_of = vec![NO_SLOT; n];
    let mut slot_expert = vec![NO_SLOT; capacity];
    let mut stamp = vec![0u32; n];
    let mut missed: Vec<u16> = Vec::with_capacity(64);
    let mut pinned: Vec<usize> = Vec::with_capacity(64);
    let credits = scorer.credits(steps);
    let mut misses = 0u64;
    for s in 0..steps.len() {
        if let Some(scale) = scorer.begin_step(s) {
            tree.map_keys(|k| Key {
                p: k.p * scale,
                tie: k.tie,
            });
        }
        let mark = s as u32 + 1;
        for i in steps.range(s) {
            let e = steps.expert[i];
            scorer.request(i, e, credits[i], s);
            stamp[e as usize] = mark;
            let slot = slot_of[e as usize];
            if slot == NO_SLOT {
                missed.push(e);
            } else if !S::MONOTONE {
                tree.set(slot as usize, scorer.key(e as usize));
            }
        }
        if scorer.credits_near() {
            let j = steps.near_range(s);
            for (&e, &uses) in steps.near[j.clone()].iter().zip(&steps.near_uses[j]) {
                scorer.near(e, uses);
            }
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
        overflow_steps: steps.overflow_steps(capacity),
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
    keys: IdTable<Key>,
}

impl Default for Lfu {
    /// Scores for every expert, all unused.
    fn default() -> Lfu {
        Lfu {
            keys: IdTable::new(Key::UNSCORED),
        }
    }
}

impl Scorer for Lfu {
    const MONOTONE: bool = true;

    #[inline]
    fn request(&mut self, _i: usize, e: u16, uses: f32, s: usize) {
        let k = self.keys.get_mut(e);
        k.p += f64::from(uses);
        k.tie = Key::tie(s, e);
    }

    #[inline]
    fn key(&self, e: usize) -> Key {
        self.keys.get(e)
    }
}

/// Belady's MIN: the score is minus the step of the next use, so the expert
/// used farthest in the future (or never again) is evicted first.
pub struct Belady {
    next_use: Vec<u32>,
    keys: IdTable<Key>,
    /// Per expert, the steps that request it, ascending (prefetch replay
    /// only), and a cursor into them.
    uses: Vec<Vec<u32>>,
    cursor: Vec<usize>,
    /// The next use of an expert never used again: the number of steps.
    never: u32,
}

impl Belady {
    /// Scores for the requests of `steps`.
    pub fn new(steps: &Steps) -> Belady {
        Belady {
            next_use: steps.next_use(),
            keys: IdTable::new(Key::UNSCORED),
            uses: Vec::new(),
            cursor: Vec::new(),
            never: steps.len() as u32,
        }
    }

    /// [`Belady::new`] that can also score experts loaded ahead of a step
    /// by their next use ([`Scorer::prefetched`]; steps must only advance).
    pub fn with_prefetch(steps: &Steps) -> Belady {
        let mut uses = vec![Vec::new(); steps.n_expert];
        for s in 0..steps.len() {
            for &e in &steps.expert[steps.range(s)] {
                uses[e as usize].push(s as u32);
            }
        }
        Belady {
            cursor: vec![0; steps.n_expert],
            uses,
            ..Belady::new(steps)
        }
    }
}

impl Scorer for Belady {
    const MONOTONE: bool = false;

    #[inline]
    fn request(&mut self, i: usize, e: u16, _credit: f32, s: usize) {
        *self.keys.get_mut(e) = Key {
            p: -f64::from(self.next_use[i]),
            tie: Key::tie(s, e),
        };
    }

    #[inline]
    fn key(&self, e: usize) -> Key {
        self.keys.get(e)
    }

    fn prefetched(&mut self, e: u16, s: usize) {
        let (uses, at) = (&self.uses[e as usize], &mut self.cursor[e as usize]);
        while *at < uses.len() && (uses[*at] as usize) < s {
            *at += 1;
        }
        let next = uses.get(*at).copied().unwrap_or(self.never);
        self.keys.get_mut(e).p = -f64::from(next);
    }
}
