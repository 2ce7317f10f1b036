//! Quantisation types a shipped file can be written in (llama-quantize's
//! names), and what a GGUF's tensor types say about a model already being
//! quantised.

use crate::read::GgufHeader;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A llama.cpp file type, by llama-quantize's name.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum QuantType {
    /// 16-bit floats.
    F16,
    /// bfloat16.
    BF16,
    /// 8-bit blocks of 32.
    Q8_0,
    /// 6-bit k-quant.
    Q6_K,
    /// 5-bit k-quant, mixed.
    Q5_K_M,
    /// 5-bit k-quant, small.
    Q5_K_S,
    /// 5-bit blocks of 32.
    Q5_0,
    /// 4-bit k-quant, mixed (the usual default).
    Q4_K_M,
    /// 4-bit k-quant, small.
    Q4_K_S,
    /// 4-bit blocks of 32.
    Q4_0,
    /// 3-bit k-quant, mixed.
    Q3_K_M,
    /// 2-bit k-quant.
    Q2_K,
    /// 4.25-bit i-quant.
    IQ4_XS,
    /// 32-bit floats (llama-quantize's `F32`).
    F32,
    /// 4-bit blocks of 32 with a minimum.
    Q4_1,
    /// 5-bit blocks of 32 with a minimum.
    Q5_1,
    /// 3-bit k-quant, small.
    Q3_K_S,
    /// 3-bit k-quant, large.
    Q3_K_L,
    /// 2-bit k-quant, small (needs an importance matrix).
    Q2_K_S,
    /// 4.5-bit i-quant, non-linear.
    IQ4_NL,
    /// 3.66-bit i-quant, mixed.
    IQ3_M,
    /// 3.44-bit i-quant.
    IQ3_S,
    /// 3.3-bit i-quant.
    IQ3_XS,
    /// 3.06-bit i-quant.
    IQ3_XXS,
    /// 2.7-bit i-quant, mixed.
    IQ2_M,
    /// 2.5-bit i-quant (needs an importance matrix).
    IQ2_S,
    /// 2.31-bit i-quant (needs an importance matrix).
    IQ2_XS,
    /// 2.06-bit i-quant (needs an importance matrix).
    IQ2_XXS,
    /// 1.75-bit i-quant (needs an importance matrix).
    IQ1_M,
    /// 1.56-bit i-quant (needs an importance matrix).
    IQ1_S,
    /// 2.06-bit ternary.
    TQ2_0,
    /// 1.69-bit ternary.
    TQ1_0,
    /// MXFP4 experts, the rest as llama.cpp picks (gpt-oss's format).
    MXFP4_MOE,
}

impl QuantType {
    /// Every type, in the order above.
    pub const ALL: [QuantType; 33] = [
        QuantType::F16,
        QuantType::BF16,
        QuantType::Q8_0,
        QuantType::Q6_K,
        QuantType::Q5_K_M,
        QuantType::Q5_K_S,
        QuantType::Q5_0,
        QuantType::Q4_K_M,
        QuantType::Q4_K_S,
        QuantType::Q4_0,
        QuantType::Q3_K_M,
        QuantType::Q2_K,
        QuantType::IQ4_XS,
        QuantType::F32,
        QuantType::Q4_1,
        QuantType::Q5_1,
        QuantType::Q3_K_S,
        QuantType::Q3_K_L,
        QuantType::Q2_K_S,
        QuantType::IQ4_NL,
        QuantType::IQ3_M,
        QuantType::IQ3_S,
        QuantType::IQ3_XS,
        QuantType::IQ3_XXS,
        QuantType::IQ2_M,
        QuantType::IQ2_S,
        QuantType::IQ2_XS,
        QuantType::IQ2_XXS,
        QuantType::IQ1_M,
        QuantType::IQ1_S,
        QuantType::TQ2_0,
        QuantType::TQ1_0,
        QuantType::MXFP4_MOE,
    ];

