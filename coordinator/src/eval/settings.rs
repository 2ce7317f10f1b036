//! `[eval]` of the run config: which keep maps `coordinator run` evaluates
//! after scoring, and which positions are scored.

use serde::{Deserialize, Serialize};

/// `[eval]`: the keep maps `coordinator run` evaluates after scoring (none:
/// no evaluation), and which positions are scored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSettings {
    /// Keep maps by name, `<method>_K<k>`.
    pub keep_maps: Vec<String>,
    /// Splits scored: `fit`, `heldout` or `both`.
    pub split: String,
    /// Positions skipped at the start of every chunk.
    pub skip_first: u32,
}

impl Default for EvalSettings {
    fn default() -> Self {
        EvalSettings {
            keep_maps: Vec::new(),
            split: "both".into(),
            skip_first: 0,
        }
    }
}
