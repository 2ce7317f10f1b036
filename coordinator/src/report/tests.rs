//! The report renders and its PNGs are real plots.

use super::*;
use crate::replay::results::{Mode, TraceKind};
use crate::replay::{Policy, PolicyParams, ResultRow};
use crate::score::testdata::{audit_layer, layer, saliency};

/// Decodes a PNG; returns (width, height, variance of the grey level, share
/// of non-white pixels).
fn inspect(bytes: &[u8]) -> (u32, u32, f64, f64) {
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px: Vec<f64> = buf[..info.buffer_size()]
        .chunks(info.color_type.samples())
        .map(|p| p.iter().take(3).map(|&c| c as f64).sum::<f64>() / 3.0)
        .collect();
    let mean = px.iter().sum::<f64>() / px.len() as f64;
    let var = px.iter().map(|p| (p - mean).powi(2)).sum::<f64>() / px.len() as f64;
    let ink = px.iter().filter(|&&p| p < 250.0).count() as f64 / px.len() as f64;
    (info.width, info.height, var, ink)
}

/// Replay results with one LRU row per capacity on the held-out split.
fn replay_results(points: &[(usize, f64)]) -> ReplayReport {
    let rows = points
        .iter()
        .map(|&(capacity, hit_rate)| ResultRow {
            split: Split::Heldout,
            trace_mode: TraceKind::Prefill,
            mode: Mode::Token,
            ubatch: 1,
            policy: Policy::Lru,
            capacity_spec: capacity.to_string(),
            capacity: capacity as f64,
            keep_map: "none".into(),
            tokens: 100,
            layers: 3,
            steps: 300,
            requests: 600,
            misses: 0,
            forced_misses: 0,
            overflow_steps: 0,
            hit_rate,
            misses_per_token: 0.0,
            bytes_moved: None,
            bytes_per_token: None,
            per_layer: Vec::new(),
        })
        .collect();
    ReplayReport {
        n_expert: 16,
        params: PolicyParams::default(),
        ubatch: 512,
        model: None,
        rows,
        lru_curves: Vec::new(),
        markdown: String::new(),
    }
}

async fn markdown(store: &RunStore) -> String {
    String::from_utf8(store.get(names::REPORT_MD).await.unwrap().to_vec()).unwrap()
}

#[tokio::test]
async fn report_renders_markdown_and_non_blank_plots() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
    let s = saliency(
        2,
        vec![
            audit_layer(1),
            audit_layer(3),
            layer(
                5,
                &[4000, 3000, 2000, 1000, 200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                &[1.0; 16],
            ),
        ],
    );
    store
        .put(names::SALIENCY_JSON, s.to_json_bytes())
        .await
        .unwrap();
    crate::score::score(&store, &crate::score::ScoreOptions::default())
        .await
        .unwrap();
    let replay = replay_results(&[(2, 0.2), (4, 0.5), (8, 0.8)]);
    store
        .put(names::REPLAY_RESULTS_JSON, replay.json_bytes())
        .await
        .unwrap();
    let out = report(&store).await.unwrap();
    assert!(
        !out.verified,
        "layer 5's reap sums hold dead experts' values: verify must say so"
    );
    assert_eq!(out.missing, Vec::<String>::new());
    assert_eq!(out.plots.len(), 3 + 1 + 1, "{:?}", out.plots);
    for name in &out.plots {
        let (w, h, var, ink) = inspect(&store.get(name).await.unwrap());
        assert_eq!((w, h), plots::SIZE);
        assert!(
            var > 100.0 && ink > 0.01,
            "{name} looks blank: variance {var}, ink {ink}"
        );
    }
    let md = markdown(&store).await;
    for needle in [
        "## Verification: SOME INVARIANTS FAIL",
        "![slot replacement K=4](slot_replacement_K4.png)",
        "![expert counts](expert_counts.png)",
        "![miss rate](miss_rate.png)",
        "### reap_hybrid K=12",
    ] {
        assert!(md.contains(needle), "report lacks {needle:?}:\n{md}");
    }
    // Without replay results the report says so and skips that plot.
    store.delete(names::REPLAY_RESULTS_JSON).await.unwrap();
    let again = report(&store).await.unwrap();
    assert_eq!(again.plots.len(), 4);
    assert_eq!(again.missing.len(), 1, "{:?}", again.missing);
    assert!(again.missing[0].contains("replay/results.json is missing"));
    assert!(markdown(&store).await.contains("Not shown: "));
}

#[tokio::test]
async fn report_without_scores_names_them_missing_and_writes_no_keep_maps() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
    let s = saliency(2, vec![audit_layer(1), audit_layer(3)]);
    store
        .put(names::SALIENCY_JSON, s.to_json_bytes())
        .await
        .unwrap();
    let out = report(&store).await.unwrap();
    assert!(
        out.missing
            .iter()
            .any(|m| m.contains("score/score.json is missing") && m.contains("coordinator score")),
        "{:?}",
        out.missing
    );
    assert_eq!(out.plots, vec!["report/expert_counts.png".to_string()]);
    assert!(store.list(names::KEEP_MAPS_DIR).await.unwrap().is_empty());
    assert!(!store
        .exists(crate::score::outputs::REPORT_JSON)
        .await
        .unwrap());

    // Scores of an older saliency.json are named stale, not redone.
    crate::score::score(&store, &crate::score::ScoreOptions::default())
        .await
        .unwrap();
    let maps = store.list(names::KEEP_MAPS_DIR).await.unwrap();
    let before: Vec<_> = read_all(&store, &maps).await;
    let changed = saliency(2, vec![audit_layer(1), audit_layer(5)]);
    store
        .put(names::SALIENCY_JSON, changed.to_json_bytes())
        .await
        .unwrap();
    let out = report(&store).await.unwrap();
    assert!(
        out.missing
            .iter()
            .any(|m| m.contains("computed from another saliency.json")),
        "{:?}",
        out.missing
    );
    assert_eq!(read_all(&store, &maps).await, before);
    assert_eq!(store.list(names::KEEP_MAPS_DIR).await.unwrap(), maps);
}

async fn read_all(store: &RunStore, names: &[String]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for n in names {
        out.push(store.get(n).await.unwrap().to_vec());
    }
    out
}

#[test]
fn a_blank_image_is_recognised_as_blank() {
    let white = vec![255u8; (plots::SIZE.0 * plots::SIZE.1 * 3) as usize];
    let (_, _, var, ink) = inspect(&plots::encode_png(&white, plots::SIZE).unwrap());
    assert_eq!((var, ink), (0.0, 0.0));
}
