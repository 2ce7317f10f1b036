//! `worker quantize`: llama.cpp's quantiser on one GGUF, with an importance
//! matrix; prints what it wrote as one JSON line (what `coordinator ship`
//! reads).

use gguf::quant::QuantType;
use std::path::PathBuf;
use worker::quantize::{quantize_file, QuantizeOptions};
use worker::WorkerError;

/// Arguments of `worker quantize`.
#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// The GGUF model to quantise.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Quantisation type, llama-quantize's name (Q8_0, Q4_K_M, ...).
    #[arg(long = "type", value_parser = QuantType::parse)]
    quant: QuantType,
    /// Output GGUF (created; an existing file is an error).
    #[arg(long)]
    out: PathBuf,
    /// Importance matrix (llama.cpp's GGUF imatrix, e.g. a pruned model's
    /// sliced `.imatrix.gguf`).
    #[arg(long)]
    imatrix: Option<PathBuf>,
    /// Quantise a model that is already quantised.
    #[arg(long)]
    allow_requantize: bool,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long)]
    threads: Option<u32>,
}

/// Entry point of `worker quantize`.
pub fn run(a: QuantizeArgs) -> Result<(), WorkerError> {
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    let opts = QuantizeOptions {
        quant: a.quant,
        imatrix: a.imatrix,
        allow_requantize: a.allow_requantize,
        threads,
    };
    let q = quantize_file(&a.model, &a.out, &opts)?;
    println!("{}", serde_json::to_string(&q).map_err(WorkerError::Json)?);
    Ok(())
}
