//! Prefetch replay on the quickstart's traces (issue #56): the quickstart's
//! prefill and decode traces both carry the worker's lookahead columns for
//! d = 1 and 2 (a guess on every row whose layer has a MoE layer d ahead,
//! none past the last); the fast replayer equals the independent eager one
//! (`replay::prefetch_reference`) on every cell (trace kind, split, layer,
//! predictor, m, policy, capacity) of both trace kinds, and
//! `replay/results.json` holds the prefetch rows and the recall table with
//! the oracle beside the guesses.

use numbers::Split;
use replay::keep::requests;
use replay::predict::{self, Predictor};
use replay::prefetch::{self, Prefetch};
use replay::prefetch_reference::eager;
use replay::results::TraceKind;
use replay::steps::NONE;
use replay::trace_io::{RawLayer, TraceSet};
use replay::{pinned, Cache, Policy, PolicyParams, ReplayReport, Steps};
use runfiles::store::RunStore;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The quickstart without its `[eval]` section, in a temporary directory.
fn quickstart(dir: &Path) -> PathBuf {
    let configs = dir.join("configs");
    let sample = configs.join("sample_corpus");
    let models = configs.join("models");
    std::fs::create_dir_all(&sample).unwrap();
    std::fs::create_dir_all(&models).unwrap();
    for e in std::fs::read_dir(repo().join("configs/sample_corpus")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), sample.join(e.file_name())).unwrap();
    }
    std::fs::copy(
        repo().join("configs/models/quickstart-moe.gguf"),
        models.join("quickstart-moe.gguf"),
    )
    .unwrap();
    let text = std::fs::read_to_string(repo().join("configs/quickstart.toml")).unwrap();
    let text = &text[..text.find("\n[eval]").unwrap()];
    let config = configs.join("quickstart.toml");
    std::fs::write(&config, text).unwrap();
    let out = dir.join("run");
    fixtures::coordinator_run(&config, 2, &out);
    out
}

