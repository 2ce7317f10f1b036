//! Where a layer's prefetch guesses come from, aligned to its tokens, and how
//! well they recall the actual selection.
//!
//! A guess for layer `L` is made `d` layers earlier, at layer `L - d`, for
//! the same token: the trace's lookahead columns of layer `L - d` (layer
//! `L`'s router on the residual stream after layer `L - d`), or the baseline
//! "same experts as this layer" (layer `L - d`'s own router top-N). The
//! oracle knows layer `L`'s actual selection.

use super::steps::NONE;
use super::trace_io::RawLayer;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A source of prefetch guesses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "distance")]
pub enum Predictor {
    /// The trace's lookahead guess made `d` layers earlier.
    Lookahead(u8),
    /// Baseline: layer `L - d`'s own router top-N.
    SameLayer(u8),
    /// The actual selection (the ceiling for a prefetch budget).
    Oracle,
}

impl fmt::Display for Predictor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Predictor::Lookahead(d) => write!(f, "lookahead_d{d}"),
            Predictor::SameLayer(d) => write!(f, "same_layer_d{d}"),
            Predictor::Oracle => f.write_str("oracle"),
        }
    }
}

impl Predictor {
    /// Layers between the guess and its target (0 for the oracle).
    pub fn distance(self) -> u32 {
        match self {
            Predictor::Lookahead(d) | Predictor::SameLayer(d) => u32::from(d),
            Predictor::Oracle => 0,
        }
    }
}

/// Guesses for each token of a target layer, `width` per token, best first,
/// [`NONE`]-padded (no guess: the source layer lacks the token or the column).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Guesses {
    /// Guesses per token.
    pub width: usize,
    /// `width` ids per token of the target layer.
    pub ids: Vec<u16>,
}

/// The guesses of `predictor` for the tokens of `target`, made at `source`
/// (layer `L - d` of the same split; `None` when the trace has no such
/// layer). `None` when the trace lacks the predictor's columns.
pub fn guesses(
    predictor: Predictor,
    target: &RawLayer,
    source: Option<&RawLayer>,
) -> Option<Guesses> {
    let (width, ids): (usize, &[u16]) = match predictor {
        Predictor::Oracle => {
            return Some(Guesses {
                width: target.k,
                ids: target.selected.clone(),
            })
        }
        Predictor::SameLayer(_) => {
            let s = source?;
            (s.n, &s.topn)
        }
        Predictor::Lookahead(d) => {
            let a = source?.ahead.iter().find(|a| a.distance == d)?;
            (a.width, &a.ids)
        }
    };
    let source = source?;
    let mut out = Guesses {
        width,
        ids: vec![NONE; target.tokens() * width],
    };
    // Both layers are in (chunk, pos) order: a merge join.
    let key = |r: &RawLayer, i: usize| (r.chunk[i], r.pos[i]);
    let mut j = 0;
    for i in 0..target.tokens() {
        while j < source.tokens() && key(source, j) < key(target, i) {
            j += 1;
        }
        if j < source.tokens() && key(source, j) == key(target, i) {
            out.ids[i * width..(i + 1) * width].copy_from_slice(&ids[j * width..(j + 1) * width]);
        }
    }
    Some(out)
}

/// Recall counts of one (predictor, m) on one layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recall {
    /// Tokens with a guess.
    pub tokens: u64,
    /// Selected experts of those tokens.
    pub selected: u64,
    /// Of those, the ones among the first `m` guesses.
    pub hit: u64,
}

/// How many of each token's selected experts are among its first `m`
/// guesses (tokens without a guess are left out).
pub fn recall(target: &RawLayer, g: &Guesses, m: usize) -> Recall {
    let mut out = Recall::default();
    let m = m.min(g.width);
    for t in 0..target.tokens() {
        let guess = &g.ids[t * g.width..t * g.width + m];
        if guess.first().is_none_or(|&e| e == NONE) {
            continue;
        }
        let sel = &target.selected[t * target.k..(t + 1) * target.k];
        out.tokens += 1;
        out.selected += sel.len() as u64;
        out.hit += sel.iter().filter(|e| guess.contains(e)).count() as u64;
    }
    out
}
