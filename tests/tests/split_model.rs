//! Models split across files as llama.cpp's `gguf-split` writes them (how
//! large MoE models are published): a worker measures one from its first
//! file exactly as it measures the same model in one file, the model's hash
//! covers every file, a missing file is named, and the slicer reads all the
//! files as one model: what it writes is what the one-file model gives.

use numbers::partial::Partial;
use std::path::Path;
use synth::{Overrides, Preset};

const N_CTX: u32 = 48;

fn collect(model: &Path, corpus: &Path, out: &Path) -> std::process::Output {
    let extra = ["--threads", "2", "--n-ubatch", "32", "--reduce", "host"];
    fixtures::run(
        "worker",
        &fixtures::worker_args("collect", model, corpus, "0..4", out, &extra),
    )
}

/// The `tiny` preset (seed 7, as [`fixtures::model`] writes it) as `count`
/// split files named after `path`; the first file's path.
fn split_tiny(path: &Path, count: u16) -> std::path::PathBuf {
    synth::write_model_split(Preset::Tiny, 7, Overrides::default(), path, count).unwrap()
}

fn partial(out: &Path) -> Partial {
    Partial::from_bytes(&std::fs::read(out.join("partials/part-00000000-00000004.bin")).unwrap())
        .unwrap()
}

#[test]
fn a_split_model_is_measured_as_the_same_model_in_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let whole = fixtures::model(dir.path(), Preset::Tiny);
    let first = split_tiny(&dir.path().join("split/tiny.gguf"), 3);
    assert!(first.ends_with("split/tiny-00001-of-00003.gguf"));
    let corpus = fixtures::corpus_dir(dir.path(), "corpus-run", 4, N_CTX);

    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for (model, out) in [(&whole, &a), (&first, &b)] {
        let o = collect(model, &corpus, out);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let (pa, mut pb) = (partial(&a), partial(&b));
    // The split model's hash is of its three files' bytes in order.
    let mut bytes = Vec::new();
    for i in 1..=3 {
        let shard = dir.path().join(format!("split/tiny-0000{i}-of-00003.gguf"));
        bytes.extend(std::fs::read(shard).unwrap());
    }
    assert_eq!(pb.model_sha256, gguf::hash::sha256_hex(&bytes));
    assert_eq!(
        pa.model_sha256,
        gguf::hash::sha256_hex(&std::fs::read(&whole).unwrap())
    );
    // Everything else is the same measurement.
    pb.model_sha256.clone_from(&pa.model_sha256);
    assert!(pa == pb, "the split model measured differently");

    // The slicer's own split files (a third of the model each at most)
    // load in llama.cpp as the model.
    let third = std::fs::metadata(&whole).unwrap().len() / 3;
    let ours = dir.path().join("ours/tiny.gguf");
    std::fs::create_dir(ours.parent().unwrap()).unwrap();
    let parts = slicer::make_model_split(&whole, None, None, &ours, third).unwrap();
    assert!(parts.len() >= 3, "{} files", parts.len());
    let c = dir.path().join("c");
    let o = collect(&parts[0].0, &corpus, &c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut pc = partial(&c);
    pc.model_sha256.clone_from(&pa.model_sha256);
    assert!(pa == pc, "the slicer's split files measured differently");

    // A missing file is named before llama.cpp is asked to load.
    std::fs::remove_file(dir.path().join("split/tiny-00003-of-00003.gguf")).unwrap();
    let o = collect(&first, &corpus, &dir.path().join("d"));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("is split into 3 files, but")
            && err.contains("tiny-00003-of-00003.gguf is missing"),
        "{err}"
    );
}

