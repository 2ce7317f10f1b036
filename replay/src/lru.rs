//! LRU: an O(1) intrusive list per capacity, and the miss curve for every
//! capacity in one pass from stack distances.
//!
//! Within a step the experts are moved to the front in request order, so the
//! last one requested is the most recent; the cache then drops least-recent
//! experts until it holds `capacity`. A capacity-`C` cache therefore always
//! holds the `C` most recent experts, which is what makes the one-pass curve
//! exact.

use super::steps::Steps;
use super::Counts;

/// Replays `steps` through an LRU cache of `capacity` experts.
pub fn simulate(steps: &Steps, capacity: usize) -> Counts {
    let mut list = LruList::new(steps.n_expert);
    let mut misses = 0u64;
    for s in 0..steps.len() {
        for &e in &steps.expert[steps.range(s)] {
            misses += u64::from(!list.touch(e as usize));
        }
        list.evict_to(capacity, |_| {});
    }
    Counts {
        requests: steps.requests(),
        misses,
        overflow_steps: steps.overflow_steps(capacity),
    }
}

/// A layer's resident experts in recency order, on an intrusive list: O(1)
/// use and eviction. Shared by [`simulate`] and the prefetch replay.
pub(crate) struct LruList {
    /// `next[head]` is the most recent expert, `prev[head]` the least
    /// (`head`, the sentinel, is the number of experts).
    next: Vec<u16>,
    prev: Vec<u16>,
    resident: Vec<bool>,
    size: usize,
}

impl LruList {
    /// An empty cache of a layer with `n_expert` experts.
    pub(crate) fn new(n_expert: usize) -> LruList {
        LruList {
            next: vec![n_expert as u16; n_expert + 1],
            prev: vec![n_expert as u16; n_expert + 1],
            resident: vec![false; n_expert],
            size: 0,
        }
    }

    /// Makes `e` the most recent expert (loading it if absent); whether it
    /// was resident before.
    pub(crate) fn touch(&mut self, e: usize) -> bool {
        let was = self.resident[e];
        if was {
            self.unlink(e);
        } else {
            self.resident[e] = true;
            self.size += 1;
        }
        let head = self.resident.len();
        let first = self.next[head] as usize;
        self.next[e] = first as u16;
        self.prev[e] = head as u16;
        self.prev[first] = e as u16;
        self.next[head] = e as u16;
        was
    }

    /// Drops the least recent experts until at most `capacity` remain,
    /// telling `evicted` each one.
    pub(crate) fn evict_to(&mut self, capacity: usize, mut evicted: impl FnMut(usize)) {
        while self.size > capacity {
            let last = self.prev[self.resident.len()] as usize;
            self.unlink(last);
            self.resident[last] = false;
            self.size -= 1;
            evicted(last);
        }
    }

    fn unlink(&mut self, e: usize) {
        let (p, q) = (self.prev[e] as usize, self.next[e] as usize);
        self.next[p] = q as u16;
        self.prev[q] = p as u16;
    }
}

/// LRU misses for every capacity `0..=n_expert`, from one pass.
///
/// The stack distance of a request is the number of distinct experts used
/// more recently (before its step); it misses in a capacity-`C` cache exactly
/// when that distance is `>= C` or the expert was never used. Distances come
/// from a Fenwick tree over request times: O(log T) per request.
pub fn miss_curve(steps: &Steps) -> Vec<u64> {
    let n = steps.n_expert;
    let total = steps.expert.len();
    let mut fenwick = Fenwick::new(total + 1);
    let mut last = vec![0usize; n]; // 0: never used; else the time of the last use
    let mut hist = vec![0u64; n + 1];
    let mut cold = 0u64;
    let mut now = 0usize;
    let mut dist = Vec::new();
    for s in 0..steps.len() {
        let r = steps.range(s);
        dist.clear();
        let live = fenwick.prefix(now);
        for &e in &steps.expert[r.clone()] {
            let t = last[e as usize];
            if t == 0 {
                cold += 1;
            } else {
                dist.push(live - fenwick.prefix(t));
            }
        }
        for &d in &dist {
            hist[d as usize] += 1;
        }
        for &e in &steps.expert[r] {
            let e = e as usize;
            if last[e] != 0 {
                fenwick.add(last[e], -1);
            }
            now += 1;
            last[e] = now;
            fenwick.add(now, 1);
        }
    }
    // misses(C) = cold + #(distance >= C)
    let mut curve = vec![0u64; n + 1];
    let mut tail = 0u64;
    for c in (0..=n).rev() {
        tail += hist[c];
        curve[c] = cold + tail;
    }
    curve
}

/// A Fenwick (binary indexed) tree of counts over positions `1..len`.
struct Fenwick {
    tree: Vec<i64>,
}

impl Fenwick {
    fn new(len: usize) -> Fenwick {
        Fenwick {
            tree: vec![0; len + 1],
        }
    }

    fn add(&mut self, mut i: usize, v: i64) {
        while i < self.tree.len() {
            self.tree[i] += v;
            i += i & i.wrapping_neg();
        }
    }

    /// Sum over positions `1..=i`.
    fn prefix(&self, mut i: usize) -> i64 {
        let mut s = 0;
        while i > 0 {
            s += self.tree[i];
            i &= i - 1;
        }
        s
    }
}
