//! Prefetch replay: before each step the cache loads the experts predicted
//! for it ([`Prefetch`], issued `d` layers earlier), evicting by the
//! policy's own rule, and then serves the step's actual requests.
//!
//! Rules, the same for every policy:
//! - A step's prefetch list holds at most `min(m, capacity)` distinct
//!   experts. Its resident members are kept through the prefetch phase; the
//!   others are loaded (one prefetch load each).
//! - `lru`: every listed expert becomes most recent (in list order), then
//!   the least recent others leave until the cache fits. The scored policies: a load takes a free
//!   slot, else evicts the smallest key `(score, tie, id)` outside the list;
//!   a prefetched expert keeps the score it has (LFU and EMA credit only
//!   requests), and Belady scores it by its next use. `static`: a listed
//!   expert outside the pinned set is loaded beside it for the step.
//! - The demand phase is the policy's replay without prefetch.
//! - A prefetch load is useful when its expert is requested before it is
//!   evicted (`static`: in its step), wasted otherwise (still resident at
//!   the end counts as wasted: it was never used).

use super::ema::{Credit, LazyEma};
use super::lru::LruList;
use super::scored::{argmin, lane_min, lane_minima, Belady, Lfu, Scorer, FLAT_MAX, LANES};
use super::steps::{Steps, NONE};
use super::tree::Key;
use super::{pinned, Cache, Counts, Policy};

/// The experts to load before each step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prefetch {
    /// Step `s` loads `expert[start[s]..start[s + 1]]`.
    pub start: Vec<u32>,
    /// Predicted experts, distinct within a step, best first.
    pub expert: Vec<u16>,
}

impl Prefetch {
    /// Per step, the first `m` distinct ids of `width` guesses per step
    /// (`NONE` entries skipped); `guesses.len() == steps * width`.
    pub fn from_guesses(guesses: &[u16], width: usize, m: usize) -> Prefetch {
        let steps = guesses.len().checked_div(width).unwrap_or(0);
        let mut out = Prefetch {
            start: Vec::with_capacity(steps + 1),
            expert: Vec::with_capacity(steps * m.min(width)),
        };
        out.start.push(0);
        for s in 0..steps {
            let first = out.expert.len();
            for &e in &guesses[s * width..(s + 1) * width] {
                if out.expert.len() - first == m {
                    break;
                }
                if e != NONE && !out.expert[first..].contains(&e) {
                    out.expert.push(e);
                }
            }
            out.start.push(out.expert.len() as u32);
        }
        out
    }

    /// Step `s`'s list, cut to `limit` experts.
    #[inline]
    fn list(&self, s: usize, limit: usize) -> &[u16] {
        let (a, b) = (self.start[s] as usize, self.start[s + 1] as usize);
        &self.expert[a..b.min(a + limit)]
    }
}

/// What a prefetch replay of one layer counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchCounts {
    /// Demand requests, misses (what the step still had to load) and
    /// overflow steps.
    pub demand: Counts,
    /// Experts loaded ahead of their step.
    pub loads: u64,
    /// Prefetch loads requested before being evicted.
    pub useful: u64,
    /// Prefetch loads never requested while resident.
    pub wasted: u64,
}

/// Replays `steps` through `cache` with the loads of `pf` before each step
/// (`pf` has one list per step of `steps`).
pub fn simulate(cache: Cache<'_>, steps: &Steps, pf: &Prefetch) -> PrefetchCounts {
    let (policy, capacity, params) = (cache.policy, cache.capacity, cache.params);
    assert_eq!(
        pf.start.len(),
        steps.len() + 1,
        "one prefetch list per step"
    );
    if capacity == 0 {
        return PrefetchCounts {
            demand: super::simulate(policy, steps, 0, params, cache.fit),
            ..PrefetchCounts::default()
        };
    }
    let ema = |credit, near| LazyEma::new(params.ema_decay, credit, near);
    match policy {
        Policy::Lru => lru(steps, capacity, pf),
        Policy::Lfu => scored(steps, capacity, pf, &mut Lfu::default()),
        Policy::Ema => scored(steps, capacity, pf, &mut ema(Credit::Uses, 0.0)),
        Policy::NearPickEma => scored(
            steps,
            capacity,
            pf,
            &mut ema(Credit::Uses, params.near_pick_credit),
        ),
        Policy::RouterEma => scored(steps, capacity, pf, &mut ema(Credit::RouterProb, 0.0)),
        Policy::InverseRouterEma => scored(steps, capacity, pf, &mut ema(Credit::InverseRank, 0.0)),
        Policy::Belady => scored(steps, capacity, pf, &mut Belady::with_prefetch(steps)),
        Policy::Static => fixed(steps, capacity, cache.fit, pf),
    }
}

