//! Sources as people have them, end to end: a corpus of a code folder (a
//! glob with an exclusion), a zstd Parquet file with a `content` column,
//! OpenAI tool-call chats with the `developer` role, ShareGPT, a JSON array
//! and compressed JSON lines, all written by the ecosystem's own writers
//! (`tests/fixtures/inputs/make.py`), prepared and run by `coordinator run`
//! with local workers on the generated tiny model; and files as Windows
//! tools write them (a byte-order mark) and records without text (null,
//! empty, absent), prepared by `coordinator corpus`.

use std::collections::BTreeMap;
use std::path::Path;

const CONFIG: &str = r#"
[model]
path = "tiny.gguf"
[corpus]
n_ctx = 64
# The fixtures' records are near copies of one another (rotating sentences,
# repeated turns): held-out text would take its fit copies with it (dedup by
# containment). This test is about formats; it holds nothing out.
heldout_fraction = 0.0
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

/// Issue 54: JSON lines and a JSON array that begin with a UTF-8
/// byte-order mark load; a pyarrow-written Parquet file with null and empty
/// `text` rows and JSON lines with null, empty and absent texts load too,
/// those records skipped and counted per source in the manifest and the
/// corpus summary (one rule for every format).
#[test]
fn byte_order_marks_and_records_without_text_load_with_the_skipped_counted() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::model(dir.path(), synth::Preset::Tiny);
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/inputs"),
        &dir.path().join("inputs"),
    );
    let config = dir.path().join("windows.toml");
    std::fs::write(
        &config,
        r#"
[model]
path = "tiny.gguf"
[corpus]
n_ctx = 64
heldout_fraction = 0.2
[[corpus.domains]]
name = "marked"
sources = [{ path = "inputs/bom.jsonl" }, { path = "inputs/bom.json" }]
# The two files hold the same records: held-out text would drop its copies.
heldout_fraction = 0.0
[[corpus.domains]]
name = "gaps"
sources = [{ path = "inputs/nulls.parquet" }, { path = "inputs/nulls.jsonl" }]
# Both files hold the same texts: held-out text would drop its copies.
heldout_fraction = 0.0
"#,
    )
    .unwrap();
    let run = dir.path().join("run");
    let out = fixtures::run(
        "coordinator",
        &[
            "corpus",
            config.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap();
    let sources: BTreeMap<&str, &serde_json::Value> = manifest["domains"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| d["sources"].as_array().unwrap())
        .map(|s| (s["path"].as_str().unwrap(), s))
        .collect();
    let counts = |path: &str| {
        let s = sources[path];
        (
            s["records"].as_u64().unwrap(),
            s["skipped_no_text"].as_u64().unwrap_or(0),
        )
    };
    // The fixtures' own counts (make.py): 8 and 8 records with text; 33
    // rows, 3 null and 1 empty; 12 lines, 2 null, 1 empty, 1 absent.
    assert_eq!(counts("inputs/bom.jsonl"), (8, 0));
    assert_eq!(counts("inputs/bom.json"), (8, 0));
    assert_eq!(counts("inputs/nulls.parquet"), (29, 4));
    assert_eq!(counts("inputs/nulls.jsonl"), (8, 4));
    for line in [
        "inputs/nulls.parquet: 4 records without text skipped",
        "inputs/nulls.jsonl: 4 records without text skipped",
    ] {
        assert!(
            stdout.contains(line) || stderr.contains(line),
            "the corpus summary says {line:?}:\n{stdout}\n{stderr}"
        );
    }
    let docs = std::fs::read_to_string(run.join("corpus/documents.jsonl")).unwrap();
    // The first record of each marked file is read (its mark skipped), and
    // the records after a skipped one keep their own locations.
    for at in [
        "inputs/bom.jsonl:1",
        "inputs/bom.json (record 1)",
        "inputs/nulls.parquet (row 33)",
        "inputs/nulls.jsonl:12",
    ] {
        assert!(docs.contains(&format!("\"at\":\"{at}\"")), "{at} missing");
    }
    assert!(!docs.contains("\"at\":\"inputs/nulls.jsonl:3\""));
}
