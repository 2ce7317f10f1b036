//! Shipped files measured against the base model: one evaluation job of
//! every shipped model file, run by the evaluation pipeline
//! ([`crate::eval::evaluate`]: the same runner, workers, checks, exact merge
//! and resume), with its objects under `ship/eval/` so the run's own
//! `eval/` stays as it is. Workers make each file from their base model
//! as its recipe says ([`EvalCandidate`]) and must match its SHA-256; a
//! second ship of the same files resumes every stored eval partial.

use super::spec::Candidate;
use crate::eval::recorded::{evaluate_held, evaluate_recorded, recorded, Base};
use crate::eval::{check_base, Choice};
use crate::MeasureError;
use gguf::quant::QuantType;
use numbers::eval::choice::pareto_front;
use numbers::eval::EvalSummary;
use numbers::Split;
use protocol::wire::{EvalCandidate, EvalJob};
use runfiles::store::RunStore;
use runtime::run::crew::Crew;
use runtime::run::RunSetup;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// The job's entry of the shipped model file `file` (`<name>.gguf`) of
/// candidate `c`, quantised to `quant`.
pub fn job_candidate(
    file: &str,
    sha256: &str,
    c: &Candidate,
    quant: Option<QuantType>,
) -> EvalCandidate {
    EvalCandidate {
        name: file.strip_suffix(".gguf").unwrap_or(file).to_string(),
        keep_map: c.keep_map_object(),
        sha256: sha256.to_string(),
        expert_used: c.experts_used,
        quant,
    }
}

/// Who evaluates the shipped files, and under whose lock.
pub enum Evaluator<'a> {
    /// `coordinator ship`: the evaluation takes the run's lock, with this
    /// many local workers (0: waits for workers to join).
    Own {
        /// Local worker processes.
        local_workers: u32,
    },
    /// `coordinator run` with `[ship]`: it holds the lock (`setup.store` is
    /// the lock's) and has its workers (those of its earlier phases).
    Locked {
        /// The run being shipped from.
        setup: &'a RunSetup,
        /// Its workers.
        crew: &'a mut Crew<'static>,
    },
}

/// Evaluates `candidates` against `base` on the run's corpus with the
/// splits and skipped positions of the run's `[eval]`, by `how`; prints
/// the evaluation's table and returns its figures (with each file's size
/// from `sizes`, by candidate name).
pub async fn measure(
    store: &RunStore,
    base: &Path,
    candidates: Vec<EvalCandidate>,
    sizes: BTreeMap<String, u64>,
    how: Evaluator<'_>,
) -> Result<EvalSummary, MeasureError> {
    let (_, config) = recorded(store).await?;
    let splits = config.eval.split.splits();
    let sha256 = check_base(store, base).await?;
    let index = runtime::run::read_index(store).await?;
    let job = EvalJob {
        candidates,
        skip_first: config.eval.skip_first_of(index.n_ctx),
        splits,
        models_in_memory: config.eval.models_in_memory,
        scratch_dir: config.eval.scratch_dir.clone(),
        generate: crate::eval::prompts::job(store, &config.eval, &index).await?,
    };
    let out = runfiles::layout::SHIP_EVAL;
    let base = Base { path: base, sha256 };
    let choice = Choice {
        sizes,
        kl_budget: None,
        budget_scope: Default::default(),
    };
    let outcome = match how {
        Evaluator::Own { local_workers } => {
            evaluate_recorded(store, &config, base, job, out, choice, local_workers).await?
        }
        Evaluator::Locked { setup, crew } => {
            evaluate_held(setup, base, job, out, choice, crew).await?
        }
    };
    Ok(outcome.summary)
}

/// The ship table: one row per shipped model file (`(file, bytes)`), with
/// its held-out figures (fit where no held-out positions were scored), KL
/// with its 95% interval clustered by group, and whether the file is on the
/// size-versus-KL Pareto front (no other shipped file is both smaller and
/// closer to the base model).
pub fn table(files: &[(String, u64)], s: &EvalSummary) -> String {
    let mut md = String::from(
        "| file | bytes | KL mean [95% interval] | KL p99 | same top-1 | ppl ratio [95% interval] | split | Pareto front |\n|---|---|---|---|---|---|---|---|\n",
    );
    let rows: Vec<_> = files
        .iter()
        .map(|(file, bytes)| {
            let stem = file.strip_suffix(".gguf").unwrap_or(file);
            let figures = s.candidates.iter().find(|c| c.name == stem).and_then(|c| {
                [Split::Heldout, Split::Fit]
                    .into_iter()
                    .find_map(|split| c.splits.get(&split).map(|f| (split, &f.all)))
                    .filter(|(_, f)| f.n > 0)
            });
            (file, *bytes, figures)
        })
        .collect();
    let measured: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|(_, b, f)| f.map(|(_, f)| (*b, f.kl.mean)))
        .collect();
    let mut front = pareto_front(&measured).into_iter();
    for (file, bytes, figures) in rows {
        let _ = match figures {
            Some((split, f)) => writeln!(
                md,
                "| {file} | {bytes} | {:.6} [{:.6}, {:.6}] | {:.6} | {:.2}% | {:.4} [{:.4}, {:.4}] | {split} | {} |",
                f.kl.mean,
                f.kl.lo,
                f.kl.hi,
                f.kl.p99,
                100.0 * f.top1_same,
                f.ppl_ratio,
                f.ppl_ratio_ci.lo,
                f.ppl_ratio_ci.hi,
                if front.next().unwrap_or(false) { "yes" } else { "" }
            ),
            None => writeln!(md, "| {file} | {bytes} | - | - | - | - | - | - |"),
        };
    }
    md
}
