//! `coordinator prune` on a run directory and on an S3 run: the pruned model
//! and its importance matrix are written, load in llama.cpp's GGUF reader,
//! and what was done is printed; a refused keep map leaves no file behind.

use fixtures::llama_gguf::LlamaGguf;
use numbers::imatrix::{Imatrix, ImatrixEntry};
use runfiles::keepmap::KeepMap;
use runfiles::store::RunStore;
use std::path::Path;
use synth::Preset;

const N_EXPERT: u32 = 16;
const MOE_LAYERS: [u32; 3] = [0, 1, 2];

fn keep_map(k: u32, layers: &[u32]) -> KeepMap {
    fixtures::keep_map(k, layers, N_EXPERT)
}

/// An importance matrix shaped like `tiny`'s, each expert's counts = its id.
fn imatrix() -> Vec<u8> {
    let mut m = Imatrix {
        chunk_count: 2,
        chunk_size: 48,
        ..Default::default()
    };
    for l in MOE_LAYERS {
        m.entries.insert(
            format!("blk.{l}.ffn_gate_inp.weight"),
            ImatrixEntry::new(64, 1),
        );
        for (name, n_in) in [
            ("ffn_gate_exps", 64),
            ("ffn_up_exps", 64),
            ("ffn_down_exps", 32),
        ] {
            let mut e = ImatrixEntry::new(n_in, N_EXPERT);
            e.counts = (0..N_EXPERT as u64).collect();
            m.entries.insert(format!("blk.{l}.{name}.weight"), e);
        }
    }
    m.to_gguf(&["test".into()])
}

/// Writes the run's keep maps, importance matrix and a manifest naming `model`.
async fn populate(store: &RunStore, model: &Path) {
    for (k, layers) in [(8, &MOE_LAYERS[..]), (8, &[0, 1, 2, 5][..])] {
        let mut map = keep_map(k, layers);
        if layers.len() == 4 {
            map.method = "bad".into();
        }
        let name = KeepMap::object_name(&format!("{}_K{k}", map.method));
        store
            .put(&name, serde_json::to_vec(&map).unwrap())
            .await
            .unwrap();
    }
    store.put("imatrix.gguf", imatrix()).await.unwrap();
    let manifest = serde_json::json!({ "config": { "model": { "path": model } } });
    store
        .put("manifest.json", serde_json::to_vec(&manifest).unwrap())
        .await
        .unwrap();
}

/// `coordinator prune RUN --keep-map KEEP_MAP --out OUT [--model MODEL]`.
fn prune_args<'a>(
    run: &'a str,
    keep_map: &'a str,
    out: &'a Path,
    model_flag: Option<&'a Path>,
) -> Vec<&'a str> {
    let mut args = vec!["prune", run, "--keep-map", keep_map];
    args.extend(["--out", out.to_str().unwrap()]);
    if let Some(m) = model_flag {
        args.extend(["--model", m.to_str().unwrap()]);
    }
    args
}

fn prune_and_check(run: &str, dir: &Path, model_flag: Option<&Path>) {
    let out = dir.join("pruned.gguf");
    let args = prune_args(run, "test_K8", &out, model_flag);
    let stdout = String::from_utf8(fixtures::run_ok("coordinator", &args).stdout).unwrap();
    let imatrix = dir.join("pruned.imatrix.gguf");
    let sha = gguf::hash::sha256_file(&out).unwrap();
    assert!(stdout.contains("12 tensors sliced"), "{stdout}");
    assert!(stdout.contains(&format!("sha256 {sha}")), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "sha256 {}",
            gguf::hash::sha256_file(&imatrix).unwrap()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("GB/s"), "{stdout}");
    let g = LlamaGguf::open(&out).unwrap();
    assert_eq!(g.u32("qwen3moe.expert_count"), Some(8));
    let m = LlamaGguf::open(&imatrix).unwrap();
    let counts = m.f32_tensor("blk.1.ffn_up_exps.weight.counts").unwrap();
    let want: Vec<f32> = keep_map(8, &MOE_LAYERS).layers[&1]
        .iter()
        .map(|&e| e as f32)
        .collect();
    assert_eq!(
        counts.data, want,
        "the importance matrix keeps the kept experts' counts"
    );
    // Neither file is left under its temporary name.
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pruned") || n.starts_with('.'))
        .collect();
    names.sort();
    assert_eq!(names, ["pruned.gguf", "pruned.imatrix.gguf"]);
}

