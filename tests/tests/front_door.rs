//! The README's front door: `coordinator run` on the quickstart config with
//! two local workers runs the whole job (generated model, sample corpus,
//! collection over QUIC, merge, score, replay, verify, report, the `[eval]`
//! candidates against the base model) and marks the run complete only
//! because verification passed; on a grouped model, an `[eval]` failure
//! keeps what verification wrote.

use std::path::Path;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A private copy of configs/ in `dir` with the quickstart config edited by
/// `edit`: the run generates its model next to the config, and the
/// repository's own copy must stay untouched. Returns the config's path.
fn quickstart_copy(dir: &Path, edit: impl Fn(String) -> String) -> std::path::PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let configs = dir.join("configs");
    copy_dir(
        &repo.join("configs/sample_corpus"),
        &configs.join("sample_corpus"),
    );
    let text = std::fs::read_to_string(repo.join("configs/quickstart.toml")).unwrap();
    let config = configs.join("quickstart.toml");
    std::fs::write(&config, edit(text)).unwrap();
    config
}

#[test]
fn quickstart_run_finishes_verified_and_marked_complete() {
    let dir = tempfile::tempdir().unwrap();
    let configs = quickstart_copy(dir.path(), |t| t)
        .parent()
        .unwrap()
        .to_path_buf();
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

/// A grouped model (the deepseek2 preset: MLA, 32 experts in 4 routing
/// groups, 2 per token) with an `[eval]` share grouped routing cannot run
/// ("20%" is 6 experts, 4 in whole groups: one per group, which llama.cpp
/// cannot rank). `coordinator run` verifies before it evaluates: the verify
/// table, the report and the manifest are written, then the evaluation
/// stage fails naming the entry and the run exits 1. Every keep map `score`
/// wrote (every method, every size) is group-balanced: the slicer accepts
/// each, and llama.cpp runs a pruned model.
#[test]
fn grouped_model_keeps_verify_and_report_when_eval_fails_and_every_map_prunes() {
    let dir = tempfile::tempdir().unwrap();
    let config = quickstart_copy(dir.path(), |t| {
        assert!(t.contains("k = [\"50%\", \"75%\"]"), "{t}");
        t.replace("k = [\"50%\", \"75%\"]", "k = [\"50%\", \"20%\"]")
    });
    let model = fixtures::model(dir.path(), worker::synth::Preset::Deepseek2);
    let out = dir.path().join("runs/grouped");
    let run = fixtures::run(
        "coordinator",
        &[
            "run",
            config.to_str().unwrap(),
            "--local-workers",
            "2",
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("[eval] failed")
            && stderr.contains("\"20%\"")
            && stderr.contains("1 expert per routing group"),
        "{stderr}"
    );
    assert!(
        stdout.contains("invariants hold") && !stdout.contains("run complete"),
        "{stdout}"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["run"]["verify_passed"], true, "{manifest}");
    assert_eq!(manifest["run"]["complete"], true, "{manifest}");
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    assert!(
        report.contains("## Verification: every invariant holds")
            && report.contains("Keep maps follow the model's grouped routing"),
        "{report}"
    );
    assert!(!out.join("eval/summary.json").exists());

    // Every map score wrote is one the slicer accepts; one runs in llama.cpp.
    let mut maps: Vec<_> = std::fs::read_dir(out.join("keep_maps"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    maps.sort();
    let mut ks = std::collections::BTreeSet::new();
    let pruned = dir.path().join("pruned.gguf");
    for path in &maps {
        let map: common::keepmap::KeepMap =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        ks.insert(map.k);
        common::prune::slice_model(&model, &map, &pruned)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        std::fs::remove_file(&pruned).unwrap();
    }
    // 8, 16, 24 (the defaults, 16 also for "50%"), five methods each.
    assert_eq!(ks.into_iter().collect::<Vec<_>>(), vec![8, 16, 24]);
    assert_eq!(maps.len(), 15, "{maps:?}");
    let smallest: common::keepmap::KeepMap =
        serde_json::from_slice(&std::fs::read(out.join("keep_maps/reap_hybrid_K8.json")).unwrap())
            .unwrap();
    common::prune::slice_model(&model, &smallest, &pruned).unwrap();
    let logits = fixtures::llama_logits::logits(&pruned, &[1, 2, 3, 4], 1).unwrap();
    assert!(logits.iter().flatten().all(|v| v.is_finite()));
}
