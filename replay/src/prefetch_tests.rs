//! Prefetch replay against the eager reference ([`super::prefetch_reference`])
//! and by the rules it must keep.

use super::predict::{self, Predictor};
use super::prefetch::{self, Prefetch};
use super::prefetch_reference::eager;
use super::steps::{Steps, TokenReqs, NONE};
use super::synthetic::{raw_layer, Shape};
use super::trace_io::{Ahead, RawLayer};
use super::{simulate, Cache, Policy, PolicyParams};

fn shape(n_expert: usize, k: usize, tokens: usize) -> Shape {
    Shape {
        n_expert,
        k,
        n: (2 * k).min(n_expert),
        tokens,
        chunk_len: 64,
        ..Shape::audited()
    }
}

/// Token steps of a synthetic layer, with near picks.
fn token_steps(raw: &RawLayer, n_expert: usize) -> Steps {
    let t: TokenReqs = super::keep::requests(raw, n_expert, None, 2);
    Steps::build(&t, 1)
}

/// Guesses as a lookahead column might give them: half the slots a selected
/// expert of the token, a quarter empty, a quarter a random id.
fn noisy_guesses(raw: &RawLayer, n_expert: usize, seed: u64, width: usize) -> Vec<u16> {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as usize
    };
    let mut out = Vec::new();
    for t in 0..raw.tokens() {
        let sel = &raw.selected[t * raw.k..(t + 1) * raw.k];
        for j in 0..width {
            // Half the guesses right (a selected expert), some empty.
            out.push(match next() % 4 {
                0 | 1 => sel[j % sel.len()],
                2 => NONE,
                _ => (next() % n_expert) as u16,
            });
        }
    }
    out
}

#[test]
fn prefetch_replay_equals_the_eager_reference_on_generated_traces() {
    let params = PolicyParams::default();
    let mut cells = 0;
    for (seed, n_expert, k) in [(1u64, 16usize, 2usize), (2, 16, 4), (3, 12, 3)] {
        let raw = raw_layer(&shape(n_expert, k, 400), seed);
        let steps = token_steps(&raw, n_expert);
        let fit = super::pinned::traffic(&steps);
        for width in [k, 2 * k] {
            let g = noisy_guesses(&raw, n_expert, seed * 7 + width as u64, width);
            for m in [1, k, 2 * k] {
                let pf = Prefetch::from_guesses(&g, width, m);
                for policy in Policy::ALL {
                    for capacity in [1, 3, 5, 8, n_expert] {
                        let cache = Cache::new(policy, capacity, &params, &fit);
                        let fast = prefetch::simulate(cache, &steps, &pf);
                        let slow = eager(cache, &steps, &pf);
                        assert_eq!(
                            fast, slow,
                            "{policy} C={capacity} m={m} width={width} seed={seed}"
                        );
                        assert_eq!(
                            fast.loads,
                            fast.useful + fast.wasted,
                            "{policy} C={capacity}"
                        );
                        cells += 1;
                    }
                }
            }
        }
    }
    assert_eq!(cells, 3 * 2 * 3 * 8 * 5);
}

/// Caches of several slots per lane of the flat engine, and past
/// [`super::scored::FLAT_MAX`] (the scanned engine), on many experts.
#[test]
fn prefetch_replay_equals_the_eager_reference_on_large_caches() {
    let params = PolicyParams::default();
    let (n_expert, k) = (2000usize, 16usize);
    assert!(n_expert > super::scored::FLAT_MAX);
    let raw = raw_layer(&shape(n_expert, k, 800), 11);
    let steps = token_steps(&raw, n_expert);
    let fit = super::pinned::traffic(&steps);
    let g = noisy_guesses(&raw, n_expert, 5, 2 * k);
    let pf = Prefetch::from_guesses(&g, 2 * k, 2 * k);
    for policy in Policy::ALL {
        for capacity in [20, 100, 520, 700] {
            let cache = Cache::new(policy, capacity, &params, &fit);
            let fast = prefetch::simulate(cache, &steps, &pf);
            let slow = eager(cache, &steps, &pf);
            assert_eq!(fast, slow, "{policy} C={capacity}");
            if policy == Policy::Lru {
                // More misses than slots: every cache here evicts.
                assert!(fast.demand.misses > capacity as u64, "C={capacity}");
            }
        }
    }
}

