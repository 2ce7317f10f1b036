//! The post-collection pipeline on a real collection run of the generated
//! model: verify passes, score writes keep maps, replay covers both splits,
//! both step modes and decode traces (tokens the model generated itself),
//! and the report renders.

use fixtures::run_ok as run;
use std::path::Path;
use synth::Preset;

const N_CTX: u32 = 48;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn verify_score_replay_and_report_on_a_real_collection_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixtures::model(dir.path(), Preset::Tiny);
    let corpus = fixtures::corpus_dir(dir.path(), "corpus-run", 6, N_CTX);
    let runp = dir.path().join("run");
    let extra = [
        "--threads",
        "2",
        "--n-ubatch",
        "16",
        "--trace-top-n",
        "16",
        "--decode-tokens",
        "6",
        "--decode-prompt",
        "8",
    ];
    run(
        "worker",
        &fixtures::worker_args("collect", &model, &corpus, "0..6", &runp, &extra),
    );
    assert!(
        runp.join("trace/decode").read_dir().unwrap().count() == 1,
        "a decode trace part is written"
    );

    let verify = run("coordinator", &["verify", s(&runp)]);
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "verify on a real run:\n{text}");
    assert!(!text.contains("FAIL"), "verify on a real run:\n{text}");
    assert!(text.contains("PASS"), "verify prints its checks:\n{text}");

    // The run's own score (its defaults: every method, a quarter, half and
    // three quarters of the experts); other options would need --out.
    run("coordinator", &["score", s(&runp)]);
    assert!(runp.join("keep_maps/reap_hybrid_K8.json").exists());
    let verify = run("coordinator", &["verify", s(&runp)]);
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "verify with keep maps:\n{text}");
    assert!(!text.contains("FAIL"), "verify with keep maps:\n{text}");
    assert!(
        text.contains("keep map"),
        "verify checks the keep maps:\n{text}"
    );

    run(
        "coordinator",
        &[
            "replay",
            s(&runp),
            "--policies",
            "lru,ema,belady",
            "--capacity",
            "4,8",
            "--mode",
            "token,ubatch",
            "--split",
            "both",
            "--keep-map",
            "none,reap_hybrid_K8",
            "--model",
            s(&model),
            "--out",
            "real",
        ],
    );
    let results: serde_json::Value = serde_json::from_slice(
        &std::fs::read(runp.join("explore/real/replay/results.json")).unwrap(),
    )
    .unwrap();
    let rows = results["rows"].as_array().unwrap();
    for (split, trace, mode) in [
        ("fit", "prefill", "token"),
        ("heldout", "prefill", "token"),
        ("fit", "prefill", "ubatch"),
        ("heldout", "prefill", "ubatch"),
        ("heldout", "decode", "token"),
    ] {
        let found: Vec<_> = rows
            .iter()
            .filter(|r| r["split"] == split && r["trace_mode"] == trace && r["mode"] == mode)
            .collect();
        assert!(
            !found.is_empty(),
            "no replay rows for {split}/{trace}/{mode}"
        );
        for r in found {
            assert!(
                r["requests"].as_u64().unwrap() > 0,
                "{split}/{trace}/{mode}: no requests"
            );
            assert!(r["misses"].as_u64().unwrap() <= r["requests"].as_u64().unwrap());
        }
    }
    // Belady is optimal: never more misses than LRU or EMA in the same cell.
    for b in rows.iter().filter(|r| r["policy"] == "belady") {
        for other in rows.iter().filter(|r| {
            r["policy"] != "belady"
                && ["split", "trace_mode", "mode", "capacity", "keep_map"]
                    .iter()
                    .all(|k| r[*k] == b[*k])
        }) {
            let (belady, rival) = (
                b["misses"].as_u64().expect("belady row has misses"),
                other["misses"].as_u64().expect("every row has misses"),
            );
            assert!(belady <= rival, "belady worse than {}", other["policy"]);
        }
    }

    run("coordinator", &["report", s(&runp)]);
    let report = std::fs::read_to_string(runp.join("report/report.md")).unwrap();
    assert!(report.contains(".png"), "the report embeds plots");
}
