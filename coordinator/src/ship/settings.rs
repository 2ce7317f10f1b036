//! `[ship]` of the run config: the candidates and quantisation types
//! `coordinator run` ships after evaluation (none: nothing shipped).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[ship]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShipSettings {
    /// Candidates: `<method>_K<k>`, `top<t>`, `<method>_K<k>+top<t>`.
    pub candidates: Vec<String>,
    /// Quantisation types (llama-quantize's names: `Q8_0`, `Q4_K_M`, ...).
    pub quant: Vec<String>,
    /// Output directory, relative to the config file's directory; default
    /// `shipped/` inside a local run location.
    pub out: Option<PathBuf>,
    /// Quantise a base model that is already quantised.
    pub allow_requantize: bool,
    /// Splits scored: `fit`, `heldout` or `both`.
    pub split: String,
    /// Positions skipped at the start of every chunk.
    pub skip_first: u32,
}

impl Default for ShipSettings {
    fn default() -> Self {
        ShipSettings {
            candidates: Vec::new(),
            quant: Vec::new(),
            out: None,
            allow_requantize: false,
            split: "both".into(),
            skip_first: 0,
        }
    }
}
