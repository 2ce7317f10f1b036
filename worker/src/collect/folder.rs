//! The exact fold of finished chunks, on a thread of its own.
//!
//! Folding a chunk's f64 scratch into the run's [`ExactSum`]s touches every
//! importance-matrix sum of the model (113M at DESIGN section 11's shape), so
//! it runs beside the next chunk's decode instead of on ggml's calling thread.
//! Two scratches alternate: the observer fills one while this thread folds
//! the other; handing over a full one waits until the previous fold is done,
//! so at most two exist. Chunks are folded in the order they are handed over,
//! so the results are the ones an inline fold gives, bit for bit.
//!
//! [`ExactSum`]: numbers::exact::ExactSum

use super::scratch::ChunkScratch;
use super::strata::Strata;
use llama::yield_to_compute_threads;
use numbers::imatrix::Imatrix;
use numbers::projection::OutputProjection;
use numbers::stats::ChunkStats;
use numbers::stats::{ExpertAccum, MergeError};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

/// What the fold thread has accumulated once every chunk is in.
pub struct Folded {
    /// Expert statistics per (split, domain).
    pub experts: ExpertAccum,
    /// The importance matrix (`chunk_count` counts the folded chunks).
    pub imatrix: Imatrix,
    /// Compact fit-split statistics per chunk, in folding order.
    pub chunk_stats: Vec<ChunkStats>,
    /// Projected expert outputs, when collected.
    pub projection: Option<OutputProjection>,
}

/// A finished chunk handed to the fold thread.
struct Finished {
    chunk: u32,
    scratch: ChunkScratch,
}

/// Handle on the fold thread.
pub struct Folder {
    to_fold: Option<SyncSender<Finished>>,
    emptied: Receiver<ChunkScratch>,
    thread: Option<JoinHandle<Result<Folded, MergeError>>>,
    /// Shape of a fresh scratch: (MoE layers, experts).
    shape: (usize, usize),
    /// Whether the thread holds a scratch that it will hand back.
    lent: bool,
}

impl Folder {
    /// Starts the fold thread with empty accumulators (`projection`: the
    /// projected outputs', when collected); `strata` names the labels of
    /// the scratches' groups.
    pub fn start(
        strata: Strata,
        experts: ExpertAccum,
        imatrix: Imatrix,
        projection: Option<OutputProjection>,
        shape: (usize, usize),
    ) -> Folder {
        // Rendezvous: a hand-over waits for the thread to take it, which it
        // does only after the previous chunk is folded.
        let (to_fold, finished) = sync_channel::<Finished>(0);
        let (give_back, emptied) = sync_channel::<ChunkScratch>(1);
        let thread = std::thread::Builder::new()
            .name("exact-fold".into())
            .spawn(move || {
                yield_to_compute_threads();
                let sums = (experts, imatrix, projection);
                fold_all(&strata, sums, &finished, &give_back)
            })
            .expect("spawning the exact-fold thread");
        Folder {
            to_fold: Some(to_fold),
            emptied,
            thread: Some(thread),
            shape,
            lent: false,
        }
    }

    /// Hands over chunk `chunk`'s full scratch and returns an empty one to
    /// fill next: the one folded before (its buffers are reused) or, on the
    /// first call, a new one. Fails with the fold's error if an earlier
    /// chunk could not be folded.
    pub fn swap(&mut self, chunk: u32, scratch: ChunkScratch) -> Result<ChunkScratch, MergeError> {
        let sent = self
            .to_fold
            .as_ref()
            .is_some_and(|tx| tx.send(Finished { chunk, scratch }).is_ok());
        if !sent {
            return Err(self.stop());
        }
        if !std::mem::replace(&mut self.lent, true) {
            return Ok(ChunkScratch::new(self.shape.0, self.shape.1));
        }
        match self.emptied.recv() {
            Ok(empty) => Ok(empty),
            Err(_) => Err(self.stop()),
        }
    }

    /// Waits for the last fold and returns the accumulators.
    pub fn finish(mut self) -> Result<Folded, MergeError> {
        self.to_fold = None;
        self.join()
    }

    /// The thread's error after it stopped early.
    fn stop(&mut self) -> MergeError {
        self.to_fold = None;
        match self.join() {
            Ok(_) => MergeError::Shape("the exact-fold thread stopped early".into()),
            Err(e) => e,
        }
    }

