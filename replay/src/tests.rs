//! Replay tests: hand-computed answers, the eager oracle, the brute-force
//! optimum, and the one-pass LRU curve.

use super::ema::{Credit, LazyEma};
use super::keep::{requests, KeptLayer};
use super::lru;
use super::pinned;
use super::policy::{simulate, Policy, PolicyParams};
use super::reference;
use super::reference::{eager, optimum};
use super::scored;
use super::steps::{Steps, TokenReqs, NONE};
use super::synthetic::{raw_layer, Shape};
use super::trace_io::RawLayer;
use numbers::routing::Routing;
use numbers::splitmix::SplitMix64;

/// Tokens of one chunk; token `t` requests `tokens[t]`, ranked in that order
/// with router probabilities `probs[t]` (or 1/k each) and near picks `near[t]`.
fn reqs(n_expert: usize, tokens: &[&[u16]], probs: &[&[f32]], near: &[&[u16]]) -> TokenReqs {
    let k = tokens[0].len();
    let n_near = near.iter().map(|n| n.len()).max().unwrap_or(0);
    let mut t = TokenReqs {
        n_expert,
        k,
        n_near,
        chunk: vec![0; tokens.len()],
        ..TokenReqs::default()
    };
    for (i, experts) in tokens.iter().enumerate() {
        for (j, &e) in experts.iter().enumerate() {
            t.expert.push(e);
            t.rank.push(j as u16 + 1);
            t.prob.push(probs.get(i).map_or(1.0 / k as f32, |p| p[j]));
        }
        let mut picks = near.get(i).map_or(vec![], |n| n.to_vec());
        picks.resize(n_near, NONE);
        t.near.extend(picks);
    }
    t
}

fn single(tokens: &[u16]) -> Vec<[u16; 1]> {
    tokens.iter().map(|&e| [e]).collect()
}

fn token_steps(n_expert: usize, tokens: &[u16]) -> Steps {
    let one = single(tokens);
    let refs: Vec<&[u16]> = one.iter().map(|t| t.as_slice()).collect();
    Steps::build(&reqs(n_expert, &refs, &[], &[]), 1)
}

fn misses(policy: Policy, steps: &Steps, capacity: usize, decay: f64) -> u64 {
    let params = PolicyParams {
        ema_decay: decay,
        near_pick_n: 1,
        near_pick_credit: 0.5,
    };
    simulate(policy, steps, capacity, &params, &[]).misses
}

// --- hand-computed answers (worked out step by step in the comments) ---

/// Trace 0 1 2 0 1 3 0 1, capacity 2.
/// LRU misses all 8. LFU (counts, ties to the older use) keeps 0 and 1 at
/// the end: misses 7. Belady: hits at steps 3 and 6, misses 6. EMA with decay
/// 0.5 behaves like LRU here: 8.
#[test]
fn hand_trace_cycling_three_experts() {
    let s = token_steps(4, &[0, 1, 2, 0, 1, 3, 0, 1]);
    assert_eq!(misses(Policy::Lru, &s, 2, 0.5), 8);
    assert_eq!(misses(Policy::Lfu, &s, 2, 0.5), 7);
    assert_eq!(misses(Policy::Belady, &s, 2, 0.5), 6);
    assert_eq!(misses(Policy::Ema, &s, 2, 0.5), 8);
}

/// Trace 0 0 0 1 2 0 1 2, capacity 2.
/// LRU: misses at steps 0,3,4,5,6,7 = 6. LFU: expert 0 (count 3) is never
/// evicted: misses at 0,3,4,6,7 = 5. EMA 0.5 forgets expert 0 by step 4
/// (0.4375 < 0.5): 6. EMA 0.9 keeps it (2.1951 > 0.9): 5. Belady: 4.
#[test]
fn hand_trace_with_a_heavy_hitter() {
    let s = token_steps(4, &[0, 0, 0, 1, 2, 0, 1, 2]);
    assert_eq!(misses(Policy::Lru, &s, 2, 0.5), 6);
    assert_eq!(misses(Policy::Lfu, &s, 2, 0.5), 5);
    assert_eq!(misses(Policy::Ema, &s, 2, 0.5), 6);
    assert_eq!(misses(Policy::Ema, &s, 2, 0.9), 5);
    assert_eq!(misses(Policy::Belady, &s, 2, 0.5), 4);
}

