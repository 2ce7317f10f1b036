//! The placement flags `worker collect`, `eval` and `join` share
//! (llama.cpp's `-ngl`, `--cpu-moe`, `--n-cpu-moe`), read into the worker
//! library's [`Offload`].

use llama::{ExpertsOnCpu, Offload};
use protocol::MAX_CPU_MOE_LAYERS;

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