    fn join(&mut self) -> Result<Folded, MergeError> {
        let thread = self
            .thread
            .take()
            .ok_or_else(|| MergeError::Shape("the exact-fold thread was already joined".into()))?;
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Folder {
    /// Stops the thread when a run ends early (an error elsewhere).
    fn drop(&mut self) {
        self.to_fold = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The fold thread: folds every handed-over chunk in order and hands its
/// emptied scratch back.
fn fold_all(
    strata: &Strata,
    (mut experts, mut imatrix, mut projection): (ExpertAccum, Imatrix, Option<OutputProjection>),
    finished: &Receiver<Finished>,
    give_back: &SyncSender<ChunkScratch>,
) -> Result<Folded, MergeError> {
    let mut chunk_stats = Vec::new();
    for Finished { chunk, mut scratch } in finished {
        chunk_stats.push(scratch.chunk_stats(chunk));
        scratch.fold_into(strata, &mut experts, &mut imatrix)?;
        if let Some(p) = projection.as_mut() {
            scratch.fold_projection(p)?;
        }
        imatrix.chunk_count += 1;
        // The collector stops asking once it has every chunk; the last
        // scratch is then dropped here.
        let _ = give_back.try_send(scratch);
    }
    Ok(Folded {
        experts,
        imatrix,
        chunk_stats,
        projection,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use numbers::stats::MoeShape;
    use numbers::{Gating, Split};

    const LAYERS: usize = 3;
    const EXPERTS: usize = 8;

    fn shape() -> MoeShape {
        MoeShape {
            n_expert: EXPERTS as u32,
            n_expert_used: 2,
            gating: Gating::Softmax,
            moe_layers: (0..LAYERS as u32).collect(),
            routing: numbers::routing::Routing::default(),
        }
    }

    /// A chunk's scratch with values that differ per chunk, so a lost,
    /// repeated or reordered chunk changes the accumulators.
    fn filled(mut scratch: ChunkScratch, chunk: u32) -> ChunkScratch {
        for (i, label) in [(Split::Fit, 0u16), (Split::Heldout, 1)]
            .into_iter()
            .enumerate()
        {
            let g = scratch.group(label);
            g.n_tokens += 5 + u64::from(chunk);
            for (li, l) in g.layers.iter_mut().enumerate() {
                for e in 0..EXPERTS {
                    let v = (chunk as f64 + 1.0) * 0.1 + (li * EXPERTS + e + i) as f64 / 7.0;
                    l.count[e] += 1 + e as u64;
                    l.prob[e] += v;
                    for (sum, x) in l
                        .routed
                        .iter_mut()
                        .zip([v / 3.0, v * 1.5, v * v, v * v * v])
                    {
                        sum[e] += x;
                    }
                    l.ean_max[e] = l.ean_max[e].max(v * 1.5);
                    l.act_max[e] = l.act_max[e].max(v * 0.75);
                }
            }
        }
        let m = scratch.imatrix_entry("blk.0.ffn_up_exps.weight", 4, EXPERTS);
        for (j, (s2, s)) in m.sum2.iter_mut().zip(m.sum.iter_mut()).enumerate() {
            *s2 += f64::from(chunk) / 3.0 + j as f64;
            *s -= f64::from(chunk) / 5.0 + j as f64;
        }
        m.counts.iter_mut().for_each(|c| *c += u64::from(chunk) + 1);
        for (i, v) in scratch.projected(Split::Heldout, 2).iter_mut().enumerate() {
            *v += (i as f64 + f64::from(chunk)).sin();
        }
        scratch
    }

    /// Folding on the thread, with scratches reused, gives exactly what
    /// folding inline chunk by chunk gives.
    #[test]
    fn threaded_fold_equals_the_inline_fold() {
        let strata = Strata::new(vec!["a".to_string(), "b".to_string()]).unwrap();
        let mut experts = ExpertAccum::new(shape());
        let mut imatrix = Imatrix::default();
        let mut stats = Vec::new();
        let mut projection = OutputProjection::new(2);
        for chunk in 0..5 {
            let mut s = filled(ChunkScratch::new(LAYERS, EXPERTS), chunk);
            stats.push(s.chunk_stats(chunk));
            s.fold_into(&strata, &mut experts, &mut imatrix).unwrap();
            s.fold_projection(&mut projection).unwrap();
            imatrix.chunk_count += 1;
        }
        let mut folder = Folder::start(
            strata,
            ExpertAccum::new(shape()),
            Imatrix::default(),
            Some(OutputProjection::new(2)),
            (LAYERS, EXPERTS),
        );
        let mut scratch = ChunkScratch::new(LAYERS, EXPERTS);
        for chunk in 0..5 {
            scratch = folder.swap(chunk, filled(scratch, chunk)).unwrap();
            assert!(scratch.groups.is_empty(), "a handed-back scratch is empty");
        }
        let folded = folder.finish().unwrap();
        assert_eq!(folded.experts, experts);
        assert_eq!(folded.imatrix, imatrix);
        assert_eq!(folded.chunk_stats, stats);
        assert_eq!(folded.imatrix.chunk_count, 5);
        assert_eq!(folded.projection, Some(projection));
    }

    /// A fold that fails (an imatrix entry changing shape) is reported by
    /// the next hand-over or by `finish`, never lost.
    #[test]
    fn a_failed_fold_is_reported() {
        let mut folder = Folder::start(
            Strata::new(vec!["a".into(), "b".into()]).unwrap(),
            ExpertAccum::new(shape()),
            Imatrix::default(),
            None,
            (LAYERS, EXPERTS),
        );
        let first = folder.swap(0, filled(ChunkScratch::new(LAYERS, EXPERTS), 0));
        let mut bad = ChunkScratch::new(LAYERS, EXPERTS);
        bad.imatrix_entry("blk.0.ffn_up_exps.weight", 5, EXPERTS);
        let mut errors = Vec::new();
        if let Err(e) = folder.swap(1, bad) {
            errors.push(e.to_string());
        }
        match folder.swap(2, first.unwrap()) {
            Err(e) => errors.push(e.to_string()),
            Ok(_) => match Folder::finish(folder) {
                Err(e) => errors.push(e.to_string()),
                Ok(_) => panic!("the shape change was not reported"),
            },
        }
        assert!(
            errors.iter().any(|e| e.contains("changed shape")),
            "errors: {errors:?}"
        );
    }
}
