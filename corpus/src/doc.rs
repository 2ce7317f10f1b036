//! A tokenized document: the unit that is split, deduplicated and packed.

use numbers::Split;
use runfiles::corpus::ImageSpan;

/// One document after tokenization.
#[derive(Clone, Debug, PartialEq)]
pub struct Doc {
    /// Its index in `corpus/documents.jsonl` order (the calibration
    /// domains' documents in read order, then the eval sets').
    pub index: u32,
    /// Index into the corpus's domains.
    pub domain: u16,
    /// Where it came from (`path:LINE`, ...).
    pub at: String,
    /// Its group (the configured key's value, or the document itself).
    pub group: String,
    /// Characters of the text that was tokenized.
    pub chars: u64,
    /// Token ids (an image's positions hold its marker token).
    pub tokens: Vec<i32>,
    /// Its images' positions in `tokens`, in order.
    pub images: Vec<ImageSpan>,
    /// Which split it landed in.
    pub split: Split,
}

#[cfg(test)]
impl Doc {
    /// A test document of `n` tokens (all id 1, one character each) of
    /// `domain` and `group`, in `split`.
    pub(crate) fn filler(domain: u16, group: &str, n: usize, split: Split) -> Doc {
        Doc {
            index: 0,
            domain,
            at: format!("{domain}:{group}/{n}"),
            group: group.into(),
            chars: n as u64,
            tokens: vec![1; n],
            images: Vec::new(),
            split,
        }
    }
}
