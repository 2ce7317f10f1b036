//! Shared fixtures of the end-to-end tests: generated models, small
//! tokenized corpora, paths of the built binaries, the captured log, an
//! independent GGUF reader, logits and k-quant models through llama.cpp's
//! own C API, an image record through mtmd's own C API, an f64 forward-pass
//! oracle of the generated architectures, and a scripted peer that speaks
//! the worker protocol.
#![deny(missing_docs)]

pub mod chat_template_swap;
pub mod fake_engine;
pub mod fake_eval;
pub mod llama_backend;
pub mod llama_gguf;
pub mod llama_logits;
pub mod llama_quantize;
pub mod log;
pub mod loopback;
pub mod mtmd_record;
pub mod mutate;
pub mod oracle;
pub mod peer;
pub mod proc;

use numbers::{ChunkId, Split};
use runfiles::corpus::{
    write_chunks, Chunk, CorpusIndex, GroupInfo, Span, CHUNKS_FILE, INDEX_FILE,
};
use std::path::{Path, PathBuf};
use synth::Preset;

/// A keep map of method `test` keeping `k` experts in each of `layers`:
/// experts `(2i + l) mod n_expert`, sorted.
pub fn keep_map(k: u32, layers: &[u32], n_expert: u32) -> runfiles::keepmap::KeepMap {
    runfiles::keepmap::KeepMap {
        method: "test".into(),
        k,
        params: serde_json::Value::Null,
        saliency_sha256: String::new(),
        layers: layers
            .iter()
            .map(|&l| {
                let mut ids: Vec<u32> = (0..k).map(|i| (i * 2 + l) % n_expert).collect();
                ids.sort();
                (l, ids)
            })
            .collect(),
    }
}

/// Writes `docs` short numbered documents, blank-line separated, to
/// `dir/docs.txt` (the corpus of the run-level tests' small configs).
pub fn numbered_docs(dir: &Path, docs: usize) {
    let text: Vec<String> = (0..docs)
        .map(|i| {
            format!(
                "Document {i} reports that {} and {} differ by {}.",
                i * 7,
                i * 3,
                i * 4
            )
        })
        .collect();
    std::fs::write(dir.join("docs.txt"), text.join("\n\n")).unwrap();
}

/// Writes a preset model into `dir` and returns its path.
pub fn model(dir: &Path, preset: Preset) -> PathBuf {
    let path = dir.join(format!("{preset:?}.gguf").to_lowercase());
    synth::write_model(preset, 7, &path).expect("model generates");
    path
}

/// Writes a preset model with its weight matrices in `weights` into `dir`.
pub fn model_as(dir: &Path, preset: Preset, weights: synth::WeightType) -> PathBuf {
    let path = dir.join(format!("{preset:?}-{weights:?}.gguf").to_lowercase());
    synth::write_model_as(preset, 7, Some(weights), &path).expect("model generates");
    path
}

/// The groups of [`chunks`]' spans, as (domain, split, key): `en` fit,
/// `ja` fit and `ja` held out.
pub const FIXTURE_GROUPS: [(u16, Split, &str); 3] = [
    (0, Split::Fit, "en-fit"),
    (1, Split::Fit, "ja-fit"),
    (1, Split::Heldout, "ja-heldout"),
];

/// A deterministic corpus of `n_chunks` chunks of `n_ctx` tokens (the last
/// one shorter) over two domains, with fit and held-out spans in each chunk;
/// each span a document of its own, in a group of [`FIXTURE_GROUPS`].
pub fn chunks(n_chunks: u32, n_ctx: u32) -> Vec<Chunk> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n_chunks)
        .map(|id| {
            let len = if id + 1 == n_chunks {
                n_ctx * 5 / 8
            } else {
                n_ctx
            };
            let tokens = (0..len).map(|_| (next() % 600) as i32).collect();
            let a = len / 3 + id % 5;
            let b = 2 * len / 3;
            let spans = vec![
                Span {
                    start: 0,
                    len: a,
                    split: Split::Fit,
                    domain: (id % 2) as u16,
                    doc: 3 * id,
                    group: id % 2,
                },
                Span {
                    start: a,
                    len: b - a,
                    split: Split::Heldout,
                    domain: 1,
                    doc: 3 * id + 1,
                    group: 2,
                },
                Span {
                    start: b,
                    len: len - b,
                    split: Split::Fit,
                    domain: 0,
                    doc: 3 * id + 2,
                    group: 0,
                },
            ];
            Chunk {
                id: ChunkId(id),
                tokens,
                spans,
                images: Vec::new(),
            }
        })
        .collect()
}

