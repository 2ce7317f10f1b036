//! The coordinator: everything after the worker's measurements, and the
//! orchestration around them.
//!
//! Data flows one way: [`merge`] combines partials, then scoring, replay and
//! the report read the merged artifacts.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod corpus;
pub mod eval;
pub mod lease;
pub mod merge;
pub mod net;
pub mod pipeline;
pub mod prune;
pub mod report;
pub mod run;
pub mod score;
pub mod ship;
pub mod verify;

pub use replay;
pub use sched;
