//! `worker`: thin binary over the worker library.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod cli_collect;

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
    Collect(cli_collect::CollectArgs),
    /// Join a run: prove the join secret, then measure leased chunk ranges.
    Join(worker::join::JoinArgs),
}

#[derive(clap::Args, Debug)]
struct SynthArgs {
    /// Model preset.
    #[arg(long, value_enum)]
    preset: worker::synth::Preset,
    /// Output GGUF path.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Seed of every random weight.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::SynthModel(a) => worker::synth::write_model(a.preset, a.seed, &a.out).map(|()| {
            println!(
                "wrote {:?} model (seed {}) to {}",
                a.preset,
                a.seed,
                a.out.display()
            );
        }),
        Command::Collect(a) => cli_collect::run(a),
        Command::Join(a) => worker::join::run(a)
            .map(|_| ())
            .map_err(anyhow::Error::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
