//! The file-only stages after collection, in data-flow order: [`score`]
//! ranks experts into keep maps, [`verify`] checks the merged statistics'
//! invariants, [`prune`] slices a model to a keep map and [`report`] renders
//! what the stages wrote. Each stage reads only what earlier ones wrote, as
//! typed files of the run location; none depends on the corpus crate, the
//! worker, llama.cpp, the runtime or the network (the stages that lease work
//! to workers, eval and ship, are the `measure` crate's). Command-line
//! parsing and the async runtime are the coordinator binary's: the stages
//! are async functions taking plain option structs.
//!
//! Every stage reports through one error type, [`StagesError`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod error;
pub mod own;
pub mod prune;
pub mod report;
pub mod score;
pub mod verify;

pub use error::{During, StagesError};
