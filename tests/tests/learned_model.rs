//! Tests that only a model that learned something can pass, on the committed
//! quickstart model (`configs/models/quickstart-moe.gguf`, trained by
//! `scripts/train` on real text) and its sample corpus, held out from its
//! training: keep maps that beat a random and an inverted one by held-out
//! KL, experts that specialise by domain, a static hot list that serves
//! held-out traffic worse than the traffic it was fitted on. One quickstart
//! run (without its `[eval]` section) and one `coordinator eval` serve them
//! all. `MOE_CENSUS_LEARNED_MODEL=PATH` runs them on another GGUF with the
//! same vocabulary, such as the same shape with random weights
//! (`scripts/train/convert.py` of an untrained `train.py` model); the model
//! card records which checks then fail.
//!
//! The tokenization test checks that llama.cpp tokenizes every document of
//! the sample corpus exactly as the trained tokenizer (Hugging Face
//! `tokenizers`) did: `tests/fixtures/quickstart-moe.tokens.json` holds the
//! ids `scripts/train/convert.py` wrote with it.

use corpus::tokenizer::{LlamaTokenizer, Tokenizer};
use numbers::splitmix::SplitMix64;
use runfiles::keepmap::KeepMap;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Names a GGUF to test instead of the committed model.
const MODEL_ENV: &str = "MOE_CENSUS_LEARNED_MODEL";

const METHODS: [&str; 5] = [
    "frequency",
    "reap_mean",
    "reap_l2_sum",
    "reap_shrink",
    "reap_hybrid",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn model() -> PathBuf {
    match std::env::var_os(MODEL_ENV) {
        Some(p) => PathBuf::from(p),
        None => repo().join("configs/models/quickstart-moe.gguf"),
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The shared run: its directory, `saliency.json`, `replay/results.json`,
/// the held-out KL per candidate and the experts per layer.
struct Run {
    _dir: tempfile::TempDir,
    saliency: Value,
    replay: Value,
    kl: BTreeMap<String, f64>,
    n_expert: u32,
}

static RUN: OnceLock<Run> = OnceLock::new();

/// The quickstart on the model under test, then `coordinator eval` of every
/// method's keep map at half and a quarter of the experts, each method's
/// inverted map (the complement: the lowest-ranked half) and a seeded
/// random map, all on the held-out split.
fn run() -> &'static Run {
    RUN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let configs = dir.path().join("configs");
        let sample = configs.join("sample_corpus");
        std::fs::create_dir_all(&sample).unwrap();
        for e in std::fs::read_dir(repo().join("configs/sample_corpus")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), sample.join(e.file_name())).unwrap();
        }
        let text = std::fs::read_to_string(repo().join("configs/quickstart.toml")).unwrap();
        let text = text.replace(
            "path = \"models/quickstart-moe.gguf\"",
            &format!("path = {:?}", model().to_str().unwrap()),
        );
        let text = &text[..text.find("\n[eval]").unwrap()];
        let config = configs.join("quickstart.toml");
        std::fs::write(&config, text).unwrap();
        let out = dir.path().join("run");
        fixtures::coordinator_run(&config, 2, &out);

        let saliency = read_json(&out.join("saliency.json"));
        let n_expert = saliency["n_expert"].as_u64().unwrap() as u32;
        let half = n_expert / 2;
        let mut names: Vec<String> = Vec::new();
        for m in METHODS {
            let map: KeepMap =
                serde_json::from_value(read_json(&out.join(KeepMap::file_name(m, half)))).unwrap();
            let inverted = KeepMap {
                method: format!("inverted_{m}"),
                layers: map
                    .layers
                    .iter()
                    .map(|(l, kept)| {
                        let rest = (0..n_expert).filter(|e| !kept.contains(e)).collect();
                        (*l, rest)
                    })
                    .collect(),
                ..map.clone()
            };
            write_map(&out, &inverted);
            names.extend([
                format!("{m}_K{half}"),
                format!("inverted_{m}_K{half}"),
                format!("{m}_K{}", n_expert / 4),
            ]);
            if m == "frequency" {
                let random = KeepMap {
                    method: "random".into(),
                    layers: map
                        .layers
                        .keys()
                        .map(|&l| (l, random_experts(&l.to_string(), n_expert, half)))
                        .collect(),
                    ..map
                };
                write_map(&out, &random);
                names.push(format!("random_K{half}"));
            }
        }
        let run = out.to_str().unwrap();
        let list = names.join(",");
        fixtures::run_ok(
            "coordinator",
            &[
                "eval",
                run,
                "--keep-maps",
                &list,
                "--split",
                "heldout",
                "--local-workers",
                "2",
                "--out",
                "learned",
            ],
        );
        let summary = read_json(&out.join("explore/learned/eval/summary.json"));
        let kl = fixtures::heldout_kl(&summary)
            .map(|(_, name, kl)| (name, kl))
            .collect();
        Run {
            saliency,
            replay: read_json(&out.join("replay/results.json")),
            kl,
            n_expert,
            _dir: dir,
        }
    })
}