#[test]
fn without_guesses_prefetch_replay_is_the_plain_replay() {
    let params = PolicyParams::default();
    let raw = raw_layer(&shape(16, 4, 600), 11);
    let steps = token_steps(&raw, 16);
    let fit = super::pinned::traffic(&steps);
    let none = Prefetch::from_guesses(&vec![NONE; steps.len()], 1, 4);
    for policy in Policy::ALL {
        for capacity in [0, 2, 4, 7, 12] {
            let cache = Cache::new(policy, capacity, &params, &fit);
            let got = prefetch::simulate(cache, &steps, &none);
            assert_eq!(
                got.demand,
                simulate(policy, &steps, capacity, &params, &fit),
                "{policy} C={capacity}"
            );
            assert_eq!((got.loads, got.useful, got.wasted), (0, 0, 0));
        }
    }
}

/// The oracle loads each step's actual experts first: no demand miss is
/// left when a step fits the cache, and no load is wasted.
#[test]
fn the_oracle_prefetcher_leaves_no_miss_and_wastes_no_load() {
    let params = PolicyParams::default();
    let raw = raw_layer(&shape(16, 4, 500), 5);
    let steps = token_steps(&raw, 16);
    let fit = super::pinned::traffic(&steps);
    let g = predict::guesses(Predictor::Oracle, &raw, None).unwrap();
    let pf = Prefetch::from_guesses(&g.ids, g.width, 4);
    for policy in Policy::ALL {
        for capacity in [4, 8] {
            let base = simulate(policy, &steps, capacity, &params, &fit);
            let cache = Cache::new(policy, capacity, &params, &fit);
            let c = prefetch::simulate(cache, &steps, &pf);
            assert_eq!(c.demand.misses, 0, "{policy} C={capacity}");
            assert_eq!(c.wasted, 0, "{policy} C={capacity}");
            if policy == Policy::Lru {
                assert_eq!(c.loads, base.misses, "LRU's loads are its misses");
            }
        }
    }
}

/// The guesses for layer L come from layer L - d's row of the same token:
/// a merge join on (chunk, pos) that leaves tokens the source lacks empty.
#[test]
fn guesses_join_the_source_layer_by_chunk_and_position() {
    let target = RawLayer {
        k: 1,
        n: 1,
        chunk: vec![0, 0, 1],
        pos: vec![0, 1, 0],
        selected: vec![3, 4, 5],
        topn: vec![3, 4, 5],
        topn_prob: vec![1.0; 3],
        ahead: Vec::new(),
    };
    let source = RawLayer {
        k: 1,
        n: 2,
        chunk: vec![0, 1],
        pos: vec![1, 0],
        selected: vec![9, 8],
        topn: vec![9, 4, 8, 5],
        topn_prob: vec![0.5; 4],
        ahead: vec![Ahead {
            distance: 1,
            width: 2,
            ids: vec![4, 7, NONE, NONE],
        }],
    };
    let same = predict::guesses(Predictor::SameLayer(1), &target, Some(&source)).unwrap();
    assert_eq!(same.ids, vec![NONE, NONE, 9, 4, 8, 5]);
    let ahead = predict::guesses(Predictor::Lookahead(1), &target, Some(&source)).unwrap();
    assert_eq!(ahead.ids, vec![NONE, NONE, 4, 7, NONE, NONE]);
    assert!(predict::guesses(Predictor::Lookahead(2), &target, Some(&source)).is_none());
    // Recall: token 1 guessed [4, 7] with 4 selected; the others no guess.
    let r = predict::recall(&target, &ahead, 2);
    assert_eq!((r.tokens, r.selected, r.hit), (1, 1, 1));
    let r = predict::recall(&target, &same, 1);
    assert_eq!((r.tokens, r.selected, r.hit), (2, 2, 0));
    let r = predict::recall(&target, &same, 2);
    assert_eq!((r.tokens, r.selected, r.hit), (2, 2, 2));
}

#[test]
fn prefetch_lists_take_the_first_m_distinct_guesses() {
    let pf = Prefetch::from_guesses(&[3, 3, NONE, 5, 6, 1, 1, 2], 4, 2);
    assert_eq!(pf.start, vec![0, 2, 4]);
    assert_eq!(pf.expert, vec![3, 5, 6, 1]);
}
