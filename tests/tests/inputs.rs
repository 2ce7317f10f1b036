//! Sources as people have them, end to end: a corpus of a code folder (a
//! glob with an exclusion), a zstd Parquet file with a `content` column,
//! OpenAI tool-call chats with the `developer` role, ShareGPT, a JSON array
//! and compressed JSON lines, all written by the ecosystem's own writers
//! (`tests/fixtures/inputs/make.py`), prepared and run by `coordinator run`
//! with local workers on the generated tiny model.

use std::collections::BTreeMap;
use std::path::Path;

const CONFIG: &str = r#"
[model]
path = "tiny.gguf"
[corpus]
n_ctx = 64
heldout_fraction = 0.2
[[corpus.domains]]
name = "code"
sources = [{ path = "inputs/code/**/*", format = "text", exclude = ["vendor"], max_file_bytes = 4096 }]
[[corpus.domains]]
name = "japanese"
sources = [{ path = "inputs/japanese.parquet" }]
[[corpus.domains]]
name = "tools"
group_key = "task"
sources = [{ path = "inputs/tools.jsonl" }]
[[corpus.domains]]
name = "sharegpt"
sources = [{ path = "inputs/sharegpt.jsonl" }]
[[corpus.domains]]
name = "prose"
sources = [{ path = "inputs/articles.json" }, { path = "inputs/notes.jsonl.gz" }, { path = "inputs/notes.jsonl.zst" }]
"#;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn a_corpus_of_the_formats_people_have_prepares_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::model(dir.path(), synth::Preset::Tiny);
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/inputs"),
        &dir.path().join("inputs"),
    );
    let config = dir.path().join("inputs.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let run = dir.path().join("run");
    let out = fixtures::coordinator_run(&config, 2, &run);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("run complete"), "{stdout}");
    assert!(run.join("saliency.json").exists());

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap();
    let domains: BTreeMap<&str, &serde_json::Value> = manifest["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["shares"]["domain"].as_str().unwrap(), d))
        .collect();
    let records = |name: &str| -> Vec<u64> {
        domains[name]["sources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["records"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(records("code"), [3]);
    assert_eq!(records("japanese"), [24]);
    assert_eq!(records("tools"), [10]);
    assert_eq!(records("sharegpt"), [10]);
    assert_eq!(records("prose"), [12, 12, 12]);
    let code = &domains["code"]["sources"][0];
    assert_eq!(
        (
            &code["files"],
            &code["skipped_binary"],
            &code["skipped_large"]
        ),
        (
            &serde_json::json!(3),
            &serde_json::json!(1),
            &serde_json::json!(1)
        ),
        "{code}"
    );
    for (name, d) in &domains {
        let tokens = d["fit_tokens"].as_u64().unwrap() + d["heldout_tokens"].as_u64().unwrap();
        assert!(tokens > 0, "domain {name} has no tokens: {d}");
    }
    // Every document is in the corpus, located in its own file.
    let docs = std::fs::read_to_string(run.join("corpus/documents.jsonl")).unwrap();
    for at in [
        "inputs/code/src/main.rs (document 1)",
        "inputs/japanese.parquet (row 24)",
        "inputs/tools.jsonl:10",
        "inputs/sharegpt.jsonl:1",
        "inputs/articles.json (record 12)",
        "inputs/notes.jsonl.zst:12",
    ] {
        assert!(docs.contains(&format!("\"at\":\"{at}\"")), "{at} missing");
    }
}
