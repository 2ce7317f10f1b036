//! Where a model's weights live when it loads: llama.cpp's `-ngl`, and its
//! `--cpu-moe` / `--n-cpu-moe`, which keep routed experts in host memory so
//! that a MoE model larger than the GPU still runs with attention and the
//! shared weights on it (how DeepSeek-V3 or Qwen3-Next are served on one
//! GPU). The placement changes where llama.cpp computes, never what a
//! worker measures.

use protocol::MAX_CPU_MOE_LAYERS;
use serde::{Deserialize, Serialize};
use std::ffi::CString;

/// llama.cpp's pattern of routed-expert weight tensors (`LLM_FFN_EXPS_REGEX`
/// in its `common.h`), matched with `std::regex_search` against names such
/// as `blk.7.ffn_down_exps.weight`.
const EXPERT_TENSORS: &str = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps";

/// Which blocks keep their routed experts in host memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpertsOnCpu {
    /// None: `n_gpu_layers` alone decides.
    #[default]
    None,
    /// Every block's (`--cpu-moe`).
    All,
    /// The first N blocks' (`--n-cpu-moe N`).
    First(u32),
}

/// Where a model's weights are placed when it loads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offload {
    /// Layers whose weights go to the GPU (`-ngl`; no effect on CPU builds).
    pub n_gpu_layers: u32,
    /// Routed experts kept in host memory whatever `n_gpu_layers` says.
    pub experts_on_cpu: ExpertsOnCpu,
}

impl Offload {
    /// `n_gpu_layers` layers on the GPU, every expert where its layer is.
    pub fn layers(n_gpu_layers: u32) -> Offload {
        Offload {
            n_gpu_layers,
            experts_on_cpu: ExpertsOnCpu::None,
        }
    }

    /// How a backend label names this placement: `, N layers on the GPU`,
    /// then `, routed experts on the CPU` or `, routed experts of the first
    /// N blocks on the CPU`.
    pub fn describe(&self) -> String {
        let mut s = format!(", {} layers on the GPU", self.n_gpu_layers);
        match self.experts_on_cpu {
            ExpertsOnCpu::None => {}
            ExpertsOnCpu::All => s.push_str(", routed experts on the CPU"),
            ExpertsOnCpu::First(n) => s.push_str(&format!(
                ", routed experts of the first {n} blocks on the CPU"
            )),
        }
        s
    }

    /// The tensor-name patterns llama.cpp's loader places in host memory,
    /// spelled as llama.cpp's own `--cpu-moe` and `--n-cpu-moe` spell them.
    pub fn cpu_patterns(&self) -> Vec<CString> {
        let patterns = match self.experts_on_cpu {
            ExpertsOnCpu::None => Vec::new(),
            ExpertsOnCpu::All => vec![EXPERT_TENSORS.to_string()],
            ExpertsOnCpu::First(n) => (0..n.min(MAX_CPU_MOE_LAYERS))
                .map(|block| format!(r"blk\.{block}{EXPERT_TENSORS}"))
                .collect(),
        };
        patterns
            .into_iter()
            .map(|p| CString::new(p).expect("patterns hold no NUL byte"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(o: Offload) -> Vec<String> {
        o.cpu_patterns()
            .into_iter()
            .map(|c| c.into_string().unwrap())
            .collect()
    }

    #[test]
    fn patterns_are_llama_cpps_own() {
        let o = |experts_on_cpu| Offload {
            n_gpu_layers: 99,
            experts_on_cpu,
        };
        assert!(strings(o(ExpertsOnCpu::None)).is_empty());
        assert_eq!(
            strings(o(ExpertsOnCpu::All)),
            [r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"]
        );
        assert_eq!(
            strings(o(ExpertsOnCpu::First(2))),
            [
                r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps",
                r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps"
            ]
        );
    }

    #[test]
    fn labels_name_the_placement() {
        assert_eq!(Offload::layers(999).describe(), ", 999 layers on the GPU");
        let first = Offload {
            n_gpu_layers: 20,
            experts_on_cpu: ExpertsOnCpu::First(4),
        };
        assert_eq!(
            first.describe(),
            ", 20 layers on the GPU, routed experts of the first 4 blocks on the CPU"
        );
        let all = Offload {
            experts_on_cpu: ExpertsOnCpu::All,
            ..first
        };
        assert_eq!(
            all.describe(),
            ", 20 layers on the GPU, routed experts on the CPU"
        );
    }
}
