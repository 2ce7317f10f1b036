//! Slicing small hand-built GGUF files: kept bytes, metadata, determinism,
//! and every refusal (with nothing left at the output).

use super::*;
use gguf::read::{GgufReader, GgufValue};
use gguf::write::{GgufWriter, TensorType, Value};
use numbers::imatrix::{Imatrix, ImatrixEntry};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const N_EXPERT: u64 = 4;

/// Bytes of expert `e` of the tensor with seed `seed`: distinct per expert.
fn expert_bytes(seed: u8, e: u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|j| {
            seed.wrapping_mul(31)
                .wrapping_add(e as u8 * 7)
                .wrapping_add(j as u8)
        })
        .collect()
}

/// `(name, dims, type, bytes per expert)` of the stacked tensors of one MoE block.
fn expert_tensors(layer: u32) -> Vec<(String, Vec<u64>, TensorType, usize)> {
    vec![
        (
            format!("blk.{layer}.ffn_gate_inp.weight"),
            vec![8, N_EXPERT],
            TensorType::F32,
            32,
        ),
        (
            format!("blk.{layer}.ffn_up_exps.weight"),
            vec![32, 2, N_EXPERT],
            TensorType::Q8_0,
            68,
        ),
        (
            format!("blk.{layer}.ffn_down_exps.weight"),
            vec![2, 8, N_EXPERT],
            TensorType::F16,
            32,
        ),
        (
            format!("blk.{layer}.exp_probs_b.bias"),
            vec![N_EXPERT],
            TensorType::F32,
            4,
        ),
    ]
}

/// A model with a dense block 0 and MoE blocks 1 and 2; `extra` adds keys.
fn model_with(extra: &[(&str, Value)], tweak: impl Fn(&mut GgufWriter)) -> Vec<u8> {
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::Str("glm4moe".into()))
        .kv("glm4moe.expert_count", Value::U32(N_EXPERT as u32))
        .kv("glm4moe.expert_used_count", Value::U32(2))
        .kv(
            "tokenizer.ggml.tokens",
            Value::StrArray(vec!["a".into(), "b".into()]),
        );
    for (k, v) in extra {
        g.kv(k, v.clone());
    }
    g.tensor_f32("token_embd.weight", &[8, 2], &[0.5; 16]);
    g.tensor_f32("blk.0.ffn_up.weight", &[8, 4], &[1.5; 32]);
    g.tensor_f32("blk.0.attn_q_norm.weight", &[4], &[2.0; 4]);
    for layer in [1, 2] {
        g.tensor_f32(&format!("blk.{layer}.attn_q_norm.weight"), &[4], &[3.0; 4]);
        for (i, (name, dims, ty, per)) in expert_tensors(layer).into_iter().enumerate() {
            let seed = (layer * 10 + i as u32) as u8;
            let data = (0..N_EXPERT)
                .flat_map(|e| expert_bytes(seed, e, per))
                .collect();
            g.tensor(&name, &dims, ty, data);
        }
    }
    tweak(&mut g);
    g.to_bytes()
}

fn model() -> Vec<u8> {
    model_with(&[], |_| {})
}

fn keep(layers: &[(u32, &[u32])]) -> KeepMap {
    KeepMap {
        method: "reap_l2_sum".into(),
        k: layers[0].1.len() as u32,
        params: serde_json::Value::Null,
        saliency_sha256: String::new(),
        layers: layers
            .iter()
            .map(|(l, ids)| (*l, ids.to_vec()))
            .collect::<BTreeMap<_, _>>(),
    }
}

struct Files {
    _dir: tempfile::TempDir,
    base: PathBuf,
    out: PathBuf,
}

fn files(bytes: &[u8]) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.gguf");
    std::fs::write(&base, bytes).unwrap();
    let out = dir.path().join("pruned.gguf");
    Files {
        _dir: dir,
        base,
        out,
    }
}

