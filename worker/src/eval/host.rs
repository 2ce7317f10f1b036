//! A group of micro-batches compared on the host: the base model decodes
//! the whole group, then each candidate does, and the scored rows of all of
//! them are compared in f64 at the end ([`rows::compare_rows`]).
//!
//! Decoding model by model rather than micro-batch by micro-batch keeps
//! each model's weights in the CPU's cache across the group's chunks: a
//! small base model and its candidates together overflow a last-level
//! cache that each fits alone, and alternating them every micro-batch
//! fetches every weight again from memory (BENCHMARKS.md, issue #22). The
//! price is a copy of every model's scored rows of the group, bounded by
//! [`KEPT_BYTES`]; a group of one micro-batch copies nothing (each context
//! still holds its logits when they are compared). The rows and their
//! comparison are those of decoding the micro-batches in turn, so the
//! figures are the same bit for bit.

use super::plan::Ubatch;
use super::rows::{self, RowResult, ScoredRow};
use super::Dumps;
use crate::error::WorkerError;
use crate::images::Embeddings;
use llama::{Context, NoGraph};
use std::time::Instant;

/// At most this many bytes of scored logits rows are kept for a group:
/// `(1 + n) x rows x n_vocab x 4` with n candidates, so a group holds
/// [`max_rows`] scored rows (a lease's at a vocabulary of a few thousand;
/// one micro-batch, copied nowhere, at the real vocabularies).
pub(super) const KEPT_BYTES: usize = 64 << 20;

/// The scored rows a group may keep for `models` models (base included) of
/// `n_vocab` tokens.
pub(super) fn max_rows(models: usize, n_vocab: usize) -> usize {
    KEPT_BYTES / (models.max(1) * n_vocab.max(1) * std::mem::size_of::<f32>())
}

/// Decodes `group` in the base model, then in each candidate (clearing a
/// context's KV cache at the start of each chunk), and compares the scored
/// rows; the results come in the group's row order (an image micro-batch
/// decodes its rows of `embeddings`). `host_s` gains the
/// seconds of the copies and the comparison; `dumps`, when given, every
/// decode's whole logits.
pub(super) fn compare_group<'m>(
    base: &mut Context<'m, NoGraph>,
    cands: &mut [Context<'m, NoGraph>],
    group: &[Ubatch<'_>],
    embeddings: &Embeddings,
    threads: usize,
    mut dumps: Option<&mut Dumps>,
    host_s: &mut f64,
) -> Result<Vec<RowResult>, WorkerError> {
    let n_vocab = base.n_vocab();
    let single = group.len() == 1;
    let n_rows: usize = group.iter().map(|u| u.rows.len()).sum();
    let mut kept: Vec<Vec<f32>> = Vec::new();
    for (m, ctx) in std::iter::once(&mut *base)
        .chain(cands.iter_mut())
        .enumerate()
    {
        let mut rows = Vec::with_capacity(if single { 0 } else { n_rows * n_vocab });
        for u in group {
            if u.pos0 == 0 {
                ctx.clear();
            }
            ctx.decode_input(u.input(embeddings), u.pos0 as i32)?;
            let logits = ctx.batch_logits();
            if let Some(d) = dumps.as_deref_mut() {
                d.entry((m, u.chunk.id.0))
                    .or_default()
                    .extend_from_slice(logits);
            }
            if !single {
                let started = Instant::now();
                for r in &u.rows {
                    rows.extend_from_slice(&logits[r.row * n_vocab..(r.row + 1) * n_vocab]);
                }
                *host_s += started.elapsed().as_secs_f64();
            }
        }
        kept.push(rows);
    }
    let (logits, rows): (Vec<&[f32]>, Vec<ScoredRow>) = if single {
        let logits = std::iter::once(&*base)
            .chain(cands.iter())
            .map(|c| c.batch_logits())
            .collect();
        (logits, group[0].rows.clone())
    } else {
        let rows = group
            .iter()
            .flat_map(|u| &u.rows)
            .enumerate()
            .map(|(row, r)| ScoredRow { row, next: r.next })
            .collect();
        (kept.iter().map(Vec::as_slice).collect(), rows)
    };
    let started = Instant::now();
    let results = rows::compare_rows(logits[0], &logits[1..], &rows, n_vocab, threads);
    *host_s += started.elapsed().as_secs_f64();
    Ok(results)
}
