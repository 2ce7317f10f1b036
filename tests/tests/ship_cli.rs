//! `coordinator ship` on a run directory: every candidate sliced, quantised
//! by llama.cpp's quantiser with the sliced importance matrix, written
//! create-only with its SHA-256 in `SHA256SUMS`; the quantised files load
//! and run in llama.cpp with the asked tensor types and are byte for byte
//! what llama.cpp's own `llama_model_quantize` makes of the slice with
//! importance weights computed here; a second ship reuses every file; a
//! quantised base is refused unless `--allow-requantize`.

use fixtures::llama_gguf::LlamaGguf;
use fixtures::llama_quantize::{quantize, quantize_with, Kv, Q4_K_M, Q8_0};
use gguf::quant::QuantType;
use gguf::read::GgufReader;
use llama_cpp_sys_2 as sys;
use numbers::exact::ExactSum;
use numbers::imatrix::{Imatrix, ImatrixEntry};
use runfiles::keepmap::KeepMap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use synth::{Preset, WeightType};

/// An importance matrix for every weight matrix of `model` but the token
/// embedding: `in_sum2` values `0.5 + j/64` (exact in f32), `counts` of
/// matrix m `m mod 4` (so some matrices saw no input).
fn imatrix(model: &Path) -> Imatrix {
    let header = GgufReader::open(model).unwrap().header;
    let mut m = Imatrix {
        chunk_count: 2,
        chunk_size: 32,
        ..Default::default()
    };
    for t in &header.tensors {
        let Some(base) = t.name.strip_suffix(".weight") else {
            continue;
        };
        if t.dims.len() < 2 || base == "token_embd" {
            continue;
        }
        let (n_in, n_mat) = (t.dims[0] as u32, t.dims.get(2).copied().unwrap_or(1) as u32);
        let mut e = ImatrixEntry::new(n_in, n_mat);
        for (j, s) in e.in_sum2.iter_mut().enumerate() {
            *s = ExactSum::from_f64(0.5 + (j % 97) as f64 / 64.0).unwrap();
        }
        e.counts = (0..u64::from(n_mat)).map(|i| i % 4).collect();
        m.entries.insert(t.name.clone(), e);
    }
    m
}

/// The importance weights of `m` sliced to `keep`, as llama-quantize derives
/// them (`in_sum2 / count`, 1 where a matrix saw nothing), computed here:
/// the expert matrices of a kept layer keep the kept experts' rows.
fn sliced_weights(m: &Imatrix, keep: &KeepMap, n_expert: u32) -> BTreeMap<String, Vec<f32>> {
    m.entries
        .iter()
        .map(|(name, e)| {
            let layer: Option<u32> = name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|l| l.parse().ok());
            let mats: Vec<u32> = match layer.and_then(|l| keep.kept(l)) {
                Some(kept) if e.n_mat == n_expert => kept.to_vec(),
                _ => (0..e.n_mat).collect(),
            };
            let n_in = e.n_in as usize;
            let mut w = Vec::new();
            for mat in mats {
                let count = e.counts[mat as usize] as f32;
                let row = &e.in_sum2[mat as usize * n_in..][..n_in];
                w.extend(row.iter().map(|s| match count > 0.0 {
                    true => s.to_f64() as f32 / count,
                    false => 1.0,
                }));
            }
            (name.clone(), w)
        })
        .collect()
}

/// The keys llama-quantize writes into a file it quantises with `--imatrix
/// file` holding `m` (written by [`run_dir`] with the one dataset "test"):
/// the file as given, the first dataset, the entries, the chunks.
fn llama_quantize_keys<'a>(file: &'a str, m: &Imatrix) -> Vec<(&'static str, Kv<'a>)> {
    vec![
        ("quantize.imatrix.file", Kv::Str(file)),
        ("quantize.imatrix.dataset", Kv::Str("test")),
        (
            "quantize.imatrix.entries_count",
            Kv::Int(m.entries.len() as i64),
        ),
        (
            "quantize.imatrix.chunks_count",
            Kv::Int(m.chunk_count as i64),
        ),
    ]
}

/// A run directory with `maps`, the importance matrix `m` and a manifest
/// naming `model`.
/// The tiny model under `dir`, its importance matrix, and a run there with
/// the keep maps `test_K8` and `test_K4` of its three MoE layers; returns
/// (model, importance matrix, the K8 map, run).
fn two_candidate_run(dir: &Path) -> (PathBuf, Imatrix, KeepMap, PathBuf) {
    let model = fixtures::model(dir, Preset::Tiny);
    let layers = [0, 1, 2];
    let (k8, k4) = (
        fixtures::keep_map(8, &layers, 16),
        fixtures::keep_map(4, &layers, 16),
    );
    let m = imatrix(&model);
    let run = run_dir(dir, &model, &[("test_K8", &k8), ("test_K4", &k4)], &m);
    (model, m, k8, run)
}

