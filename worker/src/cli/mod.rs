//! The `worker` command line: subcommands and their dispatch, shared by the
//! `worker` binary and the binaries the end-to-end tests build.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod collect;
mod eval;

/// moe-census worker.
#[derive(Parser, Debug)]
#[command(
    name = "worker",
    version,
    about = "moe-census worker: generate test models, measure chunks, join a run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write a deterministic MoE GGUF model that llama.cpp loads and runs.
    SynthModel(SynthArgs),
    /// Measure a chunk range of a tokenized corpus and write a partial (no network).
    Collect(collect::CollectArgs),
    /// Evaluate pruned candidates against the base model on a chunk range (no network).
    Eval(eval::EvalArgs),
    /// Join a run: prove the join secret, then measure leased chunk ranges.
    Join(crate::join::JoinArgs),
}

#[derive(clap::Args, Debug)]
struct SynthArgs {
    /// Model preset.
    #[arg(long, value_enum)]
    preset: crate::synth::Preset,
    /// Output GGUF path.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Seed of every random weight.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Parses the command line, runs the subcommand and maps errors to the exit code.
pub fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::SynthModel(a) => crate::synth::write_model(a.preset, a.seed, &a.out).map(|()| {
            println!(
                "wrote {:?} model (seed {}) to {}",
                a.preset,
                a.seed,
                a.out.display()
            );
        }),
        Command::Collect(a) => collect::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Join(a) => crate::join::run(a).map(|_| ()).map_err(anyhow::Error::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
