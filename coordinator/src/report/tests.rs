//! The report renders and its PNGs are real plots.

use super::*;
use crate::score::testdata::{audit_layer, layer, saliency};
use common::artifacts::names;

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
    let replay = serde_json::json!({"split": "heldout", "results": [
        {"policy": "lru", "capacity": 2, "misses": 80, "requests": 100},
        {"policy": "lru", "capacity": 4, "misses": 50, "requests": 100},
        {"policy": "lru", "capacity": 8, "misses": 20, "requests": 100}]});
    store
        .put("replay/lru.json", serde_json::to_vec(&replay).unwrap())
        .await
        .unwrap();
    let out = report(&store).await.unwrap();
    assert!(
        !out.verified,
        "layer 5's reap sums hold dead experts' values: verify must say so"
    );
    assert_eq!(out.plots.len(), 3 + 2 + 1, "{:?}", out.plots);
    for name in &out.plots {
        let (w, h, var, ink) = inspect(&store.get(name).await.unwrap());
        assert_eq!((w, h), plots::SIZE);
        assert!(
            var > 100.0 && ink > 0.01,
            "{name} looks blank: variance {var}, ink {ink}"
        );
    }
    let md = String::from_utf8(store.get(REPORT_MD).await.unwrap().to_vec()).unwrap();
    for needle in [
        "## Verification: SOME INVARIANTS FAIL",
        "![slot replacement K=4](slot_replacement_K4.png)",
        "![expert counts](expert_counts.png)",
        "![expert reap](expert_reap.png)",
        "![miss rate](miss_rate.png)",
        "### reap_hybrid K=12",
        "Note: `score` had not been run",
    ] {
        assert!(md.contains(needle), "report lacks {needle:?}:\n{md}");
    }
    // A second report reuses the stored scores and, without replay, skips that plot.
    store.delete("replay/lru.json").await.unwrap();
    let again = report(&store).await.unwrap();
    assert_eq!(again.plots.len(), 5);
    let md = String::from_utf8(store.get(REPORT_MD).await.unwrap().to_vec()).unwrap();
    assert!(
        md.contains("No replay results") && !md.contains("Note: `score`"),
        "{md}"
    );
}

#[test]
fn a_blank_image_is_recognised_as_blank() {
    let white = vec![255u8; (plots::SIZE.0 * plots::SIZE.1 * 3) as usize];
    let (_, _, var, ink) = inspect(&plots::encode_png(&white, plots::SIZE).unwrap());
    assert_eq!((var, ink), (0.0, 0.0));
}
