//! The result of a response lease: the token ids the base model generated
//! for a range of prompts (the response phase's units are prompts, counted
//! like chunks), with how each stopped and its negative log-likelihood
//! under the model, for the perplexity filter. Merges are concatenations of
//! disjoint prompt ranges, so a run's responses are the same however the
//! leases were grouped.

use crate::split::{coalesce, ChunkRange};
use serde::{Deserialize, Serialize};

/// Format version of [`ResponsePartial`]'s encoding.
pub const RESPONSE_FORMAT_VERSION: u32 = 1;

/// The most bytes an encoded response partial may hold (256 MiB).
pub const MAX_RESPONSE_PARTIAL_BYTES: usize = 256 << 20;

/// Why two response partials do not merge.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ResponseMergeError(pub String);

/// One generated response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// Index of its prompt in the run's prompt list.
    pub prompt: u32,
    /// Which of the prompt's `n` responses it is (0-based).
    pub sample: u32,
    /// The generated token ids, without the end-of-generation token.
    pub tokens: Vec<i32>,
    /// It stopped at an end-of-generation token (else at `max_tokens`).
    pub stopped_at_eog: bool,
    /// Sum over the generated tokens (the end-of-generation one included)
    /// of `-ln p(token)` under the model at temperature 1.
    pub nll: f64,
}

impl Response {
    /// Tokens scored in [`Response::nll`] (the end-of-generation token counts).
    pub fn scored(&self) -> usize {
        self.tokens.len() + usize::from(self.stopped_at_eog)
    }

    /// Perplexity of the response under the model (1 for an empty one).
    pub fn perplexity(&self) -> f64 {
        match self.scored() {
            0 => 1.0,
            n => (self.nll / n as f64).exp(),
        }
    }
}

/// The responses of one or more disjoint prompt ranges.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResponsePartial {
    /// [`RESPONSE_FORMAT_VERSION`].
    pub version: u32,
    /// The prompt ranges covered, sorted, disjoint, adjacent ones joined.
    pub chunks: Vec<ChunkRange>,
    /// Every response of those prompts, sorted by (prompt, sample).
    pub responses: Vec<Response>,
}

impl ResponsePartial {
    /// The responses of the prompts `range`.
    pub fn new(range: ChunkRange, mut responses: Vec<Response>) -> ResponsePartial {
        responses.sort_by_key(|r| (r.prompt, r.sample));
        ResponsePartial {
            version: RESPONSE_FORMAT_VERSION,
            chunks: coalesce(&[range]).unwrap_or_default(),
            responses,
        }
    }

    /// Bincode encoding (standard config).
    pub fn to_bytes(&self) -> Vec<u8> {
        bincode::serde::encode_to_vec(self, bincode::config::standard())
            .expect("response partial encodes")
    }

    /// Decodes at most [`MAX_RESPONSE_PARTIAL_BYTES`] under a limit sized
    /// from the input ([`crate::bounded`]), no trailing bytes, this
    /// build's format version.
    pub fn from_bytes(bytes: &[u8]) -> Result<ResponsePartial, String> {
        if bytes.len() > MAX_RESPONSE_PARTIAL_BYTES {
            return Err(format!(
                "{} bytes exceed the limit of {MAX_RESPONSE_PARTIAL_BYTES}",
                bytes.len()
            ));
        }
        let p: ResponsePartial = crate::bounded::decode(bytes)
            .map_err(|e| format!("not a moe-census response partial: {e}"))?;
        if p.version != RESPONSE_FORMAT_VERSION {
            return Err(format!(
                "response partial format {} is not this build's {RESPONSE_FORMAT_VERSION}",
                p.version
            ));
        }
        Ok(p)
    }

    /// Adds the responses of other, disjoint prompts.
    pub fn merge(&mut self, other: &ResponsePartial) -> Result<(), ResponseMergeError> {
        let mut all = self.chunks.clone();
        all.extend_from_slice(&other.chunks);
        self.chunks = coalesce(&all)
            .map_err(|c| ResponseMergeError(format!("prompt {c} is covered by both results")))?;
        self.responses.extend(other.responses.iter().cloned());
        self.responses.sort_by_key(|r| (r.prompt, r.sample));
        Ok(())
    }

    /// Whether another worker's responses of the same prompts are the same
    /// (generation on one backend is deterministic); names the first
    /// difference.
    pub fn agree(&self, other: &ResponsePartial) -> Result<(), String> {
        if self.chunks != other.chunks || self.responses.len() != other.responses.len() {
            return Err("the two results cover other prompts or counts of responses".into());
        }
        match self
            .responses
            .iter()
            .zip(&other.responses)
            .find(|(a, b)| a != b)
        {
            None => Ok(()),
            Some((a, _)) => Err(format!(
                "prompt {} response {} differs between the two workers",
                a.prompt, a.sample
            )),
        }
    }

