//! Corpus tests on the generated `tiny` GGUF model: its byte-level BPE
//! vocabulary with merged Japanese pieces, ChatML special tokens and chat
//! template, loaded through llama.cpp.

use super::*;
use crate::tokenizer::LlamaTokenizer;
use std::collections::HashMap;
use synth::{write_model, Preset};

/// A fixture whose `model.gguf` is the generated tiny model.
fn tiny_fixture() -> (Fixture, LlamaTokenizer) {
    let f = Fixture::new();
    let model = f.dir.path().join("model.gguf");
    write_model(Preset::Tiny, 1, &model).unwrap();
    let tok = LlamaTokenizer::load(&model, None).unwrap();
    (f, tok)
}

/// Re-tokenizes every source record of the fixture with llama.cpp's
/// tokenizer directly (the llama crate's, itself checked against
/// llama-cpp-2 in tests/tests/llama_vocab_oracle.rs), splitting documents
/// and rendering chat records as ChatML by hand: `at` -> token ids.
fn independent_tokens(f: &Fixture) -> HashMap<String, Vec<i32>> {
    let model = ::llama::Model::load_vocab(&f.dir.path().join("model.gguf")).unwrap();
    let tok = |text: &str, special: bool| -> Vec<i32> { model.tokenize(text, true, special) };
    // Documents are located by the source path as the config names it.
    let mut out = HashMap::new();
    let path = |n: &str| f.dir.path().join(n);
    for (i, line) in std::fs::read_to_string(path("en.jsonl"))
        .unwrap()
        .lines()
        .enumerate()
    {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        out.insert(
            format!("en.jsonl:{}", i + 1),
            tok(v["text"].as_str().unwrap(), false),
        );
    }
    let ja = std::fs::read_to_string(path("ja.txt")).unwrap();
    for (i, doc) in ja
        .split("\n\n")
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .enumerate()
    {
        out.insert(format!("ja.txt (document {})", i + 1), tok(doc, false));
    }
    for (i, line) in std::fs::read_to_string(path("chat.jsonl"))
        .unwrap()
        .lines()
        .enumerate()
    {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let chatml: String = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                format!(
                    "<|im_start|>{}\n{}<|im_end|>\n",
                    m["role"].as_str().unwrap(),
                    m["content"].as_str().unwrap()
                )
            })
            .collect();
        out.insert(format!("chat.jsonl:{}", i + 1), tok(&chatml, true));
    }
    out
}

fn histogram<'a>(tokens: impl Iterator<Item = &'a i32>) -> BTreeMap<i32, u64> {
    let mut h = BTreeMap::new();
    for &t in tokens {
        *h.entry(t).or_default() += 1;
    }
    h
}

#[test]
fn tiny_model_token_counts_equal_an_independent_retokenization() {
    let (f, tok) = tiny_fixture();
    let targets = f.measured_targets("model.gguf", &tok);
    let p = prepare(&f.config("model.gguf", targets), &tok, "m").unwrap();
    check_invariants(&p);
    let expected = independent_tokens(&f);
    assert_eq!(p.documents.len(), expected.len());
    for d in &p.documents {
        assert_eq!(d.tokens, expected[&d.at].len() as u64, "{}", d.at);
    }
    let chunk_hist = histogram(p.chunks.iter().flat_map(|c| &c.tokens));
    let doc_hist = histogram(expected.values().flatten());
    assert_eq!(
        chunk_hist, doc_hist,
        "the chunks hold exactly the re-tokenized documents"
    );

    // Chat markup became ChatML control tokens, three messages per record.
    let im_start = tok.tokenize("<|im_start|>", true);
    assert_eq!(im_start.len(), 1, "{im_start:?}");
    assert_eq!(chunk_hist[&im_start[0]], 24 * 3);
    let info = tok.info();
    assert!(
        !info.add_bos && info.chat_template_sha256.is_some() && info.n_vocab > 256,
        "{info:?}"
    );
}

#[test]
fn tiny_model_shares_are_in_tokens_not_characters() {
    let (f, tok) = tiny_fixture();
    let targets = f.measured_targets("model.gguf", &tok);
    let p = prepare(&f.config("model.gguf", targets), &tok, "m").unwrap();
    let ja = &p.manifest.domains[1].shares;
    assert_eq!(ja.domain, "japanese");
    assert!((ja.token_share - ja.char_share).abs() > 0.05, "{ja:?}");
    // Targets set to the character shares miss, and say so in the table.
    let chars: Vec<f64> = p
        .manifest
        .domains
        .iter()
        .map(|d| d.shares.char_share)
        .collect();
    let err = prepare(
        &f.config(
            "model.gguf",
            [chars[0], chars[1], 1.0 - chars[0] - chars[1]],
        ),
        &tok,
        "m",
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("japanese") && msg.contains("MISS"), "{msg}");
}

#[test]
fn tiny_model_splits_by_group_and_drops_an_inserted_near_duplicate() {
    let (f, tok) = tiny_fixture();
    let targets = f.measured_targets("model.gguf", &tok);
    let config = f.config("model.gguf", targets);
    inserted_near_duplicate_is_dropped(&f, &config, &tok);
}

#[tokio::test]
async fn tiny_model_run_is_stored_reused_and_protected() {
    let (f, tok) = tiny_fixture();
    let targets = f.measured_targets("model.gguf", &tok);
    drop(tok);
    let config = f.config("model.gguf", targets);
    let store = f.store("run");
    let first = prepare_run(&config, &store, false).await.unwrap();
    assert!(!first.reused);
    assert_eq!(
        first.manifest.model_sha256,
        sha256_file(&f.dir.path().join("model.gguf")).unwrap()
    );
    let chunks = read_chunks(store.child("corpus").get(CHUNKS_FILE).await.unwrap(), None).unwrap();
    assert_eq!(
        chunks.iter().map(|c| c.tokens.len() as u64).sum::<u64>(),
        first.manifest.chunk_plan.n_tokens
    );
    assert!(prepare_run(&config, &store, false).await.unwrap().reused);
    // Another model is another input.
    write_model(Preset::Tiny, 2, &f.dir.path().join("model.gguf")).unwrap();
    let err = prepare_run(&config, &store, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("--force"), "{err}");
}
