//! The model and workload options the collection and evaluation benchmarks
//! share (`bench_collect`, `bench_eval`).

use clap::Args;
use std::path::{Path, PathBuf};
use synth::Preset;

/// The model measured and the chunks it is measured on.
#[derive(Args)]
pub struct Workload {
    /// GGUF model to measure (token ids are drawn inside its vocabulary);
    /// without it, the `--preset` model is generated in a temporary directory.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Generated model when `--model` is not given.
    #[arg(long, value_parser = coordinator::values::preset(), default_value = "bench")]
    pub preset: Preset,
    /// The generated model's vocabulary size (default: the preset's; a
    /// real-vocabulary preset at 1000 is the same model with a small head).
    #[arg(long)]
    pub n_vocab: Option<usize>,
    /// Chunks per measurement.
    #[arg(long, default_value_t = 8)]
    pub chunks: u32,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    pub n_ctx: u32,
    /// Tokens per micro-batch.
    #[arg(long, default_value_t = 512)]
    pub n_ubatch: u32,
    /// CPU threads.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// Layers offloaded to the GPU (`-ngl`; 999: all, the output head too).
    #[arg(long, default_value_t = 0)]
    pub ngl: u32,
}

impl Workload {
    /// Writes the `--preset` model (with `--n-vocab`) to `path`.
    pub fn generate(&self, path: &Path) -> anyhow::Result<()> {
        let o = synth::Overrides {
            n_vocab: self.n_vocab,
            ..Default::default()
        };
        synth::write_model_with(self.preset, 0, o, path)?;
        Ok(())
    }
}