fn run_dir(dir: &Path, model: &Path, maps: &[(&str, &KeepMap)], m: &Imatrix) -> PathBuf {
    let run = dir.join("run");
    std::fs::create_dir_all(run.join("keep_maps")).unwrap();
    for (name, map) in maps {
        std::fs::write(
            run.join(KeepMap::object_name(name)),
            serde_json::to_vec(map).unwrap(),
        )
        .unwrap();
    }
    std::fs::write(run.join("imatrix.gguf"), m.to_gguf(&["test".into()])).unwrap();
    let manifest = serde_json::json!({ "config": { "model": { "path": model } } });
    std::fs::write(
        run.join("manifest.json"),
        serde_json::to_vec(&manifest).unwrap(),
    )
    .unwrap();
    run
}

fn ship(
    run: &Path,
    out: &Path,
    candidates: &str,
    quant: &str,
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec![
        "ship",
        run.to_str().unwrap(),
        "--candidates",
        candidates,
        "--quant",
        quant,
        "--out",
        out.to_str().unwrap(),
        "--threads",
        "2",
        "--no-eval",
    ];
    args.extend(extra);
    fixtures::run("coordinator", &args)
}

/// Every file of `out` (no scratch or temporary file is left) and the
/// checksums `SHA256SUMS` records, checked against the files.
fn listed(out: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).unwrap();
    let mut recorded: Vec<String> = Vec::new();
    for line in sums.lines() {
        let (sha, name) = line.split_once("  ").unwrap();
        assert_eq!(
            gguf::hash::sha256_file(&out.join(name)).unwrap(),
            sha,
            "{name}"
        );
        recorded.push(name.to_string());
    }
    recorded.push("SHA256SUMS".into());
    recorded.sort();
    assert_eq!(
        names, recorded,
        "every file is recorded, nothing else is left"
    );
    names
}

/// llama.cpp loads `model` and decodes a few tokens to finite logits.
/// The expert tensors `experts` of `g` (the file `shipped`) are Q4_K_M's
/// mix, Q4_K with some Q6_K (at least one Q4_K), and llama.cpp runs the file.
fn q4_k_m_experts_run(g: &LlamaGguf, shipped: &Path, experts: impl Iterator<Item = String>) {
    let mut types = std::collections::BTreeSet::new();
    for t in experts {
        let ty = g.tensor_type(&t).unwrap();
        assert!(
            [sys::GGML_TYPE_Q4_K, sys::GGML_TYPE_Q6_K].contains(&ty),
            "{}: {t}: {ty}",
            shipped.display()
        );
        types.insert(ty);
    }
    let shown = shipped.display();
    assert!(types.contains(&sys::GGML_TYPE_Q4_K), "{shown}: {types:?}");
    runs_in_llama_cpp(shipped);
}

fn runs_in_llama_cpp(model: &Path) {
    let logits = fixtures::llama_logits::logits(model, &[1, 17, 42, 99, 3], 2).unwrap();
    assert!(
        logits.iter().flatten().all(|x| x.is_finite()),
        "{}",
        model.display()
    );
}

/// The card of `<name>.Q8_0.gguf` names the file, the base model, the keep
/// map and the sliced importance matrix by SHA-256, and its commands, which
/// name no local path (`RUN`, `OUT`, the base model's file name), make the
/// same bytes again once `RUN` is `run` and the base model is at hand.
fn card_says(out: &Path, name: &str, k: u32, model: &Path, run: &Path) {
    let file = format!("{name}.Q8_0.gguf");
    let sha = |p: &Path| gguf::hash::sha256_file(p).unwrap();
    let card: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(format!("{name}.Q8_0.json"))).unwrap())
            .unwrap();
    assert_eq!(card["file"]["file"], file.as_str());
    assert_eq!(card["file"]["sha256"], sha(&out.join(&file)).as_str());
    assert_eq!(card["base"]["file"]["sha256"], sha(model).as_str());
    assert_eq!(card["base"]["n_expert"], 16);
    assert_eq!(card["keep_map"]["k"], k);
    assert_eq!(card["quantisation"]["quant"], "Q8_0");
    let im = format!("{name}.imatrix.gguf");
    assert_eq!(card["quantisation"]["imatrix"]["file"], im.as_str());
    assert_eq!(
        card["quantisation"]["imatrix"]["sha256"],
        sha(&out.join(&im)).as_str()
    );
    assert!(
        card["tensor_types"]["Q8_0"].as_u64().unwrap() >= 9,
        "{card}"
    );
    let md = std::fs::read_to_string(out.join(format!("{name}.Q8_0.md"))).unwrap();
    // Hugging Face's metadata block first (its YAML is checked by the
    // `stages` unit test of the card).
    assert!(
        md.starts_with("---\nlibrary_name: gguf\ntags:\n- gguf\n"),
        "{md}"
    );
    assert!(md.contains("\n---\n\n# "), "{md}");
    assert!(
        md.contains("Q8_0 by llama.cpp's quantiser") && md.contains(&sha(&out.join(&file))),
        "{md}"
    );
    // The step-by-step commands, run in a directory holding the base model.
    let commands = card["commands"].as_array().unwrap();
    assert!(
        commands.iter().all(|c| !c.as_str().unwrap().contains('/')),
        "{commands:?}"
    );
    let again = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(model, again.path().join(model.file_name().unwrap())).unwrap();
    let run = run.to_str().unwrap();
    for c in commands.iter().skip(2) {
        let words: Vec<&str> = c
            .as_str()
            .unwrap()
            .split_whitespace()
            .map(|w| if w == "RUN" { run } else { w })
            .collect();
        if words[0] == "#" {
            continue;
        }
        let o = fixtures::command(words[0])
            .args(&words[1..])
            .current_dir(again.path())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{c}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(
        sha(&again.path().join(&file)),
        sha(&out.join(&file)),
        "the card's commands make {file} again"
    );
}

