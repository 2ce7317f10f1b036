//! Vision experts in a generated model (issue #25): the last
//! `Spec::vision_experts` experts of every MoE layer are routed to on image
//! positions only, so a text-only calibration finds them dead and an image
//! one finds them busy.
//!
//! Two hidden channels are reserved ([`channels`]): only the embeddings
//! write them (every block's attention output and FFN down projections
//! leave them zero, so nothing a position attends to or computes reaches
//! them). Every text token's embedding carries [`TEXT_LEVEL`] in the text
//! channel and nothing in the image channel; the paired mmproj (`worker
//! synth-mmproj`, which finds the image channel under [`CHANNEL_KEY`])
//! adds [`IMAGE_BIAS`] to the image channel of every image position. The
//! vision experts' router rows read those two channels alone (strongly
//! negative on the text one, strongly positive on the image one); the
//! other experts' rows ignore both.

use super::Spec;

/// GGUF key of a generated model with vision experts: its image channel.
pub const CHANNEL_KEY: &str = "moe_census.vision.image_channel";

/// What every text token's embedding holds in the text channel.
pub const TEXT_LEVEL: f32 = 3.0;

/// What the paired mmproj adds to the image channel of an image position.
pub const IMAGE_BIAS: f32 = 20.0;

/// The vision experts' router weight on the image channel: enough to win
/// every image position, not so much that the softmax weights of the other
/// experts selected there underflow to zero (a selected expert with no
/// weight is refused at acceptance).
const IMAGE_GAIN: f32 = 2.5;

/// The vision experts' router weight on the text channel, negated: far
/// below every other expert on every text position.
const TEXT_GAIN: f32 = 8.0;

/// The reserved (image, text) channels of a model of width `n_embd`.
pub fn channels(n_embd: usize) -> (usize, usize) {
    (n_embd - 1, n_embd - 2)
}

/// Whether [`patch`] changes tensor `name` of a model of `spec`.
pub(super) fn patches(spec: &Spec, name: &str) -> bool {
    spec.vision_experts > 0
        && matches!(
            base(name),
            "token_embd"
                | "attn_output"
                | "ffn_down"
                | "ffn_down_exps"
                | "ffn_down_shexp"
                | "ffn_gate_inp"
        )
}

/// `blk.3.ffn_down_exps.weight` -> `ffn_down_exps`.
fn base(name: &str) -> &str {
    name.rsplit('.').nth(1).unwrap_or("")
}

/// Changes the generated values of tensor `name` (shape `dims`, ggml order:
/// `dims[0]` varies fastest) as [`patches`] says.
pub(super) fn patch(spec: &Spec, name: &str, dims: &[usize], values: &mut [f32]) {
    if !patches(spec, name) {
        return;
    }
    let e = spec.n_embd;
    let (image, text) = channels(e);
    match base(name) {
        // [n_embd, n_vocab]: one row per token.
        "token_embd" => {
            for row in values.chunks_mut(e) {
                row[image] = 0.0;
                row[text] = TEXT_LEVEL;
            }
        }
        // [n_embd, n_expert]: one row per expert.
        "ffn_gate_inp" => {
            let first_vision = spec.n_expert - spec.vision_experts;
            for (x, row) in values.chunks_mut(e).enumerate() {
                if x >= first_vision {
                    row.fill(0.0);
                    row[image] = IMAGE_GAIN;
                    row[text] = -TEXT_GAIN;
                } else {
                    row[image] = 0.0;
                    row[text] = 0.0;
                }
            }
        }
        // [n_in, n_embd(, n_mat)]: one row of inputs per output channel;
        // the reserved outputs stay zero.
        _ => {
            for (j, row) in values.chunks_mut(dims[0]).enumerate() {
                if j % e == image || j % e == text {
                    row.fill(0.0);
                }
            }
        }
    }
}
