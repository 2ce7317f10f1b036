//! Known-answer tests of scoring on synthetic saliency files.

use super::keep::{keep_map, rank_layers, top_k};
use super::method::{ranking, scores, Prior, ScoreParams};
use super::source::LayerInput;
use super::tables::prior_row;
use super::testdata::{audit_layer, layer, saliency};
use super::*;
use config::method::Method;

fn dead(l: &LayerInput) -> Vec<u32> {
    (0..l.n_expert() as u32)
        .filter(|&e| l.count[e as usize] == 0.0)
        .collect()
}

/// The audit's biased prior: the count-weighted layer mean.
fn count_weighted_shrink(l: &LayerInput, m: f64) -> Vec<u32> {
    let mu: f64 = l.reap_l2_sum.iter().sum::<f64>() / l.count.iter().sum::<f64>();
    let s: Vec<f64> = (0..l.n_expert())
        .map(|e| (l.reap_l2_sum[e] + m * mu) / (l.count[e] + m))
        .collect();
    let mut ids: Vec<u32> = (0..l.n_expert() as u32).collect();
    ids.sort_by(|&a, &b| s[b as usize].total_cmp(&s[a as usize]).then(a.cmp(&b)));
    ids
}

#[test]
fn audit_case_shrink_and_hybrid_keep_no_dead_expert_under_any_prior() {
    let l = LayerInput::scaled(&audit_layer(3), 1.0);
    let dead = dead(&l);
    assert_eq!(dead.len(), 4);
    let diag = prior_row(&l);
    assert_eq!((diag.live, diag.live_below_weighted), (12, 9), "{diag:?}");
    // The audit's prior keeps dead experts at K=6.
    let biased = top_k(&count_weighted_shrink(&l, 10.0), 6);
    assert!(
        dead.iter().any(|e| biased.contains(e)),
        "setup must reproduce the audit: {biased:?}"
    );
    for prior in [Prior::Median, Prior::Lcb] {
        for c_min in [1, 500] {
            let p = ScoreParams {
                prior,
                c_min,
                ..Default::default()
            };
            for method in [Method::ReapShrink, Method::ReapHybrid] {
                let order = ranking(method, &p, &l);
                for k in 1..=12 {
                    let kept = top_k(&order, k);
                    assert!(
                        !dead.iter().any(|e| kept.contains(e)),
                        "{method:?} {prior:?} c_min={c_min} K={k}: {kept:?}"
                    );
                }
            }
        }
        // Not only the hard rule: the unbiased prior itself puts dead experts
        // below the better half of the live ones.
        let p = ScoreParams {
            prior,
            allow_dead: true,
            ..Default::default()
        };
        let kept = top_k(&ranking(Method::ReapShrink, &p, &l), 6);
        assert!(
            !dead.iter().any(|e| kept.contains(e)),
            "{prior:?} with dead allowed: {kept:?}"
        );
    }
}

fn outlier_layer() -> LayerInput {
    let cm: [(f64, f64); 16] = [
        (2000.0, 1.0),
        (1800.0, 1.2),
        (1500.0, 1.5),
        (1200.0, 1.1),
        (1000.0, 2.0),
        (800.0, 2.5),
        (600.0, 3.0),
        (500.0, 4.0),
        (400.0, 5.0),
        (300.0, 6.0),
        (200.0, 7.0),
        (150.0, 8.0),
        (100.0, 9.0),
        (60.0, 10.0),
        (30.0, 12.0),
        (20.0, 14.0),
    ];
    LayerInput {
        layer: 0,
        count: cm.iter().map(|x| x.0).collect(),
        raw_count: cm.iter().map(|x| x.0).collect(),
        reap_l2_sum: cm.iter().map(|x| x.0 * x.1).collect(),
        reap_l2_sq_sum: cm.iter().map(|x| x.0 * x.1 * x.1 * 1.2).collect(),
        guarded: Vec::new(),
        domain_mass: Vec::new(),
    }
}

