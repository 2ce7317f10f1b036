//! The corpus side of the response phase: the prompts of the sources that
//! set `respond` (rendered with the model's chat template and its
//! generation prompt, or a text document's first `prefix_tokens` tokens),
//! the responses workers generated turned into stored responses (their
//! text as the vocabulary writes it, the perplexity filter), and the
//! records rebuilt from them, which then go through the same rendering,
//! tokenizing, dedup and split as any source.
//!
//! - `assistant`: a chat record is cut after its last user turn; the
//!   model's answer becomes the assistant turn after it.
//! - `every_turn`: every assistant turn is the model's answer to the
//!   conversation as written up to that user turn; the record keeps its
//!   other messages and takes the answers in place of the written ones.
//! - `continue`: a text record's first `prefix_tokens` tokens, then the
//!   model's continuation; the document's tokens are exactly those.

use super::chat::{Chat, ChatKwargs, Message, Role};
use super::error::CorpusError;
use super::source::{read_source, Content, Record};
use super::tokenizer::Tokenizer;
use config::respond::{RespondMode, RespondSettings};
use config::{Config, SourceConfig};
use numbers::respond::ResponsePartial;
use runfiles::respond::{prompt_sha256, PromptEntry, PromptFile, StoredResponse};
use std::collections::BTreeMap;

/// The prompt file of `config`'s responding sources, in domain, source and
/// record order; `model_sha256` is recorded in it.
pub fn prompts(
    config: &Config,
    tokenizer: &dyn Tokenizer,
    model_sha256: &str,
) -> Result<PromptFile, CorpusError> {
    let c = &config.corpus;
    let settings = c.respond_settings();
    let kwargs = settings
        .chat_template_kwargs
        .clone()
        .unwrap_or_else(|| c.chat_template_kwargs.clone());
    let mut prompts = Vec::new();
    for d in &c.domains {
        let group_key = d.group_key.as_deref().or(c.group_key.as_deref());
        for s in &d.sources {
            let Some(mode) = s.respond else { continue };
            let data = read_source(s, &config.resolve(&s.path), group_key)?;
            for rec in &data.records {
                let bad = |message: String| CorpusError::Record {
                    at: rec.at.clone(),
                    message,
                };
                if !rec.images.is_empty() {
                    return Err(bad(format!(
                        "respond = \"{}\" takes text and chat records only; this one has images",
                        mode.as_str()
                    )));
                }
                for (turn, tokens) in
                    record_prompts(rec, mode, &settings, tokenizer, &kwargs).map_err(bad)?
                {
                    prompts.push(PromptEntry {
                        source: source_name(s),
                        at: rec.at.clone(),
                        turn,
                        sha256: prompt_sha256(&tokens),
                        tokens,
                    });
                }
            }
        }
    }
    Ok(PromptFile {
        model_sha256: model_sha256.to_string(),
        prompts,
    })
}

/// How a source is named in prompts and stored responses: its path as the
/// config writes it.
pub fn source_name(s: &SourceConfig) -> String {
    s.path.display().to_string()
}

/// The (turn, token ids) of each prompt of one record.
fn record_prompts(
    rec: &Record,
    mode: RespondMode,
    settings: &RespondSettings,
    tokenizer: &dyn Tokenizer,
    kwargs: &ChatKwargs,
) -> Result<Vec<(u32, Vec<i32>)>, String> {
    match (mode, &rec.content) {
        (RespondMode::Continue, Content::Text(t)) => {
            let mut tokens = tokenizer.tokenize(t, false);
            tokens.truncate(settings.prefix_tokens as usize);
            if tokens.is_empty() {
                return Err("respond = \"continue\": the document has no tokens".into());
            }
            Ok(vec![(0, tokens)])
        }
        (RespondMode::Continue, Content::Chat(_)) => Err(
            "respond = \"continue\" continues text records; this one is a chat (use respond = \"assistant\")"
                .into(),
        ),
        (_, Content::Text(_)) => Err(format!(
            "respond = \"{}\" answers chat records; this one is text (use respond = \"continue\")",
            mode.as_str()
        )),
        (_, Content::Chat(chat)) => {
            let turns = user_turns(chat, mode);
            if turns.is_empty() {
                return Err(format!(
                    "respond = \"{}\": the conversation has no user turn to answer",
                    mode.as_str()
                ));
            }
            turns
                .into_iter()
                .map(|u| {
                    let cut = Chat {
                        messages: chat.messages[..=u].to_vec(),
                        tools: chat.tools.clone(),
                    };
                    let text = tokenizer.apply_chat_template_prompt(&cut, kwargs)?;
                    Ok(((u + 1) as u32, tokenizer.tokenize(&text, true)))
                })
                .collect()
        }
    }
}