#[test]
fn keeps_the_kept_experts_bytes_in_keep_map_order() {
    let f = files(&model());
    let map = keep(&[(1, &[0, 3]), (2, &[1, 2])]);
    let planned = model_bytes(&f.base, Some(&map), None).unwrap();
    let sliced = slice_model(&f.base, &map, &f.out).unwrap();
    assert_eq!(sliced.k, 2);
    let bytes = std::fs::read(&f.out).unwrap();
    assert_eq!(sliced.bytes, bytes.len() as u64);
    // The size planned from the header: within a few metadata bytes (the
    // new expert count) of what was written.
    assert!(
        planned.abs_diff(sliced.bytes) <= 64,
        "planned {planned}, wrote {}",
        sliced.bytes
    );
    assert!(planned < std::fs::metadata(&f.base).unwrap().len());
    assert_eq!(sliced.sha256, gguf::hash::sha256_hex(&bytes));
    let mut r = GgufReader::open(&f.out).unwrap();
    assert_eq!(
        r.header.get("glm4moe.expert_count"),
        Some(&GgufValue::U32(2))
    );
    assert_eq!(
        r.header.get("glm4moe.expert_used_count"),
        Some(&GgufValue::U32(2))
    );
    // Every metadata entry is kept; a size label and the base model's
    // count are added.
    assert_eq!(r.header.kv.len(), 6);
    for (layer, kept) in [(1u32, [0u64, 3]), (2, [1, 2])] {
        for (i, (name, dims, _, per)) in expert_tensors(layer).into_iter().enumerate() {
            let seed = (layer * 10 + i as u32) as u8;
            let t = r.header.tensor(&name).unwrap().clone();
            let mut want_dims = dims.clone();
            *want_dims.last_mut().unwrap() = 2;
            assert_eq!(t.dims, want_dims, "{name}");
            let want: Vec<u8> = kept
                .iter()
                .flat_map(|&e| expert_bytes(seed, e, per))
                .collect();
            assert_eq!(r.tensor_bytes(&name).unwrap(), want, "{name}");
        }
    }
    let mut base = GgufReader::open(&f.base).unwrap();
    for name in [
        "token_embd.weight",
        "blk.0.ffn_up.weight",
        "blk.1.attn_q_norm.weight",
    ] {
        assert_eq!(
            r.tensor_bytes(name).unwrap(),
            base.tensor_bytes(name).unwrap(),
            "{name}"
        );
    }
    assert_eq!(
        r.header.get("tokenizer.ggml.tokens"),
        base.header.get("tokenizer.ggml.tokens")
    );
}

#[test]
fn keeping_every_expert_rewrites_the_same_bytes_and_slices_are_deterministic() {
    let base = model();
    let f = files(&base);
    let all: &[u32] = &[0, 1, 2, 3];
    let sliced = slice_model(&f.base, &keep(&[(1, all), (2, all)]), &f.out).unwrap();
    assert_eq!(std::fs::read(&f.out).unwrap(), base);
    assert_eq!(sliced.sha256, gguf::hash::sha256_hex(&base));

    let map = keep(&[(1, &[1, 2]), (2, &[0, 1])]);
    let a = slice_model(&f.base, &map, &f.out).unwrap();
    let first = std::fs::read(&f.out).unwrap();
    let b = slice_model(&f.base, &map, &f.out).unwrap();
    assert_eq!(a, b);
    assert_eq!(std::fs::read(&f.out).unwrap(), first);
}

/// Asserts that slicing `bytes` with `map` fails with a message containing
/// every one of `needles`, and leaves nothing at the output.
fn refused(bytes: &[u8], map: &KeepMap, needles: &[&str]) -> PruneError {
    let f = files(bytes);
    let err = slice_model(&f.base, map, &f.out).unwrap_err();
    let msg = err.to_string();
    for n in needles {
        assert!(msg.contains(n), "{msg:?} lacks {n:?}");
    }
    let left: Vec<_> = std::fs::read_dir(f.out.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["base.gguf"], "nothing but the input is left");
    err
}

#[test]
fn refuses_a_map_whose_k_differs_per_layer() {
    let err = refused(
        &model(),
        &keep(&[(1, &[0, 1]), (2, &[0, 1, 2])]),
        &["keep map reap_l2_sum_K2", "layer 2 keeps 3"],
    );
    assert!(matches!(err, PruneError::KeepMap { .. }));
}

