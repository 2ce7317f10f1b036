//! The report renders and its PNGs are real plots.

use super::*;
use crate::score::testdata::{audit_layer, layer, saliency};
use ::replay::results::{CurvePoint, LruCurve, Mode, TraceKind};
use ::replay::{Policy, PolicyParams, ResultRow};

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
            resident_bytes: None,
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
        prefetch: Vec::new(),
        accuracy: Vec::new(),
        markdown: String::new(),
    }
}

async fn markdown(store: &RunStore) -> String {
    String::from_utf8(store.get(layout::REPORT_MD).await.unwrap().to_vec()).unwrap()
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
        .put(layout::SALIENCY_JSON, s.to_json_bytes())
        .await
        .unwrap();
    crate::score::score(&store, &crate::score::ScoreOptions::default())
        .await
        .unwrap();
    let replay = replay_results(&[(2, 0.2), (4, 0.5), (8, 0.8)]);
    store
        .put(layout::REPLAY_RESULTS_JSON, replay.json_bytes())
        .await
        .unwrap();
    let out = report(&store).await.unwrap();
    assert!(
        !out.verified,
        "layer 5's reap sums hold dead experts' values: verify must say so"
    );
    assert_eq!(out.missing, Vec::<String>::new());
    assert_eq!(out.plots.len(), 3 + 2 + 1, "{:?}", out.plots);
    for name in &out.plots {
        let (w, h, var, ink) = inspect(&store.get(name).await.unwrap());
        let size = if name.contains("miss_rate") {
            panels::figure_size(1, 1, 1)
        } else {
            plots::SIZE
        };
        assert_eq!((w, h), size, "{name}");
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
        "![expert reap](expert_reap.png)",
        "![miss rate, keep map none](miss_rate_none.png)",
        "### reap_hybrid K=12",
    ] {
        assert!(md.contains(needle), "report lacks {needle:?}:\n{md}");
    }
    // Without replay results the report says so and skips that plot.
    store.delete(layout::REPLAY_RESULTS_JSON).await.unwrap();
    let again = report(&store).await.unwrap();
    assert_eq!(again.plots.len(), 5);
    assert_eq!(again.missing.len(), 1, "{:?}", again.missing);
    assert!(again.missing[0].contains("replay/results.json is missing"));
    assert!(markdown(&store).await.contains("Not shown: "));
}

#[tokio::test]
async fn report_without_scores_names_them_missing_and_writes_no_keep_maps() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
    let s = saliency(2, vec![audit_layer(1), audit_layer(3)]);
    let out = report_over(
        &store,
        &s,
        &["score/score.json is missing", "coordinator score"],
    )
    .await;
    assert_eq!(
        out.plots,
        vec![
            "report/expert_counts.png".to_string(),
            "report/expert_reap.png".to_string()
        ]
    );
    assert!(store.list(layout::KEEP_MAPS_DIR).await.unwrap().is_empty());
    assert!(!store
        .exists(runfiles::layout::score::REPORT_JSON)
        .await
        .unwrap());

    // No scores: the evaluation table's slot column reads `-`, silently.
    let slots = || super::eval_table::slot_tables(&store);
    assert_eq!(slots().await.unwrap(), Ok(Vec::new()));

    // Scores of an older saliency.json are named stale, not redone, by the
    // report and by the evaluation table alike.
    crate::score::score(&store, &crate::score::ScoreOptions::default())
        .await
        .unwrap();
    assert!(!slots().await.unwrap().unwrap().is_empty());
    let maps = store.list(layout::KEEP_MAPS_DIR).await.unwrap();
    let before: Vec<_> = read_all(&store, &maps).await;
    let changed = saliency(2, vec![audit_layer(1), audit_layer(5)]);
    report_over(&store, &changed, &["computed from another saliency.json"]).await;
    let stale = slots().await.unwrap().unwrap_err();
    assert!(
        stale.contains("computed from another saliency.json"),
        "{stale}"
    );
    assert_eq!(read_all(&store, &maps).await, before);
    assert_eq!(store.list(layout::KEEP_MAPS_DIR).await.unwrap(), maps);
}