/// Indices of the user turns the model answers: the last one, or each.
fn user_turns(chat: &Chat, mode: RespondMode) -> Vec<usize> {
    let mut users: Vec<usize> = chat
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::User)
        .map(|(i, _)| i)
        .collect();
    if mode != RespondMode::EveryTurn {
        users.drain(..users.len().saturating_sub(1));
    }
    users
}

/// The stored responses of `merged` (every prompt's, in prompt then sample
/// order): their text written by `tokenizer`, their settings and seed, and
/// those above `drop_ppl_quantile` of their source's perplexities marked
/// dropped.
pub fn stored(
    file: &PromptFile,
    merged: &ResponsePartial,
    settings: &RespondSettings,
    tokenizer: &dyn Tokenizer,
) -> Result<Vec<StoredResponse>, CorpusError> {
    let settings_json = serde_json::to_value(settings).unwrap_or_default();
    let mut out = Vec::with_capacity(merged.responses.len());
    for r in &merged.responses {
        let p = file.prompts.get(r.prompt as usize).ok_or_else(|| {
            CorpusError::Config(format!("response to unknown prompt {}", r.prompt))
        })?;
        let text = tokenizer
            .detokenize(&r.tokens)
            .map_err(|message| CorpusError::Record {
                at: p.at.clone(),
                message,
            })?;
        out.push(StoredResponse {
            source: p.source.clone(),
            at: p.at.clone(),
            turn: p.turn,
            sample: r.sample,
            prompt_sha256: p.sha256.clone(),
            model_sha256: file.model_sha256.clone(),
            settings: settings_json.clone(),
            seed: settings.seed,
            tokens: r.tokens.clone(),
            text,
            stopped_at_eog: r.stopped_at_eog,
            perplexity: r.perplexity(),
            dropped: false,
        });
    }
    if let Some(q) = settings.drop_ppl_quantile {
        drop_above_quantile(&mut out, q);
    }
    Ok(out)
}

/// Marks dropped, per source, the responses whose perplexity is above the
/// `q` quantile of that source's (the nearest rank at or above `q`).
fn drop_above_quantile(responses: &mut [StoredResponse], q: f64) {
    let mut by_source: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in responses.iter() {
        by_source
            .entry(r.source.clone())
            .or_default()
            .push(r.perplexity);
    }
    let limits: BTreeMap<String, f64> = by_source
        .into_iter()
        .map(|(s, mut v)| {
            v.sort_by(f64::total_cmp);
            let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
            (s, v[rank - 1])
        })
        .collect();
    for r in responses.iter_mut() {
        r.dropped = r.perplexity > limits[&r.source];
    }
}

/// The summary line of each responded source.
pub fn summary(responses: &[StoredResponse]) -> String {
    runfiles::respond::by_source(responses)
        .iter()
        .map(|(s, f)| {
            format!(
                "responses {s}: {} prompts, {} responses, {} tokens generated; {} stopped at \
                 end of generation, {} at max_tokens; {} dropped by the perplexity filter\n",
                f.prompts, f.responses, f.tokens, f.at_eog, f.at_max_tokens, f.dropped
            )
        })
        .collect()
}

