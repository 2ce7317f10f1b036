//! Flags whose value names one of a library enum's values: the libraries
//! know no command line, so each enum has a clap value enum here that
//! mirrors it (same names, same help), with one conversion each way so that
//! a variant added on either side fails to compile until both agree, and a
//! parser into the library's own type (`value_parser = values::preset()`)
//! for the binaries' flags, the bench binaries' included.

use clap::builder::{EnumValueParser, TypedValueParser};

/// [`config::method::Method`] as a flag's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum MethodFlag {
    /// `count`.
    Frequency,
    /// `reap_l2_sum / count`.
    ReapMean,
    /// `reap_l2_sum`.
    ReapL2Sum,
    /// `(reap_l2_sum + m * mu0) / (count + m)`.
    ReapShrink,
    /// Mean of the ranks under `reap_l2_sum` and `reap_shrink`.
    ReapHybrid,
    /// The experts maximising the smallest, over calibration domains, of
    /// the domain's retained share of its `reap_l2_sum` (greedy leximin).
    WorstDomain,
}

/// Parses a flag's value into a [`config::method::Method`].
pub fn method() -> impl TypedValueParser<Value = config::method::Method> {
    EnumValueParser::<MethodFlag>::new().map(config::method::Method::from)
}

impl From<MethodFlag> for config::method::Method {
    fn from(f: MethodFlag) -> config::method::Method {
        match f {
            MethodFlag::Frequency => config::method::Method::Frequency,
            MethodFlag::ReapMean => config::method::Method::ReapMean,
            MethodFlag::ReapL2Sum => config::method::Method::ReapL2Sum,
            MethodFlag::ReapShrink => config::method::Method::ReapShrink,
            MethodFlag::ReapHybrid => config::method::Method::ReapHybrid,
            MethodFlag::WorstDomain => config::method::Method::WorstDomain,
        }
    }
}

impl From<config::method::Method> for MethodFlag {
    fn from(v: config::method::Method) -> MethodFlag {
        match v {
            config::method::Method::Frequency => MethodFlag::Frequency,
            config::method::Method::ReapMean => MethodFlag::ReapMean,
            config::method::Method::ReapL2Sum => MethodFlag::ReapL2Sum,
            config::method::Method::ReapShrink => MethodFlag::ReapShrink,
            config::method::Method::ReapHybrid => MethodFlag::ReapHybrid,
            config::method::Method::WorstDomain => MethodFlag::WorstDomain,
        }
    }
}

/// [`replay::results::Mode`] as a flag's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeFlag {
    /// One token (decode-like).
    Token,
    /// One ubatch of a chunk (prefill-like): the union of its experts.
    Ubatch,
}

/// Parses a flag's value into a [`replay::results::Mode`].
pub fn mode() -> impl TypedValueParser<Value = replay::results::Mode> {
    EnumValueParser::<ModeFlag>::new().map(replay::results::Mode::from)
}

impl From<ModeFlag> for replay::results::Mode {
    fn from(f: ModeFlag) -> replay::results::Mode {
        match f {
            ModeFlag::Token => replay::results::Mode::Token,
            ModeFlag::Ubatch => replay::results::Mode::Ubatch,
        }
    }
}

impl From<replay::results::Mode> for ModeFlag {
    fn from(v: replay::results::Mode) -> ModeFlag {
        match v {
            replay::results::Mode::Token => ModeFlag::Token,
            replay::results::Mode::Ubatch => ModeFlag::Ubatch,
        }
    }
}

