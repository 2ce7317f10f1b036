//! Evaluation of pruned candidates against the base model (DESIGN section 12).
//!
//! - [`partial`]: [`EvalPartial`], the exact per-(split, domain) sums and
//!   per-position KL values a worker returns for an eval lease, their exact
//!   merge and a bounded decoder.
//! - [`agree`]: whether two workers' eval partials of one lease agree
//!   (bitwise on one backend, within stated tolerances across backends).
//! - [`bounds`]: the figures an eval partial may hold (finite KL of at
//!   least 0, counts in range, sums those of their positions).
//! - [`memory`]: [`ModelsInMemory`], how many models a worker holds at once.
//! - [`summary`]: [`EvalSummary`], the float view written as
//!   `eval/summary.json` and read by the report.
//! - [`stats`]: intervals by clusters (held-out groups) and
//!   llama-perplexity's percentiles.
//! - [`choice`]: K from a KL budget held by every domain, and the
//!   size-versus-KL Pareto front.
//! - [`generation`]: the generation check, greedy continuations of
//!   held-out prompts by the base model and each candidate.

pub mod agree;
pub mod bounds;
pub mod choice;
pub mod generation;
pub mod memory;
pub mod partial;
pub mod stats;
pub mod summary;

pub use generation::{GenerateJob, Generation, GenerationNoise, GenerationSummary, Prompt};
pub use memory::ModelsInMemory;
pub use partial::{
    BaseSums, CandidateResult, CandidateSums, CellKey, ChunkSums, EvalPartial, Group, TokenKl,
    EVAL_FORMAT_VERSION,
};
pub use stats::Interval;
pub use summary::{
    Binding, BudgetPicks, BudgetScope, Comparison, DomainDiff, EvalSummary, Figures, KlFigures,
    Paired, PairedRow,
};

/// Why eval partials cannot be decoded or combined.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// The bytes are not an eval partial of this build.
    #[error("{0}")]
    Decode(String),
    /// Two partials of different evaluations, or an overlap.
    #[error("eval partials do not combine: {0}")]
    Mismatch(String),
}

#[cfg(test)]
mod tests;
