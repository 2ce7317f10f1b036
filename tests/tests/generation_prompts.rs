//! The generation check's prompts on the quickstart corpus packed at
//! n_ctx 1024, where every chat conversation is shorter than a chunk (so
//! no chunk is wholly one conversation's, the old rule's condition): the
//! chat domain gets prompts, each a held-out conversation's tokens up to
//! its first assistant turn, ending with the ChatML generation prompt
//! `<|im_start|>assistant\n`; the oracle is the whole conversation as the
//! model's template renders it (compared with Jinja2 in `chat_templates`),
//! cut before its first assistant turn's text by string search and
//! tokenized. Every domain gets prompts or a reason.

use corpus::chat::Role;
use corpus::tokenizer::{LlamaTokenizer, Tokenizer};
use runfiles::manifest::DocRecord;
use runfiles::store::RunStore;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn chat_prompts_end_after_a_user_turn_at_n_ctx_1024() {
    let mut config = config::Config::load(&repo().join("configs/quickstart.toml")).unwrap();
    config.corpus.n_ctx = 1024;
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(corpus::prepare_run(&config, &store, false))
        .unwrap();
    let index = rt.block_on(runtime::run::read_index(&store)).unwrap();
    let settings = config::eval::EvalSettings::default();
    let job = rt
        .block_on(measure::eval::prompts::job(&store, &settings, &index))
        .unwrap();

    let docs: Vec<DocRecord> = std::fs::read_to_string(dir.path().join("corpus/documents.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let chat_domain = index.domains.iter().position(|d| d == "chat").unwrap() as u16;
    let held_out_chats: Vec<&DocRecord> = docs
        .iter()
        .filter(|d| d.domain == "chat" && d.split == numbers::Split::Heldout && d.dropped.is_none())
        .collect();
    assert!(held_out_chats.len() >= 2, "the quickstart holds out chats");
    // The condition of the test: every conversation is shorter than n_ctx.
    assert!(docs
        .iter()
        .filter(|d| d.domain == "chat")
        .all(|d| d.tokens < 1024));

    let tok =
        LlamaTokenizer::load(&repo().join("configs/models/quickstart-moe.gguf"), None).unwrap();
    let header = tok.tokenize("<|im_start|>assistant\n", true);
    let chat_prompts: Vec<_> = job
        .prompts
        .iter()
        .filter(|p| p.domain == chat_domain)
        .collect();
    assert_eq!(chat_prompts.len(), settings.generate_prompts as usize);
    let lines: Vec<String> =
        std::fs::read_to_string(repo().join("configs/sample_corpus/chat.jsonl"))
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
    for p in &chat_prompts {
        assert!(p.after_user_turn);
        assert!(p.tokens.ends_with(&header), "prompt of doc {}", p.doc);
        assert!(p.tokens.len() + job.new_tokens as usize <= 1024);
        // The oracle: the record's conversation rendered whole, cut before
        // its first assistant turn's text.
        let doc = &docs[p.doc as usize];
        assert_eq!(
            (doc.domain.as_str(), doc.split),
            ("chat", numbers::Split::Heldout)
        );
        let line: usize = doc.at.rsplit(':').next().unwrap().parse().unwrap();
        let record: Value = serde_json::from_str(&lines[line - 1]).unwrap();
        let chat = fixtures::chat_of(&record["messages"]);
        assert!(chat.messages.iter().any(|m| m.role == Role::User));
        let whole = tok.apply_chat_template(&chat, &Default::default()).unwrap();
        let marker = "<|im_start|>assistant\n";
        let cut = whole.find(marker).unwrap() + marker.len();
        assert_eq!(
            p.tokens,
            tok.tokenize(&whole[..cut], true),
            "doc {}",
            doc.at
        );
        // The turn before the generation prompt is a user turn.
        let before = &whole[..cut - marker.len()];
        let last_turn = before.rfind("<|im_start|>").unwrap();
        assert!(
            before[last_turn..].starts_with("<|im_start|>user"),
            "{before}"
        );
    }
    // Every domain with held-out text gets prompts, or a reason.
    for (d, name) in index.domains.iter().enumerate() {
        let prompted = job.prompts.iter().any(|p| usize::from(p.domain) == d);
        let why = job.unprompted.get(&(d as u16));
        assert!(prompted != why.is_some(), "{name}: {why:?}");
    }
    assert!(job.prompts.iter().all(|p| !p.tokens.is_empty()));
}
