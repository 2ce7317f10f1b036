//! The real routing shape (DESIGN section 11): the `wide` preset's 48 MoE
//! layers x 512 experts, top-10, traced by `worker collect` in the compact
//! trace layout, and replay reading trace parts from S3 by range.

use fixtures::run_ok;
use numbers::Split;
use runfiles::trace::{read_part, write_part_as, Encoding, TraceRow};
use std::collections::BTreeSet;
use std::path::Path;
use synth::Preset;

const N_CTX: u32 = 1024;

fn parts(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir.join("trace"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    out.sort();
    out
}

#[test]
fn wide_model_traces_48_layers_of_512_experts_compactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Wide);
    let corpus = fixtures::corpus_dir(dir.path(), "corpus-run", 2, N_CTX);
    let out = dir.path().join("out");
    let extra = [
        "--threads",
        "2",
        "--trace-every",
        "1",
        "--trace-top-n",
        "64",
    ];
    run_ok(
        "worker",
        &fixtures::worker_args("collect", &model, &corpus, "0..2", &out, &extra),
    );
    let saliency: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("saliency.json")).unwrap()).unwrap();
    assert_eq!(saliency["n_expert"], 512);
    assert_eq!(saliency["n_expert_used"], 10);
    assert_eq!(
        saliency["splits"]["fit"]["layers"]
            .as_array()
            .unwrap()
            .len(),
        48
    );
    let tokens = u64::from(N_CTX + N_CTX * 5 / 8);
    assert_eq!(saliency["trace_tokens_written"], tokens);

    let mut rows: Vec<TraceRow> = Vec::new();
    let mut bytes = 0u64;
    for p in parts(&out) {
        let b = std::fs::read(&p).unwrap();
        bytes += b.len() as u64;
        rows.extend(read_part(b.into()).unwrap());
    }
    assert_eq!(rows.len() as u64, tokens * 48);
    let layers: BTreeSet<u32> = rows.iter().map(|r| r.layer).collect();
    assert_eq!(layers, (0..48).collect());
    for r in &rows {
        assert_eq!((r.selected.len(), r.topn_id.len()), (10, 64));
        let ids: BTreeSet<u16> = r.topn_id.iter().copied().collect();
        assert_eq!(ids.len(), 64, "top-64 ids repeat: {:?}", r.topn_id);
        assert!(ids.iter().all(|&e| e < 512));
        assert!(
            r.topn_prob.windows(2).all(|w| w[0] >= w[1]),
            "top-N probabilities not descending"
        );
        // Softmax gating: the selection is the router's top-10.
        let top10: BTreeSet<u16> = r.topn_id[..10].iter().copied().collect();
        let sel: BTreeSet<u16> = r.selected.iter().copied().collect();
        assert_eq!(
            sel, top10,
            "chunk {} pos {} layer {}",
            r.chunk, r.pos, r.layer
        );
    }
    let per_token = bytes as f64 / tokens as f64;
    // The same rows in the f32 layout, for the record.
    let full = write_part_as(&mut rows.clone(), 10, 64, Encoding::Full).unwrap();
    let full_per_token = full.len() as f64 / tokens as f64;
    println!("bytes per traced token: compact {per_token:.0}, f32 layout {full_per_token:.0}");
    // Issue #12's goal (at most 25,000 / 3 bytes per traced token) is a
    // benchmark figure on real 4,096-token parts (BENCHMARKS.md: 8,238 and
    // 8,192). These 1,664 random-token positions route less regularly and
    // carry the parts' fixed costs over fewer tokens (8,467 here), so the
    // test asserts the compact layout against the f32 one on the same rows.
    assert!(
        per_token * 1.4 < full_per_token,
        "compact trace takes {per_token:.0} bytes per traced token, the f32 layout {full_per_token:.0}"
    );
}

/// Routing with some locality over `layers` layers of 128 experts.
fn synthetic_rows(layers: u32, tokens: u32, chunk0: u32) -> Vec<TraceRow> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(chunk0);
    let mut below = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut rows = Vec::new();
    for layer in 0..layers {
        let mut prev: Vec<u16> = (0..16).collect();
        for t in 0..tokens {
            let mut ids: Vec<u16> = Vec::new();
            for &p in &prev {
                let e = if below(3) == 0 { below(128) as u16 } else { p };
                if !ids.contains(&e) {
                    ids.push(e);
                }
            }
            while ids.len() < 16 {
                let e = below(128) as u16;
                if !ids.contains(&e) {
                    ids.push(e);
                }
            }
            prev = ids.clone();
            let probs: Vec<f32> = (0..16).map(|i| 0.5f32.powi(i + 1)).collect();
            rows.push(TraceRow {
                split: if t % 4 == 3 {
                    Split::Heldout
                } else {
                    Split::Fit
                },
                domain: "web".into(),
                chunk: chunk0 + t / 256,
                pos: t % 256,
                token_id: 1,
                layer,
                selected: ids[..4].to_vec(),
                selected_weight: vec![0.25; 4],
                topn_id: ids,
                topn_prob: probs,
                lookahead: Vec::new(),
            });
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_s3_reads_parts_by_range_and_matches_local_replay() {
    let Some(bucket) = fixtures::s3_bucket() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let local = runfiles::store::RunStore::open(dir.path().to_str().unwrap()).unwrap();
    let prefix = format!(
        "s3://{bucket}/replay-{}",
        gguf::hash::sha256_hex(&protocol::wire::random_bytes(8))
    );
    let s3 = runfiles::store::RunStore::open(&prefix).unwrap();
    let saliency = br#"{"n_expert": 128, "n_expert_used": 4, "gating": "softmax", "trace_tokens_written": 0, "nonfinite_drops": 0, "splits": {}}"#.to_vec();
    for store in [&local, &s3] {
        for p in 0..3u32 {
            let mut rows = synthetic_rows(6, 512, 2 * p);
            let part = runfiles::trace::write_part(&mut rows, 4, 16).unwrap();
            store
                .put(&format!("trace/part-{p}.parquet"), part)
                .await
                .unwrap();
        }
        store.put("saliency.json", saliency.clone()).await.unwrap();
    }
    let args = |run: &str| {
        vec![
            "replay".to_string(),
            run.to_string(),
            "--capacity".into(),
            "8,32".into(),
            "--out".into(),
            "wide".into(),
        ]
    };
    for run in [local.url().to_string(), prefix.clone()] {
        let a = args(&run);
        tokio::task::spawn_blocking(move || {
            let argv: Vec<&str> = a.iter().map(String::as_str).collect();
            run_ok("coordinator", &argv);
        })
        .await
        .unwrap();
    }
    let results = |b: bytes::Bytes| {
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        v["rows"].clone()
    };
    let from_local = results(local.get("explore/wide/replay/results.json").await.unwrap());
    let from_s3 = results(s3.get("explore/wide/replay/results.json").await.unwrap());
    assert!(from_local.as_array().is_some_and(|r| r.len() >= 2 * 7 * 2));
    assert_eq!(
        from_local, from_s3,
        "replay from S3 differs from local replay"
    );
}