/// [`synth::Preset`] as a flag's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PresetFlag {
    /// qwen3moe, 3 MoE layers, 16 experts, top-4, f32.
    Tiny,
    /// glm4moe, 1 dense + 3 MoE layers, 24 experts, top-4, sigmoid + bias, shared expert, f32.
    TinyAlt,
    /// qwen3moe, 8 MoE layers, 64 experts, top-8, hidden 512, Q8_0.
    Bench,
    /// qwen3moe, 48 MoE layers, 512 experts, top-10, hidden 64, expert width 16, f16.
    Wide,
    /// qwen3moe, 2 MoE layers, 512 experts, top-10, hidden 2048, expert width 32, Q8_0.
    WideHidden,
    /// qwen3moe at Qwen3-Next's routing width: 4 MoE layers, 512 experts,
    /// top-10, hidden 2048, expert width 512, Q8_0 (about 6.8 GB); for
    /// costs that scale with the real per-layer work (the lookahead's).
    RealWidth,
    /// qwen3 without experts: a valid model that the collector must refuse.
    Dense,
    /// glm4moe like `tiny-alt` (1 dense + 2 MoE layers, 16 experts, top-4)
    /// with hidden size and expert width 256, f16: every expert row is a
    /// whole number of k-quant blocks.
    TinyAltQk,
    /// gpt-oss: softmax over the selected logits, router and expert biases,
    /// attention sinks; 3 MoE layers, 16 experts, top-4.
    GptOss,
    /// llama4: sigmoid gate on the expert input, an ungated shared expert;
    /// 4 MoE layers, 16 experts, top-1.
    Llama4,
    /// llama4 with `interleave_moe_layer_step = 2` (Maverick): blocks 1 and
    /// 3 of 4 are MoE, 0 and 2 dense.
    Llama4Interleaved,
    /// deepseek2 as DeepSeek-V3: MLA attention, 1 dense + 3 MoE layers, 32
    /// experts in 4 groups (2 used), top-4, sigmoid with a selection bias,
    /// normalised weights scaled by 2.5, a shared expert.
    Deepseek2,
    /// deepseek2 as DeepSeek-V2: MLA, no `expert_gating_func` key (llama.cpp
    /// runs softmax), unnormalised weights, 16 experts, top-4.
    Deepseek2V2,
    /// `deepseek2` with softmax gating (`expert_gating_func = 1`) and its
    /// selection bias: a pruned model's softmax runs over the kept experts,
    /// which can reorder them against the bias.
    Deepseek2Softmax,
    /// glm4moe with an MTP (NextN) block: 1 dense + 2 MoE layers and block 3
    /// as NextN, 16 experts, top-4.
    Glm4moeMtp,
    /// qwen3next: gated DeltaNet and attention layers (3 + 1), softmax
    /// routing, a sigmoid-gated shared expert; 16 experts, top-4.
    Qwen3next,
    /// qwen3next with an MTP block after its 4 layers.
    Qwen3nextMtp,
    /// qwen35moe: Qwen3.5's hybrid layout (separate DeltaNet beta and alpha
    /// projections, multi-section RoPE); 16 experts, top-4.
    Qwen35moe,
    /// qwen35moe with each expert's gate and up projections fused in one
    /// tensor (`ffn_gate_up_exps`, gate rows first), hidden size and expert
    /// width 256: every expert row is a whole number of k-quant blocks.
    Qwen35moeFused,
    /// granitemoe: softmax top-k with logit, residual and embedding scales;
    /// 16 experts, top-4.
    Granitemoe,
    /// mixtral (llama.cpp's `llama` with experts): 8 experts, top-2.
    Mixtral,
    /// qwen2moe: softmax, unnormalised weights, a sigmoid-gated shared
    /// expert; 16 experts, top-4.
    Qwen2moe,
    /// minimax-m2: sigmoid with a selection bias, per-head q/k norms over
    /// all heads; 16 experts, top-4.
    MinimaxM2,
    /// qwen3moe with Qwen3's vocabulary size (151,936), hidden 2048, 3 MoE
    /// layers, 512 experts, top-10, expert width 32, Q8_0, tied embeddings.
    #[value(name = "vocab-152k")]
    Vocab152k,
    /// `vocab-152k` with Qwen3.5's vocabulary size (248,320).
    #[value(name = "vocab-248k")]
    Vocab248k,
}

/// Parses a flag's value into a [`synth::Preset`].
pub fn preset() -> impl TypedValueParser<Value = synth::Preset> {
    EnumValueParser::<PresetFlag>::new().map(synth::Preset::from)
}

