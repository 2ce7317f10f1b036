//! The MoE facts of a GGUF model read from its header alone, before
//! llama.cpp loads it: llama.cpp aborts in a `GGML_ASSERT` on a model with
//! `expert_count = 0`, or with more experts or layers than its fixed arrays
//! hold ([`LLAMA_MAX_EXPERTS`], [`LLAMA_MAX_LAYERS`]), and a coordinator
//! must refuse such a model before it hands out any lease (otherwise every
//! worker fails and a cluster waits).

use crate::read::GgufReader;
use std::path::Path;

/// llama.cpp's `LLAMA_MAX_EXPERTS` (`src/llama-hparams.h` of the vendored
/// llama.cpp, llama-cpp-sys-2 0.1.161): a larger `expert_count` aborts its
/// loader.
pub const LLAMA_MAX_EXPERTS: u64 = 1024;

/// llama.cpp's `LLAMA_MAX_LAYERS` (the same header): a `block_count` of 0 or
/// above it aborts its loader.
pub const LLAMA_MAX_LAYERS: u64 = 512;

/// Routed experts per layer and experts used per token, as the header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeFacts {
    /// `{arch}.expert_count`.
    pub n_expert: u32,
    /// `{arch}.expert_used_count` (k).
    pub n_expert_used: u32,
}

/// Reads `{arch}.expert_count`, `{arch}.expert_used_count` and
/// `{arch}.block_count` from the GGUF header at `path`; a missing or zero
/// count, `k` outside `1..=n_expert`, or a count beyond the limit llama.cpp
/// asserts on (named in the error) is an error naming the file and the key.
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
    let beyond = |key: &str, n: u64, limit: &str, max: u64| {
        format!(
            "model {shown}: {arch}.{key} is {n}, more than llama.cpp's {limit} ({max}); \
             llama.cpp would abort loading it"
        )
    };
    let n_layer = num("block_count").filter(|&n| n > 0).ok_or_else(|| {
        format!("model {shown}: {arch}.block_count is missing or 0 in the GGUF header")
    })?;
    if n_layer > LLAMA_MAX_LAYERS {
        return Err(beyond(
            "block_count",
            n_layer,
            "LLAMA_MAX_LAYERS",
            LLAMA_MAX_LAYERS,
        ));
    }
    let n_expert = num("expert_count").filter(|&n| n > 0).ok_or_else(|| {
        format!("model {shown} has no MoE layers: {arch}.expert_count is missing or 0")
    })?;
    if n_expert > LLAMA_MAX_EXPERTS {
        return Err(beyond(
            "expert_count",
            n_expert,
            "LLAMA_MAX_EXPERTS",
            LLAMA_MAX_EXPERTS,
        ));
    }
    let n_expert_used = num("expert_used_count")
        .filter(|&k| k > 0 && k <= n_expert)
        .ok_or_else(|| {
            format!("model {shown}: {arch}.expert_used_count is missing or not in 1..={n_expert}")
        })?;
    // Both fit in u32: bounded by LLAMA_MAX_EXPERTS above.
    Ok(MoeFacts {
        n_expert: n_expert as u32,
        n_expert_used: n_expert_used as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::{GgufWriter, Value};

    fn write(dir: &Path, experts: u32, used: u32) -> std::path::PathBuf {
        write_layers(dir, experts, used, 2)
    }

    fn write_layers(dir: &Path, experts: u32, used: u32, layers: u32) -> std::path::PathBuf {
        let mut g = GgufWriter::new();
        g.kv("general.architecture", Value::Str("qwen3moe".into()));
        g.kv("qwen3moe.block_count", Value::U32(layers));
        g.kv("qwen3moe.expert_count", Value::U32(experts));
        g.kv("qwen3moe.expert_used_count", Value::U32(used));
        let path = dir.join(format!("m{experts}-{used}-{layers}.gguf"));
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
        assert!(e.contains("m0-2-2.gguf"), "{e}");
        let e = moe_facts(&write(d.path(), 8, 9)).unwrap_err();
        assert!(e.contains("expert_used_count"), "{e}");
        let missing = d.path().join("missing.gguf");
        let e = moe_facts(&missing).unwrap_err();
        let shown = missing.display().to_string();
        assert!(e.starts_with(&format!("model {shown}: ")), "{e}");
        assert_eq!(e.matches(&shown).count(), 1, "the file named once: {e}");
    }

    /// The limits are llama.cpp's: at them a model loads, past them it is
    /// refused naming the key, the value and llama.cpp's constant.
    #[test]
    fn counts_past_llama_cpps_limits_are_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        assert!(moe_facts(&write_layers(d.path(), 1024, 8, 512)).is_ok());
        let e = moe_facts(&write(d.path(), u32::MAX, 2)).unwrap_err();
        assert!(
            e.contains("qwen3moe.expert_count is 4294967295, more than llama.cpp's LLAMA_MAX_EXPERTS (1024)"),
            "{e}"
        );
        assert!(e.contains("m4294967295-2-2.gguf"), "{e}");
        let e = moe_facts(&write(d.path(), 1025, 2)).unwrap_err();
        assert!(e.contains("LLAMA_MAX_EXPERTS"), "{e}");
        let e = moe_facts(&write_layers(d.path(), 8, 2, 513)).unwrap_err();
        assert!(
            e.contains("qwen3moe.block_count is 513, more than llama.cpp's LLAMA_MAX_LAYERS (512)"),
            "{e}"
        );
        let e = moe_facts(&write_layers(d.path(), 8, 2, 0)).unwrap_err();
        assert!(e.contains("qwen3moe.block_count is missing or 0"), "{e}");
        let e = moe_facts(&write(d.path(), 8, u32::MAX)).unwrap_err();
        assert!(
            e.contains("expert_used_count is missing or not in 1..=8"),
            "{e}"
        );
    }

    /// The constants are the vendored llama.cpp's own, read from its source
    /// in Cargo's registry (the workspace builds llama-cpp-sys-2 from there).
    #[test]
    fn the_limits_match_the_vendored_llama_cpp() {
        let home = std::env::var_os("CARGO_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
            .expect("CARGO_HOME or HOME");
        let registries = std::fs::read_dir(home.join("registry/src")).unwrap();
        let mut seen = 0;
        for reg in registries.flatten() {
            let h = reg
                .path()
                .join("llama-cpp-sys-2-0.1.161/llama.cpp/src/llama-hparams.h");
            let Ok(text) = std::fs::read_to_string(&h) else {
                continue;
            };
            let define = |name: &str| -> u64 {
                let line = text
                    .lines()
                    .find(|l| l.starts_with(&format!("#define {name} ")))
                    .unwrap_or_else(|| panic!("{name} in {}", h.display()));
                line.split_whitespace().nth(2).unwrap().parse().unwrap()
            };
            assert_eq!(define("LLAMA_MAX_EXPERTS"), LLAMA_MAX_EXPERTS);
            assert_eq!(define("LLAMA_MAX_LAYERS"), LLAMA_MAX_LAYERS);
            seen += 1;
        }
        assert!(seen > 0, "llama-cpp-sys-2 0.1.161's sources under {home:?}");
    }
}