/// The report of `store` with `s` as its `saliency.json`, asserting that one
/// of the things it names missing says every one of `needles`.
async fn report_over(
    store: &RunStore,
    s: &numbers::saliency::Saliency,
    needles: &[&str],
) -> ReportOutput {
    store
        .put(layout::SALIENCY_JSON, s.to_json_bytes())
        .await
        .unwrap();
    let out = report(store).await.unwrap();
    assert!(
        out.missing
            .iter()
            .any(|m| needles.iter().all(|n| m.contains(n))),
        "{needles:?} not in {:?}",
        out.missing
    );
    out
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

/// Replay results grouped like a run at the real shape: 3 keep maps x 2
/// splits x (prefill token, prefill ubatch, decode token) x `policies` x
/// capacities 4, 8, 12 of 16 experts, plus a one-pass LRU curve per group
/// when LRU is among them. Every row gets its own miss rate; keep maps
/// other than `none` have 5 forced misses per group.
fn many_curves(policies: &[Policy]) -> ReplayReport {
    let groups = [
        (TraceKind::Prefill, Mode::Token),
        (TraceKind::Prefill, Mode::Ubatch),
        (TraceKind::Decode, Mode::Token),
    ];
    let mut base = replay_results(&[]);
    for keep in MANY_KEEP_MAPS {
        let forced = if keep == "none" { 0 } else { 5 };
        for split in Split::ALL {
            for (trace_mode, mode) in groups {
                for &policy in policies {
                    for capacity in [4usize, 8, 12] {
                        let n = base.rows.len() as f64;
                        let mut row =
                            replay_results(&[(capacity, 0.05 + n / 1000.0)]).rows[0].clone();
                        (row.split, row.trace_mode, row.mode) = (split, trace_mode, mode);
                        (row.policy, row.keep_map, row.forced_misses) =
                            (policy, keep.to_string(), forced);
                        base.rows.push(row);
                    }
                }
                if policies.contains(&Policy::Lru) {
                    let points = (1..=16)
                        .map(|capacity| CurvePoint {
                            capacity,
                            requests: 1000,
                            misses: 1000 - 60 * capacity as u64,
                        })
                        .collect();
                    base.lru_curves.push(LruCurve {
                        policy: LruCurve::POLICY.to_string(),
                        split,
                        trace_mode,
                        mode,
                        keep_map: keep.to_string(),
                        points,
                    });
                }
            }
        }
    }
    base
}

const MANY_KEEP_MAPS: [&str; 3] = ["none", "frequency_K8", "reap_l2_sum_K8"];

/// Writes `results` and a scored saliency into a fresh run, then reports it.
async fn report_of(results: &ReplayReport) -> (tempfile::TempDir, RunStore, ReportOutput) {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
    let s = saliency(2, vec![audit_layer(1), audit_layer(3)]);
    store
        .put(layout::SALIENCY_JSON, s.to_json_bytes())
        .await
        .unwrap();
    store
        .put(layout::REPLAY_RESULTS_JSON, results.json_bytes())
        .await
        .unwrap();
    let out = report(&store).await.unwrap();
    (dir, store, out)
}

/// Whether any pixel of the PNG `bytes` has exactly the colour `c`.
fn has_colour(bytes: &[u8], c: plotters::style::RGBColor) -> bool {
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf[..info.buffer_size()]
        .chunks(info.color_type.samples())
        .any(|p| (p[0], p[1], p[2]) == (c.0, c.1, c.2))
}

#[tokio::test]
async fn every_miss_rate_curve_is_drawn_in_one_figure_per_keep_map() {
    let results = many_curves(&Policy::ALL);
    assert_eq!(results.rows.len(), 3 * 2 * 3 * Policy::ALL.len() * 3);
    let (_dir, store, out) = report_of(&results).await;
    let stored = store.get(layout::REPORT_MISS_RATES_JSON).await.unwrap();
    let rates: replay::MissRates = serde_json::from_slice(&stored).unwrap();
    // One figure per keep map, each with 2 splits x 3 (trace, mode) panels
    // on a 3 x 2 grid, and one legend entry per policy.
    let maps: Vec<&str> = rates.figures.iter().map(|f| f.keep_map.as_str()).collect();
    assert_eq!(maps, MANY_KEEP_MAPS);
    for f in &rates.figures {
        assert_eq!(f.legend, Policy::ALL, "{}", f.keep_map);
        assert_eq!(f.capacities, [4.0, 8.0, 12.0]);
        let mut cells: Vec<(usize, usize)> = f.panels.iter().map(|p| (p.row, p.column)).collect();
        cells.sort();
        let grid: Vec<(usize, usize)> = (0..3).flat_map(|r| (0..2).map(move |c| (r, c))).collect();
        assert_eq!(cells, grid, "{}", f.keep_map);
        for p in &f.panels {
            assert_eq!(
                p.column,
                Split::ALL.iter().position(|&s| s == p.split).unwrap()
            );
            let policies: Vec<Policy> = p.curves.iter().map(|c| c.policy).collect();
            assert_eq!(policies, Policy::ALL);
        }
    }
    // The panel of a keep map's figure for a (split, trace mode, mode).
    let panel_of = |keep_map: &str, key| {
        let figure = rates.figures.iter().find(|f| f.keep_map == keep_map);
        let panels = &figure.unwrap().panels;
        panels
            .iter()
            .find(|p| (p.split, p.trace_mode, p.mode) == key)
            .unwrap()
    };
    // Every row's point is in its figure, panel and curve.
    for row in &results.rows {
        let panel = panel_of(&row.keep_map, (row.split, row.trace_mode, row.mode));
        let curve = panel
            .curves
            .iter()
            .find(|c| c.policy == row.policy)
            .unwrap();
        assert!(
            curve.points.contains(&(row.capacity, 1.0 - row.hit_rate)),
            "{} {} {} {} {} C={} missing from {:?}",
            row.keep_map,
            row.split,
            row.trace_mode,
            row.mode,
            row.policy,
            row.capacity,
            curve.points
        );
    }
    // LRU's line runs through every integer capacity between the replayed
    // ones, from the one-pass curve with the group's forced misses.
    for c in &results.lru_curves {
        let lru = &panel_of(&c.keep_map, (c.split, c.trace_mode, c.mode)).curves[0];
        assert_eq!(lru.policy, Policy::Lru);
        let xs: Vec<f64> = lru.points.iter().map(|p| p.0).collect();
        assert_eq!(xs, (4..=12).map(f64::from).collect::<Vec<_>>());
        let forced = if c.keep_map == "none" { 0 } else { 5 };
        for p in c
            .points
            .iter()
            .filter(|p| [5, 6, 7, 9, 10, 11].contains(&p.capacity))
        {
            let rate = (p.misses + forced) as f64 / (p.requests + forced) as f64;
            assert!(
                lru.points.contains(&(p.capacity as f64, rate)),
                "{p:?} {:?}",
                lru.points
            );
        }
    }
    // The PNGs: one per figure, sized for its grid, every policy's colour in it.
    let pngs: Vec<&String> = out
        .plots
        .iter()
        .filter(|p| p.contains("miss_rate"))
        .collect();
    let expected: Vec<String> = rates
        .figures
        .iter()
        .map(|f| format!("report/{}", f.png))
        .collect();
    assert_eq!(pngs, expected.iter().collect::<Vec<_>>());
    for name in pngs {
        let bytes = store.get(name).await.unwrap();
        let (w, h, var, ink) = inspect(&bytes);
        assert_eq!((w, h), panels::figure_size(3, 2, Policy::ALL.len()));
        assert!(var > 100.0 && ink > 0.01, "{name} looks blank");
        for p in Policy::ALL {
            assert!(
                has_colour(&bytes, replay::colour(p)),
                "{name} has no {p} line"
            );
        }
    }
    let md = markdown(&store).await;
    for keep in MANY_KEEP_MAPS {
        let needle =
            format!("### Keep map `{keep}`\n\n![miss rate, keep map {keep}](miss_rate_{keep}.png)");
        assert!(md.contains(&needle), "report lacks {needle:?}:\n{md}");
    }
    assert!(md.contains("[miss_rate.json](miss_rate.json)"));
    assert!(!md.contains("Showing the first"));
}

#[tokio::test]
async fn the_miss_rate_legend_names_only_the_policies_replayed() {
    let results = many_curves(&[Policy::Lru, Policy::Belady]);
    let (_dir, store, out) = report_of(&results).await;
    let stored = store.get(layout::REPORT_MISS_RATES_JSON).await.unwrap();
    let rates: replay::MissRates = serde_json::from_slice(&stored).unwrap();
    assert_eq!(rates.figures.len(), 3);
    for f in &rates.figures {
        assert_eq!(f.legend, [Policy::Lru, Policy::Belady]);
    }
    let name = out
        .plots
        .iter()
        .find(|p| p.contains("miss_rate_none"))
        .unwrap();
    let bytes = store.get(name).await.unwrap();
    assert_eq!(inspect(&bytes).0, panels::figure_size(3, 2, 2).0);
    for p in Policy::ALL {
        let drawn = matches!(p, Policy::Lru | Policy::Belady);
        assert_eq!(has_colour(&bytes, replay::colour(p)), drawn, "{p}");
    }
}

#[test]
fn keep_map_labels_become_distinct_file_names() {
    let mut results = many_curves(&[Policy::Ema]);
    for row in &mut results.rows {
        row.keep_map = match row.keep_map.as_str() {
            "none" => "a/b".into(),
            "frequency_K8" => "a b".into(),
            other => other.into(),
        };
    }
    let rates = replay::miss_rates(&results);
    let pngs: Vec<&str> = rates.figures.iter().map(|f| f.png.as_str()).collect();
    assert_eq!(
        pngs,
        [
            "miss_rate_a_b.png",
            "miss_rate_a_b_2.png",
            "miss_rate_reap_l2_sum_K8.png"
        ]
    );
}