/// The audit's fragile hybrid: max-normalised scores added.
fn max_normalised_hybrid(p: &ScoreParams, l: &LayerInput) -> Vec<u32> {
    let a = scores(Method::ReapL2Sum, p, l);
    let b = scores(Method::ReapShrink, p, l);
    let (ma, mb) = (
        a.iter().copied().fold(0.0, f64::max),
        b.iter().copied().fold(0.0, f64::max),
    );
    let s: Vec<f64> = (0..l.n_expert()).map(|e| a[e] / ma + b[e] / mb).collect();
    let mut ids: Vec<u32> = (0..l.n_expert() as u32).collect();
    ids.sort_by(|&x, &y| s[y as usize].total_cmp(&s[x as usize]).then(x.cmp(&y)));
    ids
}

#[test]
fn one_extreme_outlier_does_not_change_the_hybrids_other_choices() {
    let p = ScoreParams::default();
    let base = outlier_layer();
    let mut wild = base.clone();
    let x = 12;
    wild.reap_l2_sum[x] *= 1e6;
    wild.reap_l2_sq_sum[x] *= 1e12;
    let without = |order: Vec<u32>| {
        order
            .into_iter()
            .filter(|&e| e != x as u32)
            .collect::<Vec<_>>()
    };
    let before = ranking(Method::ReapHybrid, &p, &base);
    let after = ranking(Method::ReapHybrid, &p, &wild);
    assert_eq!(after[0], x as u32);
    assert_eq!(
        without(before.clone()),
        without(after),
        "rank averaging must ignore the outlier's size"
    );
    // The max-normalised hybrid is thrown off by the same outlier.
    let fragile_before = without(max_normalised_hybrid(&p, &base));
    let fragile_after = without(max_normalised_hybrid(&p, &wild));
    assert_ne!(
        fragile_before[..6],
        fragile_after[..6],
        "setup must break the max-normalised hybrid"
    );
}

#[test]
fn keep_maps_are_nested_across_k_and_cite_their_recipe() {
    let s = saliency(2, vec![audit_layer(1), audit_layer(5)]);
    let p = ScoreParams::default();
    let layers = p.source.layers(&s).unwrap();
    for m in Method::ALL {
        let r = rank_layers(m, &p, &layers, None);
        let maps: Vec<_> = (1..=16)
            .map(|k| keep_map(m, k, &p, "sha", &r).unwrap())
            .collect();
        for w in maps.windows(2) {
            for (layer, small) in &w[0].layers {
                let big = &w[1].layers[layer];
                assert!(
                    small.iter().all(|e| big.contains(e)),
                    "{m:?} K={} not inside K={}",
                    w[0].k,
                    w[1].k
                );
                assert!(big.windows(2).all(|x| x[0] < x[1]), "sorted and unique");
                assert_eq!(big.len() as u32, w[1].k);
            }
        }
    }
}

async fn write_run(dir: &std::path::Path, s: &numbers::saliency::Saliency) -> RunStore {
    let store = RunStore::open(dir.to_str().unwrap()).unwrap();
    store
        .put(layout::SALIENCY_JSON, s.to_json_bytes())
        .await
        .unwrap();
    store
}

#[tokio::test]
async fn score_writes_maps_equal_to_recomputation_and_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let s = saliency(
        2,
        vec![
            audit_layer(1),
            layer(
                4,
                &[6000, 4000, 200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                &[6.0; 16],
            ),
        ],
    );
    let store = write_run(dir.path(), &s).await;
    let opts = ScoreOptions {
        k: vec![8, 4],
        bootstrap: 0,
        ..Default::default()
    };
    let report = score(&store, &opts).await.unwrap();
    assert_eq!(report.ks, vec![4, 8]);
    assert_eq!(report.keep_maps.len(), 12);
    assert_eq!(report.overlaps.len(), 30);
    let sha = gguf::hash::sha256_hex(&s.to_json_bytes());
    for name in &report.keep_maps {
        let map: KeepMap = serde_json::from_slice(&store.get(name).await.unwrap()).unwrap();
        assert_eq!(map.saliency_sha256, sha);
        let (m, p) = keep::map_recipe(&map).unwrap();
        let fresh = keep_map(m, map.k, &p, &sha, &rank_all(&s, &[m], &p).unwrap()[0].1).unwrap();
        assert_eq!(map, fresh, "{name}");
    }
    // Layer 4 has 13 dead experts: K=4 keeps the 3 live ones and one dead.
    let t = report
        .tables
        .iter()
        .find(|t| t.method == "reap_shrink" && t.k == 4)
        .unwrap();
    assert_eq!(t.rows[1].dead_kept, 1);
    assert_eq!(t.rows[0].dead_kept, 0);
    for out in [
        runfiles::layout::score::REPORT_JSON,
        runfiles::layout::score::TABLES_MD,
        runfiles::layout::score::TABLES_PARQUET,
    ] {
        assert!(store.exists(out).await.unwrap(), "{out}");
    }
    let md = tables_md(&store).await;
    assert!(
        md.contains("### reap_hybrid K=8") && md.contains("Not run: no trace parts"),
        "{md}"
    );
    let bad = ScoreOptions {
        k: vec![17],
        ..Default::default()
    };
    assert!(score(&store, &bad)
        .await
        .unwrap_err()
        .to_string()
        .contains("--k 17"));
}