#[test]
fn refuses_unsorted_ids_and_a_wrong_k_field() {
    refused(
        &model(),
        &keep(&[(1, &[1, 0]), (2, &[0, 1])]),
        &["layer 1", "sorted"],
    );
    let mut map = keep(&[(1, &[0, 1]), (2, &[0, 1])]);
    map.k = 3;
    refused(&model(), &map, &["reap_l2_sum_K3", "k field says 3"]);
}

#[test]
fn refuses_a_layer_that_is_not_moe_and_a_missing_one() {
    let err = refused(
        &model(),
        &keep(&[(0, &[0, 1]), (1, &[0, 1]), (2, &[0, 1])]),
        &["base.gguf", "reap_l2_sum_K2", "layer 0", "not an MoE layer"],
    );
    assert!(matches!(err, PruneError::Mismatch { .. }));
    refused(
        &model(),
        &keep(&[(1, &[0, 1])]),
        &["reap_l2_sum_K2", "does not cover MoE layer 2"],
    );
    refused(
        &model(),
        &keep(&[(1, &[0, 4]), (2, &[0, 1])]),
        &["layer 1 keeps expert 4"],
    );
}

#[test]
fn refuses_fewer_experts_than_are_routed_to() {
    refused(
        &model(),
        &keep(&[(1, &[0]), (2, &[3])]),
        &["reap_l2_sum_K1", "glm4moe.expert_used_count is 2"],
    );
}

#[test]
fn grouped_routing_needs_the_same_number_kept_per_group() {
    let grouped = model_with(&[("glm4moe.expert_group_count", Value::U32(2))], |_| {});
    refused(
        &grouped,
        &keep(&[(1, &[0, 2]), (2, &[0, 1])]),
        &["reap_l2_sum_K2", "layer 2 keeps [2, 0]", "2 routing groups"],
    );
    // One per group is balanced, but llama.cpp ranks groups by their two
    // best experts (GGML_ASSERT in ggml_argsort_top_k otherwise).
    refused(
        &grouped,
        &keep(&[(1, &[0, 2]), (2, &[1, 3])]),
        &[
            "reap_l2_sum_K2",
            "keeps 1 expert per routing group",
            "at least 2",
        ],
    );
    let f = files(&grouped);
    let all: &[u32] = &[0, 1, 2, 3];
    slice_model(&f.base, &keep(&[(1, all), (2, all)]), &f.out).unwrap();
}

/// A NextN block (`nextn_predict_layers`, the last of `block_count`) is
/// never run by a decode, so no keep map covers it; the slice leaves its
/// tensors out and describes the remaining blocks (issue #19).
#[test]
fn nextn_blocks_are_dropped_and_the_metadata_describes_the_rest() {
    let mtp = model_with(
        &[
            ("glm4moe.block_count", Value::U32(3)),
            ("glm4moe.nextn_predict_layers", Value::U32(1)),
            (
                "glm4moe.attention.head_count_kv",
                Value::I32Array(vec![1, 2, 3]),
            ),
        ],
        |g| {
            g.tensor_f32("blk.2.nextn.eh_proj.weight", &[16, 8], &[0.25; 128]);
        },
    );
    refused(
        &mtp,
        &keep(&[(1, &[0, 1]), (2, &[0, 1])]),
        &["names layer 2, which is not an MoE layer"],
    );
    let f = files(&mtp);
    slice_model(&f.base, &keep(&[(1, &[1, 3])]), &f.out).unwrap();
    let r = GgufReader::open(&f.out).unwrap();
    let base = GgufReader::open(&f.base).unwrap();
    assert!(r
        .header
        .tensors
        .iter()
        .all(|t| !t.name.starts_with("blk.2.")));
    assert_eq!(
        r.header.tensors.len(),
        base.header.tensors.len() - 6,
        "blk.2's attention norm, 4 expert tensors and NextN projection are left out"
    );
    assert_eq!(
        r.header.get("glm4moe.block_count"),
        Some(&GgufValue::U32(2))
    );
    assert_eq!(
        r.header.get("glm4moe.nextn_predict_layers"),
        Some(&GgufValue::U32(0))
    );
    assert_eq!(
        r.header.get("glm4moe.attention.head_count_kv"),
        Some(&GgufValue::Array(vec![
            GgufValue::I32(1),
            GgufValue::I32(2)
        ]))
    );
    assert_eq!(
        r.header.get("glm4moe.expert_count"),
        Some(&GgufValue::U32(2))
    );
}