fn write_map(run: &Path, map: &KeepMap) {
    let path = run.join(KeepMap::file_name(&map.method, map.k));
    std::fs::write(path, serde_json::to_vec_pretty(map).unwrap()).unwrap();
}

/// `k` of `n` experts drawn without replacement (seeded per layer), sorted.
fn random_experts(layer: &str, n: u32, k: u32) -> Vec<u32> {
    let mut rng = SplitMix64::for_stream(43, layer);
    let mut all: Vec<u32> = (0..n).collect();
    for i in 0..k as usize {
        let j = i + rng.below(all.len() - i);
        all.swap(i, j);
    }
    let mut kept = all[..k as usize].to_vec();
    kept.sort_unstable();
    kept
}

/// At half the experts, every method's keep map has less held-out KL than
/// a seeded random map and its inverted ranking, and every REAP method's at
/// most a third of the random map's. The margin is what learning gives: on
/// the committed model the random map costs 3.9x (reap_mean) to 7.7x
/// (reap_l2_sum) a REAP method's KL (frequency: 1.7x); on random weights it
/// costs 1.3x-1.5x (the same shape and vocabulary) and 2.6x-2.9x (the
/// `tiny` preset), so this test fails on both.
#[test]
fn keep_maps_at_half_the_experts_beat_random_and_inverted_ones_on_held_out_kl() {
    let r = run();
    let half = r.n_expert / 2;
    let random = r.kl[&format!("random_K{half}")];
    let mut failures = Vec::new();
    for m in METHODS {
        let kl = r.kl[&format!("{m}_K{half}")];
        let inverted = r.kl[&format!("inverted_{m}_K{half}")];
        println!(
            "{m}_K{half}: held-out KL {kl:.4}; random {random:.4} ({:.2}x), inverted {inverted:.4} ({:.2}x)",
            random / kl,
            inverted / kl
        );
        // "Well below" a random map: at most a third of its KL for the
        // methods that weigh activations (REAP); below it for frequency.
        let margin = if m == "frequency" { 1.0 } else { 3.0 };
        if !(margin * kl < random && kl < inverted) {
            failures.push(format!(
                "{m}: KL {kl:.4} against random {random:.4} and inverted {inverted:.4}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Per layer, the quarter of experts whose traffic is most Japanese and the
/// quarter whose traffic is most English share fewer experts than two random
/// sets of that size would (`q * q / n` on average). The ranking is by the
/// domain's share of each expert's fit tokens: by raw count, the experts
/// every domain uses most can top both lists (the count-ranked quarters
/// overlap by 1.25 experts a layer on the committed model and by 2.25 on
/// the 600-step one, against 2 for random sets; the test prints both). This one also holds on random weights of
/// the same shape and vocabulary (overlap 0.75 against 0.25 here): routing
/// follows token identity, and the two scripts share few tokens.
#[test]
fn japanese_and_english_lean_on_different_experts() {
    let r = run();
    let fit = &r.saliency["splits"]["fit"];
    let n = r.n_expert as usize;
    let q = n / 4;
    let counts = |v: &Value| -> Vec<u64> {
        v["count"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect()
    };
    let top = |key: &dyn Fn(usize) -> f64| -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
        order.truncate(q);
        order
    };
    let layers = fit["layers"].as_array().unwrap().len();
    let mut by_share = Vec::new();
    let mut by_count = Vec::new();
    for li in 0..layers {
        let total = counts(&fit["layers"][li]);
        let en = counts(&fit["domains"]["english"]["layers"][li]);
        let ja = counts(&fit["domains"]["japanese"]["layers"][li]);
        let share = |c: &[u64], e: usize| c[e] as f64 / total[e].max(1) as f64;
        let overlap = |a: Vec<usize>, b: Vec<usize>| a.iter().filter(|e| b.contains(e)).count();
        by_share.push(overlap(top(&|e| share(&en, e)), top(&|e| share(&ja, e))));
        by_count.push(overlap(top(&|e| en[e] as f64), top(&|e| ja[e] as f64)));
    }
    let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len() as f64;
    let random = (q * q) as f64 / n as f64;
    println!(
        "top-{q} overlap per layer (english, japanese): by domain share {by_share:?}, mean {:.2}; by count {by_count:?}, mean {:.2}; random sets: {random:.2}",
        mean(&by_share),
        mean(&by_count)
    );
    assert!(
        mean(&by_share) < random,
        "overlaps {by_share:?}: mean {} not below {random}",
        mean(&by_share)
    );
}

fn hit_rates(r: &Run, policy: &str, split: &str) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = r.replay["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| {
            row["policy"] == policy
                && row["split"] == split
                && row["keep_map"] == "none"
                && row["trace_mode"] == "prefill"
                && row["mode"] == "token"
        })
        .map(|row| {
            (
                row["capacity"].as_f64().unwrap(),
                row["hit_rate"].as_f64().unwrap(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// A static hot list fitted on the fit split (per layer, the C experts
/// with the most fit traffic) serves held-out traces better than a uniform
/// share (C / n of the routings) at every replayed capacity, and LRU's hit
/// rate rises with its capacity. Whether held-out traffic is served worse
/// than in-sample (the anchors' finding on 512-expert models) is printed,
/// not asserted: on the committed model the mean over capacities is 0.4413
/// held out against 0.4394 in sample, within the noise of 3,722 held-out
/// tokens (the model trained for 600 steps gave 0.4647 against 0.4663).
/// These also hold on random weights, whose routing is as uneven.
#[test]
fn a_static_hot_list_beats_a_uniform_share_on_held_out_traffic_and_lru_gains_with_capacity() {
    let r = run();
    let fit = hit_rates(r, "static", "fit");
    let held = hit_rates(r, "static", "heldout");
    let mean = |v: &[(f64, f64)]| v.iter().map(|(_, h)| h).sum::<f64>() / v.len() as f64;
    println!(
        "static hit rate per capacity, fit {fit:?}, held-out {held:?}; means {:.4} and {:.4}",
        mean(&fit),
        mean(&held)
    );
    assert!(
        !held.is_empty() && fit.len() == held.len(),
        "{fit:?} {held:?}"
    );
    for &(capacity, hit) in &held {
        let uniform = capacity / f64::from(r.n_expert);
        assert!(
            hit > uniform,
            "static list of {capacity} experts: held-out hit rate {hit} not above the uniform {uniform}"
        );
    }
    for split in ["fit", "heldout"] {
        let lru = hit_rates(r, "lru", split);
        println!("lru hit rate per capacity on {split}: {lru:?}");
        assert!(lru.len() >= 2, "{lru:?}");
        assert!(lru.windows(2).all(|w| w[1].1 > w[0].1), "{split}: {lru:?}");
    }
}

/// The methods' ranking by held-out KL at half and a quarter of the
/// experts, printed as a reference for future changes (not asserted beyond
/// every figure being there).
#[test]
fn methods_ranked_by_held_out_kl_at_two_sizes() {
    let r = run();
    for k in [r.n_expert / 2, r.n_expert / 4] {
        let mut ranked: Vec<(&str, f64)> = METHODS
            .iter()
            .map(|m| (*m, r.kl[&format!("{m}_K{k}")]))
            .collect();
        assert!(
            ranked.iter().all(|(_, kl)| kl.is_finite() && *kl >= 0.0),
            "{ranked:?}"
        );
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
        let line: Vec<String> = ranked
            .iter()
            .map(|(m, kl)| format!("{m} {kl:.4}"))
            .collect();
        println!("K={k}: {}", line.join(" < "));
    }
}

/// llama.cpp (the corpus stage's tokenizer and chat template) gives every
/// document of the sample corpus the ids the trained tokenizer gave it.
#[test]
fn llama_cpp_tokenizes_the_sample_corpus_as_the_trained_tokenizer() {
    let fixture = read_json(&repo().join("tests/fixtures/quickstart-moe.tokens.json"));
    let tok =
        LlamaTokenizer::load(&repo().join("configs/models/quickstart-moe.gguf"), None).unwrap();
    let ids_of = |key: &str| -> Vec<i32> {
        fixture[key]["ids"]
            .as_array()
            .unwrap_or_else(|| panic!("{key} is not in the fixture"))
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect()
    };
    let sample = repo().join("configs/sample_corpus");
    let mut seen = 0;
    let mut tokens = 0;
    for file in ["english.jsonl", "code.jsonl", "chat.jsonl", "eval.jsonl"] {
        let text = std::fs::read_to_string(sample.join(file)).unwrap();
        for (i, line) in text.lines().enumerate() {
            let key = format!("{file}:{}", i + 1);
            let rec: Value = serde_json::from_str(line).unwrap();
            let ids = match rec.get("messages") {
                Some(msgs) => tok.tokenize(
                    &tok.apply_chat_template(&fixtures::chat_of(msgs), &Default::default())
                        .unwrap(),
                    true,
                ),
                None => tok.tokenize(rec["text"].as_str().unwrap(), false),
            };
            let want = ids_of(&key);
            assert_eq!(ids, want, "{key}");
            seen += 1;
            tokens += ids.len();
        }
    }
    let ja = std::fs::read_to_string(sample.join("japanese.txt")).unwrap();
    for (i, doc) in ja
        .split("\n\n")
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .enumerate()
    {
        let key = format!("japanese.txt#{}", i + 1);
        let want = ids_of(&key);
        assert_eq!(tok.tokenize(doc, false), want, "{key}");
        seen += 1;
        tokens += want.len();
    }
    assert_eq!(seen, fixture.as_object().unwrap().len());
    println!("{seen} documents, {tokens} tokens, identical");
}