#[test]
fn fast_prefetch_replay_equals_the_eager_one_on_every_quickstart_cell() {
    let dir = tempfile::tempdir().unwrap();
    let run = quickstart(dir.path());
    let results = std::fs::read(run.join("replay/results.json")).unwrap();
    let report = ReplayReport::from_json(&results, "replay/results.json").unwrap();
    let n_expert = report.n_expert;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = RunStore::open(run.to_str().unwrap()).unwrap();
    let (prefill, decode) = rt.block_on(runfiles::trace::stored_parts(&store)).unwrap();
    let params = PolicyParams::default();
    let mut cells = 0u64;
    let mut kinds = 0;
    for names in [prefill, decode] {
        let Some(set) = rt.block_on(TraceSet::open(&store, &names)).unwrap() else {
            continue;
        };
        kinds += 1;
        let layers = set.layers();
        check_lookahead_columns(&set, &layers, n_expert);
        for &layer in &layers[1..] {
            if !layers.contains(&(layer - 1)) {
                continue;
            }
            let raw = set.read_layer(layer, n_expert).unwrap();
            let prev = set.read_layer(layer - 1, n_expert).unwrap();
            let fit_steps = Steps::build(&requests(&raw[0], n_expert, None, 0), 1);
            let fit = pinned::traffic(&fit_steps);
            for s in 0..2 {
                let target = &raw[s];
                if target.tokens() == 0 {
                    continue;
                }
                let steps = Steps::build(&requests(target, n_expert, None, 4), 1);
                for predictor in [
                    Predictor::Oracle,
                    Predictor::SameLayer(1),
                    Predictor::Lookahead(1),
                ] {
                    let g = predict::guesses(predictor, target, Some(&prev[s])).unwrap();
                    for m in [target.k, 2 * target.k] {
                        let pf = Prefetch::from_guesses(&g.ids, g.width, m);
                        for policy in Policy::ALL {
                            for capacity in [n_expert / 8, n_expert / 4, n_expert / 2] {
                                let cache = Cache::new(policy, capacity, &params, &fit);
                                let fast = prefetch::simulate(cache, &steps, &pf);
                                let slow = eager(cache, &steps, &pf);
                                assert_eq!(
                                    fast, slow,
                                    "layer {layer} split {s} {predictor} m={m} {policy} C={capacity}"
                                );
                                cells += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    // The quickstart traces prefill and decode ([run] trace_decode_tokens).
    assert_eq!(
        kinds, 2,
        "prefill and decode trace parts in the quickstart run"
    );
    // At least one layer with a layer before it, both splits.
    assert!(cells >= 2 * 3 * 2 * 8 * 3, "{cells} cells compared");

    // results.json: every policy at every capacity, fit and held-out prefill
    // and held-out decode, for the oracle, the baseline and the lookahead
    // guesses, and a recall table.
    let cases = [
        (TraceKind::Prefill, Split::Fit),
        (TraceKind::Prefill, Split::Heldout),
        (TraceKind::Decode, Split::Heldout),
    ];
    for policy in Policy::ALL {
        for (kind, split) in cases {
            for predictor in [
                Predictor::Oracle,
                Predictor::SameLayer(1),
                Predictor::Lookahead(1),
                Predictor::Lookahead(2),
            ] {
                let rows: Vec<_> = report
                    .prefetch
                    .iter()
                    .filter(|r| {
                        (r.policy, r.split, r.predictor, r.trace_mode)
                            == (policy, split, predictor, kind)
                    })
                    .collect();
                assert_eq!(
                    rows.len(),
                    3 * 2,
                    "{policy} {kind:?} {split:?} {predictor}: capacities x m"
                );
                for r in rows {
                    assert_eq!(r.loads, r.useful + r.wasted, "{r:?}");
                    if predictor == Predictor::Oracle {
                        assert_eq!(r.wasted, 0, "the oracle wastes nothing: {r:?}");
                    }
                }
            }
        }
    }
    for kind in [TraceKind::Prefill, TraceKind::Decode] {
        for predictor in [
            Predictor::SameLayer(1),
            Predictor::Lookahead(1),
            Predictor::Lookahead(2),
        ] {
            assert!(
                report
                    .accuracy
                    .iter()
                    .any(|a| (a.predictor, a.split, a.trace_mode)
                        == (predictor, Split::Heldout, kind)),
                "{kind:?} {predictor}: no held-out recall"
            );
        }
    }
}

/// The trace set has lookahead columns for d = 1 and 2, as wide as the
/// router top-N; every row of a layer with a MoE layer d ahead has a guess
/// (distinct experts), every row past the last has none.
fn check_lookahead_columns(set: &TraceSet, layers: &[u32], n_expert: usize) {
    let distances: Vec<u8> = set.ahead.iter().map(|&(d, _)| d).collect();
    assert_eq!(distances, vec![1, 2], "lookahead distances of the trace");
    for &(d, width) in &set.ahead {
        assert_eq!(width, set.n, "lookahead d={d} width");
    }
    for &layer in layers {
        let raw = set.read_layer(layer, n_expert).unwrap();
        for split in raw.iter().filter(|r| r.tokens() > 0) {
            for a in &split.ahead {
                let ahead = layers.contains(&(layer + u32::from(a.distance)));
                check_rows(split, a.distance, a.width, &a.ids, ahead, layer);
            }
        }
    }
}

fn check_rows(raw: &RawLayer, d: u8, width: usize, ids: &[u16], ahead: bool, layer: u32) {
    for t in 0..raw.tokens() {
        let row = &ids[t * width..(t + 1) * width];
        if !ahead {
            assert!(
                row.iter().all(|&e| e == NONE),
                "layer {layer} d={d}: a guess past the last layer"
            );
            continue;
        }
        let mut seen: Vec<u16> = row.to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert!(
            !row.contains(&NONE) && seen.len() == width,
            "layer {layer} d={d} token {t}: guesses {row:?}"
        );
    }
}