#[test]
fn ships_two_q8_0_candidates_reuses_them_and_refuses_to_requantize() {
    let d = tempfile::tempdir().unwrap();
    let (model, m, k8, run) = two_candidate_run(d.path());
    let out = d.path().join("ship");
    let o = ship(&run, &out, "test_K8,test_K4", "Q8_0", &[]);
    assert!(o.status.success());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("shipped 14 files") && stdout.contains("(14 made, 0 reused"),
        "{stdout}"
    );
    let names = listed(&out);
    assert_eq!(names.len(), 15, "{names:?}");
    for (name, k) in [("test_K8", 8), ("test_K4", 4)] {
        let q = out.join(format!("{name}.Q8_0.gguf"));
        let g = LlamaGguf::open(&q).unwrap();
        assert_eq!(g.u32("qwen3moe.expert_count"), Some(k));
        for t in g.tensor_names() {
            let ty = g.tensor_type(&t).unwrap();
            if t.contains("_exps.") {
                assert_eq!(ty, sys::GGML_TYPE_Q8_0, "{t}");
            } else {
                assert!(
                    [sys::GGML_TYPE_F32, sys::GGML_TYPE_Q8_0].contains(&ty),
                    "{t}: {ty}"
                );
            }
        }
        // llama.cpp's own quantiser on the slice makes the same bytes, with
        // the keys llama-quantize adds for the sliced matrix (Q8_0 weighs
        // no error by it).
        let want = d.path().join(format!("{name}.want.gguf"));
        let im = format!("{name}.imatrix.gguf");
        let keys = llama_quantize_keys(&im, &m);
        quantize_with(
            &out.join(format!("{name}.gguf")),
            &want,
            Q8_0,
            1,
            None,
            &keys,
        )
        .unwrap();
        assert_eq!(
            std::fs::read(&q).unwrap(),
            std::fs::read(&want).unwrap(),
            "{name}"
        );
        runs_in_llama_cpp(&q);
        card_says(&out, name, k, &model, &run);
    }

    // The same inputs again: every file is reused, none touched.
    let sums = std::fs::read(out.join("SHA256SUMS")).unwrap();
    let mtime = |n: &str| std::fs::metadata(out.join(n)).unwrap().modified().unwrap();
    let before: Vec<_> = names.iter().map(|n| mtime(n)).collect();
    let o = ship(&run, &out, "test_K8,test_K4", "Q8_0", &[]);
    assert!(o.status.success());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("(0 made, 14 reused"), "{stdout}");
    assert_eq!(std::fs::read(out.join("SHA256SUMS")).unwrap(), sums);
    let file_mtimes = |t: &[std::time::SystemTime]| {
        names
            .iter()
            .zip(t)
            .filter(|(n, _)| *n != "SHA256SUMS")
            .map(|(_, t)| *t)
            .collect::<Vec<_>>()
    };
    let after: Vec<_> = names.iter().map(|n| mtime(n)).collect();
    assert_eq!(file_mtimes(&before), file_mtimes(&after));

    // A quantised base: refused before anything is written, unless asked.
    let q8 = fixtures::model_as(d.path(), Preset::Tiny, WeightType::Q8_0);
    let run = run_dir(&d.path().join("q8"), &q8, &[("test_K8", &k8)], &m);
    let out = d.path().join("q8-ship");
    let o = ship(&run, &out, "test_K8", "Q8_0", &[]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("already quantised")
            && stderr.contains("is Q8_0")
            && stderr.contains("--allow-requantize"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing is written");
    let o = ship(&run, &out, "test_K8", "Q8_0", &["--allow-requantize"]);
    assert!(o.status.success());
    assert_eq!(listed(&out).len(), 8);
    runs_in_llama_cpp(&out.join("test_K8.Q8_0.gguf"));
}

/// Two ships to one directory holding a file a person listed in
/// `SHA256SUMS`: the checksums are merged by name, every line that was
/// there is kept (finding 7 of issue 42: a ship rewrote the file with only
/// its own files).
#[test]
fn a_second_ship_to_the_same_directory_keeps_the_checksums_there() {
    let d = tempfile::tempdir().unwrap();
    let (_, _, _, run) = two_candidate_run(d.path());
    let out = d.path().join("ship");
    std::fs::create_dir_all(&out).unwrap();
    let notes = out.join("notes.txt");
    std::fs::write(&notes, "written by hand\n").unwrap();
    let line = format!("{}  notes.txt\n", gguf::hash::sha256_file(&notes).unwrap());
    std::fs::write(out.join("SHA256SUMS"), &line).unwrap();
    for candidate in ["test_K8", "test_K4"] {
        assert!(ship(&run, &out, candidate, "Q8_0", &[]).status.success());
    }
    // Every file there is listed with its checksum, and nothing else.
    let names = listed(&out);
    for name in ["notes.txt", "test_K8.Q8_0.gguf", "test_K4.Q8_0.gguf"] {
        assert!(names.iter().any(|n| n == name), "{name}: {names:?}");
    }
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).unwrap();
    assert!(sums.contains(&line), "{sums}");
}