#[test]
fn refuses_an_expert_tensor_whose_expert_axis_is_not_outermost() {
    let bad = model_with(&[], |g| {
        g.tensor_f32("blk.2.ffn_gate_exps.weight", &[N_EXPERT, 8, 2], &[0.0; 64]);
    });
    let err = refused(
        &bad,
        &keep(&[(1, &[0, 1]), (2, &[0, 1])]),
        &[
            "tensor blk.2.ffn_gate_exps.weight",
            "[4, 8, 2]",
            "not the outermost",
        ],
    );
    assert!(matches!(err, PruneError::Tensor { .. }));
    let unknown = model_with(&[], |g| {
        g.tensor_f32("blk.1.ffn_norm_exps.weight", &[8, N_EXPERT], &[0.0; 32]);
    });
    refused(
        &unknown,
        &keep(&[(1, &[0, 1]), (2, &[0, 1])]),
        &["tensor blk.1.ffn_norm_exps.weight", "does not know"],
    );
}

#[test]
fn refuses_a_model_without_experts() {
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::Str("qwen3".into()));
    g.tensor_f32("token_embd.weight", &[8, 2], &[0.5; 16]);
    let err = refused(
        &g.to_bytes(),
        &keep(&[(1, &[0, 1])]),
        &["base.gguf", "qwen3.expert_count"],
    );
    assert!(matches!(err, PruneError::NotMoe { .. }));
}

