//! The response phase's batched generation on one worker, as llama.cpp's
//! batched-bench measures it (BENCHMARKS.md): `npl` prompts of `pp` tokens
//! decoded together, then up to `tg` greedy tokens each, one per sequence
//! per `llama_decode`, on `threads` threads; two rounds, each timed.
//!
//! `bench_respond MODEL NPL PP TG THREADS`

use protocol::wire::Sampling;
use runfiles::respond::{prompt_sha256, PromptEntry, PromptFile};
use std::time::Instant;
use worker::offload::Offload;
use worker::respond::Responder;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 6,
        "usage: bench_respond MODEL NPL PP TG THREADS"
    );
    let num = |i: usize| args[i].parse::<u32>();
    let (npl, pp, tg, threads) = (num(2)?, num(3)?, num(4)?, num(5)?);
    // The prompt tokens batched-bench's driver (BENCHMARKS.md) decodes.
    let prompts = (0..npl)
        .map(|s| {
            let tokens: Vec<i32> = (0..pp).map(|j| (100 + (j * 7 + s) % 500) as i32).collect();
            PromptEntry {
                source: "bench".into(),
                at: format!("bench:{s}"),
                turn: 0,
                sha256: prompt_sha256(&tokens),
                tokens,
            }
        })
        .collect();
    let file = PromptFile {
        model_sha256: String::new(),
        prompts,
    };
    let sampling = Sampling {
        max_tokens: tg,
        n: 1,
        seed: 0,
        temperature_bits: 0f64.to_bits(),
        top_p_bits: 1f64.to_bits(),
    };
    let r = Responder::load(
        std::path::Path::new(&args[1]),
        &Offload::default(),
        threads,
        file,
        sampling,
    )
    .map_err(anyhow::Error::msg)?;
    for round in 0..2 {
        let t = Instant::now();
        let p = r
            .respond(numbers::ChunkRange { start: 0, end: npl })
            .map_err(anyhow::Error::msg)?;
        let secs = t.elapsed().as_secs_f64();
        let generated = p.generated();
        let decoded = u64::from(npl * pp) + generated;
        println!(
            "round {round} npl {npl} pp {pp} tg {tg} threads {threads}: {secs:.3} s, {generated} tokens generated, {decoded} tokens decoded ({:.0} t/s)",
            decoded as f64 / secs
        );
    }
    Ok(())
}
