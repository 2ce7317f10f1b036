//! One micro-batch compared on the device: the base model's scored rows
//! are kept on the backend that computed them and every candidate's rows
//! are compared with them there ([`LogitsCompare`]); the figures come back
//! as [`RowResult`]s, in row order, for the same exact folding as the host
//! path's. Only scored tokens have outputs, so the output head (and the
//! last block's feed-forward part) run on those alone, and a micro-batch
//! without scored positions skips the head.

use super::metrics::Compared;
use super::plan::Ubatch;
use super::rows::RowResult;
use super::Dumps;
use crate::error::WorkerError;
use crate::images::Embeddings;
use llama::{f32s, CandidateFigures, Context, LogitsCompare, NoGraph, Outputs, ReduceError};

/// Decodes `b` in the base model and every candidate (clearing their KV
/// caches at the start of a chunk) and compares their scored rows on the
/// device (an image micro-batch decodes its rows of `embeddings`); `dumps`
/// receives each model's whole logits, when given.
pub(super) fn compare_batch(
    base: &mut Context<'_, NoGraph>,
    cands: &mut [Context<'_, NoGraph>],
    cmp: &mut LogitsCompare,
    b: &Ubatch<'_>,
    embeddings: &Embeddings,
    dumps: Option<&mut Dumps>,
) -> Result<Vec<RowResult>, WorkerError> {
    let pos0 = b.pos0 as i32;
    let input = b.input(embeddings);
    if b.pos0 == 0 {
        base.clear();
        cands.iter_mut().for_each(|c| c.clear());
    }
    let chunk = b.chunk.id.0;
    let mut dump = dumps.map(|d| {
        move |m: usize, logits: &[f32]| d.entry((m, chunk)).or_default().extend_from_slice(logits)
    });
    if b.rows.is_empty() && dump.is_none() {
        base.decode_input(input, pos0)?;
        for c in cands.iter_mut() {
            c.decode_input(input, pos0)?;
        }
        return Ok(Vec::new());
    }
    // Outputs on the scored tokens only: the head (and the last block's
    // feed-forward part) skip the others. A dump wants every row.
    let (flags, rows) = outputs_of(b, dump.is_some());
    let outputs = outputs(&flags, dump.is_some());
    let next: Vec<i32> = b.rows.iter().map(|r| r.next as i32).collect();
    let scored = !rows.is_empty();
    let mut kept = None;
    base.decode_with_logits(input, pos0, outputs, &mut |t| {
        if let Some(d) = dump.as_mut() {
            d(0, &f32s(&t.bytes()).collect::<Vec<_>>());
        }
        if scored {
            kept = Some(cmp.keep_base(t, &rows, &next));
        }
    })?;
    let mut results: Vec<RowResult> = match kept {
        Some(k) => k.map_err(|e| graph_error(b, e))?.nll,
        None if scored => return Err(graph_error(b, unseen())),
        None => Vec::new(),
    }
    .iter()
    .map(|&nll| RowResult {
        nll_base: f64::from(nll),
        candidates: Vec::with_capacity(cands.len()),
    })
    .collect();
    for (i, c) in cands.iter_mut().enumerate() {
        let mut figures = None;
        c.decode_with_logits(input, pos0, outputs, &mut |t| {
            if let Some(d) = dump.as_mut() {
                d(i + 1, &f32s(&t.bytes()).collect::<Vec<_>>());
            }
            if scored {
                figures = Some(cmp.compare(t));
            }
        })?;
        if !scored {
            continue;
        }
        let f = figures
            .unwrap_or_else(|| Err(unseen()))
            .map_err(|e| graph_error(b, e))?;
        for (j, r) in results.iter_mut().enumerate() {
            r.candidates.push(compared(&f, j, r.nll_base));
        }
    }
    Ok(results)
}

/// Row `j` of a candidate's figures as the host folds them.
pub(super) fn compared(f: &CandidateFigures, j: usize, nll_base: f64) -> Compared {
    Compared {
        kl: f64::from(f.kl[j]),
        nll_base,
        nll_candidate: f64::from(f.nll[j]),
        top1_same: f.top1_same[j],
        dprob: f64::from(f.dprob[j]),
    }
}

/// The outputs a micro-batch decodes with on the device and the rows of
/// them that are compared: the scored tokens alone, or every token when
/// whole logits are dumped (`dump`).
pub(super) fn outputs_of(b: &Ubatch<'_>, dump: bool) -> (Vec<bool>, Vec<i32>) {
    let mut flags = vec![false; b.tokens.len()];
    b.rows.iter().for_each(|r| flags[r.row] = true);
    let rows = match dump {
        true => b.rows.iter().map(|r| r.row as i32).collect(),
        false => (0..b.rows.len() as i32).collect(),
    };
    (flags, rows)
}

/// What a micro-batch decodes with on the device, from [`outputs_of`]'s
/// `flags`: every token when whole logits are dumped (`dump`), else the
/// scored ones.
pub(super) fn outputs(flags: &[bool], dump: bool) -> Outputs<'_> {
    match dump {
        true => Outputs::All,
        false => Outputs::Rows(flags),
    }
}

/// A decode that never showed its logits (a graph without a node named
/// `result_output`).
pub(super) fn unseen() -> ReduceError {
    ReduceError::Shape("the graph has no logits node named result_output".into())
}

pub(super) fn graph_error(b: &Ubatch<'_>, e: ReduceError) -> WorkerError {
    WorkerError::Graph {
        chunk: b.chunk.id.0,
        reason: format!(
            "comparing logits on the device at position {}: {e} (`--compare host` compares them on the host)",
            b.pos0
        ),
    }
}