fn imatrix_bytes() -> Vec<u8> {
    let mut m = Imatrix {
        chunk_count: 3,
        chunk_size: 16,
        ..Default::default()
    };
    for layer in [1, 2] {
        for (name, n_in, n_mat) in [
            ("ffn_gate_inp", 8, 1),
            ("ffn_up_exps", 8, 4),
            ("ffn_down_exps", 2, 4),
        ] {
            let mut e = ImatrixEntry::new(n_in, n_mat);
            for (i, s) in e.in_sum2.iter_mut().enumerate() {
                s.add_f64((layer * 1000 + i as u32) as f64).unwrap();
            }
            for (i, s) in e.in_sum.iter_mut().enumerate() {
                s.add_f64(-((layer * 1000 + i as u32) as f64) / 2.0)
                    .unwrap();
            }
            e.counts = (0..n_mat as u64).map(|m| 10 * m + layer as u64).collect();
            m.entries.insert(format!("blk.{layer}.{name}.weight"), e);
        }
    }
    m.entries
        .insert("blk.0.attn_q.weight".into(), ImatrixEntry::new(8, 1));
    m.to_gguf(&["corpus".into()])
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn slices_the_importance_matrix_per_expert() {
    let f = files(&imatrix_bytes());
    let sliced = slice_imatrix(&f.base, &keep(&[(1, &[0, 3]), (2, &[1, 2])]), &f.out).unwrap();
    assert_eq!(sliced.k, 2);
    let mut r = GgufReader::open(&f.out).unwrap();
    let mut base = GgufReader::open(&f.base).unwrap();
    for (layer, kept) in [(1u32, [0usize, 3]), (2, [1, 2])] {
        let name = format!("blk.{layer}.ffn_up_exps.weight");
        let sums = f32s(&r.tensor_bytes(&format!("{name}.in_sum2")).unwrap());
        let want: Vec<f32> = kept
            .iter()
            .flat_map(|&e| (0..8).map(move |j| (layer as usize * 1000 + e * 8 + j) as f32))
            .collect();
        assert_eq!(sums, want, "{name}.in_sum2");
        let sums = f32s(&r.tensor_bytes(&format!("{name}.in_sum")).unwrap());
        let want: Vec<f32> = want.iter().map(|v| -v / 2.0).collect();
        assert_eq!(sums, want, "{name}.in_sum");
        assert_eq!(
            r.header.tensor(&format!("{name}.in_sum")).unwrap().dims,
            [8, 2]
        );
        let counts = f32s(&r.tensor_bytes(&format!("{name}.counts")).unwrap());
        let want: Vec<f32> = kept
            .iter()
            .map(|&e| (10 * e + layer as usize) as f32)
            .collect();
        assert_eq!(counts, want, "{name}.counts");
        assert_eq!(
            r.header.tensor(&format!("{name}.counts")).unwrap().dims,
            [1, 2]
        );
        let router = format!("blk.{layer}.ffn_gate_inp.weight.in_sum2");
        assert_eq!(
            r.tensor_bytes(&router).unwrap(),
            base.tensor_bytes(&router).unwrap()
        );
    }
    assert_eq!(r.header.kv, base.header.kv, "metadata is copied as it is");
    refused_imatrix(
        &keep(&[(1, &[0, 1]), (3, &[0, 1])]),
        &["layer 3", "not an MoE layer"],
    );
    refused_imatrix(
        &keep(&[(1, &[0, 1]), (2, &[0, 1, 2])]),
        &["layer 2 keeps 3"],
    );
}

fn refused_imatrix(map: &KeepMap, needles: &[&str]) {
    let f = files(&imatrix_bytes());
    let msg = slice_imatrix(&f.base, map, &f.out).unwrap_err().to_string();
    needles
        .iter()
        .for_each(|n| assert!(msg.contains(n), "{msg:?} lacks {n:?}"));
    assert!(!f.out.exists());
}

#[test]
fn a_top_k_candidate_changes_the_experts_per_token_and_nothing_else() {
    let f = files(&model());
    let made = make_model(&f.base, None, Some(1), &f.out).unwrap();
    assert_eq!(made.k, N_EXPERT as u32, "every expert is kept");
    let (mut base, mut out) = (
        GgufReader::open(&f.base).unwrap(),
        GgufReader::open(&f.out).unwrap(),
    );
    assert_eq!(
        out.header.get("glm4moe.expert_used_count"),
        Some(&GgufValue::U32(1))
    );
    let others = |h: &gguf::read::GgufHeader| -> Vec<(String, GgufValue)> {
        h.kv.iter()
            .filter(|(k, _)| k != "glm4moe.expert_used_count")
            .cloned()
            .collect()
    };
    assert_eq!(others(&out.header), others(&base.header));
    let names: Vec<String> = base.header.tensors.iter().map(|t| t.name.clone()).collect();
    for name in names {
        assert_eq!(
            out.tensor_bytes(&name).unwrap(),
            base.tensor_bytes(&name).unwrap(),
            "{name}"
        );
    }
    // On top of a keep map: both changes.
    std::fs::remove_file(&f.out).unwrap();
    let map = keep(&[(1, &[0, 3]), (2, &[1, 2])]);
    make_model(&f.base, Some(&map), Some(1), &f.out).unwrap();
    let r = GgufReader::open(&f.out).unwrap();
    assert_eq!(
        r.header.get("glm4moe.expert_count"),
        Some(&GgufValue::U32(2))
    );
    assert_eq!(
        r.header.get("glm4moe.expert_used_count"),
        Some(&GgufValue::U32(1))
    );
    // More than the model routes to, or none: refused, nothing written.
    std::fs::remove_file(&f.out).unwrap();
    for used in [0, 3] {
        let e = make_model(&f.base, None, Some(used), &f.out).unwrap_err();
        assert!(
            matches!(e, PruneError::ExpertsUsed { .. })
                && e.to_string().contains("between 1 and the model's 2"),
            "{e}"
        );
        assert!(!f.out.exists());
    }
}

/// Tensor data bytes of a file as `gguf-split` counts them (each padded to
/// 32 bytes), in order.
fn padded_sizes(path: &Path) -> Vec<u64> {
    let h = GgufReader::open(path).unwrap().header;
    h.tensors
        .iter()
        .map(|t| t.n_bytes.next_multiple_of(32))
        .collect()
}

#[test]
fn a_split_slice_is_the_slice_in_files_of_at_most_the_size_asked() {
    let f = files(&model());
    let map = keep(&[(1, &[0, 3]), (2, &[1, 2])]);
    let one = slice_model(&f.base, &map, &f.out).unwrap();
    let sizes = padded_sizes(&f.out);
    let total: u64 = sizes.iter().sum();
    let largest = *sizes.iter().max().unwrap();
    let dir = f.out.parent().unwrap().join("split");
    std::fs::create_dir(&dir).unwrap();
    let out = dir.join("pruned.gguf");

    let max = largest.max(total / 3);
    let parts = make_model_split(&f.base, Some(&map), None, &out, max).unwrap();
    let count = parts.len();
    assert!(count >= 3, "{count} files for {total} bytes at {max}");
    let mut tensors = 0;
    for (i, (path, sliced)) in parts.iter().enumerate() {
        let name = gguf::split::shard_name("pruned", i as u16, count as u16);
        assert_eq!(path, &dir.join(name));
        assert_eq!(sliced.sha256, gguf::hash::sha256_file(path).unwrap());
        let h = GgufReader::open(path).unwrap().header;
        let key = |k: &str| h.get(k).and_then(GgufValue::as_u64);
        assert_eq!(key("split.no"), Some(i as u64));
        assert_eq!(key("split.count"), Some(count as u64));
        assert_eq!(key("split.tensors.count"), Some(sizes.len() as u64));
        assert_eq!(h.get("general.architecture").is_some(), i == 0);
        // At most `max` bytes, and only a file the next tensor would have
        // overfilled ends early.
        let mine = padded_sizes(path);
        let bytes: u64 = mine.iter().sum();
        assert!(bytes <= max, "file {i}: {bytes} > {max}");
        if i + 1 < count {
            assert!(
                bytes + sizes[tensors + mine.len()] > max,
                "file {i} ends early"
            );
        }
        tensors += mine.len();
    }
    assert_eq!(tensors, sizes.len());
    // Joined again, the files are the one-file slice byte for byte.
    let joined = f.out.with_file_name("joined.gguf");
    let again = make_model(&parts[0].0, None, None, &joined).unwrap();
    assert_eq!(again.sha256, one.sha256);

    // A size that holds the whole slice: one file, as the slice.
    let whole = make_model_split(&f.base, Some(&map), None, &out, total).unwrap();
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0], (out.clone(), one));

    // Below the largest tensor: refused, naming it, with nothing written.
    std::fs::remove_file(&out).unwrap();
    for (path, _) in &parts {
        std::fs::remove_file(path).unwrap();
    }
    let e = make_model_split(&f.base, Some(&map), None, &out, largest - 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("files of at most {} bytes: tensor", largest - 1)),
        "{e}"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// A file merged by `llama-gguf-split --merge` keeps `split.no = 0`,
