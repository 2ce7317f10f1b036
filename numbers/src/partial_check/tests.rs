use super::*;
use crate::imatrix::{Imatrix, ImatrixEntry};
use crate::partial::{BackendToHost, PARTIAL_FORMAT_VERSION};
use crate::stats::MoeShape;
use crate::{ChunkRange, Gating, Split};
use std::collections::BTreeMap;

/// Two tokens of domain `en`, 4 experts, top-2: token 0 picks experts 0 and
/// 1, token 1 experts 1 and 2, every router probability 1/4; an importance
/// matrix of one dense weight with 3 columns.
fn honest() -> Partial {
    let shape = MoeShape {
        n_expert: 4,
        n_expert_used: 2,
        gating: Gating::Softmax,
        moe_layers: vec![1],
        routing: crate::routing::Routing::default(),
    };
    let mut experts = ExpertAccum::new(shape);
    let g = experts.group_mut(Split::Fit, "en");
    g.n_tokens = 2;
    let l = &mut g.layers[0];
    let s = |v: f64| ExactSum::from_f64(v).unwrap();
    l.count = vec![1, 2, 1, 0];
    l.prob_sum = vec![s(0.5); 4];
    l.weight_sum = vec![s(0.5), s(1.0), s(0.5), s(0.0)];
    l.ean_sum = vec![s(2.0), s(3.0), s(1.0), s(0.0)];
    l.reap_l2_sum = vec![s(1.0), s(1.5), s(0.5), s(0.0)];
    l.reap_l2_sq_sum = vec![s(1.0), s(1.25), s(0.25), s(0.0)];
    l.ean_max = vec![2.0, 2.0, 1.0, 0.0];
    l.act_max = vec![1.5, 0.0, 1.0, 0.0];
    let mut im = ImatrixEntry::new(3, 1);
    im.in_sum2 = vec![s(1.0), s(0.0), s(4.0)].into();
    im.in_sum = vec![s(0.0), s(0.0), s(-2.0)].into();
    im.counts = vec![2];
    Partial {
        format_version: PARTIAL_FORMAT_VERSION,
        model_sha256: "m".into(),
        corpus_sha256: "c".into(),
        backends: vec!["cpu".into()],
        chunks: vec![ChunkRange { start: 0, end: 1 }],
        experts,
        imatrix: Imatrix {
            entries: BTreeMap::from([("blk.1.ffn_gate_inp.weight".to_string(), im)]),
            chunk_count: 1,
            chunk_size: 2,
        },
        nonfinite_drops: BTreeMap::new(),
        trace_tokens: 2,
        trace_rows: 2,
        trace_parts: Vec::new(),
        chunk_stats: Vec::new(),
        backend_to_host: BackendToHost::default(),
        projection: None,
    }
}

fn layer(p: &mut Partial) -> &mut LayerAccum {
    &mut p.experts.groups.values_mut().next().unwrap().layers[0]
}

fn refused(p: &Partial) -> String {
    check_values(p, &Budget::for_corpus(1000)).unwrap_err()
}

#[test]
fn an_honest_partial_passes() {
    check_values(&honest(), &Budget::for_corpus(1000)).unwrap();
}

/// The reported attack: `prob_sum[0] = 2^126 - 1` decodes (it is in the
/// accumulator's range) but no merge with another partial can hold it.
#[test]
fn a_sum_no_merge_can_hold_is_refused() {
    let mut p = honest();
    layer(&mut p).prob_sum[0] = ExactSum((1i128 << 126) - 1);
    let e = refused(&p);
    assert!(
        e.contains("expert 0: prob_sum") && e.contains("beyond what 2 tokens"),
        "{e}"
    );
    // Inside the range but above what probabilities of 2 tokens allow.
    let mut p = honest();
    layer(&mut p).prob_sum[1] = ExactSum::from_f64(2.5).unwrap();
    assert!(refused(&p).contains("prob_sum 2.5 above its 2 tokens"));
}

/// A change to one layer's accumulators.
type Edit = fn(&mut LayerAccum);