#[test]
fn the_slicer_reads_a_split_model_as_the_same_model_in_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let whole = fixtures::model(dir.path(), Preset::Tiny);
    let first = split_tiny(&dir.path().join("split/tiny.gguf"), 3);
    let out = |name: &str| dir.path().join(name);
    let bytes = |p: &Path| std::fs::read(p).unwrap();

    // Copied whole, the three files are the one-file model byte for byte:
    // every file's tensors in order, the split keys left out.
    let joined = slicer::make_model(&first, None, None, &out("joined.gguf")).unwrap();
    assert!(bytes(&out("joined.gguf")) == bytes(&whole));
    assert_eq!(joined.sha256, gguf::hash::sha256_file(&whole).unwrap());

    // Sliced to a keep map and fewer experts per token, and sliced alone:
    // the bytes the one-file model gives.
    let keep = fixtures::keep_map(8, &[0, 1, 2], 16);
    for used in [Some(1), None] {
        let a = slicer::make_model(&whole, Some(&keep), used, &out("a.gguf")).unwrap();
        let b = slicer::make_model(&first, Some(&keep), used, &out("b.gguf")).unwrap();
        assert_eq!(a, b, "experts used {used:?}");
        assert!(bytes(&out("a.gguf")) == bytes(&out("b.gguf")));
        std::fs::remove_file(out("a.gguf")).unwrap();
        std::fs::remove_file(out("b.gguf")).unwrap();
    }

    // A missing file is named, and nothing is written.
    std::fs::remove_file(dir.path().join("split/tiny-00002-of-00003.gguf")).unwrap();
    let err = slicer::slice_model(&first, &keep, &out("c.gguf"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "model {} is split into 3 files, but {} is missing",
            first.display(),
            dir.path().join("split/tiny-00002-of-00003.gguf").display()
        )
    );
    assert!(!out("c.gguf").exists());
}

#[test]
fn a_whole_run_on_a_split_model_matches_the_run_on_one_file() {
    let dir = tempfile::tempdir().unwrap();
    // The candidates of `[eval]` are sliced from the split model.
    let eval = "[eval]\nmethods = [\"frequency\"]\nk = [\"50%\"]\n";
    let whole_config = fixtures::text_config(dir.path(), eval);
    let first = split_tiny(&dir.path().join("tiny.gguf"), 2);
    let split_config = dir.path().join("split.toml");
    let text = std::fs::read_to_string(&whole_config).unwrap();
    std::fs::write(
        &split_config,
        text.replace("\"tiny.gguf\"", "\"tiny-00001-of-00002.gguf\""),
    )
    .unwrap();
    let (whole_run, split_run) = (dir.path().join("whole"), dir.path().join("split"));
    fixtures::coordinator_run(&whole_config, 2, &whole_run);
    fixtures::coordinator_run(&split_config, 2, &split_run);

    let hash_of = |files: &[&Path]| {
        let bytes: Vec<u8> = files
            .iter()
            .flat_map(|f| std::fs::read(f).unwrap())
            .collect();
        gguf::hash::sha256_hex(&bytes)
    };
    let whole_sha = hash_of(&[&dir.path().join("tiny.gguf")]);
    let split_sha = hash_of(&[&first, &dir.path().join("tiny-00002-of-00002.gguf")]);
    let manifest_sha = |run: &Path| {
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap();
        m["model_sha256"].as_str().unwrap().to_string()
    };
    assert_eq!(manifest_sha(&whole_run), whole_sha);
    assert_eq!(
        manifest_sha(&split_run),
        split_sha,
        "the run names the split model's hash"
    );
    // Cache replay weighs expert loads by the expert tensors' bytes, which
    // are in both files of the split model.
    let replay = |run: &Path| std::fs::read_to_string(run.join("replay/results.json")).unwrap();
    let whole_model = dir.path().join("tiny.gguf").display().to_string();
    let whole_replay = replay(&whole_run);
    let rows: serde_json::Value = serde_json::from_str(&whole_replay).unwrap();
    let rows = rows["rows"].as_array().unwrap();
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["bytes_moved"].is_u64()),
        "{whole_replay}"
    );
    assert_eq!(
        replay(&split_run).replace(&first.display().to_string(), &whole_model),
        whole_replay
    );
    for name in ["saliency.json", "imatrix.gguf", "replay/report.md"] {
        assert!(
            std::fs::read(whole_run.join(name)).unwrap()
                == std::fs::read(split_run.join(name)).unwrap(),
            "{name} of the split model differs from the one-file model's"
        );
    }
    // Its candidates, sliced from the two files, evaluate as the one-file
    // model's do.
    let summary = |run: &Path| -> numbers::eval::EvalSummary {
        serde_json::from_slice(&std::fs::read(run.join("eval/summary.json")).unwrap()).unwrap()
    };
    let (whole_eval, mut split_eval) = (summary(&whole_run), summary(&split_run));
    assert_eq!(split_eval.base_sha256, split_sha);
    assert_eq!(whole_eval.candidates.len(), 1);
    split_eval.base_sha256.clone_from(&whole_eval.base_sha256);
    assert_eq!(whole_eval, split_eval);
}
