//! The response phase's corpus side on the committed quickstart model (a
//! ChatML template, read through llama.cpp): a generated turn is rendered
//! and tokenized exactly as the same text written by hand into the
//! conversation, a continued document keeps its first `prefix_tokens`
//! tokens and then holds the response's, and a second preparation from the
//! same stored responses reuses the corpus.

use crate::prepare::{prepare, prepare_with_responses};
use crate::respond::{prompts, stored};
use crate::tokenizer::{LlamaTokenizer, Tokenizer};
use config::respond::RespondMode;
use config::{Config, CorpusConfig, DomainConfig, SourceConfig};
use numbers::respond::{Response, ResponsePartial};
use numbers::ChunkRange;
use std::path::{Path, PathBuf};

fn quickstart_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models/quickstart-moe.gguf")
}

/// A one-domain config over `file` in `dir`, nothing held out, no dedup
/// between its few records.
fn config(dir: &Path, file: &str, respond: Option<RespondMode>) -> Config {
    Config {
        model: config::ModelConfig {
            path: quickstart_model(),
            mmproj: None,
        },
        corpus: CorpusConfig {
            n_ctx: 64,
            heldout_fraction: 0.0,
            dedup: config::DedupConfig {
                threshold: 1.0,
                ..Default::default()
            },
            domains: vec![DomainConfig {
                name: "d".into(),
                target_share: None,
                heldout_fraction: None,
                group_key: None,
                sources: vec![SourceConfig {
                    path: file.into(),
                    respond,
                    ..Default::default()
                }],
            }],
            ..Default::default()
        },
        base_dir: dir.to_path_buf(),
        ..Default::default()
    }
}

/// llama.cpp's own tokenization of `text` (special tokens parsed), through
/// the llama crate's vocabulary (checked against llama-cpp-2 in
/// tests/tests/llama_vocab_oracle.rs), not the corpus's tokenizer.
fn oracle_tokens(text: &str) -> Vec<i32> {
    let model = ::llama::Model::load_vocab(&quickstart_model()).unwrap();
    model.tokenize(text, true, true)
}

/// The document tokens of a prepared corpus, in chunk order.
fn corpus_tokens(p: &crate::prepare::Prepared) -> Vec<i32> {
    p.chunks.iter().flat_map(|c| c.tokens.clone()).collect()
}