/// Writes `chunks` as a tokenized corpus under `dir/corpus/`; returns its index.
pub fn write_corpus(dir: &Path, chunks: &[Chunk], n_ctx: u32) -> CorpusIndex {
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    let bytes = write_chunks(chunks).unwrap();
    let index = CorpusIndex {
        n_chunks: chunks.len() as u32,
        n_ctx,
        domains: vec!["en".into(), "ja".into()],
        n_tokens: chunks.iter().map(|c| c.tokens.len() as u64).sum(),
        chunks_sha256: gguf::hash::sha256_hex(&bytes),
        eval_sets: Vec::new(),
        groups: FIXTURE_GROUPS
            .iter()
            .map(|&(domain, split, key)| GroupInfo {
                domain,
                split,
                key: key.into(),
            })
            .collect(),
    };
    std::fs::write(corpus.join(CHUNKS_FILE), bytes).unwrap();
    std::fs::write(corpus.join(INDEX_FILE), serde_json::to_vec(&index).unwrap()).unwrap();
    // No chat documents: no assistant-turn starts for the generation check.
    std::fs::write(corpus.join(runfiles::manifest::DOCUMENTS_FILE), b"").unwrap();
    index
}

/// `dir/name`, with a corpus of [`chunks`]`(n_chunks, n_ctx)` written under
/// it (as [`write_corpus`]): the run location of a test's collection.
pub fn corpus_dir(dir: &Path, name: &str, n_chunks: u32, n_ctx: u32) -> PathBuf {
    let run = dir.join(name);
    write_corpus(&run, &chunks(n_chunks, n_ctx), n_ctx);
    run
}

/// Writes `chunks` as the corpus under `dir` (as [`write_corpus`]) and
/// collects it with llama.cpp on `model` under `opts`.
pub fn collect(
    model: &Path,
    dir: &Path,
    chunks: &[Chunk],
    n_ctx: u32,
    opts: worker::collect::CollectOptions,
) -> worker::collect::Collected {
    let index = write_corpus(dir, chunks, n_ctx);
    worker::collect::Collector::load(model, opts)
        .unwrap()
        .run(&index, chunks, &mut |_, _| {})
        .unwrap()
}

/// Collection options that exercise both reduction paths: micro-batches of
/// 32 (a chunk of more spans several, so device sums accumulate across
/// them), every other chunk traced with its router top-8 (traced
/// micro-batches read the router probabilities on the host, the others sum
/// them on the device, under `reduce`), and decode traces of
/// `decode_tokens` generated after prompts of `decode_prompt` tokens,
/// decoded one token at a time, unmeasured.
pub fn traced_collect_options(
    reduce: worker::collect::device::Reduce,
    decode_tokens: usize,
    decode_prompt: usize,
) -> worker::collect::CollectOptions {
    worker::collect::CollectOptions {
        n_ubatch: 32,
        threads: 2,
        trace_every: 2,
        trace_top_n: 8,
        decode_tokens,
        decode_prompt,
        reduce,
        ..Default::default()
    }
}

/// Copies a tokenized corpus (`corpus/index.json`, `corpus/chunks.parquet`)
/// from one run location to another, e.g. a local run to an S3 prefix.
pub async fn copy_corpus(from: &runfiles::store::RunStore, to: &runfiles::store::RunStore) {
    for name in ["corpus/index.json", "corpus/chunks.parquet"] {
        to.put(name, from.get(name).await.unwrap()).await.unwrap();
    }
}

/// A run config over one plain-text domain of a few short documents, with
/// the tiny model beside it: small enough for a whole `coordinator run` in
/// seconds. `extra` is appended (e.g. a `[cluster]` section). The documents
/// are one template, near copies of each other, which dedup by containment
/// drops against any held-out one: the config holds nothing out
/// (`heldout_fraction = 0`, the default being 0.1).
pub fn text_config(dir: &Path, extra: &str) -> PathBuf {
    model(dir, Preset::Tiny);
    let docs: Vec<String> = (0..12)
        .map(|i| {
            format!(
                "Document {i} says that {} is a number worth writing down.",
                i * 7
            )
        })
        .collect();
    std::fs::write(dir.join("docs.txt"), docs.join("\n\n")).unwrap();
    docs_config(dir, "text.toml", 32, extra)
}

