//! The response phase's settings: which sources the base model writes
//! (`respond` on a source) and how it generates (`[corpus.respond]`), so
//! the model is calibrated on its own answers rather than on text written
//! by others (Williams et al., NAACL 2025; Ji et al., ICLR 2025).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the base model writes for a source's records (`respond` on a source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RespondMode {
    /// Chat records: the conversation is cut after its last user turn and
    /// the model writes the assistant turn that follows.
    Assistant,
    /// Chat records: the model writes the assistant turn after each user
    /// turn, every earlier assistant turn being its own answer.
    EveryTurn,
    /// Text records: the first `prefix_tokens` tokens of each document are
    /// kept and the model continues them (Ji et al.'s self-generation).
    Continue,
}

impl RespondMode {
    /// The mode's name as the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            RespondMode::Assistant => "assistant",
            RespondMode::EveryTurn => "every_turn",
            RespondMode::Continue => "continue",
        }
    }
}

/// `[corpus.respond]`: how the base model generates the text of the
/// sources that set `respond`. Every key is part of each stored response's
/// settings: a change regenerates the responses (saying so).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RespondSettings {
    /// Most tokens generated per response; a response stops earlier at one
    /// of the model's end-of-generation tokens.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Sampling temperature; 0 is greedy (the most likely token, the first
    /// of equal ones).
    #[serde(default)]
    pub temperature: f64,
    /// Nucleus sampling: the smallest set of most likely tokens whose
    /// probabilities reach this much (1: all); ignored when greedy.
    #[serde(default = "default_top_p")]
    pub top_p: f64,
    /// Seed of sampling: each response's sampler is seeded from it, its
    /// prompt's SHA-256 and its sample number only, never from the worker
    /// or the lease.
    #[serde(default)]
    pub seed: u64,
    /// Responses written per prompt (each its own document).
    #[serde(default = "default_n")]
    pub n: u32,
    /// `respond = "continue"`: tokens of each document kept as the prompt.
    #[serde(default = "default_prefix_tokens")]
    pub prefix_tokens: u32,
    /// Prompts per lease; a worker decodes every sequence of a lease (its
    /// prompts times `n`) together, many per `llama_decode`.
    #[serde(default = "default_lease_prompts")]
    pub lease_prompts: u32,
    /// Variables the chat template gets when it renders the prompts
    /// (`{ enable_thinking = false }`); default: `[corpus]
    /// chat_template_kwargs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<BTreeMap<String, serde_json::Value>>,
    /// Drop the responses whose perplexity under the base model is above
    /// this quantile of their source's (0..1); absent: keep every response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_ppl_quantile: Option<f64>,
}

/// The most sequences one lease may decode together (llama.cpp's
/// `LLAMA_MAX_SEQ`).
pub const MAX_SEQUENCES: u32 = 256;

fn default_max_tokens() -> u32 {
    256
}

fn default_top_p() -> f64 {
    1.0
}

fn default_n() -> u32 {
    1
}

fn default_prefix_tokens() -> u32 {
    32
}

fn default_lease_prompts() -> u32 {
    16
}

impl Default for RespondSettings {
    fn default() -> Self {
        RespondSettings {
            max_tokens: default_max_tokens(),
            temperature: 0.0,
            top_p: default_top_p(),
            seed: 0,
            n: default_n(),
            prefix_tokens: default_prefix_tokens(),
            lease_prompts: default_lease_prompts(),
            chat_template_kwargs: None,
            drop_ppl_quantile: None,
        }
    }
}

impl RespondSettings {
    /// Refuses settings no generation can run with, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |key: &str, why: String| Err(format!("[corpus.respond] {key}: {why}"));
        if self.max_tokens == 0 {
            return bad("max_tokens", "must be at least 1".into());
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(
                "temperature",
                format!("{} is not a number >= 0", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} is not in (0, 1]", self.top_p));
        }
        if self.n == 0 {
            return bad("n", "must be at least 1".into());
        }
        if self.prefix_tokens == 0 {
            return bad("prefix_tokens", "must be at least 1".into());
        }
        if self.lease_prompts == 0 {
            return bad("lease_prompts", "must be at least 1".into());
        }
        if u64::from(self.lease_prompts) * u64::from(self.n) > u64::from(MAX_SEQUENCES) {
            return bad(
                "lease_prompts",
                format!(
                    "{} prompts of n = {} responses each make more sequences than the {MAX_SEQUENCES} \
                     llama.cpp decodes together",
                    self.lease_prompts, self.n
                ),
            );
        }
        if let Some(q) = self.drop_ppl_quantile {
            if !(q > 0.0 && q < 1.0) {
                return bad("drop_ppl_quantile", format!("{q} is not in (0, 1)"));
            }
        }
        Ok(())
    }

    /// Whether sampling is greedy.
    pub fn greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bad_key_is_named() {
        type Spoil = fn(&mut RespondSettings);
        let cases: [(Spoil, &str); 7] = [
            (|s| s.lease_prompts = 300, "lease_prompts"),
            (|s| s.max_tokens = 0, "max_tokens"),
            (|s| s.temperature = -0.1, "temperature"),
            (|s| s.top_p = 0.0, "top_p"),
            (|s| s.n = 0, "n:"),
            (|s| s.prefix_tokens = 0, "prefix_tokens"),
            (|s| s.drop_ppl_quantile = Some(1.0), "drop_ppl_quantile"),
        ];
        for (spoil, key) in cases {
            let mut s = RespondSettings::default();
            assert_eq!(s.validate(), Ok(()));
            spoil(&mut s);
            let err = s.validate().unwrap_err();
            assert!(err.contains(key), "{err}");
        }
    }
}
