//! Keep maps: the experts kept per layer for a (method, K) (DESIGN section 10).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A keep map as written to `keep_maps/<method>_K<k>.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeepMap {
    /// Scoring method name (`frequency`, `reap_mean`, ...).
    pub method: String,
    /// Experts kept per layer.
    pub k: u32,
    /// Method parameters, as given (prior, m, z, domain mix, ...).
    pub params: serde_json::Value,
    /// SHA-256 of the `saliency.json` bytes the map was computed from.
    pub saliency_sha256: String,
    /// Block index (as a string key) to sorted, unique expert ids.
    pub layers: BTreeMap<String, Vec<u32>>,
}

impl KeepMap {
    /// The object name of this map under the run: `keep_maps/<method>_K<k>.json`.
    pub fn file_name(method: &str, k: u32) -> String {
        crate::layout::keep_map(&format!("{method}_K{k}"))
    }

    /// The object name of the map called `name` (`<method>_K<k>`) under the
    /// run: `keep_maps/<name>.json`.
    pub fn object_name(name: &str) -> String {
        crate::layout::keep_map(name)
    }

    /// Kept experts of block `layer`, if the map covers it.
    pub fn kept(&self, layer: u32) -> Option<&[u32]> {
        self.layers.get(&layer.to_string()).map(|v| v.as_slice())
    }
}
