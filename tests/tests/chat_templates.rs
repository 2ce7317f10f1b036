//! Chat as the model's server renders it: the trained model given each
//! family's published chat template (Qwen3, DeepSeek-V3.1, GLM-4.5's,
//! gpt-oss, Llama 4; `tests/fixtures/chat/make.py`) in its GGUF, and the
//! corpus stage's own path (the template read by llama.cpp from the file,
//! rendered, tokenized with special tokens) on conversations with a system
//! prompt, tool definitions, tool calls and a tool answer: the text is
//! what Python's Jinja2 rendered from the same template (the oracle Hugging
//! Face uses), and the ids are that text's. The renders at a fixed date are
//! compared in the corpus crate (`tests::templates`); here the template
//! tells today's date, so gpt-oss's `Current date:` line is today's.

use corpus::chat::ChatKwargs;
use corpus::source::{read_source, Content};
use corpus::tokenizer::{LlamaTokenizer, Tokenizer};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn each_familys_template_in_the_gguf_renders_and_tokenizes_as_jinja2_does() {
    let chat = repo().join("tests/fixtures/chat");
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(chat.join("expected.json")).unwrap())
            .unwrap();
    let fixed_date = expected["now"].as_str().unwrap()[..10].to_string();
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let path = chat.join("conversations.jsonl");
    let cfg = config::SourceConfig {
        path: path.clone(),
        ..config::SourceConfig::default()
    };
    // Each conversation's `name` read as its group key.
    let records = read_source(&cfg, &path, Some("name")).unwrap().records;
    let dir = tempfile::tempdir().unwrap();
    let base = repo().join("configs/models/quickstart-moe.gguf");
    let families = expected["renders"].as_object().unwrap();
    assert_eq!(families.len(), 5);
    for (family, want) in families {
        let template =
            std::fs::read_to_string(chat.join(format!("templates/{family}.jinja"))).unwrap();
        let model = dir.path().join(format!("{family}.gguf"));
        fixtures::chat_template_swap::with_chat_template(&base, &model, &template);
        let tok = LlamaTokenizer::load(&model, None).unwrap();
        for record in &records {
            let name = record.group.as_deref().unwrap();
            let kwargs: ChatKwargs =
                serde_json::from_value(expected["kwargs"][name].clone()).unwrap();
            let (text, special) = corpus::prepare::render(&tok, &record.content, &kwargs).unwrap();
            assert!(special && matches!(record.content, Content::Chat(_)));
            let jinja2 = want["conversations"][name].as_str().unwrap().replace(
                &format!("Current date: {fixed_date}"),
                &format!("Current date: {today}"),
            );
            assert_eq!(text, jinja2, "{family} / {name}");
            let ids = tok.tokenize(&text, special);
            assert_eq!(ids, tok.tokenize(&jinja2, true), "{family} / {name}");
            // The template's markers the vocabulary has as control tokens
            // are one id each, not their characters.
            let im_start = tok.tokenize("<|im_start|>", true);
            let markers = jinja2.matches("<|im_start|>").count();
            assert_eq!(im_start.len(), 1);
            assert_eq!(
                ids.iter().filter(|&&t| t == im_start[0]).count(),
                markers,
                "{family} / {name}"
            );
        }
    }
}
