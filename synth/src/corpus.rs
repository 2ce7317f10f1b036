//! `worker synth-corpus`: a deterministic three-domain calibration corpus of
//! any size, for runs at the real shape (`configs/wide.toml`) without
//! committing megabytes of text.
//!
//! Domains, each with distinct documents (random word sequences, so token
//! shingles do not mark them as near-duplicates):
//! - `prose.jsonl`: `{"topic", "text"}` records, grouped by topic;
//! - `code.txt`: plain-text code-like documents separated by a blank line;
//! - `chat.jsonl`: `{"task", "messages"}` conversations, grouped by task.

use crate::error::SynthError;
use numbers::splitmix::SplitMix64 as Rng;
use std::io::Write;
use std::path::Path;

/// File names of the three domains, as `configs/wide.toml` names them.
pub const FILES: [&str; 3] = ["prose.jsonl", "code.txt", "chat.jsonl"];

const WORDS: &[&str] = &[
    "the", "river", "stone", "market", "winter", "lamp", "harbour", "engine", "garden", "letter",
    "bridge", "morning", "silver", "forest", "village", "window", "signal", "orchard", "copper",
    "valley", "paper", "station", "thunder", "meadow", "mirror", "cart", "tower", "salt", "wheel",
    "candle", "field", "ladder", "island", "clock", "feather", "furnace", "harvest", "needle",
    "pocket", "rail", "shadow", "timber", "voice", "wagon", "yard", "anchor", "basket", "cellar",
    "of", "and", "a", "in", "to", "was", "near", "under", "over", "with", "slowly", "quietly",
    "carried", "opened", "followed", "built", "watched", "mended", "counted", "painted", "sold",
];

const TOPICS: &[&str] = &[
    "rivers", "markets", "railways", "weather", "gardens", "harbours", "mills", "bridges",
];

const IDENTS: &[&str] = &[
    "count", "total", "buffer", "index", "value", "offset", "layer", "width", "cache", "row",
    "col", "limit", "step", "queue", "node", "slot", "scale", "bias",
];

const TASKS: &[&str] = &[
    "units",
    "recipes",
    "travel",
    "spelling",
    "arithmetic",
    "history",
    "packing",
    "weather",
];

/// Writes the three domain files into `dir`, each about `chars` characters.
pub fn write_corpus(dir: &Path, chars: usize, seed: u64) -> Result<(), SynthError> {
    std::fs::create_dir_all(dir).map_err(SynthError::creating(dir))?;
    let writers: [fn(&mut Rng, usize) -> String; 3] = [prose_doc, code_doc, chat_doc];
    for (name, doc) in FILES.iter().zip(writers) {
        let path = dir.join(name);
        let tmp = path.with_extension("partial");
        let file = std::fs::File::create(&tmp).map_err(SynthError::creating(&tmp))?;
        let mut out = std::io::BufWriter::new(file);
        let mut rng = Rng::for_stream(seed, name);
        let (mut written, mut i) = (0, 0);
        while written < chars {
            let text = doc(&mut rng, i);
            written += text.len();
            out.write_all(text.as_bytes())
                .map_err(SynthError::writing(&tmp))?;
            i += 1;
        }
        out.flush().map_err(SynthError::writing(&tmp))?;
        drop(out);
        std::fs::rename(&tmp, &path).map_err(SynthError::renaming_to(&path))?;
    }
    Ok(())
}

fn pick<'a>(rng: &mut Rng, items: &[&'a str]) -> &'a str {
    items[rng.below(items.len())]
}

/// A group key: a name and one of 32 numbered groups under it, so held-out
/// groups are a fine-grained sample.
fn group(rng: &mut Rng, names: &[&str]) -> String {
    format!("{}-{}", pick(rng, names), rng.below(32))
}

fn sentence(rng: &mut Rng) -> String {
    let n = 6 + rng.below(10);
    let mut words: Vec<&str> = (0..n).map(|_| pick(rng, WORDS)).collect();
    let mut first = words[0].to_string();
    first[..1].make_ascii_uppercase();
    words[0] = &first;
    format!("{}.", words.join(" "))
}

/// One JSONL prose record of a few sentences.
fn prose_doc(rng: &mut Rng, _i: usize) -> String {
    let n = 4 + rng.below(8);
    let text: Vec<String> = (0..n).map(|_| sentence(rng)).collect();
    let record = serde_json::json!({ "topic": group(rng, TOPICS), "text": text.join(" ") });
    format!("{record}\n")
}

/// One code-like document: a function of a few statements, no blank lines.
fn code_doc(rng: &mut Rng, i: usize) -> String {
    let name = format!("{}_{}_{i}", pick(rng, IDENTS), pick(rng, IDENTS));
    let mut s = format!(
        "fn {name}({}: usize, {}: &[f32]) -> f32 {{\n",
        pick(rng, IDENTS),
        pick(rng, IDENTS)
    );
    for _ in 0..3 + rng.below(8) {
        let (a, b, c) = (pick(rng, IDENTS), pick(rng, IDENTS), pick(rng, IDENTS));
        let line = match rng.below(3) {
            0 => format!("    let {a} = {b} * {} + {c};\n", rng.below(1000)),
            1 => format!("    if {a} > {b} {{ {c} += {}; }}\n", rng.below(100)),
            _ => format!(
                "    for {a} in 0..{b}.len() {{ {c}[{a}] *= 0.{}; }}\n",
                rng.below(99)
            ),
        };
        s.push_str(&line);
    }
    s.push_str(&format!("    {}\n}}\n\n", pick(rng, IDENTS)));
    s
}

/// One JSONL chat record: a question and an answer.
fn chat_doc(rng: &mut Rng, _i: usize) -> String {
    let record = serde_json::json!({
        "task": group(rng, TASKS),
        "messages": [
            { "role": "user", "content": format!("{} ?", sentence(rng).trim_end_matches('.')) },
            { "role": "assistant", "content": format!("{} {}", sentence(rng), sentence(rng)) },
        ]
    });
    format!("{record}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_is_deterministic_sized_and_parses() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        write_corpus(&a, 20_000, 3).unwrap();
        write_corpus(&b, 20_000, 3).unwrap();
        for name in FILES {
            let (x, y) = (
                std::fs::read_to_string(a.join(name)).unwrap(),
                std::fs::read_to_string(b.join(name)).unwrap(),
            );
            assert_eq!(x, y, "{name} differs between two runs with one seed");
            assert!(x.len() >= 20_000, "{name} has {} chars", x.len());
            if name.ends_with(".jsonl") {
                let lines: Vec<&str> = x.lines().collect();
                let distinct: std::collections::BTreeSet<&str> = lines.iter().copied().collect();
                assert_eq!(distinct.len(), lines.len(), "{name} repeats a document");
                for line in lines {
                    serde_json::from_str::<serde_json::Value>(line).unwrap();
                }
            } else {
                let docs: Vec<&str> = x.split("\n\n").filter(|d| !d.is_empty()).collect();
                assert!(docs.len() > 10);
                assert!(docs.iter().all(|d| d.starts_with("fn ")));
            }
        }
    }
}
