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

/// The placement flags `worker collect`, `eval` and `join` share.
#[derive(clap::Args, Clone, Debug)]
pub struct OffloadArgs {
    /// Layers offloaded to the GPU (`-ngl`).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", default_value_t = 0)]
    pub n_gpu_layers: u32,
    /// Keeps every routed expert's weights in host memory, computed by the
    /// CPU, with the other layers' weights on the GPU (llama.cpp's
    /// `--cpu-moe`): for a MoE model larger than the GPU.
    #[arg(long, conflicts_with = "n_cpu_moe")]
    pub cpu_moe: bool,
    /// Keeps the routed experts of the first N blocks in host memory
    /// (llama.cpp's `--n-cpu-moe`), the rest on the GPU.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CPU_MOE_LAYERS)))]
    pub n_cpu_moe: Option<u32>,
}

impl OffloadArgs {
    /// The placement these flags ask for.
    pub fn offload(&self) -> Offload {
        let experts_on_cpu = match (self.cpu_moe, self.n_cpu_moe) {
            (true, _) => ExpertsOnCpu::All,
            (false, Some(n)) => ExpertsOnCpu::First(n),
            (false, None) => ExpertsOnCpu::None,
        };
        Offload {
            n_gpu_layers: self.n_gpu_layers,
            experts_on_cpu,
        }
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

    #[test]
    fn flags_map_to_placements_and_conflict() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            offload: OffloadArgs,
        }
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("worker").chain(args.iter().copied()))
                .map(|c| c.offload.offload())
        };
        assert_eq!(parse(&[]).unwrap(), Offload::default());
        assert_eq!(
            parse(&["--ngl", "999", "--cpu-moe"]).unwrap(),
            Offload {
                n_gpu_layers: 999,
                experts_on_cpu: ExpertsOnCpu::All
            }
        );
        assert_eq!(
            parse(&["--n-cpu-moe", "3"]).unwrap().experts_on_cpu,
            ExpertsOnCpu::First(3)
        );
        assert!(parse(&["--cpu-moe", "--n-cpu-moe", "3"]).is_err());
        assert!(parse(&["--n-cpu-moe", "0"]).is_err());
        assert!(parse(&["--n-cpu-moe", "4097"]).is_err());
    }
}
