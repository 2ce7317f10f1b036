//! `coordinator replay`: expert-cache replay of routing traces (DESIGN section 7).
//! It reads a run's files (traces, keep maps, the model's header) through the
//! run location and the GGUF format; it may not depend on the tokenizer,
//! llama.cpp, the runtime or a later stage.
//!
//! A layer's trace is turned into flat request arrays ([`steps`]): one step
//! per token (decode-like) or per ubatch (prefill-like, where the union of the
//! ubatch's experts must be resident), with a keep map applied first
//! ([`keep`], which also counts forced misses). Each policy ([`policy`])
//! replays those steps for every capacity: LRU on an intrusive list with a
//! one-pass miss curve ([`lru`]), the scored policies on flat per-slot key
//! arrays (a tournament tree of slots, [`tree`], for large caches; [`scored`])
//! with lazy EMA scores ([`ema`]) and Belady's next-use index; `static` pins
//! the experts with the most fit-split traffic ([`pinned`]). [`run`] streams
//! the trace one layer at a time ([`trace_io`]) across threads, after
//! [`inputs`] read the run; [`report`] sums the layers into the rows of
//! [`results`], the schema of `replay/results.json`. Prefetch replay
//! ([`prefetch`]) loads guessed experts before each token step, the guesses
//! made `d` layers earlier ([`predict`]: the trace's lookahead columns, the
//! "same experts as this layer" baseline, or the oracle), checked against
//! an eager reference ([`prefetch_reference`]); [`prefetch_report`] sums
//! it and the predictors' recall into `results.json`. Every failure is a
//! [`ReplayError`] naming the flag, file, object or column at fault.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod capacity;
pub mod ema;
pub mod error;
pub mod ids;
pub mod inputs;
pub mod keep;
pub mod lru;
pub mod model;
pub mod pinned;
pub mod policy;
pub mod predict;
pub mod prefetch;
pub mod prefetch_reference;
pub mod prefetch_report;
pub mod remote;
pub mod report;
pub mod results;
pub mod run;
pub mod scored;
pub mod steps;
pub mod synthetic;
pub mod trace_io;
pub mod tree;

#[cfg(test)]
mod encoding_tests;
#[cfg(test)]
mod prefetch_tests;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

pub use error::ReplayError;
pub use policy::{simulate, Cache, Policy, PolicyParams};
pub use results::{ReplayReport, ResultRow};
pub use run::{replay_in, replay_run, ReplayArgs};
pub use scored::Scorer;
pub use steps::{Steps, TokenReqs};

use serde::Serialize;

/// What one replay of one layer counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Cache requests: distinct experts per step, summed over steps.
    pub requests: u64,
    /// Requests whose expert was not resident.
    pub misses: u64,
    /// Steps that needed more experts than the capacity.
    pub overflow_steps: u64,
}