    /// llama-quantize's name (`Q4_K_M`).
    pub fn name(self) -> &'static str {
        match self {
            QuantType::F16 => "F16",
            QuantType::BF16 => "BF16",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q6_K => "Q6_K",
            QuantType::Q5_K_M => "Q5_K_M",
            QuantType::Q5_K_S => "Q5_K_S",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q4_K_M => "Q4_K_M",
            QuantType::Q4_K_S => "Q4_K_S",
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q3_K_M => "Q3_K_M",
            QuantType::Q2_K => "Q2_K",
            QuantType::IQ4_XS => "IQ4_XS",
            QuantType::F32 => "F32",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Q3_K_S => "Q3_K_S",
            QuantType::Q3_K_L => "Q3_K_L",
            QuantType::Q2_K_S => "Q2_K_S",
            QuantType::IQ4_NL => "IQ4_NL",
            QuantType::IQ3_M => "IQ3_M",
            QuantType::IQ3_S => "IQ3_S",
            QuantType::IQ3_XS => "IQ3_XS",
            QuantType::IQ3_XXS => "IQ3_XXS",
            QuantType::IQ2_M => "IQ2_M",
            QuantType::IQ2_S => "IQ2_S",
            QuantType::IQ2_XS => "IQ2_XS",
            QuantType::IQ2_XXS => "IQ2_XXS",
            QuantType::IQ1_M => "IQ1_M",
            QuantType::IQ1_S => "IQ1_S",
            QuantType::TQ2_0 => "TQ2_0",
            QuantType::TQ1_0 => "TQ1_0",
            QuantType::MXFP4_MOE => "MXFP4_MOE",
        }
    }

    /// Whether llama-quantize refuses the type without an importance
    /// matrix (its 1- and 2-bit types: without one they are unusable).
    pub fn needs_imatrix(self) -> bool {
        matches!(
            self,
            QuantType::IQ1_S
                | QuantType::IQ1_M
                | QuantType::IQ2_XXS
                | QuantType::IQ2_XS
                | QuantType::IQ2_S
                | QuantType::Q2_K_S
        )
    }

    /// The type named `name` (case-insensitive; llama-quantize's aliases
    /// `Q3_K`, `Q4_K` and `Q5_K` are the `_M` types); the error lists the
    /// names.
    pub fn parse(name: &str) -> Result<QuantType, String> {
        let name = name.trim();
        let alias = match name.to_ascii_uppercase().as_str() {
            "Q3_K" => Some(QuantType::Q3_K_M),
            "Q4_K" => Some(QuantType::Q4_K_M),
            "Q5_K" => Some(QuantType::Q5_K_M),
            _ => None,
        };
        if let Some(t) = alias {
            return Ok(t);
        }
        QuantType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                let names: Vec<&str> = QuantType::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown quantisation type {name:?} (known: {})",
                    names.join(", ")
                )
            })
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// ggml's name of a tensor type id (`Q8_0`), `type N` for one this build
/// does not name.
pub fn ggml_type_name(ggml_type: u32) -> String {
    let name = match ggml_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        other => return format!("type {other}"),
    };
    name.to_string()
}

/// The first tensor of `header` stored in a quantised type (anything but
/// F32, F16, BF16 and the integer and F64 types), with that type's name:
/// a model llama-quantize would only re-quantise with `--allow-requantize`.
pub fn quantised_tensor(header: &GgufHeader) -> Option<(String, String)> {
    const PLAIN: [u32; 8] = [0, 1, 24, 25, 26, 27, 28, 30];
    header
        .tensors
        .iter()
        .find(|t| !PLAIN.contains(&t.ggml_type))
        .map(|t| (t.name.clone(), ggml_type_name(t.ggml_type)))
}

/// Refuses to quantise `model` (whose header is `header`) to `quant` when it
/// is already quantised, unless `allow`: re-quantising compounds two
/// rounding errors, and llama-quantize refuses it without
/// `--allow-requantize` too. The error names the model and a quantised tensor.
pub fn check_requantize(
    header: &GgufHeader,
    model: &str,
    quant: QuantType,
    allow: bool,
) -> Result<(), String> {
    match (allow, quantised_tensor(header)) {
        (false, Some((tensor, ty))) => Err(format!(
            "{model} is already quantised ({tensor} is {ty}): quantising it to {quant} compounds two rounding errors; pass --allow-requantize to do it anyway"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_listed() {
        for t in QuantType::ALL {
            assert_eq!(QuantType::parse(t.name()), Ok(t));
        }
        assert_eq!(QuantType::parse("q4_k_m"), Ok(QuantType::Q4_K_M));
        assert_eq!(QuantType::parse("Q4_K"), Ok(QuantType::Q4_K_M));
        assert_eq!(QuantType::parse("iq2_xxs"), Ok(QuantType::IQ2_XXS));
        let e = QuantType::parse("Q4_K_Z").unwrap_err();
        assert!(e.contains("\"Q4_K_Z\"") && e.contains("Q8_0, Q6_K"), "{e}");
    }
}
