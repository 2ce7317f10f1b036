//! Each family's metadata and tensors, as llama.cpp's loader for that
//! architecture reads them (`load_arch_hparams` and `load_arch_tensors` in
//! `src/models/<arch>.cpp`): names, shapes and which keys are required.
//! Layout knowledge lives here only because a generator must write it; the
//! collector never reads it, it reads the graph.

use super::builder::Builder;
use super::Spec;
use gguf::write::Value;

/// MLA (deepseek2): rank of the query compression.
const Q_LORA: usize = 32;
/// MLA: rank of the key/value compression (the cached latent).
const KV_LORA: usize = 32;
/// MLA: rotary part of each query/key head.
const QK_ROPE: usize = 8;
/// Gated DeltaNet (qwen3next, qwen35moe): convolution kernel.
const D_CONV: usize = 4;
/// Gated DeltaNet: head size of keys and values (`ssm.state_size`).
const D_STATE: usize = 16;
/// Gated DeltaNet: value heads (`ssm.time_step_rank`).
const V_HEADS: usize = 4;
/// Gated DeltaNet: key heads (`ssm.group_count`).
const K_HEADS: usize = 2;
/// Hybrid models: every 4th block has full attention, the others DeltaNet.
const FULL_ATTN_INTERVAL: usize = 4;
/// gpt-oss: sliding window of its SWA blocks.
const SLIDING_WINDOW: u32 = 128;

fn hybrid(arch: &str) -> bool {
    matches!(arch, "qwen3next" | "qwen35moe")
}