impl From<PresetFlag> for synth::Preset {
    fn from(f: PresetFlag) -> synth::Preset {
        match f {
            PresetFlag::Tiny => synth::Preset::Tiny,
            PresetFlag::TinyAlt => synth::Preset::TinyAlt,
            PresetFlag::Bench => synth::Preset::Bench,
            PresetFlag::Wide => synth::Preset::Wide,
            PresetFlag::WideHidden => synth::Preset::WideHidden,
            PresetFlag::RealWidth => synth::Preset::RealWidth,
            PresetFlag::Dense => synth::Preset::Dense,
            PresetFlag::TinyAltQk => synth::Preset::TinyAltQk,
            PresetFlag::GptOss => synth::Preset::GptOss,
            PresetFlag::Llama4 => synth::Preset::Llama4,
            PresetFlag::Llama4Interleaved => synth::Preset::Llama4Interleaved,
            PresetFlag::Deepseek2 => synth::Preset::Deepseek2,
            PresetFlag::Deepseek2V2 => synth::Preset::Deepseek2V2,
            PresetFlag::Deepseek2Softmax => synth::Preset::Deepseek2Softmax,
            PresetFlag::Glm4moeMtp => synth::Preset::Glm4moeMtp,
            PresetFlag::Qwen3next => synth::Preset::Qwen3next,
            PresetFlag::Qwen3nextMtp => synth::Preset::Qwen3nextMtp,
            PresetFlag::Qwen35moe => synth::Preset::Qwen35moe,
            PresetFlag::Qwen35moeFused => synth::Preset::Qwen35moeFused,
            PresetFlag::Granitemoe => synth::Preset::Granitemoe,
            PresetFlag::Mixtral => synth::Preset::Mixtral,
            PresetFlag::Qwen2moe => synth::Preset::Qwen2moe,
            PresetFlag::MinimaxM2 => synth::Preset::MinimaxM2,
            PresetFlag::Vocab152k => synth::Preset::Vocab152k,
            PresetFlag::Vocab248k => synth::Preset::Vocab248k,
        }
    }
}

impl From<synth::Preset> for PresetFlag {
    fn from(v: synth::Preset) -> PresetFlag {
        match v {
            synth::Preset::Tiny => PresetFlag::Tiny,
            synth::Preset::TinyAlt => PresetFlag::TinyAlt,
            synth::Preset::Bench => PresetFlag::Bench,
            synth::Preset::Wide => PresetFlag::Wide,
            synth::Preset::WideHidden => PresetFlag::WideHidden,
            synth::Preset::RealWidth => PresetFlag::RealWidth,
            synth::Preset::Dense => PresetFlag::Dense,
            synth::Preset::TinyAltQk => PresetFlag::TinyAltQk,
            synth::Preset::GptOss => PresetFlag::GptOss,
            synth::Preset::Llama4 => PresetFlag::Llama4,
            synth::Preset::Llama4Interleaved => PresetFlag::Llama4Interleaved,
            synth::Preset::Deepseek2 => PresetFlag::Deepseek2,
            synth::Preset::Deepseek2V2 => PresetFlag::Deepseek2V2,
            synth::Preset::Deepseek2Softmax => PresetFlag::Deepseek2Softmax,
            synth::Preset::Glm4moeMtp => PresetFlag::Glm4moeMtp,
            synth::Preset::Qwen3next => PresetFlag::Qwen3next,
            synth::Preset::Qwen3nextMtp => PresetFlag::Qwen3nextMtp,
            synth::Preset::Qwen35moe => PresetFlag::Qwen35moe,
            synth::Preset::Qwen35moeFused => PresetFlag::Qwen35moeFused,
            synth::Preset::Granitemoe => PresetFlag::Granitemoe,
            synth::Preset::Mixtral => PresetFlag::Mixtral,
            synth::Preset::Qwen2moe => PresetFlag::Qwen2moe,
            synth::Preset::MinimaxM2 => PresetFlag::MinimaxM2,
            synth::Preset::Vocab152k => PresetFlag::Vocab152k,
            synth::Preset::Vocab248k => PresetFlag::Vocab248k,
        }
    }
}

/// [`synth::WeightType`] as a flag's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightTypeFlag {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 8-bit blocks of 32 with an f16 scale.
    #[value(name = "q8_0")]
    Q8_0,
}

/// Parses a flag's value into a [`synth::WeightType`].
pub fn weight_type() -> impl TypedValueParser<Value = synth::WeightType> {
    EnumValueParser::<WeightTypeFlag>::new().map(synth::WeightType::from)
}

impl From<WeightTypeFlag> for synth::WeightType {
    fn from(f: WeightTypeFlag) -> synth::WeightType {
        match f {
            WeightTypeFlag::F32 => synth::WeightType::F32,
            WeightTypeFlag::F16 => synth::WeightType::F16,
            WeightTypeFlag::Q8_0 => synth::WeightType::Q8_0,
        }
    }
}

