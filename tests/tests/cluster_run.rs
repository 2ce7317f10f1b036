//! A cluster run as a user starts it: `coordinator run` on the quickstart
//! config with `[eval]`, `[ship]` (a Q8_0 file of one candidate) and a
//! join secret, no local workers, and `worker join` processes started once
//! from the command the coordinator writes to `connect.json` (its
//! placeholders replaced by appended flags). The workers serve collection,
//! evaluation and shipping's evaluation, and leave when the run is
//! finished; a worker started only once the evaluation is due serves the
//! evaluation. The run's artifacts equal those of `--local-workers 2`.

use fixtures::proc::{until, Proc};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Generous bound on anything a test waits for (a loaded 2-core machine).
const DEADLINE: Duration = Duration::from_secs(600);

/// The quickstart config in `dir` (its committed model and the bundled
/// sample corpus linked) with a `[ship]` section and a `[cluster]` section
/// naming a fresh secret file and `connect.json` in `dir`; returns (config,
/// model, secret file).
fn quickstart_cluster(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (configs, model, secret) = fixtures::cluster_dir(dir);
    let quickstart = std::fs::read_to_string(configs.join("quickstart.toml")).unwrap();
    assert!(
        quickstart.contains("\n[eval]\n"),
        "the quickstart evaluates"
    );
    let config = dir.join("quickstart.toml");
    std::fs::write(
        &config,
        format!(
            "{quickstart}\n[ship]\ncandidates = [\"frequency_K16\"]\nquant = [\"Q8_0\"]\n\n\
             [cluster]\nsecret_file = \"join.secret\"\nconnect_file = \"connect.json\"\n"
        ),
    )
    .unwrap();
    (config, model, secret)
}

/// `coordinator run CONFIG --out RUN [extra...]`.
fn coordinator(config: &Path, run: &Path, extra: &[&str]) -> Proc {
    let mut cmd = fixtures::command("coordinator");
    cmd.args(["run", config.to_str().unwrap(), "--out"])
        .arg(run)
        .args(extra);
    Proc::spawn(cmd)
}

/// The `join` command of `connect.json` as a user runs it: the worker
/// binary with its arguments, then `--secret-file`, `--name` and `--model`.
fn join_from(join: &str, secret: &Path, name: &str, model: &Path) -> Proc {
    let words: Vec<&str> = join.split_whitespace().take(2).collect();
    assert_eq!(words, ["worker", "join"], "{join}");
    Proc::spawn(fixtures::join_command(join, secret, name, model))
}

/// What must not depend on who computed it: the collection's results, both
/// evaluations' figures and the shipped model files.
fn artifacts(run: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names: Vec<String> = [
        "saliency.json",
        "imatrix.gguf",
        "eval/summary.json",
        "ship/eval/summary.json",
    ]
    .map(String::from)
    .to_vec();
    let mut shipped: Vec<String> = std::fs::read_dir(run.join("shipped"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf"))
        .map(|n| format!("shipped/{n}"))
        .collect();
    shipped.sort();
    names.extend(shipped);
    fixtures::files_of(run, names)
}

#[test]
fn workers_started_once_serve_collection_evaluation_and_shipping() {
    let d = tempfile::tempdir().unwrap();
    let (config, model, secret) = quickstart_cluster(d.path());

    let reference = d.path().join("reference");
    let mut local = coordinator(&config, &reference, &["--local-workers", "2"]);
    assert!(local.wait(DEADLINE).success(), "{}", local.log());
    let expected = artifacts(&reference);
    let shipped: Vec<&str> = expected
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.starts_with("shipped/"))
        .collect();
    assert!(
        shipped.contains(&"shipped/frequency_K16.Q8_0.gguf"),
        "{shipped:?}"
    );

    let connect = d.path().join("connect.json");
    std::fs::remove_file(&connect).unwrap();
    let run = d.path().join("run");
    let mut cluster = coordinator(&config, &run, &[]);
    let mut info = serde_json::Value::Null;
    until("the coordinator writes connect.json", DEADLINE, || {
        info = std::fs::read(&connect)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        !info.is_null()
    });
    let join = info["join"].as_str().unwrap().to_string();
    assert!(
        join.contains("--secret-file SECRET_FILE") && join.contains("--model MODEL.gguf"),
        "the command names every flag a worker needs: {join}"
    );
    let mut started = [
        join_from(&join, &secret, "node-1", &model),
        join_from(&join, &secret, "node-2", &model),
    ];
    // A third worker, started only once the evaluation is due (the report
    // of the collection is printed just before it).
    until("the collection's report", DEADLINE, || {
        cluster.out().contains("\nreport: ") || cluster.child.try_wait().unwrap().is_some()
    });
    let mut late = join_from(&join, &secret, "node-late", &model);

    let status = cluster.wait(DEADLINE);
    assert!(status.success(), "{}\n{}", cluster.out(), cluster.log());
    let out = cluster.out();
    assert!(
        out.contains("evaluated 6 candidates") && out.contains("run complete"),
        "{out}"
    );
    assert_eq!(
        out.matches("waiting for workers: ").count(),
        1,
        "one join command for the whole run: {out}"
    );
    for w in started.iter_mut() {
        assert!(w.wait(DEADLINE).success(), "{}", w.log());
        let log = w.log();
        assert!(
            log.contains("joined a collection")
                && log.matches("joined an evaluation").count() == 2,
            "a worker started once serves the collection, the evaluation and shipping's evaluation:\n{log}"
        );
    }
    assert!(late.wait(DEADLINE).success(), "{}", late.log());
    let log = late.log();
    assert!(
        log.contains("joined an evaluation") && !log.contains("joined a collection"),
        "a worker joining after the collection serves the evaluation:\n{log}"
    );
    let got = artifacts(&run);
    assert_eq!(
        got.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        expected.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((name, bytes), (_, want)) in got.iter().zip(&expected) {
        assert!(
            bytes == want,
            "{name} differs from the --local-workers 2 run's"
        );
    }
}
