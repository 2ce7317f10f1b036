//! The MoE facts of a GGUF model read from its header alone, before
//! llama.cpp loads it: llama.cpp aborts in a `GGML_ASSERT` on a model with
//! `expert_count = 0`, and a coordinator must refuse a dense model before it
//! hands out any lease (otherwise every worker fails and a cluster waits).

use crate::read::GgufReader;
use std::path::Path;

/// Routed experts per layer and experts used per token, as the header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeFacts {
    /// `{arch}.expert_count`.
    pub n_expert: u32,
    /// `{arch}.expert_used_count` (k).
    pub n_expert_used: u32,
}

/// Reads `{arch}.expert_count` and `{arch}.expert_used_count` from the GGUF
/// header at `path`; a missing or zero count, or `k` outside `1..=n_expert`,
/// is an error naming the file and the key.
pub fn moe_facts(path: &Path) -> Result<MoeFacts, String> {
    let shown = path.display();
    // The reader's errors name the file.
    let r = GgufReader::open(path).map_err(|e| format!("model {e}"))?;
    let arch = r
        .header
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .ok_or_else(|| format!("model {shown}: no general.architecture in the GGUF header"))?
        .to_string();
    let num = |key: &str| {
        r.header
            .get(&format!("{arch}.{key}"))
            .and_then(|v| v.as_u64())
    };
    let n_expert = num("expert_count")
        .filter(|&n| n > 0 && n <= u64::from(u32::MAX))
        .ok_or_else(|| {
            format!("model {shown} has no MoE layers: {arch}.expert_count is missing or 0")
        })? as u32;
    let n_expert_used = num("expert_used_count")
        .filter(|&k| k > 0 && k <= u64::from(n_expert))
        .ok_or_else(|| {
            format!("model {shown}: {arch}.expert_used_count is missing or not in 1..={n_expert}")
        })? as u32;
    Ok(MoeFacts {
        n_expert,
        n_expert_used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::{GgufWriter, Value};

    fn write(dir: &Path, experts: u32, used: u32) -> std::path::PathBuf {
        let mut g = GgufWriter::new();
        g.kv("general.architecture", Value::Str("qwen3moe".into()));
        g.kv("qwen3moe.expert_count", Value::U32(experts));
        g.kv("qwen3moe.expert_used_count", Value::U32(used));
        let path = dir.join(format!("m{experts}-{used}.gguf"));
        std::fs::write(&path, g.to_bytes()).unwrap();
        path
    }

    #[test]
    fn zero_experts_and_bad_k_are_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            moe_facts(&write(d.path(), 8, 2)).unwrap(),
            MoeFacts {
                n_expert: 8,
                n_expert_used: 2
            }
        );
        let e = moe_facts(&write(d.path(), 0, 2)).unwrap_err();
        assert!(e.contains("qwen3moe.expert_count is missing or 0"), "{e}");
        assert!(e.contains("m0-2.gguf"), "{e}");
        let e = moe_facts(&write(d.path(), 8, 9)).unwrap_err();
        assert!(e.contains("expert_used_count"), "{e}");
        let missing = d.path().join("missing.gguf");
        let e = moe_facts(&missing).unwrap_err();
        let shown = missing.display().to_string();
        assert!(e.starts_with(&format!("model {shown}: ")), "{e}");
        assert_eq!(e.matches(&shown).count(), 1, "the file named once: {e}");
    }
}