#[test]
fn a_k_quant_ship_is_llama_cpp_quantising_with_the_sliced_importance_matrix() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::TinyAltQk);
    let layers = [1, 2];
    let keep = fixtures::keep_map(8, &layers, 16);
    let m = imatrix(&model);
    let run = run_dir(d.path(), &model, &[("test_K8", &keep)], &m);
    let out = d.path().join("ship");
    assert!(ship(&run, &out, "test_K8", "Q4_K_M", &[]).status.success());
    listed(&out);
    let shipped = out.join("test_K8.Q4_K_M.gguf");
    let g = LlamaGguf::open(&shipped).unwrap();
    assert_eq!(g.u32("glm4moe.expert_count"), Some(8));
    let experts = layers.iter().flat_map(|l| {
        ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"].map(|t| format!("blk.{l}.{t}.weight"))
    });
    q4_k_m_experts_run(&g, &shipped, experts);

    // The keys llama-quantize writes when run beside the files as the card
    // says (`llama-quantize --imatrix test_K8.imatrix.gguf ...`): the file
    // as named, the first dataset, the entries, the chunks; integers as
    // u32; the model's name copied.
    assert_eq!(
        g.str("quantize.imatrix.file").as_deref(),
        Some("test_K8.imatrix.gguf")
    );
    assert_eq!(g.str("quantize.imatrix.dataset").as_deref(), Some("test"));
    assert_eq!(
        g.u32("quantize.imatrix.entries_count"),
        Some(m.entries.len() as u32)
    );
    assert_eq!(g.u32("quantize.imatrix.chunks_count"), Some(2));
    let slice = out.join("test_K8.gguf");
    assert_eq!(
        g.str("general.name"),
        LlamaGguf::open(&slice).unwrap().str("general.name")
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&shipped).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644, "{mode:o}");

    // The importance weights of the slice, computed here, handed to
    // llama.cpp directly with those keys: the same bytes; without them,
    // other bytes.
    let with = d.path().join("with.gguf");
    quantize_with(
        &slice,
        &with,
        Q4_K_M,
        1,
        Some(&sliced_weights(&m, &keep, 16)),
        &llama_quantize_keys("test_K8.imatrix.gguf", &m),
    )
    .unwrap();
    let shipped_bytes = std::fs::read(&shipped).unwrap();
    assert!(
        shipped_bytes == std::fs::read(&with).unwrap(),
        "the shipped file is llama.cpp's quantisation with the sliced weights"
    );
    let without = d.path().join("without.gguf");
    quantize(&slice, &without, Q4_K_M, 1).unwrap();
    assert!(
        shipped_bytes != std::fs::read(&without).unwrap(),
        "the importance matrix changed the quantisation"
    );
}

