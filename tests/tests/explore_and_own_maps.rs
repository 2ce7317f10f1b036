//! Exploring a finished run without overwriting it, and keep maps of one's
//! own: `score`, `eval` and `replay` with `--out NAME` leave the run's
//! results byte-identical and write under `explore/NAME/`, and without it
//! refuse any option the run's config does not give; `score --k`
//! takes shares as `eval` does; a keep map written by hand at any path
//! prunes, evaluates and verifies, and one that does not fit the model is
//! refused.

use std::path::Path;

fn coordinator(args: &[&str]) -> std::process::Output {
    fixtures::run_ok("coordinator", args)
}

fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn exploring_leaves_the_run_as_it_is_and_hand_written_maps_work() {
    let dir = tempfile::tempdir().unwrap();
    let config = fixtures::text_config(
        dir.path(),
        "[eval]\nkeep_maps = [\"frequency_K8\"]\nsplit = \"fit\"\n",
    );
    let run = dir.path().join("run");
    fixtures::coordinator_run(&config, 1, &run);
    let r = run.to_str().unwrap();
    let own = [
        "score/score.json",
        "keep_maps/frequency_K8.json",
        "eval/summary.json",
        "replay/results.json",
    ];
    let before: Vec<Vec<u8>> = own.iter().map(|o| bytes(&run.join(o))).collect();
    let maps_before = std::fs::read_dir(run.join("keep_maps")).unwrap().count();

    // score: a share as eval takes it, to explore/scratch/.
    coordinator(&["score", r, "--k", "25%", "--out", "scratch"]);
    let scratch: serde_json::Value =
        serde_json::from_slice(&bytes(&run.join("explore/scratch/score/score.json"))).unwrap();
    assert_eq!(scratch["ks"], serde_json::json!([4]), "25% of 16 experts");
    assert!(run
        .join("explore/scratch/keep_maps/frequency_K4.json")
        .exists());
    coordinator(&["score", r, "--k", "50%,12", "--out", "mixed"]);
    let mixed: serde_json::Value =
        serde_json::from_slice(&bytes(&run.join("explore/mixed/score/score.json"))).unwrap();
    assert_eq!(mixed["ks"], serde_json::json!([8, 12]));
    // replay and eval, to their own outputs.
    coordinator(&["replay", r, "--capacity", "0.5", "--out", "scratch"]);
    assert!(run.join("explore/scratch/replay/results.json").exists());
    let eval_k12 = [
        "eval",
        r,
        "--keep-maps",
        "frequency_K12",
        "--split",
        "fit",
        "--local-workers",
        "1",
    ];
    coordinator(&[&eval_k12[..], &["--out", "scratch"]].concat());
    let summary = String::from_utf8(bytes(&run.join("explore/scratch/eval/summary.json"))).unwrap();
    assert!(summary.contains("frequency_K12"), "{summary}");
    // Without --out, other options than the run's config gives are
    // refused, naming them and --out, and the run's results stay as they
    // are; the run's own options rewrite the same bytes.
    let refused = [
        vec!["score", r, "--k", "4", "--methods", "frequency"],
        vec!["replay", r, "--capacity", "0.5"],
        eval_k12.to_vec(),
    ];
    for (args, flag) in refused.iter().zip(["--k [4]", "--capacity", "--keep-maps"]) {
        let out = fixtures::run("coordinator", args);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && e.contains(flag) && e.contains("pass --out NAME"),
            "{args:?}: {e}"
        );
    }
    coordinator(&["score", r]);
    for (o, b) in own.iter().zip(&before) {
        assert!(bytes(&run.join(o)) == *b, "{o} changed");
    }
    let bad_name = fixtures::run("coordinator", &["score", r, "--out", "../x"]);
    assert!(!bad_name.status.success());
    assert!(String::from_utf8_lossy(&bad_name.stderr).contains("--out ../x"));

    // A keep map by hand: the first 10 experts of every MoE block.
    let saliency: serde_json::Value =
        serde_json::from_slice(&bytes(&run.join("saliency.json"))).unwrap();
    let blocks: Vec<u64> = saliency["splits"]["fit"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["layer"].as_u64().unwrap())
        .collect();
    assert!(!blocks.is_empty());
    let maps = dir.path().join("maps");
    std::fs::create_dir(&maps).unwrap();
    // Writes `maps/NAME`, keeping the experts `ids` of every block; its path.
    let map_file = |name: &str, ids: &str| -> String {
        let entries: Vec<String> = blocks.iter().map(|b| format!("\"{b}\": [{ids}]")).collect();
        let path = maps.join(name);
        std::fs::write(
            &path,
            format!("{{\"layers\": {{{}}}}}\n", entries.join(", ")),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    };
    let mine = map_file("mine.json", "0, 1, 2, 3, 4, 5, 6, 7, 8, 9");
    let pruned = dir.path().join("mine.gguf");
    let out = coordinator(&[
        "prune",
        r,
        "--keep-map",
        &mine,
        "--out",
        pruned.to_str().unwrap(),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("10 of each MoE layer's experts kept"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(pruned.exists() && dir.path().join("mine.imatrix.gguf").exists());
    coordinator(&[
        "eval",
        r,
        "--keep-maps",
        &mine,
        "--split",
        "fit",
        "--local-workers",
        "1",
        "--out",
        "own",
    ]);
    let summary = String::from_utf8(bytes(&run.join("explore/own/eval/summary.json"))).unwrap();
    assert!(summary.contains("\"mine\""), "{summary}");
    let stored: serde_json::Value =
        serde_json::from_slice(&bytes(&run.join("keep_maps/mine.json"))).unwrap();
    assert_eq!(
        (&stored["method"], &stored["k"]),
        (&serde_json::json!("custom"), &serde_json::json!(10))
    );
    assert_eq!(
        std::fs::read_dir(run.join("keep_maps")).unwrap().count(),
        maps_before + 1
    );
    let verified = coordinator(&["verify", r]);
    let text = String::from_utf8_lossy(&verified.stdout);
    assert!(text.contains("1 made by hand, not recomputed"), "{text}");

    // Maps that do not fit the model are refused, naming the file.
    let too_big = map_file("big.json", "0, 1, 2, 3, 99");
    let x = dir.path().join("x.gguf");
    let refused = fixtures::run(
        "coordinator",
        &[
            "prune",
            r,
            "--keep-map",
            &too_big,
            "--out",
            x.to_str().unwrap(),
        ],
    );
    let e = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && e.contains("big.json") && e.contains("expert 99"),
        "{e}"
    );
    let taken = map_file("frequency_K8.json", "0, 1, 2, 3, 4, 5, 6, 7");
    let eval: [&str; 8] = [
        "eval",
        r,
        "--keep-maps",
        &taken,
        "--local-workers",
        "1",
        "--out",
        "t",
    ];
    let refused = fixtures::run("coordinator", &eval);
    let e = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && e.contains("already holds another keep map"),
        "{e}"
    );
    assert!(bytes(&run.join("keep_maps/frequency_K8.json")) == before[1]);
}