#[tokio::test]
async fn score_screens_traces_per_split_and_bootstraps_chunks() {
    use numbers::stats::ChunkStats;
    use runfiles::trace::{write_part_as, Encoding, TraceRow};
    let dir = tempfile::tempdir().unwrap();
    let s = saliency(1, vec![layer(0, &[6, 3, 1, 0], &[6.0, 3.0, 1.0, 0.0])]);
    let store = write_run(dir.path(), &s).await;
    let row = |split, sel: u16| TraceRow {
        split,
        domain: "all".into(),
        chunk: 0,
        pos: 0,
        token_id: 5,
        layer: 0,
        selected: vec![sel],
        selected_weight: vec![1.0],
        topn_id: vec![sel, 0, 1],
        topn_prob: vec![0.6, 0.3, 0.1],
        lookahead: Vec::new(),
    };
    let at = &store;
    let put_part = move |name: &'static str, mut rows: Vec<TraceRow>| {
        let bytes = write_part_as(&mut rows, 1, 3, Encoding::Full).unwrap();
        async move { at.put(name, bytes).await.unwrap() }
    };
    put_part(
        "trace/part-0.parquet",
        vec![row(Split::Fit, 0), row(Split::Heldout, 2)],
    )
    .await;
    let chunk = |c: u32, counts: [u32; 4]| ChunkStats {
        chunk: c,
        n_tokens: 5,
        count: counts.to_vec(),
        reap_l2_sum: counts.iter().map(|&x| x as f32).collect(),
        reap_l2_sq_sum: counts.iter().map(|&x| x as f32).collect(),
    };
    let partial = numbers::partial::Partial {
        chunk_stats: vec![chunk(0, [3, 2, 0, 0]), chunk(1, [3, 1, 1, 0])],
        ..testdata::empty_partial()
    };
    store
        .put(layout::MERGED_PARTIAL, partial.to_bytes())
        .await
        .unwrap();
    // Chunk 0 holds fit group 7 and held-out group 3, chunk 1 more of
    // group 7: one cluster, resampled whole.
    let span = |start, split, group| runfiles::corpus::Span {
        start,
        len: 2,
        split,
        domain: 0,
        doc: group,
        group,
    };
    let table = [
        vec![span(0, Split::Fit, 7), span(2, Split::Heldout, 3)],
        vec![span(0, Split::Fit, 7)],
    ]
    .into_iter()
    .enumerate()
    .map(|(id, spans)| runfiles::corpus::Chunk {
        id: numbers::ChunkId(id as u32),
        tokens: vec![1; spans.len() * 2],
        spans,
        images: Vec::new(),
    })
    .collect::<Vec<_>>();
    store
        .child("corpus")
        .put(
            runfiles::corpus::CHUNKS_FILE,
            runfiles::corpus::write_chunks(&table).unwrap(),
        )
        .await
        .unwrap();
    let opts = ScoreOptions {
        methods: vec![Method::Frequency],
        k: vec![1],
        bootstrap: 4,
        ..Default::default()
    };
    let report = score(&store, &opts).await.unwrap();
    assert_eq!(report.stability[0].clusters, 1, "{:?}", report.stability);
    let fit = report.screen.iter().find(|r| r.split == "fit").unwrap();
    let held = report.screen.iter().find(|r| r.split == "heldout").unwrap();
    assert_eq!((fit.rows, fit.substitutes, fit.mean_mass_lost), (1, 0, 0.0));
    assert_eq!(
        (held.rows, held.substitutes, held.mean_substitute_rank),
        (1, 1, 2.0)
    );
    assert!((held.mean_mass_lost - 0.6).abs() < 1e-6);
    assert_eq!(report.stability.len(), 1);
    assert_eq!(report.stability[0].mean_jaccard, 1.0);
    // A row budget stops the screen at a part boundary and says so.
    put_part("trace/part-1.parquet", vec![row(Split::Heldout, 1)]).await;
    let capped = ScoreOptions {
        screen_rows: 2,
        ..opts
    };
    let report = score(&store, &capped).await.unwrap();
    assert_eq!(report.screen.iter().map(|r| r.rows).sum::<u64>(), 2);
    assert!(
        report
            .screen_note
            .as_deref()
            .unwrap()
            .contains("first 1 of 2 trace parts"),
        "{:?}",
        report.screen_note
    );
}

