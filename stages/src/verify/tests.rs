//! `verify` on synthetic runs: passes on a consistent one and fails, naming
//! the right invariant, on each kind of corruption.

use super::*;
use crate::score::testdata::{audit_layer, empty_partial, saliency};
use crate::score::{score, ScoreOptions};
use runfiles::trace::{write_part, TraceRow};

fn good() -> Saliency {
    saliency(2, vec![audit_layer(1), audit_layer(5)])
}

async fn run_with(bytes: Vec<u8>) -> (tempfile::TempDir, RunStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
    store.put(layout::SALIENCY_JSON, bytes).await.unwrap();
    (dir, store)
}

/// The exit code of `coordinator verify DIR` (the command exits with its
/// report's [`VerifyReport::exit_code`]).
async fn cli_exit(dir: &std::path::Path) -> ExitCode {
    let store = RunStore::open(dir.to_str().unwrap()).unwrap();
    verify(&store).await.unwrap().exit_code()
}

fn failed(r: &VerifyReport) -> Vec<&str> {
    r.failures().iter().map(|c| c.invariant.as_str()).collect()
}

/// The verify report of a run that holds `bytes` as its `saliency.json`
/// and nothing else.
async fn verify_saliency(bytes: Vec<u8>) -> VerifyReport {
    let (_dir, store) = run_with(bytes).await;
    verify(&store).await.unwrap()
}

/// Asserts that `invariant` is the one check of `r` that fails, and that
/// its figure says `needle`.
fn assert_fails_only(r: &VerifyReport, invariant: &str, needle: &str) {
    assert_eq!(failed(r), vec![invariant], "{r}");
    assert!(
        r.check(invariant).unwrap().figure.contains(needle),
        "{needle:?}: {r}"
    );
}

fn fit_layer(s: &mut Saliency, i: usize) -> &mut numbers::saliency::LayerStats {
    &mut s.splits.get_mut(&Split::Fit).unwrap().layers[i]
}

#[tokio::test]
async fn consistent_run_with_keep_maps_passes_every_invariant() {
    let (dir, store) = run_with(good().to_json_bytes()).await;
    let opts = ScoreOptions {
        k: vec![2, 4, 8],
        bootstrap: 0,
        ..Default::default()
    };
    score(&store, &opts).await.unwrap();
    let r = verify(&store).await.unwrap();
    assert!(r.ok(), "{r}");
    for name in [
        names::COUNT_SUM,
        names::PROB_SUM,
        names::MAP_SHAPE,
        names::MAP_NESTED,
        names::MAP_RECOMPUTE,
    ] {
        assert_eq!(r.check(name).unwrap().status, Status::Pass, "{name}: {r}");
    }
    assert_eq!(r.check(names::BITWISE).unwrap().status, Status::Info);
    let code = cli_exit(dir.path()).await;
    assert_eq!(code, ExitCode::SUCCESS);
}

#[tokio::test]
async fn count_sum_off_by_one_fails_that_invariant_alone() {
    let mut s = good();
    fit_layer(&mut s, 1).count[0] += 1;
    let (dir, store) = run_with(s.to_json_bytes()).await;
    let r = verify(&store).await.unwrap();
    assert_eq!(failed(&r), vec![names::COUNT_SUM], "{r}");
    let fig = &r.check(names::COUNT_SUM).unwrap().figure;
    assert!(fig.contains("fit layer 5") && fig.contains("(+1)"), "{fig}");
    let code = cli_exit(dir.path()).await;
    assert_eq!(code, ExitCode::FAILURE);
}