/// The stored responses of one source, by (record location, turn), each
/// list in sample order.
pub type ResponseMap<'a> = BTreeMap<(&'a str, u32), Vec<&'a StoredResponse>>;

/// A rebuilt record, with the exact token ids of a continued document.
pub type Rebuilt = (Record, Option<Vec<i32>>);

/// The records `mode` makes of a source's `records` with its `responses`
/// (dropped ones left out): one record per response sample, each with the
/// record's group (its own location when it has none, so the samples are
/// held out together); `continue` records come with the exact token ids
/// of the document (its prefix, then the response).
pub fn apply(
    records: Vec<Record>,
    mode: RespondMode,
    responses: &ResponseMap<'_>,
    settings: &RespondSettings,
    tokenizer: &dyn Tokenizer,
) -> Result<Vec<Rebuilt>, CorpusError> {
    let mut out = Vec::new();
    for rec in records {
        let missing = |turn: u32| CorpusError::Record {
            at: rec.at.clone(),
            message: format!(
                "no stored response for turn {turn} (the response phase of `coordinator run` \
                 writes them under corpus/responses/)"
            ),
        };
        let group = Some(
            rec.group
                .clone()
                .unwrap_or_else(|| format!("doc:{}", rec.at)),
        );
        for sample in 0..settings.n {
            let pick = |turn: u32| -> Result<Option<&StoredResponse>, CorpusError> {
                let r = responses
                    .get(&(rec.at.as_str(), turn))
                    .and_then(|l| l.get(sample as usize))
                    .ok_or_else(|| missing(turn))?;
                Ok((!r.dropped).then_some(*r))
            };
            let made = match (&rec.content, mode) {
                (Content::Text(t), RespondMode::Continue) => pick(0)?.map(|r| {
                    let mut tokens = tokenizer.tokenize(t, false);
                    tokens.truncate(settings.prefix_tokens as usize);
                    let prefix = tokenizer.detokenize(&tokens).unwrap_or_default();
                    tokens.extend_from_slice(&r.tokens);
                    (Content::Text(prefix + &r.text), Some(tokens))
                }),
                (Content::Chat(chat), mode) => {
                    answered(chat, mode, &pick)?.map(|c| (Content::Chat(c), None))
                }
                (Content::Text(_), _) => None,
            };
            if let Some((content, tokens)) = made {
                let at = match settings.n {
                    1 => rec.at.clone(),
                    _ => format!("{} (response {})", rec.at, sample + 1),
                };
                let record = Record {
                    at,
                    content,
                    group: group.clone(),
                    images: Vec::new(),
                };
                out.push((record, tokens));
            }
        }
    }
    Ok(out)
}