/// `split.count = 0` and `split.tensors.count`: split again, its first
/// file holds each split key once, with the new values.
#[test]
fn a_merged_model_split_again_has_each_split_key_once() {
    let merged = model_with(
        &[
            ("split.no", Value::U16(0)),
            ("split.count", Value::U16(0)),
            ("split.tensors.count", Value::I32(12)),
        ],
        |_| {},
    );
    let f = files(&merged);
    let h = GgufReader::open(&f.base).unwrap().header;
    let largest = h.tensors.iter().map(|t| t.n_bytes).max().unwrap();
    let parts =
        make_model_split(&f.base, None, None, &f.out, largest.next_multiple_of(32)).unwrap();
    assert!(parts.len() >= 2);
    let first = GgufReader::open(&parts[0].0).unwrap().header;
    let count = |key: &str| first.kv.iter().filter(|(k, _)| k == key).count();
    for key in ["split.no", "split.count", "split.tensors.count"] {
        assert_eq!(count(key), 1, "{key}");
    }
    let value = |key: &str| first.get(key).and_then(GgufValue::as_u64);
    assert_eq!(value("split.count"), Some(parts.len() as u64));
    assert_eq!(value("split.tensors.count"), Some(h.tensors.len() as u64));
    let joined = gguf::split::open_joined(&parts[0].0).unwrap().header;
    let without_split: Vec<_> =
        h.kv.iter()
            .filter(|(k, _)| !k.starts_with("split."))
            .cloned()
            .collect();
    assert_eq!(joined.kv, without_split);
}