#[tokio::test]
async fn domain_scoring_uses_that_domains_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let s = testdata::saliency_with_domains(&[
        ("a", 100, layer(0, &[100, 0], &[10.0, 0.0])),
        ("b", 300, layer(0, &[0, 300], &[0.0, 30.0])),
    ]);
    let store = write_run(dir.path(), &s).await;
    let opts = ScoreOptions {
        methods: vec![Method::Frequency],
        k: vec![1],
        domain: Some("a".into()),
        ..Default::default()
    };
    let report = score(&store, &opts).await.unwrap();
    let map: KeepMap =
        serde_json::from_slice(&store.get(&report.keep_maps[0]).await.unwrap()).unwrap();
    assert_eq!(map.kept(0), Some(&[0u32][..]));
    assert_eq!(map.params["source"]["name"], "a");
}

/// Brute-force reference of a grouped keep map's layer: in every group, of
/// all subsets of `k / n_group` experts, the one whose positions in the
/// method's own (ungrouped) ranking add up least: the group's best.
fn brute_force_grouped(order: &[u32], n_group: u32, k: u32) -> Vec<u32> {
    let n = order.len() as u32;
    let size = n / n_group;
    let per = k / n_group;
    let pos = |e: u32| order.iter().position(|&x| x == e).unwrap();
    let mut kept = Vec::new();
    for g in 0..n_group {
        let best = (0u32..1 << size)
            .filter(|m| m.count_ones() == per)
            .min_by_key(|m| {
                (0..size)
                    .filter(|i| m >> i & 1 == 1)
                    .map(|i| pos(g * size + i))
                    .sum::<usize>()
            })
            .unwrap();
        kept.extend(
            (0..size)
                .filter(|i| best >> i & 1 == 1)
                .map(|i| g * size + i),
        );
    }
    kept.sort_unstable();
    kept
}