/// Writes `dir/name`, a run config of the tiny model (`tiny.gguf`) over one
/// domain `text` of `docs.txt`'s blank-line separated documents in chunks of
/// `n_ctx`, nothing held out (the documents are near copies), with `extra`
/// appended; returns its path.
pub fn docs_config(dir: &Path, name: &str, n_ctx: u32, extra: &str) -> PathBuf {
    let config = dir.join(name);
    std::fs::write(
        &config,
        format!(
            "[model]\npath = \"tiny.gguf\"\n[corpus]\nn_ctx = {n_ctx}\nheldout_fraction = 0\n\
             [[corpus.domains]]\nname = \"text\"\n\
             sources = [{{ path = \"docs.txt\", separator = \"\\n\\n\" }}]\n{extra}"
        ),
    )
    .unwrap();
    config
}

/// The conversation of a sample corpus record's `messages` array (each
/// message a `role` and a text `content`).
pub fn chat_of(messages: &serde_json::Value) -> corpus::chat::Chat {
    use corpus::chat::{Chat, Message, Role};
    let messages = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            Message::text(
                Role::parse(m["role"].as_str().unwrap()).unwrap(),
                m["content"].as_str().unwrap(),
            )
        })
        .collect();
    Chat::new(messages)
}

/// Each candidate of an `eval/summary.json` (as JSON) with its name and
/// its held-out mean KL over all domains.
pub fn heldout_kl(
    summary: &serde_json::Value,
) -> impl Iterator<Item = (&serde_json::Value, String, f64)> {
    summary["candidates"].as_array().unwrap().iter().map(|c| {
        let kl = c["splits"]["heldout"]["all"]["kl"]["mean"]
            .as_f64()
            .unwrap();
        (c, c["name"].as_str().unwrap().to_string(), kl)
    })
}

/// Names the variable that, set to `1`, lets the S3 tests skip when no
/// S3-compatible server is configured (a fresh laptop without moto).
pub const SKIP_S3_ENV: &str = "MOE_CENSUS_SKIP_S3";

/// The S3 test bucket (`.ci/s3-server` exports it). Without one the test
/// fails, unless `MOE_CENSUS_SKIP_S3=1` says explicitly to skip it; once the
/// bucket is named, a server that does not answer fails the test too.
pub fn s3_bucket() -> Option<String> {
    if let Ok(bucket) = std::env::var("MOE_CENSUS_S3_BUCKET") {
        return Some(bucket);
    }
    if std::env::var(SKIP_S3_ENV).as_deref() == Ok("1") {
        println!("SKIPPED ({SKIP_S3_ENV}=1): no S3 test server");
        return None;
    }
    panic!(
        "MOE_CENSUS_S3_BUCKET is unset: `source .ci/s3-server` starts a local S3 server \
         (or set {SKIP_S3_ENV}=1 to skip the S3 tests explicitly)"
    );
}

/// The arguments of the worker stage `stage` (`collect`, `eval`) on `model`
/// over `chunks` of the corpus under `corpus`, writing under `out`, then
/// `extra`: the flags every such call spells, in one place.
pub fn worker_args<'a>(
    stage: &'a str,
    model: &'a Path,
    corpus: &'a Path,
    chunks: &'a str,
    out: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![stage, "--chunks", chunks];
    for (flag, path) in [("--model", model), ("--corpus", corpus), ("--out", out)] {
        args.extend([flag, path.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    args
}

/// `worker eval` of `candidates` against `base` on the held-out split of
/// every chunk of the run `run`, with `threads` threads, its results under
/// `out`: the evaluation's `eval/summary.json`.
pub fn held_out_eval(
    base: &Path,
    run: &Path,
    candidates: &[&Path],
    out: &Path,
    threads: &str,
) -> serde_json::Value {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("corpus/index.json")).unwrap()).unwrap();
    let chunks = format!("0..{}", index["n_chunks"].as_u64().unwrap());
    let mut extra = vec!["--threads", threads, "--split", "heldout"];
    for c in candidates {
        extra.extend(["--candidate", c.to_str().unwrap()]);
    }
    run_ok(
        "worker",
        &worker_args("eval", base, run, &chunks, out, &extra),
    );
    serde_json::from_slice(&std::fs::read(out.join("eval/summary.json")).unwrap()).unwrap()
}

