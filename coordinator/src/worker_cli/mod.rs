//! The `worker` command line: subcommands and their dispatch over the worker
//! library, shared by the `worker` binary and the binaries the end-to-end
//! tests build.

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use worker::WorkerError;

mod chunk_job;
mod collect;
mod eval;
mod join;
mod offload;
mod quantize;

/// moe-census worker.
#[derive(Parser, Debug)]
#[command(
    name = "worker",
    version,
    about = "moe-census worker: generate test models, measure chunks, join a run, quantise"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write a deterministic MoE GGUF model that llama.cpp loads and runs.
    SynthModel(SynthArgs),
    /// Write a deterministic mmproj GGUF (vision encoder + projector) that
    /// llama.cpp's mtmd loads beside a text model.
    SynthMmproj(SynthMmprojArgs),
    /// Write a deterministic three-domain corpus (prose, code, chat) of a given size.
    SynthCorpus(SynthCorpusArgs),
    /// Write the bundled image sample (small generated PNGs and their
    /// records) into a directory.
    SynthImages(SynthImagesArgs),
    /// Measure a chunk range of a tokenized corpus and write a partial (no network).
    Collect(collect::CollectArgs),
    /// Evaluate pruned candidates against the base model on a chunk range (no network).
    Eval(eval::EvalArgs),
    /// Join a run: prove the join secret, then serve every phase of the run
    /// (collection, evaluation, shipping's evaluation) until it is finished.
    /// A flag given again overrides the earlier one (and `--secret-file` and
    /// `--key-file` override each other), so the placeholders of the
    /// coordinator's printed command are replaced by appending flags.
    #[command(args_override_self = true)]
    Join(join::JoinFlags),
    /// Quantise a GGUF with llama.cpp's quantiser and an importance matrix.
    Quantize(quantize::QuantizeArgs),
}

#[derive(clap::Args, Debug)]
struct SynthArgs {
    /// Model preset.
    #[arg(long, value_parser = crate::values::preset())]
    preset: synth::Preset,
    /// Output GGUF path.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Seed of every random weight.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Encoding of the weight matrices (default: the preset's own).
    #[arg(long, value_parser = crate::values::weight_type())]
    weight_type: Option<synth::WeightType>,
    /// Tokens in the vocabulary, padded with unused tokens (default: the
    /// preset's own; `vocab-152k` and `vocab-248k` have the real sizes).
    #[arg(long)]
    n_vocab: Option<usize>,
    /// Make the last N experts of every MoE layer serve image positions
    /// only (pair the model with `worker synth-mmproj`, which finds them).
    #[arg(long)]
    vision_experts: Option<usize>,
    /// Write the model as N split files, as llama.cpp's `gguf-split` does
    /// (`OUT` minus `.gguf`, then `-00001-of-0000N.gguf`, ...).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(2..))]
    split: Option<u16>,
}

#[derive(clap::Args, Debug)]
struct SynthMmprojArgs {
    /// The text model the projector feeds (its hidden size is the projector's output width).
    #[arg(long)]
    model: std::path::PathBuf,
    /// Output GGUF path.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Seed of every random weight.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(clap::Args, Debug)]
struct SynthImagesArgs {
    /// Output directory (`images.jsonl` and `images/`).
    #[arg(long)]
    out: std::path::PathBuf,
}

#[derive(clap::Args, Debug)]
struct SynthCorpusArgs {
    /// Output directory (one file per domain).
    #[arg(long)]
    out: std::path::PathBuf,
    /// Characters per domain (about 1.3 characters per token with the
    /// synthetic vocabulary: the default gives about 1.1M tokens in all).
    #[arg(long, default_value_t = 500_000)]
    chars: usize,
    /// Seed of the generated documents.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn synth_mmproj(a: &SynthMmprojArgs) -> Result<(), WorkerError> {
    use synth::mmproj;
    let spec = mmproj::MmprojSpec::for_model(&a.model)?;
    mmproj::write_mmproj(&spec, a.seed, &a.out)?;
    println!(
        "wrote mmproj (seed {}, {} positions per image, output width {}) to {}",
        a.seed,
        spec.positions_per_image(),
        spec.n_embd_text,
        a.out.display()
    );
    Ok(())
}

/// llama.cpp's multi-letter short flag `-ngl N` (or `-ngl=N`), which clap
/// cannot declare, spelled `--n-gpu-layers`; `-m` and `-t` are declared.
fn llama_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-ngl") => "--n-gpu-layers".into(),
        Some(s) if s.starts_with("-ngl=") => format!("--n-gpu-layers={}", &s[5..]).into(),
        _ => a,
    })
    .collect()
}

/// Parses the command line, runs the subcommand and maps errors to the exit code.
pub fn main() -> ExitCode {
    crate::front::init_logging();
    let cli = Cli::parse_from(llama_flags(std::env::args_os()));
    let result = match cli.command {
        Command::SynthModel(a) => {
            let o = synth::Overrides {
                weights: a.weight_type,
                n_vocab: a.n_vocab,
                vision_experts: a.vision_experts,
            };
            let written = match a.split {
                None => {
                    synth::write_model_with(a.preset, a.seed, o, &a.out).map(|()| a.out.clone())
                }
                Some(n) => synth::write_model_split(a.preset, a.seed, o, &a.out, n),
            };
            written
                .map(|first| {
                    println!(
                        "wrote {:?} model (seed {}) to {}",
                        a.preset,
                        a.seed,
                        first.display()
                    );
                })
                .map_err(WorkerError::from)
        }
        Command::SynthMmproj(a) => synth_mmproj(&a),
        Command::SynthCorpus(a) => synth::corpus::write_corpus(&a.out, a.chars, a.seed)
            .map(|()| {
                println!(
                    "wrote {} to {}",
                    synth::corpus::FILES.join(", "),
                    a.out.display()
                )
            })
            .map_err(WorkerError::from),
        Command::SynthImages(a) => synth::images::write_images(&a.out)
            .map(|()| {
                println!(
                    "wrote {} and {}/ to {}",
                    synth::images::RECORDS,
                    synth::images::DIR,
                    a.out.display()
                )
            })
            .map_err(WorkerError::from),
        Command::Collect(a) => collect::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Join(a) => return exit_code(join::run(a).map(|_| ())),
    };
    exit_code(result)
}

/// Success, or the error printed with its causes and a failure exit code.
fn exit_code<E: std::error::Error>(result: Result<(), E>) -> ExitCode {
    result.map_or_else(|e| crate::front::failed(&e), |()| ExitCode::SUCCESS)
}