#[tokio::test]
async fn grouped_keep_maps_equal_a_brute_force_reference_for_every_method_and_k() {
    // 32 experts in 4 groups of 8 (2 groups per token), top-4. Layer 1's
    // statistics favour group 0, layer 3's group 3: a global top-K is
    // never balanced.
    let down: Vec<u64> = (0..32).map(|e| 1000 - 30 * e).collect();
    let up: Vec<u64> = (0..32).map(|e| 70 + 30 * e).collect();
    let reap = |c: &[u64]| -> Vec<f64> {
        c.iter()
            .enumerate()
            .map(|(e, &n)| n as f64 * (1.0 + (e * 7 % 5) as f64))
            .collect()
    };
    let mut s = saliency(
        4,
        vec![layer(1, &down, &reap(&down)), layer(3, &up, &reap(&up))],
    );
    s.routing.groups = Some(numbers::routing::ExpertGroups {
        n_group: 4,
        n_group_used: 2,
    });
    let dir = tempfile::tempdir().unwrap();
    let store = write_run(dir.path(), &s).await;
    let opts = ScoreOptions {
        bootstrap: 0,
        ..Default::default()
    };
    let report = score(&store, &opts).await.unwrap();
    // The default sizes are whole groups of at least 2 each.
    assert_eq!(report.ks, vec![8, 16, 24]);
    assert!(report.routing_note.as_deref().unwrap().contains("K / 4"));
    assert_eq!(report.keep_maps.len(), Method::ALL.len() * 3);
    let mut unbalanced_globally = 0;
    for name in &report.keep_maps {
        let map: KeepMap = serde_json::from_slice(&store.get(name).await.unwrap()).unwrap();
        let (m, p) = keep::map_recipe(&map).unwrap();
        for l in p.source.layers(&s).unwrap() {
            let order = ranking(m, &p, &l);
            let want = brute_force_grouped(&order, 4, map.k);
            assert_eq!(
                map.kept(l.layer),
                Some(&want[..]),
                "{name} layer {}",
                l.layer
            );
            let global = top_k(&order, map.k);
            if global != want {
                unbalanced_globally += 1;
            }
            // What the slicer and llama.cpp require of it.
            let mut per_group = [0u32; 4];
            want.iter().for_each(|&e| per_group[(e / 8) as usize] += 1);
            assert_eq!(per_group, [map.k / 4; 4], "{name} layer {}", l.layer);
        }
    }
    assert!(
        unbalanced_globally > 0,
        "setup must unbalance a global top-K"
    );
    // Maps of one method stay nested across K.
    for m in Method::ALL {
        let maps: Vec<KeepMap> = [8, 16, 24]
            .iter()
            .map(|&k| {
                let name = KeepMap::file_name(m.as_str(), k);
                serde_json::from_slice(&std::fs::read(dir.path().join(&name)).unwrap()).unwrap()
            })
            .collect();
        for w in maps.windows(2) {
            for (layer, small) in &w[0].layers {
                assert!(small.iter().all(|e| w[1].layers[layer].contains(e)));
            }
        }
    }
    // Sizes grouped routing cannot run are refused, naming why.
    for (k, why) in [(10, "multiple of the 4"), (4, "at least 2")] {
        let bad = ScoreOptions {
            k: vec![k],
            bootstrap: 0,
            ..Default::default()
        };
        let e = score(&store, &bad).await.unwrap_err().to_string();
        assert!(e.contains(&format!("--k {k}")) && e.contains(why), "{e}");
    }
}

/// A 3-hit expert whose mean is a little above a 300-hit expert's, in a
/// layer whose other experts are well measured and score higher still.
fn near_dead_layer() -> LayerInput {
    // (count, mean): expert 0 has 3 hits, expert 1 has 300.
    let cm: [(f64, f64); 8] = [
        (3.0, 1.0),
        (300.0, 0.95),
        (5000.0, 2.0),
        (4000.0, 2.2),
        (3000.0, 1.8),
        (2000.0, 2.5),
        (1000.0, 1.6),
        (800.0, 3.0),
    ];
    LayerInput {
        layer: 0,
        count: cm.iter().map(|x| x.0).collect(),
        raw_count: cm.iter().map(|x| x.0).collect(),
        reap_l2_sum: cm.iter().map(|x| x.0 * x.1).collect(),
        reap_l2_sq_sum: cm.iter().map(|x| x.0 * x.1 * x.1 * 1.1).collect(),
        guarded: Vec::new(),
        domain_mass: Vec::new(),
    }
}

#[test]
fn a_three_hit_expert_is_never_kept_over_a_300_hit_one_at_default_settings() {
    let l = near_dead_layer();
    let position = |order: &[u32], e: u32| order.iter().position(|&x| x == e).unwrap();
    for prior in [Prior::Median, Prior::Lcb] {
        let p = ScoreParams {
            prior,
            ..Default::default()
        };
        for method in Method::ALL {
            let order = ranking(method, &p, &l);
            assert!(
                position(&order, 1) < position(&order, 0),
                "{method:?} {prior:?}: {order:?}"
            );
            for k in 1..=8 {
                let kept = top_k(&order, k);
                assert!(
                    !kept.contains(&0) || kept.contains(&1),
                    "{method:?} {prior:?} K={k}: {kept:?}"
                );
            }
        }
    }
    // Without the floor (c_min = 1) the near-dead expert wins on its mean
    // and on the prior: the floor is what keeps it out.
    let no_floor = ScoreParams {
        c_min: 1,
        ..Default::default()
    };
    for method in [Method::ReapMean, Method::ReapShrink, Method::ReapHybrid] {
        let order = ranking(method, &no_floor, &l);
        assert!(
            position(&order, 0) < position(&order, 1),
            "{method:?} without a floor: {order:?}"
        );
    }
    assert_eq!(ScoreParams::default().c_min, method::DEFAULT_C_MIN);
}