#[tokio::test]
async fn a_bare_nan_written_by_hand_fails_the_finite_invariant() {
    let mut s = good();
    fit_layer(&mut s, 0).ean_sum[3] = 123456.789;
    let text = String::from_utf8(s.to_json_bytes())
        .unwrap()
        .replacen("123456.789", "NaN", 1);
    assert!(
        serde_json::from_str::<Saliency>(&text).is_err(),
        "serde refuses the file"
    );
    let r = verify_saliency(text.into_bytes()).await;
    assert_fails_only(&r, names::FINITE, "splits.fit.layers[0].ean_sum[3]");
    // serde_json's own spelling of a non-finite float is null.
    let text = String::from_utf8(good().to_json_bytes()).unwrap();
    let text = text.replacen("\"prob_sum\": [\n", "\"prob_sum\": [\n null,", 1);
    let r = verify_saliency(text.into_bytes()).await;
    assert_eq!(r.check(names::FINITE).unwrap().status, Status::Fail, "{r}");
}

#[tokio::test]
async fn zero_count_with_nonzero_sum_fails_dead_iff_zero() {
    let mut s = good();
    fit_layer(&mut s, 0).reap_l2_sum[13] = 0.5;
    let r = verify_saliency(s.to_json_bytes()).await;
    assert_fails_only(&r, names::DEAD_IFF_ZERO, "layer 1 expert 13");
}

/// Regression (the 48 x 512 wide-shape run): an expert whose few routed
/// outputs are so small that their squares fall below the exact sums' 2^-64
/// grid has `reap_l2_sq_sum == 0` with a positive bound of about 1.8e-20;
/// that is rounding, not a violation.
#[tokio::test]
async fn cauchy_schwarz_allows_squares_below_the_exact_grid() {
    let mut s = good();
    let l = fit_layer(&mut s, 1);
    l.reap_l2_sum[4] = 1.0e-10 * l.count[4] as f64;
    l.reap_l2_sq_sum[4] = 0.0;
    let r = verify_saliency(s.to_json_bytes()).await;
    assert!(failed(&r).is_empty(), "{r}");
    // A shortfall well above the grid still fails.
    let mut s = good();
    let l = fit_layer(&mut s, 1);
    l.reap_l2_sum[4] = 3.0e-6 * l.count[4] as f64;
    l.reap_l2_sq_sum[4] = 0.0;
    let r = verify_saliency(s.to_json_bytes()).await;
    assert_eq!(failed(&r), vec![names::CAUCHY_SCHWARZ], "{r}");
}

#[tokio::test]
async fn cauchy_schwarz_violation_fails_that_invariant() {
    let mut s = good();
    let l = fit_layer(&mut s, 1);
    l.reap_l2_sq_sum[4] = l.reap_l2_sum[4] * l.reap_l2_sum[4] / l.count[4] as f64 * 0.999;
    let r = verify_saliency(s.to_json_bytes()).await;
    assert_fails_only(&r, names::CAUCHY_SCHWARZ, "layer 5 expert 4");
}

#[tokio::test]
async fn a_non_nested_keep_map_fails_the_nesting_invariant() {
    let (_dir, store) = run_with(good().to_json_bytes()).await;
    let opts = ScoreOptions {
        methods: vec![config::method::Method::Frequency],
        k: vec![2, 4],
        bootstrap: 0,
        ..Default::default()
    };
    score(&store, &opts).await.unwrap();
    let name = KeepMap::file_name("frequency", 2);
    let (mut map, _) = KeepMap::read_object(&store, &name).await.unwrap();
    // Keep a dead expert (15) instead of the second kept one: sorted, unique, K=2.
    let kept = map.layers.get_mut(&1).unwrap();
    kept[1] = 15;
    // The report of the run with `map` stored in place of the scored one.
    let (store, name) = (&store, &name);
    let verify_with = move |map: &KeepMap| {
        let bytes = serde_json::to_vec(map).unwrap();
        async move {
            store.put(name, bytes).await.unwrap();
            verify(store).await.unwrap()
        }
    };
    let r = verify_with(&map).await;
    assert_eq!(
        r.check(names::MAP_SHAPE).unwrap().status,
        Status::Pass,
        "{r}"
    );
    let nested = r.check(names::MAP_NESTED).unwrap();
    assert_eq!(nested.status, Status::Fail, "{r}");
    assert!(
        nested
            .figure
            .contains("frequency_K2.json keeps expert 15 of layer 1"),
        "{r}"
    );
    assert_eq!(r.check(names::MAP_RECOMPUTE).unwrap().status, Status::Fail);
    // An unsorted map fails the shape check.
    map.layers.get_mut(&1).unwrap().reverse();
    let r = verify_with(&map).await;
    assert!(
        r.check(names::MAP_SHAPE)
            .unwrap()
            .figure
            .contains("not sorted"),
        "{r}"
    );
}