/// Every quantisation type llama-quantize offers (and the vendored llama.cpp
/// has) ships with the sliced importance matrix and runs in llama.cpp; the
/// 1- and 2-bit types llama-quantize refuses without an importance matrix
/// are refused without one here too, naming it, with nothing written.
#[test]
fn every_llama_quantize_type_ships_and_runs() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::TinyAltQk);
    let keep = fixtures::keep_map(8, &[1, 2], 16);
    let m = imatrix(&model);
    let run = run_dir(d.path(), &model, &[("test_K8", &keep)], &m);
    let out = d.path().join("ship");
    let all: Vec<&str> = QuantType::ALL.iter().map(|t| t.name()).collect();
    let o = ship(&run, &out, "test_K8", &all.join(","), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    listed(&out);
    for t in QuantType::ALL {
        let file = out.join(format!("test_K8.{}.gguf", t.name()));
        assert!(file.is_file(), "{}", file.display());
        runs_in_llama_cpp(&file);
    }
    let bare = d.path().join("bare.gguf");
    let o = fixtures::run(
        "worker",
        &[
            "quantize",
            "-m",
            out.join("test_K8.gguf").to_str().unwrap(),
            "--type",
            "IQ2_XXS",
            "--out",
            bare.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("IQ2_XXS needs an importance matrix"),
        "{err}"
    );
    assert!(!bare.exists());
}

/// A run config on `model` over two domains of the sample corpus with the
/// `[ship]` section `ship` (none: no `[ship]`).
fn ship_config(dir: &Path, model: &Path, ship: &str) -> PathBuf {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/sample_corpus");
    let source = |f: &str| corpus.join(f).display().to_string();
    let text = format!(
        "[model]\npath = {model:?}\n[corpus]\nn_ctx = 256\nheldout_fraction = 0.2\n\
         [[corpus.domains]]\nname = \"english\"\ngroup_key = \"topic\"\nsources = [{{ path = {:?} }}]\n\
         [[corpus.domains]]\nname = \"japanese\"\nsources = [{{ path = {:?}, separator = \"\\n\\n\" }}]\n{ship}",
        source("english.jsonl"),
        source("japanese.txt"),
    );
    let config = dir.join("ship.toml");
    std::fs::write(&config, text).unwrap();
    config
}

/// The held-out figures `worker eval` measures of `candidates` against
/// `base` over every chunk of the run `run`, by candidate.
fn held_out(base: &Path, run: &Path, candidates: &[&Path], out: &Path) -> Vec<serde_json::Value> {
    let summary = fixtures::held_out_eval(base, run, candidates, out, "2");
    summary["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["splits"]["heldout"]["all"].clone())
        .collect()
}

/// `[ship]` in the run config: bad values fail before anything is written,
/// naming the config file and the key; on the k-quant model
/// (`tiny-alt-qk`), `coordinator run` ends with a keep map and the base
/// model shipped as Q4_K_M (tensor types read back), every model file
/// evaluated with its card and table row, under `RUN/shipped/`; the same
/// ship by `coordinator ship` reuses every file and eval partial and writes
/// byte-identical cards; and the pruned Q4_K_M file, quantised with the
/// run's real importance matrix sliced to its keep map, differs from the
/// slice quantised without it and is no further from the base model on
/// held-out text.
#[test]
fn a_ship_section_ships_q4_k_m_files_measured_with_the_runs_importance_matrix() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::TinyAltQk);
    let run = d.path().join("run");
    let coordinator_run = |config: &Path| {
        let args = fixtures::run_args(config, 2, &run);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fixtures::run("coordinator", &args)
    };
    for (ship, key, entry) in [
        (
            "[ship]\ncandidates = [\"frequency_K8\"]\nquant = [\"Q4_KM\"]\n",
            "[ship] quant",
            "\"Q4_KM\"",
        ),
        (
            "[ship]\ncandidates = [\"frequncy_K8\"]\n",
            "[ship] candidates",
            "\"frequncy_K8\"",
        ),
        (
            "[ship]\ncandidates = [\"frequency_K8\"]\nsplit_max_size = \"48GB\"\n",
            "[ship] split_max_size",
            "\"48GB\"",
        ),
        // Only the model knows it has 16 experts per layer and routes 4.
        (
            "[ship]\ncandidates = [\"frequency_K17\"]\n",
            "[ship]",
            "\"frequency_K17\"",
        ),
        (
            "[ship]\ncandidates = [\"base_top5\"]\n",
            "[ship]",
            "\"base_top5\"",
        ),
    ] {
        let config = ship_config(d.path(), &model, ship);
        let o = coordinator_run(&config);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&config.display().to_string())
                && stderr.contains(key)
                && stderr.contains(entry),
            "{stderr}"
        );
        assert!(!run.exists(), "nothing is written: {stderr}");
    }

    // Ship's evaluation scores the split of the run's [eval].
    let ship = "[eval]\nsplit = \"heldout\"\n\
                [ship]\ncandidates = [\"frequency_K8\", \"base\"]\nquant = [\"Q4_K_M\"]\n";
    let o = coordinator_run(&ship_config(d.path(), &model, ship));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}");
    assert!(
        stdout.contains("shipped 10 files") && stdout.contains("run complete"),
        "{stdout}"
    );
    let out = run.join("shipped");
    listed(&out);
    let models = ["frequency_K8", "frequency_K8.Q4_K_M", "base.Q4_K_M"];
    for m in models {
        assert!(stdout.contains(&format!("| {m}.gguf | ")), "{m}: {stdout}");
        let card: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join(format!("{m}.json"))).unwrap()).unwrap();
        let held = &card["measured"]["splits"]["heldout"]["all"];
        assert!(held["n"].as_u64().unwrap() > 0, "{m}: {card}");
        let kl = held["kl"]["mean"].as_f64().unwrap();
        assert!(kl > 0.0 && kl.is_finite(), "{m}: {card}");
    }
    for m in ["frequency_K8.Q4_K_M", "base.Q4_K_M"] {
        let shipped = out.join(format!("{m}.gguf"));
        let g = LlamaGguf::open(&shipped).unwrap();
        let experts = g
            .tensor_names()
            .into_iter()
            .filter(|t| t.contains("_exps."));
        q4_k_m_experts_run(&g, &shipped, experts);
    }

    // `coordinator ship` with the same inputs: the same files and cards.
    let cards = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        let mut names = listed(dir);
        names.retain(|n| n.ends_with(".json") || n.ends_with(".md"));
        names
            .into_iter()
            .map(|n| (n.clone(), std::fs::read(dir.join(&n)).unwrap()))
            .collect()
    };
    let before = cards(&out);
    let o = fixtures::run_ok(
        "coordinator",
        &[
            "ship",
            run.to_str().unwrap(),
            "--candidates",
            "frequency_K8,base",
            "--quant",
            "Q4_K_M",
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("(0 made, 10 reused") && stdout.contains(", 0 computed, "),
        "{stdout}"
    );
    assert_eq!(cards(&out), before, "the cards are byte-identical");

    // The slice quantised without the importance matrix: other bytes, and
    // no closer to the base model on held-out text.
    let with = out.join("frequency_K8.Q4_K_M.gguf");
    let without = d.path().join("frequency_K8.Q4_K_M.without.gguf");
    fixtures::run_ok(
        "worker",
        &[
            "quantize",
            "--model",
            out.join("frequency_K8.gguf").to_str().unwrap(),
            "--type",
            "Q4_K_M",
            "--out",
            without.to_str().unwrap(),
        ],
    );
    assert_ne!(
        std::fs::read(&with).unwrap(),
        std::fs::read(&without).unwrap()
    );
    let figures = held_out(
        &model,
        &run,
        &[&with, &without],
        &d.path().join("imatrix_or_not"),
    );
    let kl = |i: usize| figures[i]["kl"]["mean"].as_f64().unwrap();
    eprintln!(
        "frequency_K8.Q4_K_M held-out KL over {} positions: {} with the importance matrix, {} without",
        figures[0]["n"],
        kl(0),
        kl(1)
    );
    assert!(
        kl(0) <= kl(1),
        "held-out KL with the importance matrix {} > without {}",
        kl(0),
        kl(1)
    );
}

