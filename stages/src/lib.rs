//! The stages after collection, in data-flow order: [`score`] ranks
//! experts into keep maps, [`verify`] checks the merged statistics' invariants,
//! [`prune`] slices a model to a keep map, [`eval`] measures pruned candidates
//! against the base through the runtime's lease pipeline, [`report`] renders
//! what the earlier stages wrote, and [`ship`] quantises and measures the
//! files users deploy. Each stage reads only what earlier ones wrote, as
//! typed files of the run location; none depends on the corpus crate,
//! the worker or llama.cpp (workers do the model's work, over the runtime).
//!
//! Every stage reports through one error type, [`StagesError`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod error;
pub mod eval;
pub mod own;
pub mod prune;
pub mod report;
pub mod score;
pub mod ship;
pub mod verify;

pub use error::{During, StagesError};

/// The tokio runtime a stage's command-line entry point runs its I/O on.
fn async_runtime() -> Result<tokio::runtime::Runtime, StagesError> {
    tokio::runtime::Runtime::new().map_err(|source| StagesError::Runtime { source })
}

/// Where a stage run with `--out NAME` writes: `explore/NAME/` in the run
/// (`None`: the run itself); a name that is not one is refused.
fn explore_output(
    store: &runfiles::store::RunStore,
    name: Option<&str>,
) -> Result<runfiles::store::RunStore, StagesError> {
    let Some(name) = name else {
        return Ok(store.clone());
    };
    let prefix = runfiles::layout::explore(name).ok_or_else(|| StagesError::Argument {
        argument: format!("--out {name}"),
        problem: runfiles::layout::EXPLORE_NAME_RULE.into(),
    })?;
    Ok(store.child(&prefix))
}
