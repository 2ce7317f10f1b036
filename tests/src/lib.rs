//! Shared fixtures of the end-to-end tests: generated models, small
//! tokenized corpora, paths of the built binaries, and an independent GGUF
//! reader through llama.cpp's own C API.
#![deny(missing_docs)]

pub mod llama_gguf;

use common::corpus::{write_chunks, Chunk, CorpusIndex, Span, CHUNKS_FILE, INDEX_FILE};
use common::{ChunkId, Split};
use std::path::{Path, PathBuf};
use worker::synth::Preset;

/// Writes a preset model into `dir` and returns its path.
pub fn model(dir: &Path, preset: Preset) -> PathBuf {
    let path = dir.join(format!("{preset:?}.gguf").to_lowercase());
    worker::synth::write_model(preset, 7, &path).expect("model generates");
    path
}

/// A deterministic corpus of `n_chunks` chunks of `n_ctx` tokens (the last
/// one shorter) over two domains, with fit and held-out spans in each chunk.
pub fn chunks(n_chunks: u32, n_ctx: u32) -> Vec<Chunk> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n_chunks)
        .map(|id| {
            let len = if id + 1 == n_chunks {
                n_ctx * 5 / 8
            } else {
                n_ctx
            };
            let tokens = (0..len).map(|_| (next() % 600) as i32).collect();
            let a = len / 3 + id % 5;
            let b = 2 * len / 3;
            let spans = vec![
                Span {
                    start: 0,
                    len: a,
                    split: Split::Fit,
                    domain: (id % 2) as u16,
                },
                Span {
                    start: a,
                    len: b - a,
                    split: Split::Heldout,
                    domain: 1,
                },
                Span {
                    start: b,
                    len: len - b,
                    split: Split::Fit,
                    domain: 0,
                },
            ];
            Chunk {
                id: ChunkId(id),
                tokens,
                spans,
            }
        })
        .collect()
}

/// Writes `chunks` as a tokenized corpus under `dir/corpus/`; returns its index.
pub fn write_corpus(dir: &Path, chunks: &[Chunk], n_ctx: u32) -> CorpusIndex {
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    let bytes = write_chunks(chunks).unwrap();
    let index = CorpusIndex {
        n_chunks: chunks.len() as u32,
        n_ctx,
        domains: vec!["en".into(), "ja".into()],
        n_tokens: chunks.iter().map(|c| c.tokens.len() as u64).sum(),
        chunks_sha256: common::hash::sha256_hex(&bytes),
    };
    std::fs::write(corpus.join(CHUNKS_FILE), bytes).unwrap();
    std::fs::write(corpus.join(INDEX_FILE), serde_json::to_vec(&index).unwrap()).unwrap();
    index
}

/// Copies a tokenized corpus (`corpus/index.json`, `corpus/chunks.parquet`)
/// from one run location to another, e.g. a local run to an S3 prefix.
pub async fn copy_corpus(from: &common::store::RunStore, to: &common::store::RunStore) {
    for name in ["corpus/index.json", "corpus/chunks.parquet"] {
        to.put(name, from.get(name).await.unwrap()).await.unwrap();
    }
}

/// Runs a workspace binary; prints its stderr when it fails.
pub fn run(bin_name: &str, args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(bin(bin_name))
        .args(args)
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!(
            "{bin_name} {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Runs a workspace binary and asserts that it succeeds.
pub fn run_ok(bin_name: &str, args: &[&str]) -> std::process::Output {
    let out = run(bin_name, args);
    assert!(
        out.status.success(),
        "{bin_name} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// Path of a binary built by this workspace (`worker`, `coordinator`).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --workspace` first",
        path.display()
    );
    path
}