#[test]
fn the_bounds_counts_imply_are_enforced() {
    let cases: Vec<(Edit, &str)> = vec![
        (|l| l.ean_sum[3] = ExactSum(1), "ean_sum 0.0000"),
        (|l| l.reap_l2_sum[2] = ExactSum::ZERO, "reap_l2_sum is 0"),
        (|l| l.ean_sum[0] = ExactSum(-1), "ean_sum -"),
        (
            // Inflated saliency whose square was not inflated with it.
            |l| l.reap_l2_sum[1] = ExactSum::from_f64(15.0).unwrap(),
            "Cauchy-Schwarz",
        ),
        (
            |l| l.prob_sum[0] = ExactSum::from_f64(0.25).unwrap(),
            "sum(prob_sum) = 1.75 for 2 tokens",
        ),
        // The largest output norm must be a norm, zero for an unselected
        // expert, and between the mean and the sum of the norms.
        (
            |l| l.ean_max[0] = f64::NAN,
            "expert 0: ean_max NaN is not a norm",
        ),
        (|l| l.ean_max[0] = -1.0, "ean_max -1 is not a norm"),
        (
            |l| l.ean_max[3] = 0.5,
            "expert 3: ean_max 0.5 for an expert no token",
        ),
        (|l| l.ean_max[1] = 3.5, "ean_max 3.5 above ean_sum 3"),
        (
            |l| l.ean_max[1] = 1.0,
            "ean_max 1 below ean_sum / count = 1.5",
        ),
        (|l| l.ean_max.truncate(3), "3 output maxima for 4 experts"),
        // The largest output element: a maximum from 0 of finite values,
        // zero for an unselected expert, at most the largest norm.
        (
            |l| l.act_max[0] = f64::INFINITY,
            "expert 0: act_max inf is not a maximum",
        ),
        (|l| l.act_max[1] = -0.5, "act_max -0.5 is not a maximum"),
        (
            |l| l.act_max[3] = 0.25,
            "expert 3: act_max 0.25 for an expert no token",
        ),
        (
            |l| l.act_max[2] = 1.01,
            "act_max 1.01 above ean_max 1: an element exceeds",
        ),
        (|l| l.act_max.push(0.0), "5 element maxima for 4 experts"),
    ];
    for (poison, expected) in cases {
        let mut p = honest();
        poison(layer(&mut p));
        let e = refused(&p);
        assert!(e.contains(expected), "{expected:?} not in {e}");
    }
}

#[test]
fn importance_matrix_entries_are_well_formed() {
    fn entry(p: &mut Partial) -> &mut ImatrixEntry {
        p.imatrix.entries.values_mut().next().unwrap()
    }
    let mut p = honest();
    entry(&mut p).in_sum2.pop();
    assert!(refused(&p).contains("1 counts, 2 sums of squares and 3 sums for [3, 1]"));
    let mut p = honest();
    entry(&mut p).in_sum.pop();
    assert!(refused(&p).contains("1 counts, 3 sums of squares and 2 sums for [3, 1]"));
    let mut p = honest();
    entry(&mut p).in_sum2[1] = ExactSum(-5);
    assert!(refused(&p).contains("column 1"));
    let mut p = honest();
    entry(&mut p).in_sum[2] = ExactSum(i128::MAX / 2);
    assert!(refused(&p).contains("matrix 0 column 2: sum "));
    let mut p = honest();
    let e = entry(&mut p);
    (e.counts[0], e.in_sum2) = (0, vec![ExactSum::ZERO; 3].into());
    assert!(refused(&p).contains("matrix 0 column 2: sum -2 over 0 rows"));
    let mut p = honest();
    entry(&mut p).counts[0] = u64::MAX;
    assert!(refused(&p).contains("counts 18446744073709551615 rows"));
}

/// Blocks of 16 sums cross matrices of 3 columns: each sum is checked
/// against its own matrix's count and named by its matrix and column.
#[test]
fn importance_matrix_sums_are_named_by_matrix_and_column_across_blocks() {
    let s = |v: f64| ExactSum::from_f64(v).unwrap();
    let with = |counts: Vec<u64>, poison: fn(&mut [ExactSum])| {
        let mut p = honest();
        let mut e = ImatrixEntry::new(3, 7);
        let mut sums = vec![s(1.0); 21];
        for m in (0..7).filter(|&m| counts[m] == 0) {
            sums[3 * m..3 * m + 3].fill(ExactSum::ZERO);
        }
        e.counts = counts;
        e.in_sum = sums.clone().into();
        poison(&mut sums);
        e.in_sum2 = sums.into();
        p.imatrix
            .entries
            .insert("blk.1.ffn_up_exps.weight".into(), e);
        p
    };
    let counts = vec![2, 2, 0, 2, 2, 0, 2];
    check_values(&with(counts.clone(), |_| ()), &Budget::for_corpus(1000)).unwrap();
    // Sum 17, matrix 5 (no rows) column 2: in the second block of 16.
    let e = refused(&with(counts.clone(), |x| x[17] = ExactSum(1)));
    assert!(e.contains("matrix 5 column 2: sum of squares"), "{e}");
    // Sum 13, matrix 4 column 1: the first block's last matrix, cut by it.
    let e = refused(&with(counts.clone(), |x| x[13] = ExactSum(-1)));
    assert!(e.contains("matrix 4 column 1: sum of squares"), "{e}");
    // Of two failing sums in one block, the first is named.
    let e = refused(&with(counts, |x| {
        (x[4], x[8]) = (ExactSum(-1), ExactSum(1))
    }));
    assert!(e.contains("matrix 1 column 1: sum of squares"), "{e}");
}

