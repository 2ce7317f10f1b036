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
    let n = steps.n_expert;
    let head = n; // sentinel: next[head] is the most recent, prev[head] the least
    let mut next = vec![head as u16; n + 1];
    let mut prev = vec![head as u16; n + 1];
    let mut resident = vec![false; n];
    let mut size = 0usize;
    let mut misses = 0u64;
    let mut overflow_steps = 0u64;
    for s in 0..steps.len() {
        let r = steps.range(s);
        if r.len() > capacity {
            overflow_steps += 1;
        }
        for &e in &steps.expert[r] {
            let e = e as usize;
            if resident[e] {
                let (p, q) = (prev[e] as usize, next[e] as usize);
                next[p] = q as u16;
                prev[q] = p as u16;
            } else {
                resident[e] = true;
                misses += 1;
                size += 1;
            }
            let first = next[head] as usize;
            next[e] = first as u16;
            prev[e] = head as u16;
            prev[first] = e as u16;
            next[head] = e as u16;
        }
        while size > capacity {
            let last = prev[head] as usize;
            let p = prev[last] as usize;
            next[p] = head as u16;
            prev[head] = p as u16;
            resident[last] = false;
            size -= 1;
        }
    }
    Counts {
        requests: steps.requests(),
        misses,
        overflow_steps,
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
