//! `coordinator corpus` as a user runs it: the quickstart's sample corpus on
//! the committed quickstart model; a share miss is a non-zero exit with the
//! table.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The quickstart config with absolute sample paths, the given targets
/// (english, japanese, code, chat) and a copy of the model beside it.
fn config(dir: &Path, targets: [f64; 4]) -> PathBuf {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/quickstart.toml");
    let base = sample.parent().unwrap().canonicalize().unwrap();
    let text = std::fs::read_to_string(&sample)
        .unwrap()
        .replace(
            "\"sample_corpus/",
            &format!("\"{}/sample_corpus/", base.display()),
        )
        .replace(
            "target_share = 0.36",
            &format!("target_share = {}", targets[0]),
        )
        .replace(
            "target_share = 0.18",
            &format!("target_share = {}", targets[1]),
        )
        .replace(
            "target_share = 0.22",
            &format!("target_share = {}", targets[2]),
        )
        .replace(
            "target_share = 0.24",
            &format!("target_share = {}", targets[3]),
        );
    let path = dir.join("quickstart.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::create_dir_all(dir.join("models")).unwrap();
    std::fs::copy(
        sample.parent().unwrap().join("models/quickstart-moe.gguf"),
        dir.join("models/quickstart-moe.gguf"),
    )
    .unwrap();
    path
}

fn corpus(config: &Path, out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .args([
            "corpus",
            config.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap()
}

#[test]
fn quickstart_corpus_is_prepared_then_reused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), [0.36, 0.18, 0.22, 0.24]);
    let out = dir.path().join("run");
    let first = corpus(&cfg, &out);
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        stdout.contains("japanese") && stdout.contains("wrote the corpus"),
        "{stdout}"
    );
    assert!(out.join("manifest.json").is_file() && out.join("corpus/chunks.parquet").is_file());
    chunks_are_of_one_split_and_name_their_documents(&out);
    let again = corpus(&cfg, &out);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("reused the corpus"));
}

/// Over the stored `chunks.parquet` of the run `out`: no chunk holds spans
/// of both splits (held-out positions never see fit text), and every span
/// names its document (a line of `documents.jsonl`, of the span's domain and
/// split, not dropped) and its group (an entry of `index.json`'s groups,
/// the document's); every kept document's tokens are all in the chunks.
fn chunks_are_of_one_split_and_name_their_documents(out: &Path) {
    use runfiles::corpus::{read_chunks, CorpusIndex};
    use runfiles::manifest::DocRecord;
    let read = |name: &str| std::fs::read(out.join("corpus").join(name)).unwrap();
    let chunks = read_chunks(bytes::Bytes::from(read("chunks.parquet")), None).unwrap();
    let index = CorpusIndex::decode(&read("index.json"), "index.json").unwrap();
    let docs: Vec<DocRecord> = String::from_utf8(read("documents.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut placed = vec![0u64; docs.len()];
    let mut by_split = [0usize; 2];
    for c in &chunks {
        let split = c.spans[0].split;
        assert!(
            c.spans.iter().all(|s| s.split == split),
            "chunk {} holds spans of both splits: {:?}",
            c.id,
            c.spans
        );
        by_split[usize::from(split == numbers::Split::Heldout)] += 1;
        for s in &c.spans {
            let doc = &docs[s.doc as usize];
            let group = &index.groups[s.group as usize];
            assert_eq!(doc.domain, index.domains[usize::from(s.domain)]);
            assert_eq!((doc.split, doc.dropped.as_deref()), (s.split, None));
            assert_eq!(
                (group.domain, group.split, group.key.as_str()),
                (s.domain, s.split, doc.group.as_str())
            );
            placed[s.doc as usize] += u64::from(s.len);
        }
    }
    assert!(by_split[0] > 0 && by_split[1] > 0, "{by_split:?}");
    for (d, n) in docs.iter().zip(&placed) {
        let expected = if d.dropped.is_some() { 0 } else { d.tokens };
        assert_eq!(*n, expected, "{}", d.at);
    }
}

#[test]
fn off_targets_exit_non_zero_with_the_table_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), [0.2, 0.5, 0.1, 0.2]);
    // Shares checked as the files give them (shares = "sample", the
    // default, would leave text out until they are met).
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("[corpus]\n"), "{text}");
    std::fs::write(
        &cfg,
        text.replace("[corpus]\n", "[corpus]\nshares = \"verify\"\n"),
    )
    .unwrap();
    let out = dir.path().join("run");
    let o = corpus(&cfg, &out);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    for needle in [
        "token shares miss",
        "english",
        "japanese",
        "target%",
        "MISS",
    ] {
        assert!(stderr.contains(needle), "{needle}:\n{stderr}");
    }
    assert!(!out.join("manifest.json").exists());
}
