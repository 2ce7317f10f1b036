//! The evaluating engine behind `worker join` in an evaluation run:
//! [`EvalEngine`] is what the join loop needs, [`SlicedEvaluator`] the real
//! one (it makes the job's candidates from the base model first).

use crate::error::WorkerError;
use crate::eval::candidates::{self, Inputs};
use crate::eval::{Candidate, EvalOptions, Evaluator};
use crate::images::ImageBytes;
use numbers::eval::EvalPartial;
use protocol::wire::EvalJob;
use runfiles::corpus::{Chunk, CorpusIndex};
use std::path::Path;

/// Evaluates chunks of a corpus.
pub trait EvalEngine {
    /// SHA-256 of the base model.
    fn base_sha256(&self) -> String;
    /// Evaluates the chunks, whose images' bytes are in `images`.
    fn evaluate(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        images: &ImageBytes,
    ) -> Result<EvalPartial, String>;
}

/// The real evaluator with the scratch directory of its slices (under
/// [`EvalOptions::scratch_dir`], checked for room before writing; removed
/// when the engine is dropped).
pub struct SlicedEvaluator {
    evaluator: Evaluator,
    _scratch: tempfile::TempDir,
}

impl SlicedEvaluator {
    /// Makes the job's candidates from `base` and `inputs` and loads
    /// everything; a candidate whose SHA-256 differs from the job's is
    /// refused, naming the candidate and both hashes.
    pub fn load(
        base: &Path,
        inputs: &Inputs,
        eval: &EvalJob,
        opts: EvalOptions,
    ) -> Result<SlicedEvaluator, String> {
        let scratch = tempfile::tempdir_in(&opts.scratch_dir)
            .map_err(|e| format!("scratch directory {}: {e}", opts.scratch_dir.display()))?;
        let cands: Vec<Candidate> =
            candidates::make(base, &eval.candidates, inputs, scratch.path(), opts.threads)
                .map_err(|e| e.to_string())?;
        for (mine, theirs) in cands.iter().zip(&eval.candidates) {
            if mine.sha256 != theirs.sha256 {
                return Err(format!(
                    "candidate {}: this worker's candidate made from {} has SHA-256 {}, the coordinator's {}",
                    theirs.name,
                    base.display(),
                    mine.sha256,
                    theirs.sha256
                ));
            }
        }
        let evaluator = Evaluator::load(base, &cands, opts).map_err(|e| e.to_string())?;
        Ok(SlicedEvaluator {
            evaluator,
            _scratch: scratch,
        })
    }

    /// Loads the base model's mmproj ([`Evaluator::load_mmproj`]).
    pub fn load_mmproj(&mut self, mmproj: &Path) -> Result<String, WorkerError> {
        self.evaluator.load_mmproj(mmproj)
    }
}

impl EvalEngine for SlicedEvaluator {
    fn base_sha256(&self) -> String {
        self.evaluator.base_sha256().to_string()
    }

    fn evaluate(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        images: &ImageBytes,
    ) -> Result<EvalPartial, String> {
        self.evaluator
            .run_with_images(index, chunks, images, &mut |_, _| {})
            .map(|e| e.partial)
            .map_err(|e| e.to_string())
    }
}