impl From<synth::WeightType> for WeightTypeFlag {
    fn from(v: synth::WeightType) -> WeightTypeFlag {
        match v {
            synth::WeightType::F32 => WeightTypeFlag::F32,
            synth::WeightType::F16 => WeightTypeFlag::F16,
            synth::WeightType::Q8_0 => WeightTypeFlag::Q8_0,
        }
    }
}

/// [`worker::collect::device::Reduce`] as a flag's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReduceFlag {
    /// `device` when model layers are offloaded to a GPU (copies would bound
    /// the run there), `host` otherwise (on the CPU the host reads tensors
    /// in place, and the device path's one-hot matmuls are extra work).
    Auto,
    /// Copy (or read in place) every observed tensor and reduce on the host
    /// in f64: the reference path.
    Host,
    /// Reduce on the tensor's own backend and copy only the results.
    Device,
}

/// Parses a flag's value into a [`worker::collect::device::Reduce`].
pub fn reduce() -> impl TypedValueParser<Value = worker::collect::device::Reduce> {
    EnumValueParser::<ReduceFlag>::new().map(worker::collect::device::Reduce::from)
}

impl From<ReduceFlag> for worker::collect::device::Reduce {
    fn from(f: ReduceFlag) -> worker::collect::device::Reduce {
        match f {
            ReduceFlag::Auto => worker::collect::device::Reduce::Auto,
            ReduceFlag::Host => worker::collect::device::Reduce::Host,
            ReduceFlag::Device => worker::collect::device::Reduce::Device,
        }
    }
}

impl From<worker::collect::device::Reduce> for ReduceFlag {
    fn from(v: worker::collect::device::Reduce) -> ReduceFlag {
        match v {
            worker::collect::device::Reduce::Auto => ReduceFlag::Auto,
            worker::collect::device::Reduce::Host => ReduceFlag::Host,
            worker::collect::device::Reduce::Device => ReduceFlag::Device,
        }
    }
}

/// [`worker::eval::Compare`] as a flag's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompareFlag {
    /// `device` when model layers are offloaded to a GPU, `host` otherwise:
    /// on the CPU backend the f64 host comparison costs less than the
    /// backend's own (BENCHMARKS.md, issue #22).
    Auto,
    /// On the backend that holds them, in f32; only per-position figures
    /// are copied to the host.
    Device,
    /// On the host in f64, after llama.cpp copies every logits row (the
    /// reference path).
    Host,
}

/// Parses a flag's value into a [`worker::eval::Compare`].
pub fn compare() -> impl TypedValueParser<Value = worker::eval::Compare> {
    EnumValueParser::<CompareFlag>::new().map(worker::eval::Compare::from)
}

impl From<CompareFlag> for worker::eval::Compare {
    fn from(f: CompareFlag) -> worker::eval::Compare {
        match f {
            CompareFlag::Auto => worker::eval::Compare::Auto,
            CompareFlag::Device => worker::eval::Compare::Device,
            CompareFlag::Host => worker::eval::Compare::Host,
        }
    }
}

impl From<worker::eval::Compare> for CompareFlag {
    fn from(v: worker::eval::Compare) -> CompareFlag {
        match v {
            worker::eval::Compare::Auto => CompareFlag::Auto,
            worker::eval::Compare::Device => CompareFlag::Device,
            worker::eval::Compare::Host => CompareFlag::Host,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// Every flag value converts to a distinct library value and back.
    fn round_trip<F, L>()
    where
        F: ValueEnum + Copy + PartialEq + std::fmt::Debug + Into<L> + From<L>,
        L: Copy + PartialEq + std::fmt::Debug,
    {
        let libs: Vec<L> = F::value_variants().iter().map(|&f| f.into()).collect();
        for (i, &f) in F::value_variants().iter().enumerate() {
            assert_eq!(F::from(libs[i]), f);
            assert!(
                !libs[..i].contains(&libs[i]),
                "{f:?} maps onto another value"
            );
        }
    }

    #[test]
    fn every_value_maps_one_to_one() {
        round_trip::<MethodFlag, config::method::Method>();
        round_trip::<ModeFlag, replay::results::Mode>();
        round_trip::<PresetFlag, synth::Preset>();
        round_trip::<WeightTypeFlag, synth::WeightType>();
        round_trip::<ReduceFlag, worker::collect::device::Reduce>();
        round_trip::<CompareFlag, worker::eval::Compare>();
    }
}
