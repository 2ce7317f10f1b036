//! `general.*` metadata of a pruned model, so a published slice does not
//! present itself as its base: the name says what was pruned, the size
//! label is recomputed from the sliced tensors by gguf-py's rule (what
//! llama.cpp's converter writes), and `general.base_model.*` names the base
//! model (its name, organisation, version and repository), replacing the
//! base's own ancestry.

use gguf::read::{GgufHeader, GgufValue};

/// Changes to the header's metadata: entries replaced, dropped and added.
#[derive(Default)]
pub(super) struct GeneralKv {
    /// Entries (indices) replaced by new encoded bytes.
    pub overrides: Vec<(usize, Vec<u8>)>,
    /// Entries (indices) left out.
    pub dropped: Vec<usize>,
    /// Encoded entries appended.
    pub added: Vec<Vec<u8>>,
}

const BASE_MODEL: &str = "general.base_model.";

/// The `general.*` changes for a slice of `header` to `k` of `n_expert`
/// experts per layer whose tensors are `sliced` (name and ggml dims of each
/// kept tensor after its cut); `verb` ("pruned", "merged") goes in the name.
pub(super) fn pruned(
    header: &GgufHeader,
    sliced: &[(String, Vec<u64>)],
    k: u32,
    n_expert: u64,
    verb: &str,
) -> GeneralKv {
    let mut out = GeneralKv::default();
    let index = |key: &str| header.kv.iter().position(|(k, _)| k == key);
    let text = |key: &str| header.get(key).and_then(GgufValue::as_str);
    let set = |key: &str, value: GgufValue, out: &mut GeneralKv| {
        let bytes = super::kv::entry(key, &value);
        match index(key) {
            Some(i) => out.overrides.push((i, bytes)),
            None => out.added.push(bytes),
        }
    };
    if let Some(name) = text("general.name") {
        let pruned = format!("{name} ({verb} to {k} of {n_expert} experts)");
        set("general.name", GgufValue::Str(pruned), &mut out);
    }
    let label = size_label(sliced);
    set("general.size_label", GgufValue::Str(label), &mut out);
    out.dropped = (0..header.kv.len())
        .filter(|&i| header.kv[i].0.starts_with(BASE_MODEL))
        .collect();
    out.added.push(super::kv::entry(
        "general.base_model.count",
        &GgufValue::U32(1),
    ));
    for (from, to) in [
        ("general.name", "name"),
        ("general.organization", "organization"),
        ("general.version", "version"),
        ("general.repo_url", "repo_url"),
    ] {
        if let Some(v) = text(from) {
            let key = format!("{BASE_MODEL}0.{to}");
            out.added
                .push(super::kv::entry(&key, &GgufValue::Str(v.to_string())));
        }
    }
    out
}

/// gguf-py's `size_label` of tensors (name, ggml dims): with expert
/// tensors (`_exps.` of at least 3 dims) `{experts}x{shared + one expert's
/// parameters}`, else the total, in `model_weight_count_rounded_notation`.
fn size_label(tensors: &[(String, Vec<u64>)]) -> String {
    let (mut total, mut shared, mut expert) = (0u64, 0u64, 0u64);
    let (mut expert_sum, mut expert_tensors) = (0u64, 0u64);
    for (name, dims) in tensors {
        let size: u64 = dims.iter().product();
        if name.contains("_exps.") && dims.len() >= 3 {
            // gguf-py's shape is ggml's dims reversed: shape[-3] (weights)
            // or shape[-2] (biases) is the expert axis.
            let count = if name.contains(".bias") {
                dims[1]
            } else {
                dims[2]
            }
            .max(1);
            expert += size / count;
            expert_sum += count;
            expert_tensors += 1;
        } else {
            shared += size;
        }
        total += size;
    }
    match expert_sum.checked_div(expert_tensors).unwrap_or(0) {
        0 => rounded_notation(total),
        experts => format!("{experts}x{}", rounded_notation(shared + expert)),
    }
}

/// gguf-py's `model_weight_count_rounded_notation` with two significant
/// digits at least.
fn rounded_notation(count: u64) -> String {
    let n = count as f64;
    let (scaled, suffix) = if n > 1e12 {
        (n * 1e-12, "T")
    } else if n > 1e9 {
        (n * 1e-9, "B")
    } else if n > 1e6 {
        (n * 1e-6, "M")
    } else {
        (n * 1e-3, "K")
    };
    let whole = scaled.round_ties_even().to_string();
    let digits = whole.trim_start_matches('0').len();
    let fix = 2usize.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figures from gguf-py 0.19.0 (`model_weight_count_rounded_notation`,
    /// `size_label`), the converter's own implementation.
    #[test]
    fn labels_match_gguf_py() {
        for (n, want) in [
            (999, "1.0K"),
            (12_345, "12K"),
            (1_500_000, "1.5M"),
            (3_049_000_000, "3.0B"),
            (30_532_122_624, "31B"),
            (1_234_567_890_123, "1.2T"),
            (250, "0.25K"),
            (7_000_000, "7.0M"),
            (1_000_000_000, "1000M"),
        ] {
            assert_eq!(rounded_notation(n), want, "{n}");
        }
        // size_label(total, 2_000_000 shared, 300_000 per expert, 16) is
        // "16x2.3M": two expert tensors of 16 experts of 150,000 each.
        let tensors = [
            ("token_embd.weight".to_string(), vec![1000, 2000]),
            ("blk.0.ffn_up_exps.weight".to_string(), vec![300, 500, 16]),
            ("blk.0.ffn_down_exps.weight".to_string(), vec![500, 300, 16]),
        ];
        assert_eq!(size_label(&tensors), "16x2.3M");
        assert_eq!(size_label(&tensors[..1]), "2.0M");
    }
}