#[tokio::test]
async fn trace_rows_must_equal_tokens_times_layers() {
    let mut s = good();
    s.trace_tokens_written = 2;
    let (_dir, store) = run_with(s.to_json_bytes()).await;
    let row = |layer, pos| TraceRow {
        split: Split::Fit,
        domain: "all".into(),
        chunk: 0,
        pos,
        token_id: 1,
        layer,
        selected: vec![0, 1],
        selected_weight: vec![0.5, 0.5],
        topn_id: vec![0, 1],
        topn_prob: vec![0.6, 0.4],
        lookahead: Vec::new(),
    };
    let mut rows = vec![row(1, 0), row(5, 0), row(1, 1)];
    store
        .put("trace/a.parquet", write_part(&mut rows, 2, 2).unwrap())
        .await
        .unwrap();
    let r = verify(&store).await.unwrap();
    let figure = "3 rows in 1 parts vs 2 tokens x 2 layers = 4 (-1)";
    assert_fails_only(&r, names::TRACE_ROWS, figure);
    let mut more = vec![row(5, 1)];
    store
        .put("trace/sub/b.parquet", write_part(&mut more, 2, 2).unwrap())
        .await
        .unwrap();
    assert!(verify(&store).await.unwrap().ok());
}

#[tokio::test]
async fn reverse_order_re_merge_of_partials_is_compared_bitwise() {
    let part = |chunk: u32, value: f64| {
        let mut p = empty_partial();
        p.chunks = vec![numbers::ChunkRange {
            start: chunk,
            end: chunk + 1,
        }];
        let g = p.experts.group_mut(Split::Fit, "d");
        g.n_tokens = 1;
        g.layers[0].count[1] = 1;
        g.layers[0].prob_sum[1].add_f64(1.0).unwrap();
        g.layers[0].reap_l2_sum[1].add_f64(value).unwrap();
        g.layers[0].reap_l2_sq_sum[1]
            .add_f64(value * value)
            .unwrap();
        p
    };
    let (a, b, c) = (part(0, 0.1), part(1, 0.2), part(2, 0.3));
    let mut forward = a.clone();
    forward.merge(&b).unwrap();
    forward.merge(&c).unwrap();
    let bytes = forward.saliency().unwrap().to_json_bytes();
    let (_dir, store) = run_with(bytes.clone()).await;
    for (name, p) in [
        ("partials/0.bin", &a),
        ("partials/1.bin", &b),
        ("partials/2.bin", &c),
    ] {
        store.put(name, p.to_bytes()).await.unwrap();
    }
    let r = verify(&store).await.unwrap();
    assert!(r.ok(), "{r}");
    assert_eq!(r.check(names::BITWISE).unwrap().status, Status::Pass);
    let mut tampered = bytes;
    tampered.push(b'\n');
    store.put(layout::SALIENCY_JSON, tampered).await.unwrap();
    let r = verify(&store).await.unwrap();
    assert_eq!(failed(&r), vec![names::BITWISE], "{r}");
}