fn refused_leaves_nothing(run: &str, dir: &Path, model_flag: Option<&Path>) {
    let out = dir.join("bad.gguf");
    let args = prune_args(run, "bad_K8", &out, model_flag);
    let output = fixtures::run("coordinator", &args);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("keep map bad_K8") && stderr.contains("layer 5"),
        "{stderr}"
    );
    assert!(!out.exists() && !dir.join("bad.imatrix.gguf").exists());
    assert!(!std::fs::read_dir(dir).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("bad")));
}

/// A prune to an `--out` whose model or importance matrix exists is refused
/// naming that file, and both files are left as they were (finding 7 of
/// issue 42: `--out` silently replaced them).
fn never_replaces(run: &str, dir: &Path) {
    let out = dir.join("pruned.gguf");
    let imatrix = dir.join("pruned.imatrix.gguf");
    let before = [
        std::fs::read(&out).unwrap(),
        std::fs::read(&imatrix).unwrap(),
    ];
    let refused = |shown: &Path| {
        let output = fixtures::run("coordinator", &prune_args(run, "test_K8", &out, None));
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("{} exists", shown.display()))
                && stderr.contains("never replaces"),
            "{stderr}"
        );
    };
    refused(&out);
    assert_eq!(std::fs::read(&out).unwrap(), before[0]);
    assert_eq!(std::fs::read(&imatrix).unwrap(), before[1]);
    // The importance matrix alone there: refused too, no model written.
    let moved = dir.join("moved.gguf");
    std::fs::rename(&out, &moved).unwrap();
    refused(&imatrix);
    assert!(!out.exists());
    assert_eq!(std::fs::read(&imatrix).unwrap(), before[1]);
    std::fs::rename(&moved, &out).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_a_local_run_with_the_manifest_model() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let run_dir = d.path().join("run");
    populate(&RunStore::open(run_dir.to_str().unwrap()).unwrap(), &model).await;
    let out_dir = d.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    prune_and_check(run_dir.to_str().unwrap(), &out_dir, None);
    never_replaces(run_dir.to_str().unwrap(), &out_dir);
    refused_leaves_nothing(run_dir.to_str().unwrap(), &out_dir, None);

    // Split into files of at most 300 kB of tensor data: the same model
    // (joined again, byte for byte), each file printed.
    let split_dir = d.path().join("split");
    std::fs::create_dir_all(&split_dir).unwrap();
    let out = split_dir.join("pruned.gguf");
    let mut args = prune_args(run_dir.to_str().unwrap(), "test_K8", &out, None);
    args.extend(["--split-max-size", "300K"]);
    let stdout = String::from_utf8(fixtures::run_ok("coordinator", &args).stdout).unwrap();
    assert!(stdout.contains("12 tensors sliced"), "{stdout}");
    let mut names: Vec<String> = std::fs::read_dir(&split_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let parts = &names[..names.len() - 1];
    assert_eq!(names.last().unwrap(), "pruned.imatrix.gguf");
    assert!(parts.len() >= 3, "{names:?}");
    for (i, part) in parts.iter().enumerate() {
        assert_eq!(
            part,
            &format!("pruned-{:05}-of-{:05}.gguf", i + 1, parts.len())
        );
        let sha = gguf::hash::sha256_file(&split_dir.join(part)).unwrap();
        assert!(
            stdout.contains(&format!("{part}: ")) && stdout.contains(&sha),
            "{stdout}"
        );
    }
    let joined = split_dir.join("joined.gguf");
    let again = slicer::make_model(&split_dir.join(&parts[0]), None, None, &joined).unwrap();
    assert_eq!(
        again.sha256,
        gguf::hash::sha256_file(&out_dir.join("pruned.gguf")).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_a_run_in_s3() {
    let Some(bucket) = fixtures::s3_bucket() else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let prefix = format!(
        "s3://{bucket}/prune-{}",
        gguf::hash::sha256_hex(&protocol::wire::random_bytes(8))
    );
    populate(
        &RunStore::open(&prefix).unwrap(),
        Path::new("relative/model.gguf"),
    )
    .await;
    let out_dir = d.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    prune_and_check(&prefix, &out_dir, Some(&model));
    refused_leaves_nothing(&prefix, &out_dir, Some(&model));
}

/// `--imatrix FILE` slices an importance matrix written by another tool
/// instead of the run's: `tests/fixtures/imatrix/llama-imatrix.gguf`,
/// written by gguf-py (`make.py` beside it) in llama-imatrix's layout for
/// the committed quickstart model. Read back through llama.cpp's GGUF
/// reader: each stacked expert weight keeps the kept experts' `in_sum2`
/// rows and counts in the keep map's order, every other entry and the
/// file's datasets and chunk count are as written; the run needs no
/// `imatrix.gguf`.
#[test]
fn an_importance_matrix_written_by_another_tool_is_sliced_to_the_keep_map() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let model = repo.join("configs/models/quickstart-moe.gguf");
    let fixture = repo.join("tests/fixtures/imatrix/llama-imatrix.gguf");
    let dir = tempfile::tempdir().unwrap();
    // A run holding only a keep map, written by hand: per layer a
    // different half of the 32 experts.
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("keep_maps")).unwrap();
    let kept: Vec<Vec<u32>> = (0..4u32)
        .map(|l| {
            (0..32)
                .filter(|e| (e + l) % 2 == 0 || e % 7 == l)
                .take(16)
                .collect()
        })
        .collect();
    let layers: serde_json::Map<String, serde_json::Value> = kept
        .iter()
        .enumerate()
        .map(|(l, ids)| (l.to_string(), serde_json::json!(ids)))
        .collect();
    let map = run.join(KeepMap::object_name("half_K16"));
    std::fs::write(&map, serde_json::json!({ "layers": layers }).to_string()).unwrap();
    let out = dir.path().join("half.gguf");
    fixtures::run_ok(
        "coordinator",
        &[
            "prune",
            run.to_str().unwrap(),
            "--keep-map",
            "half_K16",
            "--model",
            model.to_str().unwrap(),
            "--imatrix",
            fixture.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let src = LlamaGguf::open(&fixture).unwrap();
    let got = LlamaGguf::open(&dir.path().join("half.imatrix.gguf")).unwrap();
    assert_eq!(
        got.str_array("imatrix.datasets"),
        src.str_array("imatrix.datasets")
    );
    assert_eq!(got.u32("imatrix.chunk_count"), Some(3));
    let names = src.tensor_names();
    assert_eq!(got.tensor_names().len(), names.len());
    let mut sliced = 0;
    for name in &names {
        let (s, g) = (src.f32_tensor(name).unwrap(), got.f32_tensor(name).unwrap());
        let layer: Option<usize> = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse().ok());
        if name.contains("_exps.weight") {
            let ids = &kept[layer.unwrap()];
            let row = s.ne[0];
            let want: Vec<f32> = ids
                .iter()
                .flat_map(|&e| s.data[e as usize * row..][..row].iter().copied())
                .collect();
            assert_eq!(g.ne[..2], [row, ids.len()], "{name}");
            assert_eq!(g.data, want, "{name}");
            sliced += 1;
        } else {
            assert_eq!((g.ne, &g.data), (s.ne, &s.data), "{name}");
        }
    }
    // gate, up and down of 4 layers, in_sum2 and counts each.
    assert_eq!(sliced, 24);
    assert_eq!(
        LlamaGguf::open(&out).unwrap().u32("qwen3moe.expert_count"),
        Some(16)
    );
}
