//! The response phase's files under `corpus/responses/`: the prompts the
//! coordinator rendered (which workers read, by index), and the stored
//! responses, one JSON line each with its source record, prompt hash, model
//! SHA-256, settings and seed, from which the corpus is built.

use serde::{Deserialize, Serialize};

/// Directory of the response phase's objects (its lease results are under
/// [`crate::layout::RESPONSE_PARTIALS`]).
pub const RESPONSES_DIR: &str = "corpus/responses";
/// The rendered prompts ([`PromptFile`]).
pub const PROMPTS_FILE: &str = "corpus/responses/prompts.json";
/// The stored responses ([`StoredResponse`], one JSON line each).
pub const RESPONSES_FILE: &str = "corpus/responses/responses.jsonl";

/// The most bytes [`read_prompts`] and [`read_responses`] read (1 GiB).
pub const MAX_FILE_BYTES: usize = 1 << 30;

/// One prompt: a record's conversation cut before the turn the model
/// writes, rendered with the chat template's generation prompt, or a text
/// document's first tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptEntry {
    /// The source's path as the config names it.
    pub source: String,
    /// The record's location (`path:LINE`).
    pub at: String,
    /// Which turn the model writes: the number of messages kept before it
    /// (chat), or 0 (`continue`).
    pub turn: u32,
    /// SHA-256 of the prompt's token ids (little-endian i32): its identity,
    /// from which its samplers are seeded.
    pub sha256: String,
    /// The prompt's token ids.
    pub tokens: Vec<i32>,
}

/// `corpus/responses/prompts.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptFile {
    /// SHA-256 of the model whose template and tokenizer made them.
    pub model_sha256: String,
    /// The prompts, in source and record order; leases name index ranges.
    pub prompts: Vec<PromptEntry>,
}

/// SHA-256 of a prompt's token ids, little-endian i32 each.
pub fn prompt_sha256(tokens: &[i32]) -> String {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    gguf::hash::sha256_hex(&bytes)
}

/// One stored response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The source's path as the config names it.
    pub source: String,
    /// The record's location.
    pub at: String,
    /// The turn the model wrote ([`PromptEntry::turn`]).
    pub turn: u32,
    /// Which of the prompt's responses (0-based).
    pub sample: u32,
    /// SHA-256 of the prompt ([`prompt_sha256`]).
    pub prompt_sha256: String,
    /// SHA-256 of the model that wrote it.
    pub model_sha256: String,
    /// `[corpus.respond]` as it was (sampling, lengths).
    pub settings: serde_json::Value,
    /// The run's sampling seed (`[corpus.respond] seed`); the sampler was
    /// seeded from it, the prompt's SHA-256 and the sample number.
    pub seed: u64,
    /// The generated token ids.
    pub tokens: Vec<i32>,
    /// Their text, as the model's vocabulary writes them.
    pub text: String,
    /// It stopped at an end-of-generation token (else at `max_tokens`).
    pub stopped_at_eog: bool,
    /// Perplexity under the base model (temperature 1).
    pub perplexity: f64,
    /// Dropped by the perplexity filter (`drop_ppl_quantile`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropped: bool,
}

/// Reads `prompts.json` bytes (at most [`MAX_FILE_BYTES`]).
pub fn read_prompts(bytes: &[u8]) -> Result<PromptFile, String> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(format!("{} bytes exceed {MAX_FILE_BYTES}", bytes.len()));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("not a prompt file: {e}"))
}

/// What a source's responses were: the corpus summary's and the report's
/// figures per source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceFigures {
    /// Distinct prompts.
    pub prompts: u64,
    /// Responses.
    pub responses: u64,
    /// Tokens generated.
    pub tokens: u64,
    /// Responses that stopped at an end-of-generation token.
    pub at_eog: u64,
    /// Responses that stopped at `max_tokens`.
    pub at_max_tokens: u64,
    /// Responses the perplexity filter dropped.
    pub dropped: u64,
}

/// [`SourceFigures`] of each source of `responses`, by source.
pub fn by_source(responses: &[StoredResponse]) -> std::collections::BTreeMap<&str, SourceFigures> {
    let mut out: std::collections::BTreeMap<&str, SourceFigures> = Default::default();
    for r in responses {
        let f = out.entry(r.source.as_str()).or_default();
        f.prompts += u64::from(r.sample == 0);
        f.responses += 1;
        f.tokens += r.tokens.len() as u64;
        f.at_eog += u64::from(r.stopped_at_eog);
        f.at_max_tokens += u64::from(!r.stopped_at_eog);
        f.dropped += u64::from(r.dropped);
    }
    out
}

/// The bytes of `responses.jsonl`: one line per response, in order.
pub fn responses_jsonl(responses: &[StoredResponse]) -> String {
    responses
        .iter()
        .map(|r| serde_json::to_string(r).expect("a response encodes") + "\n")
        .collect()
}

/// Reads `responses.jsonl` bytes (at most [`MAX_FILE_BYTES`]).
pub fn read_responses(bytes: &[u8]) -> Result<Vec<StoredResponse>, String> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(format!("{} bytes exceed {MAX_FILE_BYTES}", bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_round_trip_and_prompt_hashes_differ() {
        let r = StoredResponse {
            source: "chat.jsonl".into(),
            at: "chat.jsonl:3".into(),
            turn: 1,
            sample: 0,
            prompt_sha256: prompt_sha256(&[1, 2]),
            model_sha256: "m".into(),
            settings: serde_json::json!({"max_tokens": 4}),
            seed: 3,
            tokens: vec![5, 6],
            text: "héllo\n\"".into(),
            stopped_at_eog: true,
            perplexity: 2.5,
            dropped: false,
        };
        let bytes = responses_jsonl(&[r.clone(), r.clone()]);
        assert_eq!(
            read_responses(bytes.as_bytes()).unwrap(),
            vec![r.clone(), r]
        );
        assert_ne!(prompt_sha256(&[1, 2]), prompt_sha256(&[2, 1]));
        assert!(read_responses(b"{").unwrap_err().contains("line 1"));
    }
}