/// Issue 42, finding 3: an `in_sum2` of 7.2e16 (honest values are near
/// 12,785) passed; each sum is now bounded by its rows times the largest
/// input value ([`MAX_ACTIVATION`]), and names by llama.cpp's limit.
#[test]
fn importance_matrix_sums_are_bounded_by_their_rows_and_names_by_llama_cpp() {
    let s = |v: f64| ExactSum::from_f64(v).unwrap();
    let entry = |p: &mut Partial| p.imatrix.entries.values_mut().next().unwrap().clone();
    let mut p = honest();
    let mut e = entry(&mut p);
    let limit = (MAX_ACTIVATION * MAX_ACTIVATION) as f64 * 2.0;
    e.in_sum2[0] = s(limit);
    p.imatrix
        .entries
        .insert("blk.1.ffn_gate_inp.weight".into(), e.clone());
    check_values(&p, &Budget::for_corpus(1000)).unwrap();
    e.in_sum2[0] = s(7.2e16);
    p.imatrix
        .entries
        .insert("blk.1.ffn_gate_inp.weight".into(), e.clone());
    let why = refused(&p);
    assert!(
        why.contains("matrix 0 column 0: sum of squares 72000000000000000 over 2 rows")
            && why.contains("at most 65536"),
        "{why}"
    );
    e.in_sum2[0] = s(1.0);
    e.in_sum[1] = s(-2.0 * MAX_ACTIVATION as f64 - 1.0);
    p.imatrix
        .entries
        .insert("blk.1.ffn_gate_inp.weight".into(), e.clone());
    assert!(refused(&p).contains("matrix 0 column 1: sum -131073 over 2 rows"));
    let mut p = honest();
    let e = entry(&mut p);
    let long = format!("blk.1.{}.weight", "x".repeat(126 - 13));
    assert_eq!(long.len(), 126);
    p.imatrix.entries = BTreeMap::from([(long, e.clone())]);
    let why = refused(&p);
    assert!(
        why.contains("has 126 characters") && why.contains("at most 55"),
        "{why}"
    );
    let fits = format!("blk.1.{}.weight", "x".repeat(55 - 13));
    p.imatrix.entries = BTreeMap::from([(fits, e)]);
    check_values(&p, &Budget::for_corpus(1000)).unwrap();
}

#[test]
fn names_counters_and_trace_figures_are_bounded() {
    let mut p = honest();
    p.backends.push("cpu\n2026-11-30 INFO run complete".into());
    let e = refused(&p);
    assert!(e.contains("backend name") && !e.contains('\n'), "{e}");
    let mut p = honest();
    p.nonfinite_drops.insert("ffn_moe_probs-1".into(), u64::MAX);
    assert!(refused(&p).contains("non-finite drops of ffn_moe_probs-1"));
    let mut p = honest();
    p.trace_rows = 3;
    assert!(refused(&p).contains("3 trace rows for 2 traced tokens x 1 MoE layers"));
    let mut p = honest();
    p.backend_to_host.bytes = u64::MAX;
    assert!(refused(&p).contains("backend-to-host"));
}

#[test]
fn cauchy_schwarz_margin_is_in_units_of_the_slack() {
    // Equality (all terms equal) is the bound itself: margin 0.
    assert_eq!(cauchy_schwarz_margin(3.0, 3.0, 3), 0.0);
    assert!(cauchy_schwarz_margin(3.0, 2.9, 3) < -1.0);
    assert!(cauchy_schwarz_margin(3.0, 3.0 * (1.0 - 1e-7), 3) > -1.0);
}