/// Runs a workspace binary (`worker` or `coordinator`, as built by this
/// package); prints its stderr when it fails.
pub fn run(bin_name: &str, args: &[&str]) -> std::process::Output {
    let out = command(bin_name).args(args).output().unwrap();
    if !out.status.success() {
        eprintln!(
            "{bin_name} {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Runs a workspace binary and asserts that it succeeds.
pub fn run_ok(bin_name: &str, args: &[&str]) -> std::process::Output {
    let out = run(bin_name, args);
    assert!(
        out.status.success(),
        "{bin_name} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// log softmax of a logits row in f64, the textbook way: subtract the max,
/// exponentiate, normalise, take the log of each probability (the oracle
/// side of the evaluation tests).
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .map(|&v| v as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    row.iter()
        .map(|&v| ((v as f64 - max).exp() / z).ln())
        .collect()
}

/// `coordinator run CONFIG --local-workers WORKERS --out RUN`, the front
/// door's command line.
pub fn run_args(config: &Path, workers: u32, run: &Path) -> Vec<String> {
    let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_string();
    vec![
        "run".into(),
        path(config),
        "--local-workers".into(),
        workers.to_string(),
        "--out".into(),
        path(run),
    ]
}

/// Runs [`run_args`] and asserts that it succeeds, showing its stdout and
/// stderr when it does not.
pub fn coordinator_run(config: &Path, workers: u32, run: &Path) -> std::process::Output {
    let args = run_args(config, workers, run);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = self::run("coordinator", &args);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A command for a workspace binary: the coordinator is told which worker
/// binary to start for `--local-workers`, so both come from the same build.
pub fn command(bin_name: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin(bin_name));
    cmd.env(runtime::run::local::WORKER_BIN_ENV, bin("worker"));
    cmd
}

/// A cluster test's directory `dir`: the bundled sample corpus and the
/// quickstart model linked in (as `configs/` has them) and a fresh join
/// secret written; returns (the `configs/` folder, model, secret file).
pub fn cluster_dir(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    std::os::unix::fs::symlink(configs.join("sample_corpus"), dir.join("sample_corpus")).unwrap();
    std::fs::create_dir(dir.join("models")).unwrap();
    let model = dir.join("models/quickstart-moe.gguf");
    std::os::unix::fs::symlink(configs.join("models/quickstart-moe.gguf"), &model).unwrap();
    let secret = dir.join("join.secret");
    std::fs::write(&secret, protocol::secret::JoinSecret::generate().expose()).unwrap();
    (configs, model, secret)
}

/// The files `names` (relative to `run`) with their bytes, in that order;
/// a missing one panics naming it.
pub fn files_of(run: &Path, names: Vec<String>) -> Vec<(String, Vec<u8>)> {
    names
        .into_iter()
        .map(|n| {
            let bytes = std::fs::read(run.join(&n)).unwrap_or_else(|e| panic!("{n}: {e}"));
            (n, bytes)
        })
        .collect()
}

/// The `join` command of `connect.json` as a user runs it: the worker
/// binary with the command's arguments (its first word names the binary),
/// then `--secret-file`, `--name`, one thread and `--model`.
pub fn join_command(join: &str, secret: &Path, name: &str, model: &Path) -> std::process::Command {
    let args: Vec<&str> = join.split_whitespace().collect();
    let mut cmd = command("worker");
    cmd.args(&args[1..])
        .arg("--secret-file")
        .arg(secret)
        .args(["--name", name, "--threads", "1", "--model"])
        .arg(model);
    cmd
}

/// Path of a binary that Cargo built for this package's tests from the
/// current sources (`worker`, `coordinator`), never a stale build by path.
/// Cargo sets `CARGO_BIN_EXE_<name>` when it builds and runs integration tests.
pub fn bin(name: &str) -> PathBuf {
    let target = match name {
        "worker" => "worker-under-test",
        "coordinator" => "coordinator-under-test",
        other => panic!("no workspace binary named {other}"),
    };
    let var = format!("CARGO_BIN_EXE_{target}");
    let path = std::env::var_os(&var)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{var} is unset: run the end-to-end tests with `cargo test`"));
    assert!(path.exists(), "{} ({var}) does not exist", path.display());
    path
}
