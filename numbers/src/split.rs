//! Ids and small enums shared by every crate: splits, gating, chunk and layer ids.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Which side of the leak-free split a token belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Calibration data the keep maps are fitted on.
    Fit,
    /// Held-out data for honest replay and evaluation.
    Heldout,
}

impl Split {
    /// Both splits, in report order.
    pub const ALL: [Split; 2] = [Split::Fit, Split::Heldout];

    /// The name used in files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Fit => "fit",
            Split::Heldout => "heldout",
        }
    }

    /// Compact code used in Parquet columns.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Inverse of [`Split::code`].
    pub fn from_code(code: u8) -> Option<Split> {
        match code {
            0 => Some(Split::Fit),
            1 => Some(Split::Heldout),
            _ => None,
        }
    }

    /// Parses `fit` / `heldout`.
    pub fn parse(s: &str) -> Option<Split> {
        match s {
            "fit" => Some(Split::Fit),
            "heldout" => Some(Split::Heldout),
            _ => None,
        }
    }
}

/// Which splits a stage scores: `fit`, `heldout` or `both`, as configs
/// (`[eval] split`) and command lines write it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Splits {
    /// The fit split only.
    Fit,
    /// The held-out split only.
    Heldout,
    /// Both, fit first.
    #[default]
    Both,
}

impl Splits {
    /// The splits it names, in report order.
    pub fn splits(self) -> Vec<Split> {
        match self {
            Splits::Fit => vec![Split::Fit],
            Splits::Heldout => vec![Split::Heldout],
            Splits::Both => Split::ALL.to_vec(),
        }
    }

    /// Parses `fit`, `heldout` or `both`; the error says what is expected.
    pub fn parse(s: &str) -> Result<Splits, String> {
        match s {
            "both" => Ok(Splits::Both),
            other => match Split::parse(other) {
                Some(Split::Fit) => Ok(Splits::Fit),
                Some(Split::Heldout) => Ok(Splits::Heldout),
                None => Err(format!("{other:?}: expected fit, heldout or both")),
            },
        }
    }
}

impl fmt::Display for Splits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Splits::Fit => "fit",
            Splits::Heldout => "heldout",
            Splits::Both => "both",
        })
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a position of the model's input is: a text token, or one of an
/// image's positions (the mmproj's embeddings).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Modality {
    /// A text token.
    #[default]
    Text,
    /// A position of an image.
    Image,
}

impl Modality {
    /// Both modalities, in report order.
    pub const ALL: [Modality; 2] = [Modality::Text, Modality::Image];

    /// The name used in files and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Modality::Text => "text",
            Modality::Image => "image",
        }
    }
}

impl fmt::Display for Modality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the router turns logits into expert probabilities, as llama.cpp's
/// graph computes them (the op of `ffn_moe_probs`). The probability of an
/// expert is what `prob_sum` adds and the trace's `topn_prob` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gating {
    /// Softmax over all experts: probabilities of a token sum to 1.
    Softmax,
    /// Independent sigmoid per expert: each probability in [0, 1].
    Sigmoid,
    /// The gate weights are a softmax over the selected experts' logits
    /// only (gpt-oss: `ffn_moe_probs` holds logits). The probability of an
    /// expert is then the softmax of its logit over all experts, which the
    /// worker computes from the logits: it ranks experts as the logits do,
    /// sums to 1 per token, and the gate weights are these probabilities
    /// renormalised over the selected experts.
    SoftmaxWeight,
    /// `sqrt(softplus(logit))` per expert: each value at least 0.
    SqrtSoftplus,
}

impl Gating {
    /// Whether `sum(prob) == 1` per token holds, so `verify` can assert it.
    pub fn probabilities_sum_to_one(self) -> bool {
        matches!(self, Gating::Softmax | Gating::SoftmaxWeight)
    }

    /// The range every per-token value lies in, when the gating bounds it.
    pub fn value_range(self) -> (f64, f64) {
        match self {
            Gating::Softmax | Gating::SoftmaxWeight | Gating::Sigmoid => (0.0, 1.0),
            Gating::SqrtSoftplus => (0.0, f64::INFINITY),
        }
    }

    /// What a probability means under this gating, in words (check texts,
    /// trace metadata).
    pub fn describe(self) -> &'static str {
        match self {
            Gating::Softmax => "softmax over all experts",
            Gating::Sigmoid => "sigmoid per expert",
            Gating::SoftmaxWeight => {
                "softmax of the logits over all experts (gate weights: softmax over the selected)"
            }
            Gating::SqrtSoftplus => "sqrt(softplus(logit)) per expert",
        }
    }
}

/// Index of a chunk in the tokenized corpus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChunkId(pub u32);

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A half-open range of chunk ids, written `A..B` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChunkRange {
    /// First chunk id.
    pub start: u32,
    /// One past the last chunk id.
    pub end: u32,
}

impl ChunkRange {
    /// Whether chunk `id` is in the range.
    pub fn contains(&self, id: u32) -> bool {
        (self.start..self.end).contains(&id)
    }

    /// Parses `A..B` (half-open) or `A..=B` (inclusive).
    pub fn parse(s: &str) -> Result<ChunkRange, String> {
        let bad = || format!("chunk range {s:?} is not of the form A..B or A..=B");
        let (a, b, inclusive) = if let Some((a, b)) = s.split_once("..=") {
            (a, b, true)
        } else if let Some((a, b)) = s.split_once("..") {
            (a, b, false)
        } else {
            return Err(bad());
        };
        let start: u32 = a.trim().parse().map_err(|_| bad())?;
        let mut end: u32 = b.trim().parse().map_err(|_| bad())?;
        if inclusive {
            end = end.checked_add(1).ok_or_else(bad)?;
        }
        if end <= start {
            return Err(format!("chunk range {s:?} is empty"));
        }
        Ok(ChunkRange { start, end })
    }

    /// Number of chunks in the range.
    pub fn len(&self) -> u32 {
        self.end - self.start
    }

    /// True when the range holds no chunk.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// The chunk ids in order.
    pub fn iter(&self) -> impl Iterator<Item = ChunkId> {
        (self.start..self.end).map(ChunkId)
    }
}

/// The union of `ranges` as sorted, disjoint ranges with adjacent ones
/// joined (how a partial lists the chunks it covers); the first chunk
/// covered twice is the error.
pub fn coalesce(ranges: &[ChunkRange]) -> Result<Vec<ChunkRange>, u32> {
    let mut all: Vec<ChunkRange> = ranges.iter().copied().filter(|r| !r.is_empty()).collect();
    all.sort();
    let mut out: Vec<ChunkRange> = Vec::with_capacity(all.len());
    for r in all {
        match out.last_mut() {
            Some(last) if r.start < last.end => return Err(r.start),
            Some(last) if r.start == last.end => last.end = r.end,
            _ => out.push(r),
        }
    }
    Ok(out)
}

impl fmt::Display for ChunkRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_ranges_parse_both_forms() {
        assert_eq!(
            ChunkRange::parse("0..8").unwrap(),
            ChunkRange { start: 0, end: 8 }
        );
        assert_eq!(
            ChunkRange::parse("4..=7").unwrap(),
            ChunkRange { start: 4, end: 8 }
        );
        assert!(ChunkRange::parse("5..5").unwrap_err().contains("empty"));
        assert!(ChunkRange::parse("x").unwrap_err().contains("A..B"));
    }
}