/// LRU on [`LruList`]; `fresh[e]`: loaded ahead and not yet used.
fn lru(steps: &Steps, capacity: usize, pf: &Prefetch) -> PrefetchCounts {
    let mut list = LruList::new(steps.n_expert);
    let mut fresh = vec![false; steps.n_expert];
    let mut out = PrefetchCounts::default();
    for s in 0..steps.len() {
        for &e in pf.list(s, capacity) {
            let e = e as usize;
            if !list.touch(e) {
                fresh[e] = true;
                out.loads += 1;
            }
        }
        // The list is at most the capacity and now the most recent: only
        // older experts leave.
        list.evict_to(capacity, |e| {
            out.wasted += u64::from(std::mem::take(&mut fresh[e]))
        });
        for &e in &steps.expert[steps.range(s)] {
            let e = e as usize;
            if list.touch(e) {
                out.useful += u64::from(std::mem::take(&mut fresh[e]));
            } else {
                out.demand.misses += 1;
            }
        }
        list.evict_to(capacity, |e| {
            out.wasted += u64::from(std::mem::take(&mut fresh[e]))
        });
    }
    out.wasted += fresh.iter().filter(|&&f| f).count() as u64;
    out.demand.overflow_steps = steps.overflow_steps(capacity);
    out.demand.requests = steps.requests();
    out
}

const NO_SLOT: u32 = u32::MAX;

/// Strict eviction order of two residents: key, then expert id.
#[inline]
fn before(a: Key, ea: u32, b: Key, eb: u32) -> bool {
    a.lt(b) || (!b.lt(a) && ea < eb)
}

/// Slots of a scored cache with prefetch. `p[w]` is the score of slot
/// `w`'s expert, `+inf` while it is pinned (kept through the current
/// phase) or empty; `p` is padded to whole blocks of [`LANES`] with `+inf`.
/// Up to [`FLAT_MAX`] slots an eviction reads the lane minima of `p`
/// (one vectorised pass per phase, then one lane per eviction), as the
/// replay without prefetch does ([`argmin`]); larger caches scan `p`.
struct Slots {
    expert: Vec<u32>,
    p: Vec<f64>,
    slot_of: Vec<u32>,
    fresh: Vec<bool>,
    pins: Vec<usize>,
    /// The lane minima of `p` during a phase's evictions (`None`: not read
    /// yet this phase).
    acc: Option<[f64; LANES]>,
    flat: bool,
}

impl Slots {
    fn new(capacity: usize, n_expert: usize) -> Slots {
        Slots {
            expert: Vec::with_capacity(capacity),
            p: vec![f64::INFINITY; capacity.div_ceil(LANES) * LANES],
            slot_of: vec![NO_SLOT; n_expert],
            fresh: vec![false; n_expert],
            pins: Vec::with_capacity(64),
            acc: None,
            flat: capacity <= FLAT_MAX,
        }
    }

    /// The unpinned slot whose expert comes first in eviction order: the
    /// smallest score, then key and id among equal scores.
    fn victim<S: Scorer>(&mut self, scorer: &S) -> Option<usize> {
        let (expert, p) = (&self.expert, &self.p);
        // Key ties are `step << 16 | id` with fewer than 2^32 steps, so
        // `tie << 16 | id` orders by tie, then id, in one integer.
        let tie = |w: usize| {
            let e = expert[w];
            (scorer.key(e as usize).tie << 16) | u64::from(e)
        };
        if self.flat {
            let acc = self.acc.get_or_insert_with(|| lane_minima(p));
            let (w, least) = argmin(acc, p, tie);
            return (least != f64::INFINITY).then_some(w);
        }
        let least = p
            .iter()
            .fold(f64::INFINITY, |m, &x| if x < m { x } else { m });
        if least == f64::INFINITY {
            return None;
        }
        (0..expert.len())
            .filter(|&w| p[w] == least)
            .min_by_key(|&w| tie(w))
    }

    /// Sets slot `w`'s score, keeping the lane minima current.
    #[inline]
    fn set(&mut self, w: usize, x: f64) {
        self.p[w] = x;
        if let Some(acc) = &mut self.acc {
            acc[w % LANES] = lane_min(&self.p, w % LANES);
        }
    }

    fn pin(&mut self, w: usize) {
        if self.p[w] != f64::INFINITY {
            self.set(w, f64::INFINITY);
            self.pins.push(w);
        }
    }

    /// Ends a phase: pinned slots take their experts' current scores.
    fn unpin_all<S: Scorer>(&mut self, scorer: &S) {
        self.acc = None;
        for w in self.pins.drain(..) {
            self.p[w] = scorer.key(self.expert[w] as usize).p;
        }
    }