/// A run of [`good`] (16 experts, MoE layers 1 and 5) with an
/// `imatrix.gguf` as a worker would measure it, and a model file with its
/// weights recorded in the manifest: `poison` changes the importance matrix
/// before it is written, `model_extra` adds weights to the model.
async fn imatrix_run(
    poison: impl FnOnce(&mut numbers::imatrix::Imatrix),
) -> (tempfile::TempDir, RunStore) {
    use gguf::write::{GgufWriter, Value};
    use numbers::imatrix::{Imatrix, ImatrixEntry};
    let s = good();
    let (dir, store) = run_with(s.to_json_bytes()).await;
    let fit = s.split(Split::Fit).unwrap();
    let x = |v: f64| numbers::exact::ExactSum::from_f64(v).unwrap();
    let mut im = Imatrix {
        chunk_count: 1,
        chunk_size: 8,
        ..Imatrix::default()
    };
    let mut model = GgufWriter::new();
    model.kv("general.architecture", Value::Str("qwen3moe".into()));
    for l in &fit.layers {
        let mut router = ImatrixEntry::new(2, 1);
        router.counts = vec![fit.n_tokens];
        // Column 0: every input 1; column 1: inputs of 0 and 2 alike.
        let n = fit.n_tokens as f64;
        router.in_sum2 = vec![x(n), x(2.0 * n)].into();
        router.in_sum = vec![x(n), x(n)].into();
        let mut stack = ImatrixEntry::new(2, 16);
        stack.counts = l.count.clone();
        let per = |c: u64, f: f64| x(c as f64 * f);
        stack.in_sum2 = l
            .count
            .iter()
            .flat_map(|&c| [per(c, 1.0), per(c, 4.0)])
            .collect();
        stack.in_sum = l
            .count
            .iter()
            .flat_map(|&c| [per(c, -1.0), per(c, 0.5)])
            .collect();
        im.entries
            .insert(format!("blk.{}.ffn_gate_inp.weight", l.layer), router);
        im.entries
            .insert(format!("blk.{}.ffn_up_exps.weight", l.layer), stack);
        let z = vec![0.0f32; 2 * 16 * 3];
        model.tensor_f32(
            &format!("blk.{}.ffn_gate_inp.weight", l.layer),
            &[2, 16],
            &z[..32],
        );
        model.tensor_f32(
            &format!("blk.{}.ffn_up_exps.weight", l.layer),
            &[2, 3, 16],
            &z,
        );
    }
    model.tensor_f32("blk.1.attn_norm.weight", &[2], &[0.0, 0.0]);
    poison(&mut im);
    let model_path = dir.path().join("model.gguf");
    std::fs::write(&model_path, model.to_bytes()).unwrap();
    let manifest = serde_json::json!({ "model_path": model_path });
    store
        .put("manifest.json", serde_json::to_vec(&manifest).unwrap())
        .await
        .unwrap();
    store
        .put(layout::IMATRIX_GGUF, im.to_gguf(&["d".into()]))
        .await
        .unwrap();
    (dir, store)
}

