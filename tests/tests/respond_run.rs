//! The response phase as a user runs it: `coordinator run` on
//! `configs/respond.toml` (the quickstart model answering the sample
//! chats, its `[eval]` left out to keep the test short) with `worker join`
//! processes started once. With 1 and with 2 workers the stored responses
//! (`corpus/responses/`) and the corpus built from them
//! (`corpus/chunks.parquet`) are byte-identical, greedy and sampled at
//! temperature 0.8 with seed 3; a second run of the same command reuses
//! every response (no worker is needed, none generates).

use fixtures::proc::{until, Proc};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Generous bound on anything a test waits for (a loaded 2-core machine).
const DEADLINE: Duration = Duration::from_secs(600);

/// `configs/respond.toml` in `dir` without its `[eval]`, with `extra`
/// appended to `[corpus.respond]` and a `[cluster]` naming a fresh secret
/// file and `connect.json`; returns (config, model, secret file).
fn respond_config(dir: &Path, extra: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (configs, model, secret) = fixtures::cluster_dir(dir);
    let text = std::fs::read_to_string(configs.join("respond.toml")).unwrap();
    let (text, _) = text
        .split_once("\n[eval]\n")
        .expect("respond.toml evaluates");
    let text = text.replace("[corpus.respond]\n", &format!("[corpus.respond]\n{extra}"));
    assert!(text.contains("respond = \"assistant\""), "{text}");
    let config = dir.join("respond.toml");
    std::fs::write(
        &config,
        format!(
            "{text}\n[cluster]\nsecret_file = \"join.secret\"\nconnect_file = \"connect.json\"\n"
        ),
    )
    .unwrap();
    (config, model, secret)
}

/// `coordinator run CONFIG --out RUN` with no local worker.
fn coordinator(config: &Path, run: &Path) -> Proc {
    let mut cmd = fixtures::command("coordinator");
    cmd.args(["run", config.to_str().unwrap(), "--out"])
        .arg(run);
    Proc::spawn(cmd)
}

/// The `join` command of `connect.json` with the secret, a name, one
/// thread and the model appended.
fn join(connect: &Path, secret: &Path, name: &str, model: &Path) -> Proc {
    let mut info = serde_json::Value::Null;
    until("the coordinator writes connect.json", DEADLINE, || {
        info = std::fs::read(connect)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        !info.is_null()
    });
    let join = info["join"].as_str().unwrap();
    Proc::spawn(fixtures::join_command(join, secret, name, model))
}

/// Every object under `corpus/responses/` and `corpus/chunks.parquet`, by name.
fn outputs(run: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names = vec![
        "corpus/responses/prompts.json".to_string(),
        "corpus/responses/responses.jsonl".to_string(),
        "corpus/chunks.parquet".to_string(),
    ];
    let mut parts: Vec<String> = std::fs::read_dir(run.join("corpus/responses/partials"))
        .unwrap()
        .map(|e| {
            format!(
                "corpus/responses/partials/{}",
                e.unwrap().file_name().to_string_lossy()
            )
        })
        .collect();
    parts.sort();
    names.extend(parts);
    fixtures::files_of(run, names)
}

/// Runs the config with `workers` external workers into `run`; returns
/// the coordinator's output.
fn run_with(dir: &Path, run: &Path, workers: usize) -> String {
    let (config, model, secret) = (
        dir.join("respond.toml"),
        dir.join("models/quickstart-moe.gguf"),
        dir.join("join.secret"),
    );
    let connect = dir.join("connect.json");
    let _ = std::fs::remove_file(&connect);
    let mut c = coordinator(&config, run);
    let mut ws: Vec<Proc> = (0..workers)
        .map(|i| join(&connect, &secret, &format!("node-{i}"), &model))
        .collect();
    let status = c.wait(DEADLINE);
    assert!(status.success(), "{}\n{}", c.out(), c.log());
    for w in ws.iter_mut() {
        assert!(w.wait(DEADLINE).success(), "{}", w.log());
        assert!(w.log().contains("joined a response phase"), "{}", w.log());
    }
    c.out()
}

fn one_and_two_workers_agree(extra: &str) {
    let d = tempfile::tempdir().unwrap();
    respond_config(d.path(), extra);
    let one = d.path().join("one");
    let out = run_with(d.path(), &one, 1);
    assert!(
        out.contains("responses: 47 prompts in 6 leases (0 reused")
            && out.contains("6 generated")
            && out.contains("responses sample_corpus/chat.jsonl: 47 prompts, 47 responses"),
        "{out}"
    );
    let two = d.path().join("two");
    run_with(d.path(), &two, 2);
    let (a, b) = (outputs(&one), outputs(&two));
    assert_eq!(
        a.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        b.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x == y, "{name} differs between 1 and 2 workers");
    }
    // The same command again: every response reused, no worker needed.
    let mut again = coordinator(&d.path().join("respond.toml"), &two);
    assert!(again.wait(DEADLINE).success(), "{}", again.log());
    let out = again.out();
    assert!(
        out.contains("(6 reused from") && out.contains(", 0 generated,"),
        "{out}"
    );
    assert_eq!(outputs(&two), b, "a resumed run rewrites nothing");
}

#[test]
fn greedy_responses_are_the_same_with_one_and_two_workers_and_reused() {
    one_and_two_workers_agree("");
}

#[test]
fn sampled_responses_are_the_same_with_one_and_two_workers_and_reused() {
    one_and_two_workers_agree("temperature = 0.8\nseed = 3\n");
}

/// `drop_ppl_quantile` end to end: the corpus summary's dropped count is
/// the number of stored responses whose perplexity has at least
/// `ceil(q n)` of its source's perplexities below it (counted here from
/// `responses.jsonl`), each of them is marked dropped, and no kept one is.
#[test]
fn perplexity_filter_drops_the_responses_its_stored_perplexities_rank_out() {
    let q = 0.75;
    let d = tempfile::tempdir().unwrap();
    respond_config(d.path(), &format!("drop_ppl_quantile = {q}\n"));
    let run = d.path().join("run");
    let out = run_with(d.path(), &run, 1);
    let text = std::fs::read_to_string(run.join("corpus/responses/responses.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ppl: Vec<f64> = rows
        .iter()
        .map(|r| r["perplexity"].as_f64().unwrap())
        .collect();
    assert!(
        rows.iter().all(|r| r["source"] == rows[0]["source"]),
        "one responded source"
    );
    let keep = (q * ppl.len() as f64).ceil() as usize;
    let ranked_out: Vec<bool> = ppl
        .iter()
        .map(|&p| ppl.iter().filter(|&&o| o < p).count() >= keep)
        .collect();
    let expected = ranked_out.iter().filter(|&&x| x).count();
    assert!(expected > 0 && expected < ppl.len(), "{ppl:?}");
    for (r, &out_) in rows.iter().zip(&ranked_out) {
        let dropped = r.get("dropped").and_then(|v| v.as_bool()).unwrap_or(false);
        assert_eq!(dropped, out_, "{r}");
    }
    let line = format!(
        "responses sample_corpus/chat.jsonl: {} prompts, {} responses",
        ppl.len(),
        ppl.len()
    );
    let summary = out
        .lines()
        .find(|l| l.contains(&line))
        .unwrap_or_else(|| panic!("no summary line in {out}"));
    assert!(
        summary.contains(&format!("; {expected} dropped by the perplexity filter")),
        "{summary} (expected {expected} dropped)"
    );
}
