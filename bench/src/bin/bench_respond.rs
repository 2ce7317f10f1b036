//! The response phase's batched generation on one worker, as llama.cpp's
//! batched-bench measures it (BENCHMARKS.md): `npl` prompts of `pp` tokens
//! decoded together, then up to `tg` greedy tokens each, one per sequence
//! per `llama_decode`, on `threads` threads; two rounds, each timed, with
//! where the time went (context, prefill, generation; llama_decode,
//! sampling and the rest).
//!
//! `bench_respond MODEL NPL PP TG THREADS [--ignore-eog] [--rounds N]`:
//! with `--ignore-eog` every sequence runs `TG` steps (end-of-generation
//! tokens generated like others), as batched-bench's fixed steps do;
//! `--rounds` (default 2) repeats the lease, and the rounds after the
//! first are summed in responses per second (for scaling runs of several
//! processes at once).

use llama::Offload;
use protocol::wire::Sampling;
use runfiles::respond::{prompt_sha256, PromptEntry, PromptFile};
use std::time::Instant;
use worker::respond::Responder;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: bench_respond MODEL NPL PP TG THREADS [--ignore-eog] [--rounds N]";
    anyhow::ensure!(args.len() >= 6, "{usage}");
    let (mut ignore_eog, mut rounds) = (false, 2u32);
    let mut flags = args[6..].iter();
    while let Some(f) = flags.next() {
        match f.as_str() {
            "--ignore-eog" => ignore_eog = true,
            "--rounds" => {
                let n = flags.next().ok_or_else(|| anyhow::anyhow!("{usage}"))?;
                rounds = n.parse::<u32>()?.max(2);
            }
            other => anyhow::bail!("unknown flag {other}; {usage}"),
        }
    }
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
    let mut r = Responder::load(
        std::path::Path::new(&args[1]),
        &Offload::default(),
        threads,
        file,
        sampling,
    )
    .map_err(anyhow::Error::msg)?;
    if ignore_eog {
        r.ignore_end_of_generation();
    }
    let mut timed = (0u32, 0f64);
    for round in 0..rounds {
        let t = Instant::now();
        let (p, times) = r
            .respond_timed(numbers::ChunkRange { start: 0, end: npl })
            .map_err(anyhow::Error::msg)?;
        let secs = t.elapsed().as_secs_f64();
        let generated = p.generated();
        let decoded = u64::from(npl * pp) + generated;
        println!(
            "round {round} npl {npl} pp {pp} tg {tg} threads {threads}: {secs:.3} s, {generated} tokens generated, {decoded} tokens decoded ({:.0} t/s); prefill {:.0} t/s, generation {:.0} t/s",
            decoded as f64 / secs,
            f64::from(npl * pp) / times.prefill.as_secs_f64(),
            generated as f64 / times.generation.as_secs_f64(),
        );
        if round > 0 {
            timed = (timed.0 + npl, timed.1 + secs);
        }
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let other = times.prefill + times.generation - times.decode - times.sample;
        println!(
            "  sections (ms): context {:.1}, prefill {:.1}, generation {:.1}; of those two: llama_decode {:.1} ({} calls), sampling {:.1}, the rest {:.1}",
            ms(times.context),
            ms(times.prefill),
            ms(times.generation),
            ms(times.decode),
            times.decodes,
            ms(times.sample),
            ms(other),
        );
    }
    println!(
        "rounds 1..{rounds}: {} responses in {:.3} s, {:.1} responses/s",
        timed.0,
        timed.1,
        f64::from(timed.0) / timed.1
    );
    Ok(())
}