/// The conversation with the model's answers: cut after the last user
/// turn with the answer after it (`assistant`), or every written assistant
/// turn replaced by the answer to the user turn before it, up to the last
/// answer (`every_turn`); `None` when an answer was dropped.
fn answered<'r>(
    chat: &Chat,
    mode: RespondMode,
    pick: &dyn Fn(u32) -> Result<Option<&'r StoredResponse>, CorpusError>,
) -> Result<Option<Chat>, CorpusError> {
    let turns = user_turns(chat, mode);
    let mut messages = Vec::new();
    let mut from = 0;
    for u in turns {
        messages.extend(
            chat.messages[from..=u]
                .iter()
                .filter(|m| mode == RespondMode::Assistant || m.role != Role::Assistant)
                .cloned(),
        );
        let Some(r) = pick((u + 1) as u32)? else {
            return Ok(None);
        };
        messages.push(Message::text(Role::Assistant, r.text.clone()));
        from = u + 1;
    }
    Ok(Some(Chat {
        messages,
        tools: chat.tools.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(source: &str, perplexity: f64) -> StoredResponse {
        StoredResponse {
            source: source.into(),
            at: format!("{source}:1"),
            turn: 1,
            sample: 0,
            prompt_sha256: String::new(),
            model_sha256: String::new(),
            settings: serde_json::Value::Null,
            seed: 0,
            tokens: vec![1, 2],
            text: "ab".into(),
            stopped_at_eog: perplexity < 3.0,
            perplexity,
            dropped: false,
        }
    }

    #[test]
    fn every_turn_prompts_each_user_turn_and_takes_every_answer() {
        use crate::tokenizer::ByteTokenizer;
        let m = |role, text: &str| Message::text(role, text);
        let chat = Chat {
            messages: vec![
                m(Role::System, "s"),
                m(Role::User, "q1"),
                m(Role::Assistant, "written1"),
                m(Role::User, "q2"),
                m(Role::Assistant, "written2"),
            ],
            tools: None,
        };
        let rec = Record {
            at: "c.jsonl:1".into(),
            content: Content::Chat(chat),
            group: None,
            images: Vec::new(),
        };
        let settings = RespondSettings::default();
        let kwargs = ChatKwargs::new();
        let prompts = record_prompts(
            &rec,
            RespondMode::EveryTurn,
            &settings,
            &ByteTokenizer,
            &kwargs,
        )
        .unwrap();
        let text = |ids: &[i32]| ByteTokenizer.detokenize(ids).unwrap();
        let got: Vec<(u32, String)> = prompts.iter().map(|(t, ids)| (*t, text(ids))).collect();
        assert_eq!(
            got,
            vec![
                (2, "<system>s\n<user>q1\n<assistant>".to_string()),
                (
                    4,
                    "<system>s\n<user>q1\n<assistant>written1\n<user>q2\n<assistant>".to_string()
                ),
            ]
        );
        let mut a1 = response("c.jsonl", 1.0);
        a1.text = "own1".into();
        a1.turn = 2;
        let mut a2 = a1.clone();
        a2.text = "own2".into();
        a2.turn = 4;
        let mut map = ResponseMap::new();
        map.insert(("c.jsonl:1", 2), vec![&a1]);
        map.insert(("c.jsonl:1", 4), vec![&a2]);
        let made = apply(
            vec![rec],
            RespondMode::EveryTurn,
            &map,
            &settings,
            &ByteTokenizer,
        )
        .unwrap();
        let Content::Chat(c) = &made[0].0.content else {
            panic!("a chat")
        };
        let turns: Vec<(Role, &str)> = c
            .messages
            .iter()
            .map(|m| (m.role, m.content.as_str()))
            .collect();
        assert_eq!(
            turns,
            vec![
                (Role::System, "s"),
                (Role::User, "q1"),
                (Role::Assistant, "own1"),
                (Role::User, "q2"),
                (Role::Assistant, "own2"),
            ]
        );
        assert_eq!(made[0].0.group.as_deref(), Some("doc:c.jsonl:1"));
    }

    #[test]
    fn the_filter_drops_above_each_sources_quantile_and_the_summary_counts_it() {
        let mut rs: Vec<StoredResponse> = [4.0, 1.0, 3.0, 2.0]
            .iter()
            .map(|&p| response("a", p))
            .chain([response("b", 10.0)])
            .collect();
        drop_above_quantile(&mut rs, 0.5);
        let dropped: Vec<(String, f64)> = rs
            .iter()
            .filter(|r| r.dropped)
            .map(|r| (r.source.clone(), r.perplexity))
            .collect();
        // Source a's median is 2: 3 and 4 go; b's only response is its own quantile.
        assert_eq!(dropped, vec![("a".into(), 4.0), ("a".into(), 3.0)]);
        let s = summary(&rs);
        assert!(
            s.contains("responses a: 4 prompts, 4 responses, 8 tokens generated; 2 stopped at end of generation, 2 at max_tokens; 2 dropped"),
            "{s}"
        );
    }
}
