//! Tokenization throughput of the corpus stage: the bundled sample corpus
//! (English, Japanese, templated chat), repeated to a few MiB, tokenized with
//! the generated `tiny` model's tokenizer through llama.cpp on 1 and 2
//! threads. Run with `cargo bench -p moe-census-corpus --bench tokenize`; prints
//! a Markdown table for BENCHMARKS.md.

use config::Config;
use corpus::prepare::render;
use corpus::source::{read_source, ImageRef};
use corpus::tokenizer::{tokenize_all, LlamaTokenizer};
use std::path::Path;
use std::time::Instant;

/// Input size to reach by repeating the sample corpus.
const TARGET_BYTES: usize = 4 << 20;

fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let model = dir.path().join("tiny.gguf");
    synth::write_model(synth::Preset::Tiny, 0, &model)?;
    let tokenizer = LlamaTokenizer::load(&model, None)?;

    let config_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/quickstart.toml");
    let config = Config::load(&config_path)?;
    let mut docs: Vec<(String, String, bool)> = Vec::new();
    for d in &config.corpus.domains {
        for s in &d.sources {
            for r in read_source(s, &config.resolve(&s.path), None)?.records {
                let (text, special) = render(&tokenizer, &r.content, &Default::default())
                    .map_err(anyhow::Error::msg)?;
                docs.push((d.name.clone(), text, special));
            }
        }
    }
    println!("| input | threads | MiB | tokens | seconds | CPU seconds | MB/s | tokens/s |");
    println!("|---|---|---|---|---|---|---|---|");
    let domains: Vec<String> = config
        .corpus
        .domains
        .iter()
        .map(|d| d.name.clone())
        .collect();
    for domain in domains.iter().map(Some).chain([None]) {
        let one: Vec<(String, bool)> = docs
            .iter()
            .filter(|(d, _, _)| domain.is_none_or(|x| x == d))
            .map(|(_, t, s)| (t.clone(), *s))
            .collect();
        let bytes: usize = one.iter().map(|(t, _)| t.len()).sum();
        let texts: Vec<(String, bool, &[ImageRef])> = one
            .iter()
            .cycle()
            .take(one.len() * TARGET_BYTES.div_ceil(bytes))
            .map(|(t, s)| (t.clone(), *s, &[][..]))
            .collect();
        let total: usize = texts.iter().map(|(t, _, _)| t.len()).sum();
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()?;
            let _ = pool.install(|| tokenize_all(&tokenizer, &texts[..texts.len().min(64)]));
            let (start, cpu0) = (Instant::now(), cpu_seconds());
            let tokens: usize = pool
                .install(|| tokenize_all(&tokenizer, &texts))
                .map_err(|(i, e)| anyhow::anyhow!("text {i}: {e}"))?
                .iter()
                .map(|(ids, _)| ids.len())
                .sum();
            let secs = start.elapsed().as_secs_f64();
            let cpu = cpu0
                .zip(cpu_seconds())
                .map_or("-".into(), |(a, b)| format!("{:.2}", b - a));
            println!(
                "| {} | {threads} | {:.1} | {tokens} | {secs:.3} | {cpu} | {:.2} | {:.0} |",
                domain.map_or("all domains", String::as_str),
                total as f64 / (1 << 20) as f64,
                total as f64 / 1e6 / secs,
                tokens as f64 / secs
            );
        }
    }
    Ok(())
}

/// User + system CPU time of this process (Linux `/proc`), to show whether
/// the threads actually got cores on a shared machine.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