#[test]
fn a_generated_turn_is_rendered_and_tokenized_as_the_same_text_written_by_hand() {
    let tok = LlamaTokenizer::load(&quickstart_model(), None).unwrap();
    let answer = "ls lists the files of a directory.\nTry ls -l.";
    let chat = |assistant: &str| {
        serde_json::json!({"messages": [
            {"role": "system", "content": "You teach Linux."},
            {"role": "user", "content": "What is ls?"},
            {"role": "assistant", "content": assistant},
        ]})
        .to_string()
    };
    let (gen_dir, hand_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(
        gen_dir.path().join("c.jsonl"),
        chat("written by someone else"),
    )
    .unwrap();
    std::fs::write(hand_dir.path().join("c.jsonl"), chat(answer)).unwrap();
    let generated = config(gen_dir.path(), "c.jsonl", Some(RespondMode::Assistant));
    let by_hand = config(hand_dir.path(), "c.jsonl", None);

    let file = prompts(&generated, &tok, "m").unwrap();
    assert_eq!(file.prompts.len(), 1);
    let prompt = &file.prompts[0];
    let hand_prompt = "<|im_start|>system\nYou teach Linux.<|im_end|>\n<|im_start|>user\nWhat is ls?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(prompt.tokens, oracle_tokens(hand_prompt));
    // The response as a worker returns it: the answer's ids (the model's
    // own tokenization of it need not be llama.cpp's of the text).
    let ids = tok.tokenize(answer, false);
    let merged = ResponsePartial::new(
        ChunkRange { start: 0, end: 1 },
        vec![Response {
            prompt: 0,
            sample: 0,
            tokens: ids,
            stopped_at_eog: true,
            nll: 3.0,
        }],
    );
    let settings = generated.corpus.respond_settings();
    let responses = stored(&file, &merged, &settings, &tok).unwrap();
    assert_eq!(responses[0].text, answer);
    let from_responses = prepare_with_responses(&generated, &tok, "m", &responses).unwrap();
    let written = prepare(&by_hand, &tok, "m").unwrap();
    let (a, b) = (corpus_tokens(&from_responses), corpus_tokens(&written));
    assert_eq!(a, b, "the generated turn tokenizes as the hand-written one");
    // The template's assistant turn with its end-of-turn token, and no
    // generation prompt left after it.
    let whole = format!("{hand_prompt}{answer}<|im_end|>\n");
    assert_eq!(a, oracle_tokens(&whole));
    assert_eq!(&a[..prompt.tokens.len()], prompt.tokens.as_slice());
    let assistant_start = oracle_tokens("<|im_start|>assistant\n");
    let starts = a
        .windows(assistant_start.len())
        .filter(|w| *w == assistant_start.as_slice())
        .count();
    assert_eq!(starts, 1);
}

#[test]
fn a_continued_document_keeps_its_prefix_tokens_then_the_response_and_reuses_nothing_stale() {
    let tok = LlamaTokenizer::load(&quickstart_model(), None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let docs = [
        "The ls command lists directory contents, sorted by name unless told otherwise by its options and flags.",
        "cp copies files and directories; with -r it copies directories recursively, keeping their structure intact.",
    ];
    let jsonl: String = docs
        .iter()
        .map(|d| serde_json::json!({ "text": d }).to_string() + "\n")
        .collect();
    std::fs::write(dir.path().join("t.jsonl"), jsonl).unwrap();
    let mut cfg = config(dir.path(), "t.jsonl", Some(RespondMode::Continue));
    cfg.corpus.respond = Some(config::respond::RespondSettings {
        prefix_tokens: 5,
        max_tokens: 3,
        ..Default::default()
    });
    let file = prompts(&cfg, &tok, "m").unwrap();
    assert_eq!(file.prompts.len(), 2);
    for (p, d) in file.prompts.iter().zip(docs) {
        assert_eq!(p.tokens, tok.tokenize(d, false)[..5].to_vec());
    }
    // One response ends at end of generation, the other at max_tokens.
    let merged = ResponsePartial::new(
        ChunkRange { start: 0, end: 2 },
        vec![
            Response {
                prompt: 0,
                sample: 0,
                tokens: vec![300, 301],
                stopped_at_eog: true,
                nll: 1.0,
            },
            Response {
                prompt: 1,
                sample: 0,
                tokens: vec![400, 401, 402],
                stopped_at_eog: false,
                nll: 1.0,
            },
        ],
    );
    merged.check(1, 3, tok.info().n_vocab).unwrap();
    let settings = cfg.corpus.respond_settings();
    let responses = stored(&file, &merged, &settings, &tok).unwrap();
    let p = prepare_with_responses(&cfg, &tok, "m", &responses).unwrap();
    let mut docs_tokens: Vec<Vec<i32>> = Vec::new();
    for c in &p.chunks {
        for s in &c.spans {
            docs_tokens.push(c.tokens[s.start as usize..(s.start + s.len) as usize].to_vec());
        }
    }
    docs_tokens.sort();
    let mut want = vec![
        [file.prompts[0].tokens.clone(), vec![300, 301]].concat(),
        [file.prompts[1].tokens.clone(), vec![400, 401, 402]].concat(),
    ];
    want.sort();
    assert_eq!(docs_tokens, want);
    // The responses are inputs: other responses are another corpus.
    let mut other = responses.clone();
    other[0].tokens = vec![300];
    let q = prepare_with_responses(&cfg, &tok, "m", &other).unwrap();
    assert_ne!(q.manifest.inputs_sha256, p.manifest.inputs_sha256);
    let again = prepare_with_responses(&cfg, &tok, "m", &responses).unwrap();
    assert_eq!(again.manifest.inputs_sha256, p.manifest.inputs_sha256);
    assert_eq!(again.chunks_parquet, p.chunks_parquet);
}

#[test]
fn a_record_the_mode_cannot_answer_is_named() {
    let tok = LlamaTokenizer::load(&quickstart_model(), None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.jsonl"), "{\"text\": \"plain\"}\n").unwrap();
    let err = prompts(
        &config(dir.path(), "t.jsonl", Some(RespondMode::Assistant)),
        &tok,
        "m",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("t.jsonl:1") && err.contains("respond = \"continue\""),
        "{err}"
    );
    // No stored response for a record: named, with where they come from.
    let cfg = config(dir.path(), "t.jsonl", Some(RespondMode::Continue));
    let err = prepare_with_responses(&cfg, &tok, "m", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("t.jsonl:1") && err.contains("no stored response"),
        "{err}"
    );
}