    /// Puts `e` in slot `w` (a free one when `w == len`), evicting its
    /// expert, and pins it; returns whether a fresh (never used) expert was
    /// evicted.
    fn place(&mut self, w: usize, e: usize) -> bool {
        let mut wasted = false;
        if w == self.expert.len() {
            // A free slot holds `+inf` already: pinned from the start.
            self.expert.push(e as u32);
            self.pins.push(w);
        } else {
            let old = self.expert[w] as usize;
            self.slot_of[old] = NO_SLOT;
            wasted = std::mem::take(&mut self.fresh[old]);
            self.expert[w] = e as u32;
            self.pin(w);
        }
        self.slot_of[e] = w as u32;
        wasted
    }
}

/// The scored policies with prefetch.
fn scored<S: Scorer>(
    steps: &Steps,
    capacity: usize,
    pf: &Prefetch,
    scorer: &mut S,
) -> PrefetchCounts {
    let n = steps.n_expert;
    let mut c = Slots::new(capacity, n);
    let credits = scorer.credits(steps);
    let mut out = PrefetchCounts::default();
    let mut missed: Vec<usize> = Vec::with_capacity(64);
    for s in 0..steps.len() {
        if scorer.begin_step(s).is_some() {
            for (p, &e) in c.p.iter_mut().zip(&c.expert) {
                *p = scorer.key(e as usize).p;
            }
        }
        let list = pf.list(s, capacity);
        for &e in list {
            let w = c.slot_of[e as usize];
            if w != NO_SLOT {
                c.pin(w as usize);
            }
        }
        for &e in list {
            let e16 = e;
            let e = e as usize;
            if c.slot_of[e] != NO_SLOT {
                continue;
            }
            scorer.prefetched(e16, s);
            let w = if c.expert.len() < capacity {
                c.expert.len()
            } else {
                // The list fits the capacity, so an unpinned slot exists.
                c.victim(scorer).expect("an unpinned slot")
            };
            out.wasted += u64::from(c.place(w, e));
            c.fresh[e] = true;
            out.loads += 1;
        }
        c.unpin_all(scorer);
        for i in steps.range(s) {
            let e = steps.expert[i];
            scorer.request(i, e, credits[i], s);
            let w = c.slot_of[e as usize];
            if w == NO_SLOT {
                missed.push(e as usize);
            } else {
                c.pin(w as usize);
                out.useful += u64::from(std::mem::take(&mut c.fresh[e as usize]));
            }
        }
        if scorer.credits_near() {
            let j = steps.near_range(s);
            for (&e, &uses) in steps.near[j.clone()].iter().zip(&steps.near_uses[j]) {
                let score = scorer.near(e, uses);
                let w = c.slot_of[e as usize];
                if w != NO_SLOT && c.p[w as usize] != f64::INFINITY {
                    c.p[w as usize] = score;
                }
            }
        }
        out.demand.misses += missed.len() as u64;
        for &e in &missed {
            let w = if c.expert.len() < capacity {
                Some(c.expert.len())
            } else {
                c.victim(scorer)
            };
            out.wasted += u64::from(match w {
                Some(w) => c.place(w, e),
                None => keep_best(&mut c, scorer, e),
            });
        }
        missed.clear();
        c.unpin_all(scorer);
    }
    out.wasted += c.fresh.iter().filter(|&&f| f).count() as u64;
    out.demand.overflow_steps = steps.overflow_steps(capacity);
    out.demand.requests = steps.requests();
    out
}

/// Every slot holds an expert of the step: `e` replaces the first of them in
/// eviction order if it would come after it, else it is not kept.
fn keep_best<S: Scorer>(c: &mut Slots, scorer: &S, e: usize) -> bool {
    let mut w = 0;
    for x in 1..c.expert.len() {
        let (a, b) = (c.expert[x], c.expert[w]);
        if before(scorer.key(a as usize), a, scorer.key(b as usize), b) {
            w = x;
        }
    }
    let worst = c.expert[w];
    before(scorer.key(worst as usize), worst, scorer.key(e), e as u32) && c.place(w, e)
}

/// `static` with prefetch: the pinned experts stay; a listed expert outside
/// them is loaded for its step only.
fn fixed(steps: &Steps, capacity: usize, fit: &[u64], pf: &Prefetch) -> PrefetchCounts {
    let resident = pinned::pinned(fit, steps.n_expert, capacity);
    let mut loaded = vec![false; steps.n_expert];
    let mut out = PrefetchCounts::default();
    for s in 0..steps.len() {
        let list = pf.list(s, capacity);
        for &e in list {
            if !resident[e as usize] {
                loaded[e as usize] = true;
                out.loads += 1;
            }
        }
        for &e in &steps.expert[steps.range(s)] {
            let e = e as usize;
            if resident[e] {
                continue;
            }
            if loaded[e] {
                loaded[e] = false;
                out.useful += 1;
            } else {
                out.demand.misses += 1;
            }
        }
        for &e in list {
            out.wasted += u64::from(std::mem::take(&mut loaded[e as usize]));
        }
    }
    out.demand.overflow_steps = steps.overflow_steps(capacity);
    out.demand.requests = steps.requests();
    out
}