/// Tokens 0 (p 0.9, rank 1), 1 (p 0.2, rank 3), 2 (p 0.5, rank 1), 1;
/// capacity 2, decay 0.5. At step 2, router_ema has 0: 0.225, 1: 0.1 and
/// evicts 1, which step 3 needs again: 4 misses. inverse_router_ema has
/// 0: 0.25, 1: 1/6 and also evicts 1: 4. Plain EMA has 0: 0.25, 1: 0.5 and
/// evicts 0: 3 misses.
#[test]
fn hand_trace_router_credits() {
    let mut t = reqs(
        3,
        &[&[0], &[1], &[2], &[1]],
        &[&[0.9], &[0.2], &[0.5], &[0.2]],
        &[],
    );
    t.rank = vec![1, 3, 1, 3];
    let s = Steps::build(&t, 1);
    assert_eq!(misses(Policy::RouterEma, &s, 2, 0.5), 4);
    assert_eq!(misses(Policy::InverseRouterEma, &s, 2, 0.5), 4);
    assert_eq!(misses(Policy::Ema, &s, 2, 0.5), 3);
}

/// Tokens (request, near pick): (0, 1), (1, 0), (2, 0), (0, -); capacity 2,
/// decay 0.5, near credit 0.5. near_pick_ema at step 2: 0: 0.5 + 0.5 = 1.0,
/// 1: 0.625, so it evicts 1 and step 3 hits: 3 misses. Plain EMA: 0: 0.25,
/// 1: 0.5, evicts 0: 4 misses.
#[test]
fn hand_trace_near_picks() {
    let t = reqs(4, &[&[0], &[1], &[2], &[0]], &[], &[&[1], &[0], &[0], &[]]);
    let s = Steps::build(&t, 1);
    assert_eq!(misses(Policy::NearPickEma, &s, 2, 0.5), 3);
    assert_eq!(misses(Policy::Ema, &s, 2, 0.5), 4);
}

/// Tokens 0 1 | 2 0 | 1 2 in ubatches of 2, capacity 2. LRU: step 0 loads
/// both; step 1 hits 0, loads 2, evicts 1; step 2 loads 1, hits 2: 4 misses.
/// Per token the same trace misses 6 times.
#[test]
fn hand_trace_ubatch_steps_need_the_union_resident() {
    let one = single(&[0, 1, 2, 0, 1, 2]);
    let refs: Vec<&[u16]> = one.iter().map(|t| t.as_slice()).collect();
    let t = reqs(3, &refs, &[], &[]);
    let ub = Steps::build(&t, 2);
    assert_eq!(ub.start, vec![0, 2, 4, 6]);
    assert_eq!(misses(Policy::Lru, &ub, 2, 0.5), 4);
    assert_eq!(misses(Policy::Lru, &Steps::build(&t, 1), 2, 0.5), 6);
    for p in Policy::ALL {
        assert_eq!(
            misses(p, &ub, 2, 0.9),
            eager(p, &ub, 2, &params(0.9)).misses,
            "{p}"
        );
    }
}