#[tokio::test]
async fn the_importance_matrix_is_checked_against_the_model_and_the_counts() {
    let imatrix_checks = [
        names::IMATRIX_ENTRIES,
        names::IMATRIX_SHAPES,
        names::IMATRIX_COUNTS,
        names::IMATRIX_VALUES,
    ];
    let (_d, store) = imatrix_run(|_| ()).await;
    let r = verify(&store).await.unwrap();
    assert!(r.ok(), "{r}");
    for name in imatrix_checks {
        assert_eq!(r.check(name).unwrap().status, Status::Pass, "{name}: {r}");
    }
    let printed = r.to_string();
    assert!(
        printed.contains("PASS  importance matrix: values finite")
            && printed.contains("largest in_sum^2 / (count x in_sum2) 1.000000"),
        "{printed}"
    );

    let entry =
        |im: &mut numbers::imatrix::Imatrix, name: &str| im.entries.get_mut(name).unwrap().clone();
    // An entry the model lacks, and one it requires missing.
    let (_d, store) = imatrix_run(|im| {
        let e = entry(im, "blk.1.ffn_gate_inp.weight");
        im.entries.insert("blk.1.ffn_hoard.weight".into(), e);
        im.entries.remove("blk.5.ffn_up_exps.weight");
    })
    .await;
    let r = verify(&store).await.unwrap();
    assert_fails_only(
        &r,
        names::IMATRIX_ENTRIES,
        "blk.1.ffn_hoard.weight\" (not a weight",
    );
    assert!(
        r.to_string().contains("blk.5.ffn_up_exps.weight (missing)"),
        "{r}"
    );
    // A shape other than the model's.
    let (_d, store) = imatrix_run(|im| {
        let mut e = numbers::imatrix::ImatrixEntry::new(3, 1);
        e.counts = entry(im, "blk.1.ffn_gate_inp.weight").counts;
        im.entries.insert("blk.1.attn_norm.weight".into(), e);
    })
    .await;
    let r = verify(&store).await.unwrap();
    assert_fails_only(&r, names::IMATRIX_SHAPES, "[3, 1], the model's [2, 1]");
    // A dense count short of the fit tokens; an expert's off by one.
    let (_d, store) = imatrix_run(|im| {
        im.entries
            .get_mut("blk.1.ffn_gate_inp.weight")
            .unwrap()
            .counts[0] += 1;
        im.entries
            .get_mut("blk.5.ffn_up_exps.weight")
            .unwrap()
            .counts[2] += 1;
    })
    .await;
    let r = verify(&store).await.unwrap();
    assert_fails_only(&r, names::IMATRIX_COUNTS, "2 bad");
    // Cauchy-Schwarz: a sum too large for its sum of squares; and a sum of
    // squares beyond what its rows allow.
    for (poison, needle) in [(2.0, "above count x in_sum2"), (-1.0, "in_sum2")] {
        let (_d, store) = imatrix_run(|im| {
            let e = im.entries.get_mut("blk.5.ffn_gate_inp.weight").unwrap();
            let n = e.counts[0] as f64;
            if poison > 0.0 {
                e.in_sum[1] = numbers::exact::ExactSum::from_f64(poison * n).unwrap();
            } else {
                e.in_sum2[0] = numbers::exact::ExactSum::from_f64(n * 2f64.powi(33)).unwrap();
            }
        })
        .await;
        let r = verify(&store).await.unwrap();
        assert_fails_only(&r, names::IMATRIX_VALUES, needle);
    }
}

#[tokio::test]
async fn merge_plans_must_take_their_centres_from_their_keep_map() {
    use runfiles::mergeplan::{Centre, Member, MergePlan};
    let (_dir, store) = run_with(good().to_json_bytes()).await;
    let opts = ScoreOptions {
        k: vec![2],
        bootstrap: 0,
        ..Default::default()
    };
    score(&store, &opts).await.unwrap();
    let r = verify(&store).await.unwrap();
    assert_eq!(r.check(names::MERGE_PLANS).unwrap().status, Status::Info);
    let (maps, _) = load_keep_maps(&store).await.unwrap();
    let (_, keep) = &maps[0];
    // Each centre takes the first expert no centre of its layer is.
    let plan_of = |shift: u32| MergePlan {
        method: keep.method.clone(),
        k: keep.k,
        params: serde_json::Value::Null,
        saliency_sha256: keep.saliency_sha256.clone(),
        layers: keep
            .layers
            .iter()
            .map(|(&l, ids)| {
                let spare = (0..).find(|e| !ids.contains(e)).unwrap();
                let mut cs: Vec<Centre> = ids.iter().map(|&c| Centre::alone(c + shift)).collect();
                cs[0].members.push(Member {
                    expert: spare,
                    weight: 0.5,
                });
                (l, cs)
            })
            .collect(),
    };
    let put = |plan: MergePlan| {
        let store = &store;
        async move {
            let object = MergePlan::file_name(&plan.method, plan.k);
            store
                .put(&object, serde_json::to_vec(&plan).unwrap())
                .await
                .unwrap();
        }
    };
    put(plan_of(0)).await;
    let r = verify(&store).await.unwrap();
    assert_eq!(
        r.check(names::MERGE_PLANS).unwrap().status,
        Status::Pass,
        "{r}"
    );
    put(plan_of(100)).await;
    let r = verify(&store).await.unwrap();
    let c = r.check(names::MERGE_PLANS).unwrap();
    assert_eq!(c.status, Status::Fail, "{r}");
    assert!(
        c.figure.contains("merges expert 10") || c.figure.contains("not the experts of"),
        "{}",
        c.figure
    );
}