/// Files of `dir` whose names start with `prefix`, sorted.
fn named(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

#[test]
fn a_split_ship_ships_each_large_model_file_as_gguf_split_files_holding_it() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model(d.path(), Preset::Tiny);
    let k8 = fixtures::keep_map(8, &[0, 1, 2], 16);
    let m = imatrix(&model);
    let run = run_dir(d.path(), &model, &[("test_K8", &k8)], &m);
    let (whole, split) = (d.path().join("whole"), d.path().join("split"));
    assert!(ship(&run, &whole, "test_K8", "Q8_0", &[]).status.success());
    // A third of the slice's bytes: its files split, its Q8_0 (smaller) not.
    let sha = |p: &Path| gguf::hash::sha256_file(p).unwrap();
    let slice_bytes = std::fs::metadata(whole.join("test_K8.gguf")).unwrap().len();
    let q8_bytes = std::fs::metadata(whole.join("test_K8.Q8_0.gguf"))
        .unwrap()
        .len();
    let max_k = slice_bytes / 3 / 1000;
    assert!(max_k * 1000 > q8_bytes, "{max_k}K against {q8_bytes} bytes");
    let size = format!("{max_k}K");
    let args = ["--split-max-size", size.as_str()];
    let o = ship(&run, &split, "test_K8", "Q8_0", &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    listed(&split);

    let parts = named(&split, "test_K8-");
    assert!(parts.len() >= 3, "{parts:?}");
    assert!(!split.join("test_K8.gguf").exists());
    let mut tensors = 0;
    for (i, part) in parts.iter().enumerate() {
        assert_eq!(
            part,
            &format!("test_K8-{:05}-of-{:05}.gguf", i + 1, parts.len())
        );
        let h = GgufReader::open(split.join(part)).unwrap().header;
        let data: u64 = h
            .tensors
            .iter()
            .map(|t| t.n_bytes.next_multiple_of(32))
            .sum();
        assert!(data <= max_k * 1000, "{part}: {data} bytes of tensors");
        tensors += h.tensors.len();
    }
    let whole_tensors = GgufReader::open(whole.join("test_K8.gguf")).unwrap().header;
    assert_eq!(tensors, whole_tensors.tensors.len());
    // The files hold the whole ship's file, byte for byte, and llama.cpp
    // runs them.
    let joined = d.path().join("joined.gguf");
    let again = slicer::make_model(&split.join(&parts[0]), None, None, &joined).unwrap();
    assert_eq!(again.sha256, sha(&whole.join("test_K8.gguf")));
    runs_in_llama_cpp(&split.join(&parts[0]));
    // The smaller files are as the whole ship's.
    for name in ["test_K8.Q8_0.gguf", "test_K8.imatrix.gguf"] {
        assert_eq!(sha(&split.join(name)), sha(&whole.join(name)), "{name}");
    }

    // The card describes the model as one file and lists its files.
    let card: serde_json::Value =
        serde_json::from_slice(&std::fs::read(split.join("test_K8.json")).unwrap()).unwrap();
    assert_eq!(card["file"]["file"], "test_K8.gguf");
    assert_eq!(
        card["file"]["sha256"],
        sha(&whole.join("test_K8.gguf")).as_str()
    );
    let listed_parts: Vec<(String, String)> = card["split_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["file"].as_str().unwrap().to_string(),
                f["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let on_disk: Vec<(String, String)> = parts
        .iter()
        .map(|p| (p.clone(), sha(&split.join(p))))
        .collect();
    assert_eq!(listed_parts, on_disk);
    let q8_card: serde_json::Value =
        serde_json::from_slice(&std::fs::read(split.join("test_K8.Q8_0.json")).unwrap()).unwrap();
    assert!(q8_card.get("split_files").is_none(), "{q8_card}");
    let md = std::fs::read_to_string(split.join("test_K8.md")).unwrap();
    assert!(
        md.contains(&format!("{} llama.cpp `gguf-split` files", parts.len()))
            && md.contains(&format!("--split-max-size {size}")),
        "{md}"
    );

    // Again: every file is reused.
    let o = ship(&run, &split, "test_K8", "Q8_0", &args);
    assert!(o.status.success());
    let stdout = String::from_utf8_lossy(&o.stdout);
    let n = listed(&split).len() - 1;
    assert!(stdout.contains(&format!("(0 made, {n} reused")), "{stdout}");

    // A size below the largest tensor is refused, naming it; so is a size
    // that is not one.
    let refused = |dir: &str, size: &str| {
        let o = ship(
            &run,
            &d.path().join(dir),
            "test_K8",
            "Q8_0",
            &["--split-max-size", size],
        );
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let stderr = refused("tiny", "1K");
    assert!(
        stderr.contains("tiny/test_K8.gguf: splitting: files of at most 1000 bytes: tensor"),
        "{stderr}"
    );
    let stderr = refused("bad", "1.5G");
    assert!(
        stderr.contains("--split-max-size") && stderr.contains("\"1.5G\""),
        "{stderr}"
    );
}

/// A merge plan of 8 centres per layer of 16 experts (Tiny's three MoE
/// layers): centres `2i + l % 2`; of the other eight experts the first
/// seven go two by two to the first centres (so per layer three centres of
/// three members, one of two, four alone), the last is dropped.
fn merge_plan() -> runfiles::mergeplan::MergePlan {
    use runfiles::mergeplan::{Centre, Member};
    let mut layers = BTreeMap::new();
    for l in 0..3u32 {
        let centres: Vec<u32> = (0..8).map(|i| 2 * i + l % 2).collect();
        let others: Vec<u32> = (0..16).filter(|e| !centres.contains(e)).collect();
        let mut plan: Vec<Centre> = centres.iter().map(|&c| Centre::alone(c)).collect();
        // Every other expert but the last goes to centre (i / 2), weight 1 + i.
        for (i, &e) in others[..others.len() - 1].iter().enumerate() {
            plan[i / 2].members.push(Member {
                expert: e,
                weight: 1.0 + i as f64,
            });
        }
        layers.insert(l, plan);
    }
    runfiles::mergeplan::MergePlan {
        method: "reap_hybrid".into(),
        k: 8,
        params: serde_json::json!({
            "recipe": "ream_pseudo_group",
            "weights": "reap_l2_sum",
            "similarity": "router_probability_cosine",
        }),
        saliency_sha256: "5a".repeat(32),
        layers,
    }
}

/// A merge plan ships like a keep map: the merged model is the slicer's
/// merge of the base (through ggml's codec, the base being F16), its
/// importance matrix the merged one, the Q8_0 file runs in llama.cpp, and
/// the card says what was merged: the plan by SHA-256, its centres, how
/// many members a centre has, the weights rule and the similarity.
#[test]
fn a_merged_candidate_ships_with_a_card_saying_what_was_merged() {
    let d = tempfile::tempdir().unwrap();
    let model = fixtures::model_as(d.path(), Preset::Tiny, WeightType::F16);
    let m = imatrix(&model);
    let run = run_dir(d.path(), &model, &[], &m);
    let plan = merge_plan();
    let name = "reap_hybrid_merge_K8";
    std::fs::create_dir_all(run.join("merge_plans")).unwrap();
    let plan_file = run.join(format!("merge_plans/{name}.json"));
    std::fs::write(&plan_file, serde_json::to_vec_pretty(&plan).unwrap()).unwrap();
    let out = d.path().join("ship");
    let o = ship(&run, &out, name, "Q8_0", &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let names = listed(&out);
    for suffix in ["gguf", "imatrix.gguf", "Q8_0.gguf", "Q8_0.json", "Q8_0.md"] {
        assert!(names.contains(&format!("{name}.{suffix}")), "{names:?}");
    }
    let sha = |p: &Path| gguf::hash::sha256_file(p).unwrap();
    // What the slicer's merge of the base and of the run's matrix give.
    let codec = llama::GgmlCodec::new();
    let want = d.path().join("want.gguf");
    slicer::merge_model(&model, &plan, Some(&codec), &want).unwrap();
    assert_eq!(sha(&out.join(format!("{name}.gguf"))), sha(&want));
    let want_im = d.path().join("want.imatrix.gguf");
    slicer::merge_imatrix(&run.join("imatrix.gguf"), &plan, &want_im).unwrap();
    assert_eq!(
        sha(&out.join(format!("{name}.imatrix.gguf"))),
        sha(&want_im)
    );
    let q = out.join(format!("{name}.Q8_0.gguf"));
    assert_eq!(
        LlamaGguf::open(&q).unwrap().u32("qwen3moe.expert_count"),
        Some(8)
    );
    runs_in_llama_cpp(&q);

    // The card: members per centre counted from the plan as written above
    // (per layer sizes 3, 3, 3, 2, 1, 1, 1, 1; one expert dropped).
    let card: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(format!("{name}.Q8_0.json"))).unwrap())
            .unwrap();
    assert!(card["keep_map"].is_null(), "{card}");
    let merge = &card["merge"];
    assert_eq!(merge["name"], name);
    assert_eq!(merge["sha256"], sha(&plan_file).as_str());
    assert_eq!(merge["centres"], "reap_hybrid");
    assert_eq!(merge["k"], 8);
    assert_eq!(merge["saliency_sha256"], "5a".repeat(32).as_str());
    assert_eq!(merge["layers"], 3);
    assert_eq!(merge["members"], serde_json::json!([1, 2, 3]));
    assert_eq!(merge["merged"], 3 * 7);
    assert_eq!(merge["alone"], 3 * 4);
    assert_eq!(merge["dropped"], 3);
    assert_eq!(merge["weights"], "reap_l2_sum");
    assert_eq!(merge["similarity"], "router_probability_cosine");
    assert_eq!(
        card["quantisation"]["imatrix"]["sha256"],
        sha(&want_im).as_str()
    );
    let md = std::fs::read_to_string(out.join(format!("{name}.Q8_0.md"))).unwrap();
    for line in [
        "- expert-merging\n".to_string(),
        format!(
            "| Merging | merge plan `{name}` (recipe ream_pseudo_group): the centres are method reap_hybrid's keep map, 8 of 16 experts per MoE layer, "
        ),
        format!("SHA-256 `{}`, scored from saliency.json `{}` |", sha(&plan_file), "5a".repeat(32)),
        "| Members per centre | 1 to 3 (median 2) over 24 centres in 3 MoE layers: 21 experts merged into a centre, 12 centres alone, 3 experts dropped |".to_string(),
        "| Merge weights | reap_l2_sum, normalised over each centre's members |".to_string(),
        "| Merge similarity | router_probability_cosine (which centre an expert joins) |".to_string(),
    ] {
        assert!(md.contains(&line), "{line}\n{md}");
    }
    assert!(!md.contains("| Pruning |"), "{md}");
    // Made again by ship alone (`coordinator prune` slices keep maps).
    let commands: Vec<&str> = card["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert!(
        commands[1].starts_with(&format!(
            "coordinator ship RUN --candidates {name} --quant Q8_0"
        )),
        "{commands:?}"
    );

    // A merged candidate keeps the experts per token; a plan the run lacks
    // is named.
    let o = ship(
        &run,
        &d.path().join("x"),
        &format!("{name}_top2"),
        "Q8_0",
        &[],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("keeps the base model's experts per token"),
        "{err}"
    );
    let o = ship(&run, &d.path().join("y"), "frequency_merge_K8", "Q8_0", &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("the run has no merge plan frequency_merge_K8"),
        "{err}"
    );
}