/// Every `{arch}.*` key the family's loader reads.
pub(super) fn metadata(b: &mut Builder<'_>) {
    let s = b.spec;
    let a = s.arch;
    let key = |k: &str| format!("{a}.{k}");
    let (key_len, value_len) = if a == "deepseek2" {
        // MLA stores the latent as a single KV head (MQA view).
        (KV_LORA + QK_ROPE, KV_LORA)
    } else {
        (s.head_dim, s.head_dim)
    };
    let ff = match a {
        // These read the expert width from feed_forward_length.
        "llama" | "granitemoe" | "minimax-m2" => s.n_ff_exp,
        _ => s.n_ff_dense.max(s.n_ff_exp),
    };
    b.g.kv(&key("context_length"), Value::U32(4096))
        .kv(&key("embedding_length"), Value::U32(s.n_embd as u32))
        .kv(
            &key("block_count"),
            Value::U32((s.n_layer + s.n_nextn) as u32),
        )
        .kv(&key("feed_forward_length"), Value::U32(ff as u32))
        .kv(&key("attention.head_count"), Value::U32(s.n_head as u32))
        .kv(
            &key("attention.head_count_kv"),
            Value::U32(s.n_head_kv as u32),
        )
        .kv(&key("attention.key_length"), Value::U32(key_len as u32))
        .kv(&key("attention.value_length"), Value::U32(value_len as u32))
        .kv(&key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .kv(&key("rope.freq_base"), Value::F32(10000.0));
    if s.n_expert > 0 {
        b.g.kv(&key("expert_count"), Value::U32(s.n_expert as u32))
            .kv(
                &key("expert_used_count"),
                Value::U32(s.n_expert_used as u32),
            )
            .kv(
                &key("expert_feed_forward_length"),
                Value::U32(s.n_ff_exp as u32),
            );
    }
    let u = |v: usize| Value::U32(v as u32);
    let mut kvs: Vec<(&str, Value)> = Vec::new();
    match a {
        "glm4moe" => kvs.extend([
            ("leading_dense_block_count", u(s.n_dense_lead)),
            ("expert_shared_count", u(s.n_shared)),
            ("expert_weights_norm", Value::Bool(true)),
            ("expert_weights_scale", Value::F32(2.5)),
            ("expert_gating_func", u(2)),
            ("rope.dimension_count", u(s.head_dim)),
        ]),
        "gpt-oss" => kvs.push(("attention.sliding_window", Value::U32(SLIDING_WINDOW))),
        // Without attention.sliding_window, llama.cpp gives llama4 its
        // chunked attention (8,192-token chunks, with temperature tuning).
        "llama4" => kvs.push(("interleave_moe_layer_step", u(s.moe_step))),
        "deepseek2" => {
            let v3 = s.gating_key.is_some();
            kvs.extend([
                ("leading_dense_block_count", u(s.n_dense_lead)),
                ("attention.q_lora_rank", u(Q_LORA)),
                ("attention.kv_lora_rank", u(KV_LORA)),
                ("attention.key_length_mla", u(s.head_dim + QK_ROPE)),
                ("attention.value_length_mla", u(s.head_dim)),
                ("rope.dimension_count", u(QK_ROPE)),
                ("expert_shared_count", u(s.n_shared)),
                ("expert_weights_norm", Value::Bool(v3)),
                (
                    "expert_weights_scale",
                    Value::F32(if v3 { 2.5 } else { 1.0 }),
                ),
            ]);
        }
        "qwen3next" | "qwen35moe" => {
            kvs.extend([
                (
                    "expert_shared_feed_forward_length",
                    u(s.n_ff_exp * s.n_shared),
                ),
                ("ssm.conv_kernel", u(D_CONV)),
                ("ssm.inner_size", u(D_STATE * V_HEADS)),
                ("ssm.state_size", u(D_STATE)),
                ("ssm.time_step_rank", u(V_HEADS)),
                ("ssm.group_count", u(K_HEADS)),
                ("full_attention_interval", u(FULL_ATTN_INTERVAL)),
                ("rope.dimension_count", u(s.head_dim / 2)),
            ]);
            if a == "qwen35moe" {
                kvs.push(("rope.dimension_sections", Value::I32Array(vec![2, 1, 1, 0])));
            }
        }
        "granitemoe" => kvs.extend([
            ("logit_scale", Value::F32(2.0)),
            ("residual_scale", Value::F32(0.5)),
            ("embedding_scale", Value::F32(4.0)),
            ("attention.scale", Value::F32(0.25)),
        ]),
        "llama" | "minimax-m2" => kvs.push(("rope.dimension_count", u(s.head_dim))),
        "qwen2moe" => kvs.push((
            "expert_shared_feed_forward_length",
            u(s.n_ff_exp * s.n_shared),
        )),
        _ => {}
    }
    if a != "glm4moe" {
        if let Some(g) = s.gating_key {
            kvs.push(("expert_gating_func", u(g as usize)));
        }
    }
    if s.groups.0 > 1 {
        kvs.extend([
            ("expert_group_count", u(s.groups.0)),
            ("expert_group_used_count", u(s.groups.1)),
        ]);
    }
    if s.n_nextn > 0 {
        kvs.push(("nextn_predict_layers", u(s.n_nextn)));
    }
    for (k, v) in kvs {
        b.g.kv(&key(k), v);
    }
}

/// Embeddings, output head and every block (NextN blocks last).
pub(super) fn tensors(b: &mut Builder<'_>, n_vocab: usize) {
    let e = b.spec.n_embd;
    b.matrix("token_embd.weight", &[e, n_vocab], 3.0);
    b.norm("output_norm.weight", e);
    if !b.spec.tied_output {
        b.matrix("output.weight", &[e, n_vocab], 1.0);
    }
    for i in 0..b.spec.n_layer + b.spec.n_nextn {
        attention(b, i);
        ffn(b, i);
        if i >= b.spec.n_layer {
            nextn(b, i);
        }
    }
}

/// The attention part of block `i` and the norm before its FFN.
fn attention(b: &mut Builder<'_>, i: usize) {
    let s: &Spec = b.spec;
    let (a, e, hd) = (s.arch, s.n_embd, s.head_dim);
    let (q, kv) = (s.n_head * hd, s.n_head_kv * hd);
    let t = |n: &str| format!("blk.{i}.{n}.weight");
    b.norm(&t("attn_norm"), e);
    match a {
        "deepseek2" => {
            b.norm(&t("attn_q_a_norm"), Q_LORA);
            b.norm(&t("attn_kv_a_norm"), KV_LORA);
            b.matrix(&t("attn_q_a"), &[e, Q_LORA], 1.0);
            b.matrix(&t("attn_q_b"), &[Q_LORA, s.n_head * (hd + QK_ROPE)], 1.0);
            b.matrix(&t("attn_kv_a_mqa"), &[e, KV_LORA + QK_ROPE], 1.0);
            b.matrix(&t("attn_k_b"), &[hd, KV_LORA, s.n_head], 1.0);
            b.matrix(&t("attn_v_b"), &[KV_LORA, hd, s.n_head], 1.0);
            b.matrix(&t("attn_output"), &[s.n_head * hd, e], 1.0);
        }
        _ if hybrid(a) && !(i + 1).is_multiple_of(FULL_ATTN_INTERVAL) && i < s.n_layer => {
            let (key_dim, value_dim) = (D_STATE * K_HEADS, D_STATE * V_HEADS);
            b.matrix(&t("attn_qkv"), &[e, 2 * key_dim + value_dim], 1.0);
            b.matrix(&t("attn_gate"), &[e, value_dim], 1.0);
            b.small_f32(&t("ssm_conv1d"), &[D_CONV, 2 * key_dim + value_dim], 0.5);
            b.vector(&format!("blk.{i}.ssm_dt.bias"), V_HEADS, 0.0, 0.5);
            // A = -exp(A_log) < 0: every step decays the state.
            b.vector(&format!("blk.{i}.ssm_a"), V_HEADS, -0.75, 0.25);
            if a == "qwen35moe" {
                b.matrix(&t("ssm_beta"), &[e, V_HEADS], 1.0);
                b.matrix(&t("ssm_alpha"), &[e, V_HEADS], 1.0);
            } else {
                b.matrix(&t("ssm_ba"), &[e, 2 * V_HEADS], 1.0);
            }
            b.norm(&t("ssm_norm"), D_STATE);
            b.matrix(&t("ssm_out"), &[value_dim, e], 1.0);
        }
        _ => {
            // Hybrid attention blocks project the query and its gate together.
            let q_out = if hybrid(a) { 2 * q } else { q };
            b.matrix(&t("attn_q"), &[e, q_out], 1.0);
            b.matrix(&t("attn_k"), &[e, kv], 1.0);
            b.matrix(&t("attn_v"), &[e, kv], 1.0);
            b.matrix(&t("attn_output"), &[q, e], 1.0);
            if a == "gpt-oss" {
                for (n, len) in [
                    ("attn_q", q),
                    ("attn_k", kv),
                    ("attn_v", kv),
                    ("attn_output", e),
                ] {
                    b.small_f32(&format!("blk.{i}.{n}.bias"), &[len], 0.05);
                }
                b.vector(&t("attn_sinks"), s.n_head, 0.0, 1.0);
            }
            match a {
                "qwen3" | "qwen3moe" | "qwen3next" | "qwen35moe" => {
                    b.norm(&t("attn_q_norm"), hd);
                    b.norm(&t("attn_k_norm"), hd);
                }
                "minimax-m2" => {
                    b.norm(&t("attn_q_norm"), q);
                    b.norm(&t("attn_k_norm"), kv);
                }
                _ => {}
            }
        }
    }
    let pre_ffn = match a {
        "glm4moe" | "gpt-oss" | "qwen3next" | "qwen35moe" => "post_attention_norm",
        _ => "ffn_norm",
    };
    b.norm(&t(pre_ffn), e);
}

/// The FFN of block `i`: dense, or router, routed experts, shared experts
/// and the selection bias.
fn ffn(b: &mut Builder<'_>, i: usize) {
    let s: &Spec = b.spec;
    let (a, e) = (s.arch, s.n_embd);
    let t = |n: &str| format!("blk.{i}.{n}.weight");
    if !s.is_moe(i) {
        b.matrix(&t("ffn_gate"), &[e, s.n_ff_dense], 1.0);
        b.matrix(&t("ffn_up"), &[e, s.n_ff_dense], 1.0);
        b.matrix(&t("ffn_down"), &[s.n_ff_dense, e], 1.0);
        return;
    }
    let (n, ff) = (s.n_expert, s.n_ff_exp);
    b.router(&t("ffn_gate_inp"));
    match s.fused_gate_up {
        true => b.matrix(&t("ffn_gate_up_exps"), &[e, 2 * ff, n], 1.0),
        false => {
            b.matrix(&t("ffn_gate_exps"), &[e, ff, n], 1.0);
            b.matrix(&t("ffn_up_exps"), &[e, ff, n], 1.0);
        }
    }
    b.matrix(&t("ffn_down_exps"), &[ff, e, n], 1.0);
    if a == "gpt-oss" {
        let bias = |x: &str| format!("blk.{i}.{x}.bias");
        b.small_f32(&bias("ffn_gate_inp"), &[n], 0.5);
        b.small_f32(&bias("ffn_gate_exps"), &[ff, n], 0.05);
        b.small_f32(&bias("ffn_up_exps"), &[ff, n], 0.05);
        b.small_f32(&bias("ffn_down_exps"), &[e, n], 0.05);
    }
    if s.n_shared > 0 {
        let w = ff * s.n_shared;
        b.matrix(&t("ffn_gate_shexp"), &[e, w], 1.0);
        b.matrix(&t("ffn_up_shexp"), &[e, w], 1.0);
        b.matrix(&t("ffn_down_shexp"), &[w, e], 1.0);
        if matches!(a, "qwen2moe" | "qwen3next" | "qwen35moe") {
            b.small_f32(&t("ffn_gate_inp_shexp"), &[e], 0.3);
        }
    }
    if a == "glm4moe" || (a == "deepseek2" && s.gating_key.is_some()) || a == "minimax-m2" {
        b.small_f32(&format!("blk.{i}.exp_probs_b.bias"), &[n], 0.05);
    }
}

/// The NextN (MTP) tensors of block `i`: the projection of the embedding
/// and the previous hidden state, and their norms.
fn nextn(b: &mut Builder<'_>, i: usize) {
    let e = b.spec.n_embd;
    b.matrix(&format!("blk.{i}.nextn.eh_proj.weight"), &[2 * e, e], 1.0);
    b.norm(&format!("blk.{i}.nextn.enorm.weight"), e);
    b.norm(&format!("blk.{i}.nextn.hnorm.weight"), e);
    b.norm(&format!("blk.{i}.nextn.shared_head_norm.weight"), e);
}