/// `general.*` of a slice: the name says what was pruned, the size label
/// is gguf-py's for the sliced tensors, and `general.base_model.*` names
/// the base (its name, organisation and repository), replacing the base's
/// own ancestry; every other entry is as it was.
#[test]
fn a_slice_names_its_base_and_its_size() {
    let extra = [
        ("general.name", Value::Str("Tiny GLM".into())),
        ("general.organization", Value::Str("Example".into())),
        (
            "general.repo_url",
            Value::Str("https://example.org/tiny".into()),
        ),
        ("general.size_label", Value::Str("8x1K".into())),
        ("general.base_model.count", Value::U32(1)),
        (
            "general.base_model.0.name",
            Value::Str("Tiny GLM Base".into()),
        ),
    ];
    let f = files(&model_with(&extra, |_| {}));
    let map = keep(&[(1, &[0, 3]), (2, &[1, 2])]);
    slice_model(&f.base, &map, &f.out).unwrap();
    let base = GgufReader::open(&f.base).unwrap().header;
    let r = GgufReader::open(&f.out).unwrap().header;
    let text = |k: &str| r.get(k).and_then(GgufValue::as_str).map(str::to_string);
    assert_eq!(
        text("general.name").as_deref(),
        Some(format!("Tiny GLM (pruned to 2 of {N_EXPERT} experts)").as_str())
    );
    assert_eq!(
        text("general.base_model.0.name").as_deref(),
        Some("Tiny GLM")
    );
    assert_eq!(
        text("general.base_model.0.organization").as_deref(),
        Some("Example")
    );
    assert_eq!(
        text("general.base_model.0.repo_url").as_deref(),
        Some("https://example.org/tiny")
    );
    assert_eq!(r.get("general.base_model.count"), Some(&GgufValue::U32(1)));
    // The size label, by gguf-py's rule over the slice's tensors: experts
    // per layer x (shared parameters + one expert's).
    let (mut shared, mut expert) = (0u64, 0u64);
    for t in &r.tensors {
        let n: u64 = t.dims.iter().product();
        if t.name.contains("_exps.") && t.dims.len() >= 3 {
            expert += n / t.dims[2];
        } else {
            shared += n;
        }
    }
    let want = format!("2x{:.2}K", (shared + expert) as f64 * 1e-3);
    assert_eq!(text("general.size_label"), Some(want));
    // Each key once, and the rest as the base had it.
    let keys: Vec<&String> = r.kv.iter().map(|(k, _)| k).collect();
    let unique: std::collections::BTreeSet<&&String> = keys.iter().collect();
    assert_eq!(keys.len(), unique.len(), "{keys:?}");
    for (k, v) in &base.kv {
        if !k.starts_with("general.") && k != "glm4moe.expert_count" {
            assert_eq!(r.get(k), Some(v), "{k}");
        }
    }
}