/// The packed path ([`crate::partial::PackedPartial::parse_checked`] with
/// [`check_header_values`]) refuses what the decoded one refuses, in the
/// same words, and checks a column stored as a copy of another under its
/// own tensor's counts.
#[test]
fn packed_sums_are_refused_as_decoded_ones() {
    let budget = Budget::for_corpus(1000);
    let packed = |p: &Partial| {
        crate::partial::PackedPartial::parse_checked(p.to_bytes().into(), |h| {
            check_header_values(h, &budget)
        })
        .map(|_| ())
    };
    fn first(p: &mut Partial) -> &mut ImatrixEntry {
        p.imatrix.entries.values_mut().next().unwrap()
    }
    packed(&honest()).unwrap();
    let mut negative = honest();
    first(&mut negative).in_sum2[1] = ExactSum(-5);
    let mut rowless = honest();
    let e = first(&mut rowless);
    (e.counts[0], e.in_sum2) = (0, vec![ExactSum::ZERO; 3].into());
    // The same sums under a later tensor (so stored as a copy of the
    // first's) whose matrix saw no row; and with the same counts, which
    // passes without a second walk.
    let mut copy = honest();
    let mut same = first(&mut copy).clone();
    copy.imatrix
        .entries
        .insert("blk.1.zz.weight".into(), same.clone());
    packed(&copy).unwrap();
    same.counts = vec![0];
    copy.imatrix.entries.insert("blk.1.zz.weight".into(), same);
    for p in [&negative, &rowless, &copy] {
        assert_eq!(packed(p).unwrap_err(), refused(p));
    }
    assert!(
        refused(&copy).contains("blk.1.zz.weight: matrix 0 column 0: sum of squares 1 over 0 rows"),
        "{}",
        refused(&copy)
    );
}

/// A packed block passes on its header alone only where its sums pass: on
/// sums around each rule's edge (the bound, a negative sum of squares, a
/// non-zero sum of a matrix that saw no row; blocks across two matrices),
/// the packed check accepts and refuses as the decoded one, in its words.
#[test]
fn block_headers_pass_only_what_the_sums_pass() {
    let budget = Budget::for_corpus(1000);
    let bound = check_header_values(&honest(), &budget).unwrap().bound as i128;
    let packed = |p: &Partial| {
        crate::partial::PackedPartial::parse_checked(p.to_bytes().into(), |h| {
            check_header_values(h, &budget)
        })
        .map(|_| ())
    };
    let decoded = |p: &Partial| check_values(p, &budget);
    let mut rng = crate::splitmix::SplitMix64::new(23);
    let (mut refusals, mut passes) = (0, 0);
    for _ in 0..400 {
        // Matrices of 20 columns: blocks of 16 sums straddle two of them.
        let mut p = honest();
        let mut e = ImatrixEntry::new(20, 3);
        e.counts = (0..3).map(|_| [0, 2, 2][rng.below(3)]).collect();
        let mut sum = |count: u64, squares: bool| {
            let limit = imatrix_sum_limit(count, squares) as i128;
            let edge = [
                bound,
                bound + 1,
                bound >> 1,
                1 << rng.below(60),
                3,
                limit,
                limit + 1,
            ];
            let v = match (count, rng.below(200)) {
                (0, 0) => edge[rng.below(7)],
                (0, _) => 0,
                (_, 0..=1) => edge[rng.below(7)],
                (_, 2) if squares => -edge[rng.below(7)],
                (_, 3) => 0,
                _ => (rng.next_u64() >> rng.below(64)) as i128,
            };
            ExactSum(if squares || rng.below(2) == 0 { v } else { -v })
        };
        for squares in [true, false] {
            let column: Vec<ExactSum> = (0..60).map(|i| sum(e.counts[i / 20], squares)).collect();
            if squares {
                e.in_sum2 = column.into();
            } else {
                e.in_sum = column.into();
            }
        }
        p.imatrix.entries = BTreeMap::from([("blk.1.ffn_gate_inp.weight".to_string(), e)]);
        let verdict = decoded(&p);
        assert_eq!(packed(&p), verdict);
        if verdict.is_ok() {
            passes += 1;
        } else {
            refusals += 1;
        }
    }
    assert!(
        refusals > 50 && passes > 50,
        "{refusals} refused, {passes} passed"
    );
}
