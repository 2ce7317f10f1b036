//! Sources as people have them, read from files the ecosystem's own writers
//! made (`tests/fixtures/inputs/make.py`: pyarrow, Python's json, gzip and
//! zstandard), so the readers are checked against real files, not ours.

use crate::chat::Role;
use crate::source::{read_source, Content, Record};
use config::{SourceConfig, SourceFormat};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/inputs")
}

fn read(cfg: SourceConfig, group_key: Option<&str>) -> crate::source::SourceData {
    let path = fixtures().join(&cfg.path);
    read_source(&cfg, &path, group_key).unwrap()
}

fn source(path: &str) -> SourceConfig {
    SourceConfig {
        path: path.into(),
        ..SourceConfig::default()
    }
}

fn text(r: &Record) -> &str {
    match &r.content {
        Content::Text(t) => t,
        Content::Chat(_) => panic!("{} is chat", r.at),
    }
}

#[test]
fn a_code_folder_by_glob_with_an_exclusion_skips_and_counts_binary_and_large_files() {
    let d = read(
        SourceConfig {
            format: Some(SourceFormat::Text),
            exclude: vec!["vendor".into()],
            max_file_bytes: Some(4096),
            ..source("code/**/*")
        },
        None,
    );
    let at: Vec<&str> = d.records.iter().map(|r| r.at.as_str()).collect();
    assert_eq!(
        at,
        [
            "code/src/lib/parse.rs (document 1)",
            "code/src/main.rs (document 1)",
            "code/src/util.py (document 1)"
        ]
    );
    assert!(text(&d.records[1]).starts_with("fn main() {"));
    assert_eq!((d.files, d.skipped_binary, d.skipped_large), (3, 1, 1));
    // Without a format, a file whose name tells none is refused, not guessed.
    let path = fixtures().join("code/**/*.rs");
    let e = read_source(&source("code/**/*.rs"), &path, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("generated.rs") && e.contains("set format"),
        "{e}"
    );
}

#[test]
fn a_zstd_parquet_file_with_a_content_column_reads_its_rows() {
    let d = read(source("japanese.parquet"), Some("id"));
    assert_eq!(d.records.len(), 24);
    assert!(text(&d.records[0]).starts_with("川の流れは絶えずして"));
    assert_eq!(d.records[5].group.as_deref(), Some("5"));
    assert_eq!(d.records[5].at, "japanese.parquet (row 6)");
    // A text_field that names another column is not read from `content`.
    let e = read_source(
        &SourceConfig {
            text_field: "body".into(),
            ..source("japanese.parquet")
        },
        &fixtures().join("japanese.parquet"),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no text column \"body\""), "{e}");
}

#[test]
fn parquet_reads_every_common_codec() {
    for codec in ["zstd", "lz4", "brotli", "snappy", "gzip"] {
        let d = read(source(&format!("codecs/{codec}.parquet")), None);
        assert_eq!(d.records.len(), 3, "{codec}");
        assert!(text(&d.records[2]).contains("図書館"), "{codec}");
    }
}

#[test]
fn openai_tool_call_chats_with_the_developer_role() {
    let d = read(source("tools.jsonl"), Some("task"));
    assert_eq!(d.records.len(), 10);
    let Content::Chat(crate::chat::Chat { messages: m, .. }) = &d.records[1].content else {
        panic!("not chat")
    };
    let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
    use Role::*;
    assert_eq!(roles, [Developer, User, Assistant, Tool, Assistant]);
    assert_eq!(m[1].content, "What is the weather in Osaka?");
    assert_eq!(m[2].content, "");
    assert_eq!(
        (
            m[2].tool_calls[0].name.as_str(),
            m[2].tool_calls[0].arguments.as_str()
        ),
        ("get_weather", "{\"city\": \"Osaka\", \"unit\": \"C\"}")
    );
    assert_eq!(
        m[2].legacy_content(),
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Osaka\", \"unit\": \"C\"}}\n</tool_call>"
    );
    assert_eq!(m[3].content, "{\"temp\": 11}");
    assert_eq!(d.records[1].group.as_deref(), Some("weather-1"));
}

#[test]
fn sharegpt_conversations() {
    let d = read(source("sharegpt.jsonl"), None);
    let Content::Chat(crate::chat::Chat { messages: m, .. }) = &d.records[3].content else {
        panic!("not chat")
    };
    assert_eq!(
        m.iter().map(|m| m.role).collect::<Vec<_>>(),
        [Role::System, Role::User, Role::Assistant]
    );
    assert_eq!(m[2].content, "3 spiders have 24 legs.");
}

#[test]
fn a_json_array_and_compressed_json_lines() {
    let a = read(source("articles.json"), None);
    assert_eq!(a.records.len(), 12);
    assert_eq!(a.records[2].at, "articles.json (record 3)");
    assert!(text(&a.records[2]).starts_with("Note 2 on lanterns"));
    let gz = read(source("notes.jsonl.gz"), None);
    let zst = read(source("notes.jsonl.zst"), None);
    assert_eq!(gz.records.len(), 12);
    assert_eq!(gz.records[0].at, "notes.jsonl.gz:1");
    let texts = |d: &crate::source::SourceData| -> Vec<String> {
        d.records.iter().map(|r| text(r).to_string()).collect()
    };
    assert_eq!(texts(&gz), texts(&zst));
    assert!(texts(&gz)[0].starts_with("Note 100 on "));
    // The hash is the compressed file's (what the user has).
    assert_eq!(
        gz.sha256,
        gguf::hash::sha256_file(&fixtures().join("notes.jsonl.gz")).unwrap()
    );
}