/// One layer of a test plan: `(centre, [(member, weight)])` per centre.
type PlanLayer<'a> = (u32, &'a [(u32, &'a [(u32, f64)])]);

/// A merge plan of layers 1 and 2 of the test model.
fn merge_plan(layers: &[PlanLayer<'_>]) -> MergePlan {
    use runfiles::mergeplan::{Centre, Member};
    MergePlan {
        method: "reap".into(),
        k: layers[0].1.len() as u32,
        params: serde_json::Value::Null,
        saliency_sha256: String::new(),
        layers: layers
            .iter()
            .map(|&(l, centres)| {
                let cs = centres
                    .iter()
                    .map(|&(centre, members)| Centre {
                        centre,
                        members: members
                            .iter()
                            .map(|&(expert, weight)| Member { expert, weight })
                            .collect(),
                    })
                    .collect();
                (l, cs)
            })
            .collect(),
    }
}

#[test]
fn a_merged_importance_matrix_adds_its_members_entries() {
    let f = files(&imatrix_bytes());
    let plan = merge_plan(&[
        (1, &[(0, &[(0, 5.0), (2, 1.0)]), (3, &[(3, 1.0)])]),
        (2, &[(1, &[(1, 1.0), (0, 2.0), (3, 0.5)]), (2, &[(2, 1.0)])]),
    ]);
    let sliced = merge_imatrix(&f.base, &plan, &f.out).unwrap();
    assert_eq!(sliced.k, 2);
    let mut r = GgufReader::open(&f.out).unwrap();
    for (layer, groups) in [
        (1u32, vec![vec![0usize, 2], vec![3]]),
        (2, vec![vec![1, 0, 3], vec![2]]),
    ] {
        let name = format!("blk.{layer}.ffn_up_exps.weight");
        let base = |e: usize, j: usize| (layer as usize * 1000 + e * 8 + j) as f32;
        let sums = f32s(&r.tensor_bytes(&format!("{name}.in_sum2")).unwrap());
        let want: Vec<f32> = groups
            .iter()
            .flat_map(|g| (0..8).map(move |j| g.iter().map(|&e| base(e, j)).sum::<f32>()))
            .collect();
        assert_eq!(
            sums, want,
            "{name}.in_sum2: members' sums added, weights aside"
        );
        let counts = f32s(&r.tensor_bytes(&format!("{name}.counts")).unwrap());
        let want: Vec<f32> = groups
            .iter()
            .map(|g| g.iter().map(|&e| (10 * e + layer as usize) as f32).sum())
            .collect();
        assert_eq!(counts, want, "{name}.counts");
    }
}

#[test]
fn merged_f32_experts_need_no_codec_and_quantised_ones_are_refused_without_one() {
    // The test model's layout with every expert tensor in F32.
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::Str("glm4moe".into()))
        .kv("glm4moe.expert_count", Value::U32(N_EXPERT as u32))
        .kv("glm4moe.expert_used_count", Value::U32(2));
    for layer in [1u32, 2] {
        for (name, dims) in [
            ("ffn_gate_inp", vec![8, N_EXPERT]),
            ("ffn_up_exps", vec![32, 2, N_EXPERT]),
            ("ffn_down_exps", vec![2, 8, N_EXPERT]),
        ] {
            let n: u64 = dims.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|i| (i as f32 * 0.37).sin() - layer as f32)
                .collect();
            g.tensor_f32(&format!("blk.{layer}.{name}.weight"), &dims, &values);
        }
    }
    let f32_model = g.to_bytes();
    let f = files(&f32_model);
    let plan = merge_plan(&[
        (1, &[(1, &[(1, 3.0), (0, 1.0)]), (2, &[(2, 1.0)])]),
        (2, &[(0, &[(0, 1.0)]), (3, &[(3, 1.0), (1, 1.0), (2, 2.0)])]),
    ]);
    merge_model(&f.base, &plan, None, &f.out).unwrap();
    let mut r = GgufReader::open(&f.out).unwrap();
    let mut base = GgufReader::open(&f.base).unwrap();
    let down = f32s(&r.tensor_bytes("blk.2.ffn_down_exps.weight").unwrap());
    let b = f32s(&base.tensor_bytes("blk.2.ffn_down_exps.weight").unwrap());
    // 16 values per expert: centre 0 alone, centre 3 = (e3 + e1 + 2 e2) / 4.
    assert_eq!(down[..16], b[..16]);
    for j in 0..16 {
        let want = (b[48 + j] as f64 + b[16 + j] as f64 + 2.0 * b[32 + j] as f64) / 4.0;
        assert_eq!(down[16 + j], want as f32, "value {j}");
    }
    // Router rows and selection biases are the centres'.
    let router = f32s(&r.tensor_bytes("blk.1.ffn_gate_inp.weight").unwrap());
    let b = f32s(&base.tensor_bytes("blk.1.ffn_gate_inp.weight").unwrap());
    assert_eq!(router, [&b[8..16], &b[16..24]].concat());
    // The quantised model cannot be merged without a codec: refused, no file.
    let q = files(&model());
    let err = merge_model(&q.base, &plan, None, &q.out).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("blk.1.ffn_up_exps.weight") && msg.contains("needs ggml's type traits"),
        "{msg}"
    );
    assert!(!q.out.exists());
    // A plan that does not fit is refused like a keep map.
    let bad = merge_plan(&[
        (1, &[(1, &[(1, 1.0), (9, 1.0)]), (2, &[(2, 1.0)])]),
        (2, &[(0, &[(0, 1.0)]), (3, &[(3, 1.0)])]),
    ]);
    let msg = merge_model(&f.base, &bad, None, &f.out)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("layer 1 merges expert 9, but there are 4"),
        "{msg}"
    );
}