/// The super-expert guard: an expert with few hits and a low mean but an
/// extreme largest output norm is pruned at K = 4 of 8 under every method
/// without the guard, and kept first with it; the rest of each map is the
/// method's own order.
#[test]
fn a_guarded_super_expert_is_kept_under_every_method() {
    let mut l = near_dead_layer();
    // Expert 1 (300 hits, a low mean) is the layer's super expert.
    let mut maxima = vec![1.0; 8];
    maxima[1] = 400.0;
    let layers: Vec<Vec<f64>> = (0..4)
        .map(|i| match i {
            0 => maxima.clone(),
            _ => vec![1.0; 8],
        })
        .collect();
    let views: Vec<&[f64]> = layers.iter().map(Vec::as_slice).collect();
    let guard = super::super_experts::rule(&views);
    assert_eq!(
        guard[0],
        [false, true, false, false, false, false, false, false]
    );
    let p = ScoreParams::default();
    for method in Method::ALL {
        let plain = ranking(method, &p, &l);
        assert!(!top_k(&plain, 4).contains(&1), "{method:?}: {plain:?}");
    }
    l.guarded = guard[0].clone();
    let guarded = ScoreParams {
        guard_super_experts: true,
        ..Default::default()
    };
    for method in Method::ALL {
        let order = ranking(method, &guarded, &l);
        let plain: Vec<u32> = ranking(method, &p, &near_dead_layer())
            .into_iter()
            .filter(|&e| e != 1)
            .collect();
        assert_eq!(order[0], 1, "{method:?}: {order:?}");
        assert_eq!(order[1..], plain[..], "{method:?}");
    }
}

/// Each domain's retained share of its `reap_l2_sum` under a stored keep
/// map, the smallest of them: computed from `saliency.json`'s domains and
/// the map file alone (not from `score`'s own tables).
fn smallest_share(s: &numbers::saliency::Saliency, map: &KeepMap) -> f64 {
    let fit = s.split(numbers::Split::Fit).unwrap();
    let mut least = f64::INFINITY;
    for d in fit.domains.values() {
        for l in &d.layers {
            let total: f64 = l.reap_l2_sum.iter().sum();
            let kept: f64 = map
                .kept(l.layer)
                .unwrap()
                .iter()
                .map(|&e| l.reap_l2_sum[e as usize])
                .sum();
            least = least.min(kept / total);
        }
    }
    least
}

#[tokio::test]
async fn worst_domain_serves_the_worst_domain_at_least_as_well_as_every_method() {
    // Prose is large and routed to experts 0-3; code is small and routed to
    // experts 4-7 with larger outputs: the blend's rankings serve prose,
    // reap_mean's serves code.
    let dir = tempfile::tempdir().unwrap();
    let s = testdata::saliency_with_domains(&[
        (
            "prose",
            1000,
            layer(
                0,
                &[300, 250, 200, 150, 60, 20, 15, 5],
                &[300.0, 250.0, 200.0, 150.0, 60.0, 20.0, 15.0, 5.0],
            ),
        ),
        (
            "code",
            200,
            layer(
                0,
                &[0, 5, 10, 10, 40, 50, 45, 40],
                &[0.0, 5.0, 10.0, 10.0, 60.0, 80.0, 70.0, 60.0],
            ),
        ),
    ]);
    let store = write_run(dir.path(), &s).await;
    let opts = ScoreOptions {
        k: vec![1, 2, 3, 4, 5, 6],
        bootstrap: 0,
        ..Default::default()
    };
    let report = score(&store, &opts).await.unwrap();
    let maps: Vec<KeepMap> = read_maps(&store, &report.keep_maps).await;
    for &k in &report.ks {
        let of = |m: &str| {
            let map = maps.iter().find(|x| x.method == m && x.k == k).unwrap();
            smallest_share(&s, map)
        };
        let worst = of("worst_domain");
        for m in Method::ALL {
            let other = of(m.as_str());
            assert!(
                worst >= other - 1e-12,
                "K={k}: worst_domain {worst} < {m:?} {other}"
            );
        }
        let row = report
            .domain_floor
            .iter()
            .find(|f| f.method == "worst_domain" && f.k == k)
            .unwrap();
        assert!(
            (row.min_share - worst).abs() < 1e-9,
            "K={k}: {row:?} {worst}"
        );
        assert!(row.bound_mean.unwrap() >= worst - 1e-12, "K={k}: {row:?}");
    }
    // Where the rankings disagree, some method leaves a domain worse off.
    let frequency = maps
        .iter()
        .find(|x| x.method == "frequency" && x.k == 2)
        .unwrap();
    let worst = maps
        .iter()
        .find(|x| x.method == "worst_domain" && x.k == 2)
        .unwrap();
    assert!(smallest_share(&s, worst) > smallest_share(&s, frequency) + 0.1);
    let md = tables_md(&store).await;
    assert!(md.contains("### The worst-served domain"), "{md}");
}

