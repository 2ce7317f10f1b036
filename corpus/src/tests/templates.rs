//! The families' chat templates (`tests/fixtures/chat/make.py`: Qwen3,
//! DeepSeek-V3.1, GLM-4.5's, gpt-oss, Llama 4, as published) render each
//! conversation (written by Python's json: a system prompt, tool
//! definitions, tool calls with `content: null`, a tool answer, the
//! developer role, reasoning) to exactly the text Python's Jinja2 renders,
//! set up as Hugging Face's `apply_chat_template` sets it up, from the
//! messages as llama-server prepares them; and the probes find what
//! llama.cpp's chat engine finds each template supports.

use crate::chat::{Chat, ChatKwargs};
use crate::source::{read_source, Content};
use crate::template::{Caps, ChatTemplate};
use config::SourceConfig;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat")
}

/// The fixture conversations by name (their `name` field read as the
/// group key), read as a chat source.
fn conversations() -> Vec<(String, Chat)> {
    let path = fixtures().join("conversations.jsonl");
    let cfg = SourceConfig {
        path: path.clone(),
        ..SourceConfig::default()
    };
    read_source(&cfg, &path, Some("name"))
        .unwrap()
        .records
        .into_iter()
        .map(|r| match r.content {
            Content::Chat(c) => (r.group.unwrap(), c),
            Content::Text(_) => panic!("{} is not chat", r.at),
        })
        .collect()
}

#[test]
fn every_familys_template_renders_what_jinja2_renders() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap())
            .unwrap();
    let now = chrono::DateTime::parse_from_rfc3339(expected["now"].as_str().unwrap())
        .unwrap()
        .to_utc();
    let (bos, eos) = (
        expected["bos_token"].as_str().unwrap(),
        expected["eos_token"].as_str().unwrap(),
    );
    let conversations = conversations();
    let families = expected["renders"].as_object().unwrap();
    assert_eq!(
        families.len(),
        5,
        "Qwen3, DeepSeek-V3, GLM-4.5, gpt-oss, Llama 4"
    );
    let mut mismatches = Vec::new();
    for (family, want) in families {
        let source =
            std::fs::read_to_string(fixtures().join(format!("templates/{family}.jinja"))).unwrap();
        let template = ChatTemplate::new(&source, bos, eos, now).unwrap();
        let caps = &want["caps"];
        let flag = |k: &str| caps[k].as_bool().unwrap();
        assert_eq!(
            template.caps(),
            Caps {
                system_role: flag("system_role"),
                tool_calls: flag("tool_calls"),
                object_arguments: flag("object_arguments"),
                developer_role: flag("developer_role"),
            },
            "{family}"
        );
        for (name, chat) in &conversations {
            let kwargs: ChatKwargs =
                serde_json::from_value(expected["kwargs"][name].clone()).unwrap();
            let got = template.render(chat, &kwargs).unwrap();
            let want = want["conversations"][name].as_str().unwrap();
            if got != want {
                mismatches.push(format!(
                    "{family} / {name}:\n--- ours\n{got}\n--- jinja2\n{want}\n"
                ));
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