/// A ubatch never spans chunks, and repeated experts merge with summed credits.
#[test]
fn steps_group_by_chunk_and_merge_repeats() {
    let mut t = reqs(4, &[&[0, 1], &[1, 2], &[3, 0], &[1, 3]], &[], &[]);
    t.chunk = vec![0, 0, 0, 1];
    let s = Steps::build(&t, 2);
    assert_eq!(s.start, vec![0, 3, 5, 7]);
    assert_eq!(s.expert, vec![0, 1, 2, 3, 0, 1, 3]);
    assert_eq!(s.uses, vec![1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    // ranks: 0 is rank 1, 1 is rank 2 then rank 1
    assert_eq!(s.inv_rank[1], 0.5 + 1.0);
    assert_eq!(s.next_use(), vec![1, 2, 3, 2, 3, 3, 3]);
}

/// Three experts in one step, capacity 2: three misses, the step overflows,
/// and the cache keeps the two best of the step.
#[test]
fn overflowing_step_counts_every_miss() {
    let t = reqs(4, &[&[0, 1, 2], &[2, 3, 0]], &[], &[]);
    let s = Steps::build(&t, 1);
    for p in Policy::ALL {
        let c = simulate(p, &s, 2, &params(0.9), &[]);
        assert_eq!(c.overflow_steps, 2, "{p}");
        assert_eq!(c, eager(p, &s, 2, &params(0.9)), "{p}");
    }
    // LRU keeps 1 and 2 (the last two requested) after step 0: step 1 hits 2 only.
    assert_eq!(misses(Policy::Lru, &s, 2, 0.9), 5);
}

// --- keep maps and forced misses ---

/// k = 2, top-4. Token 0: top [0 1 2 3], only 1 kept: one forced miss.
/// Token 1: top [4 5 0 1]: 5 and 1 kept. Token 2: top [0 2 3 4]: none kept,
/// two forced misses. 3 forced misses in all.
#[test]
fn keep_map_with_too_few_survivors_forces_misses() {
    let raw = RawLayer {
        k: 2,
        n: 4,
        chunk: vec![0, 0, 0],
        selected: vec![0, 1, 4, 5, 0, 2],
        topn: vec![0, 1, 2, 3, 4, 5, 0, 1, 0, 2, 3, 4],
        topn_prob: vec![0.4, 0.3, 0.2, 0.1, 0.4, 0.3, 0.2, 0.1, 0.4, 0.3, 0.2, 0.1],
        ..RawLayer::default()
    };
    let kept: Vec<bool> = (0..6).map(|e| e == 1 || e == 5).collect();
    let routing = Routing::default();
    let rule = KeptLayer {
        kept: &kept,
        layer: 0,
        routing: &routing,
        gating: numbers::Gating::Softmax,
    };
    let t = requests(&raw, 6, Some(rule), 1);
    assert_eq!(t.expert, vec![1, NONE, 5, 1, NONE, NONE]);
    assert_eq!(t.rank, vec![2, 0, 2, 4, 0, 0]);
    assert_eq!(t.forced(), 3);
    let s = Steps::build(&t, 1);
    assert_eq!((s.forced, s.requests()), (3, 3));
    assert_eq!(s.near, Vec::<u16>::new());
    // Capacity 2: 1 and 5 load once each, 1 hits at token 1.
    assert_eq!(misses(Policy::Lru, &s, 2, 0.9), 2);
    // Without the keep map the selected experts are requested, near picks follow them.
    let t = requests(&raw, 6, None, 1);
    assert_eq!(t.expert, raw.selected);
    assert_eq!(t.forced(), 0);
    assert_eq!(t.near, vec![2, 0, 3]);
}

// --- oracles on random traces ---

fn params(decay: f64) -> PolicyParams {
    PolicyParams {
        ema_decay: decay,
        near_pick_n: 3,
        near_pick_credit: 0.5,
    }
}

fn random_steps(seed: u64, n_expert: usize, k: usize, tokens: usize, ubatch: usize) -> Steps {
    let shape = Shape {
        n_expert,
        k,
        n: (k + 3).min(n_expert),
        tokens,
        chunk_len: 64,
        skew: 2.0,
        reuse: 0.3,
    };
    let raw = raw_layer(&shape, seed);
    let mut kept = vec![true; n_expert];
    let mut rng = SplitMix64::new(seed ^ 0xabc);
    for _ in 0..n_expert / 4 {
        kept[rng.below(n_expert)] = false;
    }
    let routing = Routing::default();
    let keep = seed.is_multiple_of(2).then_some(KeptLayer {
        kept: &kept,
        layer: 0,
        routing: &routing,
        gating: numbers::Gating::Softmax,
    });
    Steps::build(&requests(&raw, n_expert, keep, 3), ubatch)
}

#[test]
fn every_policy_equals_the_eager_reference_on_random_traces() {
    for seed in 0..12 {
        let ubatch = [1, 1, 3, 8][seed as usize % 4];
        let s = random_steps(seed, 16, 3, 300, ubatch);
        for capacity in [1, 3, 6, 11] {
            for p in Policy::ALL {
                let decay = [0.5, 0.9, 0.99][seed as usize % 3];
                assert_eq!(
                    simulate(p, &s, capacity, &params(decay), &[]),
                    eager(p, &s, capacity, &params(decay)),
                    "{p} seed {seed} capacity {capacity} ubatch {ubatch}"
                );
            }
        }
    }
}

fn lazy_vs_eager(decay: f64, expect_rescale: bool) {
    let s = random_steps(7, 64, 4, 3200, 1);
    assert!(s.tokens >= 3000);
    for (policy, credit, near) in [
        (Policy::Ema, Credit::Uses, 0.0),
        (Policy::NearPickEma, Credit::Uses, 0.5),
        (Policy::RouterEma, Credit::RouterProb, 0.0),
        (Policy::InverseRouterEma, Credit::InverseRank, 0.0),
    ] {
        for capacity in [8, 16, 32] {
            let mut lazy = LazyEma::new(decay, credit, near);
            let fast = scored::simulate(&s, capacity, &mut lazy);
            let reference = eager(policy, &s, capacity, &params(decay));
            assert_eq!(
                fast, reference,
                "{policy} decay {decay} capacity {capacity}"
            );
            assert_eq!(
                lazy.rescales > 0,
                expect_rescale,
                "{policy} decay {decay}: {} rescales",
                lazy.rescales
            );
        }
    }
}

#[test]
fn lazy_ema_equals_eager_ema_at_decay_0_99() {
    lazy_vs_eager(0.99, false);
}

#[test]
fn lazy_ema_equals_eager_ema_at_decay_0_9_through_rescales() {
    lazy_vs_eager(0.9, true);
}

#[test]
fn belady_is_never_worse_than_any_policy_on_random_traces() {
    for seed in 100..130 {
        let ubatch = [1, 2, 4][seed as usize % 3];
        let s = random_steps(seed, 24, 4, 400, ubatch);
        let widest = (0..s.len()).map(|i| s.range(i).len()).max().unwrap();
        for capacity in [widest, widest + 3, 20] {
            let b = misses(Policy::Belady, &s, capacity, 0.9);
            // `static` is no demand cache: it starts with its experts
            // resident and never loads one, so it can beat Belady.
            for p in Policy::ALL.into_iter().filter(|&p| p != Policy::Static) {
                let m = misses(p, &s, capacity, 0.9);
                assert!(
                    b <= m,
                    "belady {b} > {p} {m}: seed {seed} capacity {capacity}"
                );
            }
        }
    }
}

#[test]
fn belady_equals_the_brute_force_optimum_on_tiny_traces() {
    let mut rng = SplitMix64::new(5);
    for case in 0..60 {
        let n_expert = 5 + case % 3;
        let k = 1 + case % 2;
        let tokens: Vec<Vec<u16>> = (0..10)
            .map(|_| {
                let mut t: Vec<u16> = Vec::new();
                while t.len() < k {
                    let e = rng.below(n_expert) as u16;
                    if !t.contains(&e) {
                        t.push(e);
                    }
                }
                t
            })
            .collect();
        let refs: Vec<&[u16]> = tokens.iter().map(|t| t.as_slice()).collect();
        let s = Steps::build(&reqs(n_expert, &refs, &[], &[]), 1 + case % 2);
        let widest = (0..s.len()).map(|i| s.range(i).len()).max().unwrap();
        for capacity in widest..=widest + 2 {
            assert_eq!(
                misses(Policy::Belady, &s, capacity, 0.9),
                optimum(&s, capacity),
                "case {case} capacity {capacity}: {tokens:?}"
            );
        }
    }
}

#[test]
fn one_pass_lru_curve_equals_per_capacity_runs() {
    for (seed, ubatch) in [(1, 1), (2, 1), (3, 4), (4, 16)] {
        let s = random_steps(seed, 40, 5, 600, ubatch);
        let curve = lru::miss_curve(&s);
        assert_eq!(curve.len(), 41);
        for (c, &m) in curve.iter().enumerate() {
            assert_eq!(
                m,
                lru::simulate(&s, c).misses,
                "seed {seed} ubatch {ubatch} capacity {c}"
            );
        }
        assert_eq!(curve[0], s.requests());
    }
}

#[test]
fn flat_and_tree_engines_equal_the_eager_reference() {
    use super::scored::{simulate_flat, simulate_tree, Belady, Lfu, Scorer};
    use super::steps::Steps as S;
    fn both<T: Scorer>(s: &S, capacity: usize, make: impl Fn() -> T) -> [super::Counts; 2] {
        [
            simulate_flat(s, capacity, &mut make()),
            simulate_tree(s, capacity, &mut make()),
        ]
    }
    for seed in 200..208 {
        let ubatch = [1, 1, 3, 8][seed as usize % 4];
        let s = random_steps(seed, 40, 4, 2000, ubatch);
        let decay = [0.5, 0.9, 0.99][seed as usize % 3];
        let ema = |credit, near| move || LazyEma::new(decay, credit, near);
        for capacity in [1, 5, 9, 17, 30] {
            let p = params(decay);
            let runs = [
                (Policy::Lfu, both(&s, capacity, Lfu::default)),
                (Policy::Ema, both(&s, capacity, ema(Credit::Uses, 0.0))),
                (
                    Policy::NearPickEma,
                    both(&s, capacity, ema(Credit::Uses, 0.5)),
                ),
                (
                    Policy::RouterEma,
                    both(&s, capacity, ema(Credit::RouterProb, 0.0)),
                ),
                (
                    Policy::InverseRouterEma,
                    both(&s, capacity, ema(Credit::InverseRank, 0.0)),
                ),
                (Policy::Belady, both(&s, capacity, || Belady::new(&s))),
            ];
            for (policy, [flat, tree]) in runs {
                let reference = eager(policy, &s, capacity, &p);
                assert_eq!(
                    flat, reference,
                    "flat {policy} seed {seed} capacity {capacity}"
                );
                assert_eq!(
                    tree, reference,
                    "tree {policy} seed {seed} capacity {capacity}"
                );
            }
        }
    }
}

/// `static` pins the experts with the most fit traffic: fit traffic
/// [1, 9, 9, 4] at capacity 2 pins 1 and 2 (a tie goes to the lower id at
/// capacity 1). Trace 0 1 | 2 3 | 1 2 per ubatch of 2: 0 and 3 miss.
#[test]
fn static_pins_the_experts_with_the_most_fit_traffic() {
    let one = single(&[0, 1, 2, 3, 1, 2]);
    let refs: Vec<&[u16]> = one.iter().map(|t| t.as_slice()).collect();
    let s = Steps::build(&reqs(4, &refs, &[], &[]), 2);
    let fit = [1, 9, 9, 4];
    assert_eq!(pinned::pinned(&fit, 4, 2), vec![false, true, true, false]);
    assert_eq!(pinned::pinned(&fit, 4, 1), vec![false, true, false, false]);
    let c = simulate(Policy::Static, &s, 2, &params(0.9), &fit);
    assert_eq!((c.requests, c.misses, c.overflow_steps), (6, 2, 0));
    assert_eq!(c, reference::eager_static(&s, 2, &fit));
    assert_eq!(pinned::traffic(&s), vec![1, 2, 2, 1]);
    for seed in 0..6 {
        let s = random_steps(seed, 16, 3, 200, [1, 4][seed as usize % 2]);
        let fit = pinned::traffic(&random_steps(seed + 50, 16, 3, 200, 1));
        for capacity in [0, 1, 5, 16] {
            assert_eq!(
                simulate(Policy::Static, &s, capacity, &params(0.9), &fit),
                reference::eager_static(&s, capacity, &fit),
                "seed {seed} capacity {capacity}"
            );
        }
    }
}