/// The scoring tables `score` wrote (`score/tables.md`), as text.
async fn tables_md(store: &RunStore) -> String {
    let bytes = store.get(runfiles::layout::score::TABLES_MD).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn read_maps(store: &RunStore, names: &[String]) -> Vec<KeepMap> {
    let mut out = Vec::new();
    for n in names {
        out.push(serde_json::from_slice(&store.get(n).await.unwrap()).unwrap());
    }
    out
}

#[tokio::test]
async fn score_writes_a_merge_plan_beside_each_keep_map_from_the_router_traces() {
    use runfiles::mergeplan::MergePlan;
    use runfiles::trace::{write_part_as, Encoding, TraceRow};
    let dir = tempfile::tempdir().unwrap();
    // Experts 0 and 2 are the most salient; the router treats 3 like 0
    // (they share tokens) and 1 like 2. REAM's first pass lets the most
    // salient centre take up to 15 experts, closest first: 0 takes 3,
    // then 1.
    let s = saliency(1, vec![layer(0, &[6, 3, 5, 2], &[6.0, 3.0, 5.0, 2.0])]);
    let store = write_run(dir.path(), &s).await;
    let opts = ScoreOptions {
        methods: vec![Method::Frequency],
        k: vec![2],
        bootstrap: 0,
        ..Default::default()
    };
    let report = score(&store, &opts).await.unwrap();
    assert!(report.merge_plans.is_empty());
    assert!(report.merge_note.unwrap().contains("no trace rows"));
    let row = |top: [(u16, f32); 2]| TraceRow {
        split: Split::Fit,
        domain: "all".into(),
        chunk: 0,
        pos: 0,
        token_id: 5,
        layer: 0,
        selected: vec![top[0].0],
        selected_weight: vec![1.0],
        topn_id: top.iter().map(|t| t.0).collect(),
        topn_prob: top.iter().map(|t| t.1).collect(),
        lookahead: Vec::new(),
    };
    let mut rows = vec![
        row([(0, 0.7), (3, 0.3)]),
        row([(2, 0.6), (1, 0.4)]),
        row([(2, 0.5), (1, 0.5)]),
    ];
    let bytes = write_part_as(&mut rows, 1, 2, Encoding::Full).unwrap();
    store.put("trace/part-0.parquet", bytes).await.unwrap();
    let report = score(&store, &opts).await.unwrap();
    assert_eq!(report.merge_plans, ["merge_plans/frequency_merge_K2.json"]);
    let plan = MergePlan::read_object(&store, &report.merge_plans[0])
        .await
        .unwrap();
    let got: Vec<(u32, Vec<(u32, f64)>)> = plan.layers[&0]
        .iter()
        .map(|c| {
            (
                c.centre,
                c.members.iter().map(|m| (m.expert, m.weight)).collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![(0, vec![(0, 6.0), (3, 2.0), (1, 3.0)]), (2, vec![(2, 5.0)])]
    );
    assert_eq!(plan.name(), "frequency_merge_K2");
    assert_eq!(
        plan.keep_map().layers,
        report_keep(&store, "frequency_K2").await
    );
}

/// The layers of the run's keep map `name`.
async fn report_keep(store: &RunStore, name: &str) -> BTreeMap<u32, Vec<u32>> {
    KeepMap::read(store, name).await.unwrap().0.layers
}
