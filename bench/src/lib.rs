//! What the benchmark binaries share: reading a model's MoE shape and the
//! median they report.
#![deny(missing_docs)]

use anyhow::Context;
use std::path::{Path, PathBuf};

/// The MoE blocks (those with a router, `blk.N.ffn_gate_inp.weight`) and
/// the expert count of `model` (a GGUF file or the first of a split one).
pub fn moe_layers(model: &Path) -> anyhow::Result<(Vec<u32>, u32)> {
    let h = gguf::split::open_joined(model)?.header;
    let arch = h
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .context("no architecture")?;
    let n_expert = h
        .get(&format!("{arch}.expert_count"))
        .and_then(|v| v.as_u64())
        .context("not an MoE model")? as u32;
    let layers = h
        .tensors
        .iter()
        .filter_map(|t| {
            let (l, name) = t.name.strip_prefix("blk.")?.split_once('.')?;
            (name == "ffn_gate_inp.weight")
                .then(|| l.parse().ok())
                .flatten()
        })
        .collect();
    Ok((layers, n_expert))
}

/// Where a benchmark writes its outputs: `--dir`, or the model's folder.
pub fn scratch_dir(dir: Option<&Path>, model: &Path) -> PathBuf {
    dir.map_or_else(
        || model.parent().unwrap_or(Path::new(".")).to_path_buf(),
        Path::to_path_buf,
    )
}

/// The middle value of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_median_is_the_middle_value() {
        assert_eq!(super::median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
    }
}