    /// Tokens generated, for progress and per-worker figures.
    pub fn generated(&self) -> u64 {
        self.responses.iter().map(|r| r.tokens.len() as u64).sum()
    }

    /// Checks the responses against what the coordinator asked for: `n`
    /// responses of every prompt of the ranges, in order, each at most
    /// `max_tokens` tokens of ids below `n_vocab`, a finite non-negative
    /// NLL, and one that stopped short of `max_tokens` stopped at an
    /// end-of-generation token.
    pub fn check(&self, n: u32, max_tokens: u32, n_vocab: u32) -> Result<(), String> {
        let mut want = self
            .chunks
            .iter()
            .flat_map(|r| r.start..r.end)
            .flat_map(|p| (0..n).map(move |s| (p, s)));
        for r in &self.responses {
            if want.next() != Some((r.prompt, r.sample)) {
                return Err(format!(
                    "response {} of prompt {} is not the next one expected",
                    r.sample, r.prompt
                ));
            }
            if r.tokens.len() > max_tokens as usize {
                return Err(format!(
                    "prompt {}: {} tokens, more than max_tokens {max_tokens}",
                    r.prompt,
                    r.tokens.len()
                ));
            }
            if r.tokens.len() < max_tokens as usize && !r.stopped_at_eog {
                return Err(format!(
                    "prompt {}: {} tokens, short of max_tokens without an end-of-generation token",
                    r.prompt,
                    r.tokens.len()
                ));
            }
            if let Some(t) = r.tokens.iter().find(|&&t| t < 0 || t as u32 >= n_vocab) {
                return Err(format!(
                    "prompt {}: token id {t} is outside the vocabulary of {n_vocab}",
                    r.prompt
                ));
            }
            if !(r.nll.is_finite() && r.nll >= 0.0) {
                return Err(format!("prompt {}: NLL {} is not >= 0", r.prompt, r.nll));
            }
        }
        match want.next() {
            None => Ok(()),
            Some((p, s)) => Err(format!("response {s} of prompt {p} is missing")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(prompt: u32, sample: u32, tokens: Vec<i32>, eog: bool) -> Response {
        Response {
            prompt,
            sample,
            tokens,
            stopped_at_eog: eog,
            nll: 1.5,
        }
    }

    #[test]
    fn merge_order_does_not_matter_and_checks_hold() {
        let a = ResponsePartial::new(
            ChunkRange { start: 0, end: 2 },
            vec![resp(1, 0, vec![5, 6], false), resp(0, 0, vec![1], true)],
        );
        let b = ResponsePartial::new(
            ChunkRange { start: 2, end: 3 },
            vec![resp(2, 0, vec![7, 7], false)],
        );
        let (mut ab, mut ba) = (a.clone(), b.clone());
        ab.merge(&b).unwrap();
        ba.merge(&a).unwrap();
        assert_eq!(ab, ba);
        assert_eq!(ab.to_bytes(), ba.to_bytes());
        assert_eq!(ab.chunks, vec![ChunkRange { start: 0, end: 3 }]);
        ab.check(1, 2, 8).unwrap();
        assert!(ab.merge(&a).unwrap_err().0.contains("covered by both"));
        let back = ResponsePartial::from_bytes(&ba.to_bytes()).unwrap();
        assert_eq!(back, ba);
    }

    #[test]
    fn check_refuses_what_was_not_asked() {
        let r = |rs| ResponsePartial::new(ChunkRange { start: 0, end: 1 }, rs);
        let long = r(vec![resp(0, 0, vec![1, 2, 3], false)]);
        assert!(long.check(1, 2, 8).unwrap_err().contains("max_tokens"));
        let short = r(vec![resp(0, 0, vec![1], false)]);
        assert!(short.check(1, 2, 8).unwrap_err().contains("short"));
        let vocab = r(vec![resp(0, 0, vec![9], true)]);
        assert!(vocab.check(1, 2, 8).unwrap_err().contains("vocabulary"));
        let missing = r(vec![resp(0, 0, vec![1], true)]);
        assert!(missing.check(2, 2, 8).unwrap_err().contains("missing"));
        let extra = r(vec![resp(0, 0, vec![1], true), resp(0, 1, vec![1], true)]);
        assert!(extra.check(1, 2, 8).unwrap_err().contains("not the next"));
        let mut garbage = long.to_bytes();
        garbage.push(0);
        assert!(ResponsePartial::from_bytes(&garbage).is_err());
    }
}
