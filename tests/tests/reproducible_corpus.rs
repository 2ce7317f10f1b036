//! The corpus is a function of the config and the files' contents only:
//! the quickstart config prepared from different working directories, and a
//! copy of `configs/` at another path, give the same chunks, the same
//! per-document table and, measured on the same model, the same
//! `saliency.json`.

use std::path::{Path, PathBuf};

/// Copies the quickstart config and its sample corpus to `to/configs`, with
/// `model` at `models/quickstart-moe.gguf` beside it; returns the config path.
fn copy_configs(to: &Path, model: &Path) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let configs = to.join("configs");
    std::fs::create_dir_all(configs.join("sample_corpus")).unwrap();
    std::fs::create_dir_all(configs.join("models")).unwrap();
    for entry in std::fs::read_dir(repo.join("configs/sample_corpus")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            configs.join("sample_corpus").join(entry.file_name()),
        )
        .unwrap();
    }
    std::fs::copy(model, configs.join("models/quickstart-moe.gguf")).unwrap();
    let config = configs.join("quickstart.toml");
    std::fs::copy(repo.join("configs/quickstart.toml"), &config).unwrap();
    config
}

/// `coordinator corpus CONFIG --out OUT` started in `cwd`; returns the manifest.
fn prepare(cwd: &Path, config: &Path, out: &Path) -> serde_json::Value {
    let run = fixtures::command("coordinator")
        .current_dir(cwd)
        .args(["corpus", config.to_str().unwrap(), "--out"])
        .arg(out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "coordinator corpus {} in {}: {}",
        config.display(),
        cwd.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap()
}

fn collect(model: &Path, run: &Path, chunks: &str) -> Vec<u8> {
    let extra = ["--trace-every", "0"];
    fixtures::run_ok(
        "worker",
        &fixtures::worker_args("collect", model, run, chunks, run, &extra),
    );
    std::fs::read(run.join("saliency.json")).unwrap()
}

#[test]
fn corpus_and_saliency_do_not_depend_on_the_working_directory_or_config_location() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let model = repo.join("configs/models/quickstart-moe.gguf");
    let here = copy_configs(&root.join("one"), &model);
    let there = copy_configs(&root.join("two/deeper/elsewhere"), &model);
    let configs = here.parent().unwrap();
    let runs = root.join("runs");

    // (working directory, config as given, run): relative from the config's
    // directory, relative from its parent, absolute from `/`, and the copy.
    let cases: [(&Path, PathBuf, PathBuf); 4] = [
        (configs, PathBuf::from("quickstart.toml"), runs.join("a")),
        (
            configs.parent().unwrap(),
            PathBuf::from("configs/quickstart.toml"),
            runs.join("b"),
        ),
        (Path::new("/"), here.clone(), runs.join("c")),
        (root, there.clone(), runs.join("d")),
    ];
    let manifests: Vec<serde_json::Value> = cases
        .iter()
        .map(|(cwd, config, out)| prepare(cwd, config, out))
        .collect();
    let first = &manifests[0];
    assert_eq!(
        first["chunk_plan"]["heldout_tokens"]
            .as_u64()
            .map(|t| t > 0),
        Some(true)
    );
    for (m, (cwd, config, _)) in manifests.iter().zip(&cases).skip(1) {
        for field in [
            "chunks_sha256",
            "index_sha256",
            "inputs_sha256",
            "domains",
            "dropped",
        ] {
            assert_eq!(
                m[field],
                first[field],
                "{field} differs for {} run from {}",
                config.display(),
                cwd.display()
            );
        }
    }
    let documents = |run: &Path| std::fs::read(run.join("corpus/documents.jsonl")).unwrap();
    for (_, _, out) in &cases[1..] {
        assert!(
            documents(out) == documents(&cases[0].2),
            "corpus/documents.jsonl of {} differs",
            out.display()
        );
    }

    // The same chunks measured on the same model: the same saliency.
    let n = first["chunk_plan"]["n_chunks"].as_u64().unwrap().min(6);
    let chunks = format!("0..{n}");
    let a = collect(&model, &cases[0].2, &chunks);
    let d = collect(&model, &cases[3].2, &chunks);
    assert!(
        a == d,
        "saliency.json differs between the two config locations"
    );
}

/// The quickstart config, tolerance as committed, on models whose
/// tokenizers split the same files into other token counts (#54): with
/// `shares = "sample"` (the default) every domain's fit share lands within
/// the tolerance of its target and the tokens left out are counted; a
/// generated model runs the whole pipeline on it.
#[test]
fn quickstart_shares_are_met_on_other_vocabularies() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let models = [
        repo.join("configs/models/quickstart-moe.gguf"),
        fixtures::model(root, synth::Preset::Tiny),
        fixtures::model(root, synth::Preset::TinyAlt),
        fixtures::model(root, synth::Preset::Deepseek2),
    ];
    for (i, model) in models.iter().enumerate() {
        let config = copy_configs(&root.join(format!("m{i}")), model);
        let m = prepare(root, &config, &root.join(format!("run{i}")));
        let mut left_out = 0;
        for d in m["domains"].as_array().unwrap() {
            let name = d["shares"]["domain"].as_str().unwrap();
            let target = d["shares"]["target"].as_f64().unwrap();
            let fit = d["fit_share"].as_f64().unwrap();
            assert!(
                (fit - target).abs() <= 0.05,
                "{}: {name} fit share {fit} against {target}",
                model.display()
            );
            left_out += d["over_share_tokens"].as_u64().unwrap_or(0);
        }
        assert!(left_out > 0, "{}: no text left out", model.display());
    }
    // The whole pipeline on the first generated model.
    let config = root.join("m1/configs/quickstart.toml");
    let out = root.join("whole");
    fixtures::run_ok(
        "coordinator",
        &[
            "run",
            config.to_str().unwrap(),
            "--local-workers",
            "2",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(out.join("eval/summary.json").is_file());
}
