//! The README's front door: `coordinator run` on the quickstart config with
//! two local workers runs the whole job (generated model, sample corpus,
//! collection over QUIC, merge, score, replay, the `[eval]` candidates against
//! the base model, verify, report) and marks the run complete only because
//! verification passed.

use std::path::Path;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn quickstart_run_finishes_verified_and_marked_complete() {
    // A private copy of configs/: the run generates its model next to the
    // config, and the repository's own copy must stay untouched.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let configs = dir.path().join("configs");
    copy_dir(
        &repo.join("configs/sample_corpus"),
        &configs.join("sample_corpus"),
    );
    std::fs::copy(
        repo.join("configs/quickstart.toml"),
        configs.join("quickstart.toml"),
    )
    .unwrap();
    let out = dir.path().join("runs/quickstart");
    let run = fixtures::run_ok(
        "coordinator",
        &[
            "run",
            configs.join("quickstart.toml").to_str().unwrap(),
            "--local-workers",
            "2",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("run complete"), "{stdout}");

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let summary = &manifest["run"];
    assert_eq!(summary["complete"], true, "{summary}");
    assert_eq!(summary["verify_passed"], true, "{summary}");
    let workers = summary["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{summary}");
    let tokens: u64 = workers.iter().map(|w| w["tokens"].as_u64().unwrap()).sum();
    assert!(tokens > 0, "{summary}");

    for artifact in [
        "saliency.json",
        "imatrix.gguf",
        "replay/report.md",
        "report/report.md",
    ] {
        let len = std::fs::metadata(out.join(artifact))
            .unwrap_or_else(|e| panic!("{artifact}: {e}"))
            .len();
        assert!(len > 0, "{artifact} is empty");
    }
    let keep_maps = std::fs::read_dir(out.join("keep_maps")).unwrap().count();
    assert!(keep_maps > 0, "no keep maps written");

    // The evaluation of `[eval]`: two methods at two K each, with real KL.
    let eval: common::eval::EvalSummary =
        serde_json::from_slice(&std::fs::read(out.join("eval/summary.json")).unwrap()).unwrap();
    let cells: Vec<(String, u32)> = eval
        .candidates
        .iter()
        .map(|c| (c.method.clone(), c.k))
        .collect();
    let methods: std::collections::BTreeSet<&String> = cells.iter().map(|(m, _)| m).collect();
    assert!(methods.len() >= 2 && cells.len() >= 4, "{cells:?}");
    for c in &eval.candidates {
        let h = &c.splits["heldout"].all;
        assert!(
            h.n > 0 && h.kl.mean > 0.0 && h.kl.mean.is_finite(),
            "{}: {h:?}",
            c.name
        );
        assert!(
            h.kl.p50 <= h.kl.p99 && h.kl.p99 <= h.kl.max,
            "{}: {h:?}",
            c.name
        );
    }
    assert!(stdout.contains("evaluated 4 candidates"), "{stdout}");
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    assert!(
        report.contains("## Pruned candidates against the base model")
            && report.contains("| reap_hybrid_K8 |")
            && out.join("report/eval_kl_vs_k.png").is_file(),
        "{report}"
    );

    replay_without_model_finds_the_recorded_model(&out);
}

/// Regression: `coordinator replay RUN` looked for a `model_path` in the
/// manifest that nothing wrote, so without `--model` it knew no expert
/// sizes and reported no bytes moved. The run records the model it
/// collected with; replay finds it there.
fn replay_without_model_finds_the_recorded_model(out: &Path) {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let recorded = manifest["model_path"]
        .as_str()
        .expect("model_path recorded");
    assert!(Path::new(recorded).is_absolute() && Path::new(recorded).is_file());
    fixtures::run_ok(
        "coordinator",
        &[
            "replay",
            out.to_str().unwrap(),
            "--policies",
            "lru",
            "--capacity",
            "4",
        ],
    );
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("replay/results.json")).unwrap()).unwrap();
    let rows = results["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        let moved = r["bytes_moved"].as_u64();
        assert!(moved.is_some_and(|b| b > 0), "no bytes moved: {r}");
    }
}
