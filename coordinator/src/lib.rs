//! The library of the binaries `coordinator` and `worker`: every command
//! line of the project (the coordinator's [`cli`], the worker's
//! [`worker_cli`], what both do around a command in [`front`]) with the
//! tokio runtimes they start, the whole run ([`pipeline`]) with its response phase ([`respond`]), the exact merge of stored partials ([`merge`])
//! and the cluster's credentials ([`keys`]) over the crates that do the work, in data-flow
//! order: `config`, `corpus`, `runtime` (leases, QUIC, resume, running merge),
//! `stages` (score, verify, prune, report: files only) and `measure` (eval,
//! ship: over the runtime's workers).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cli;
pub mod front;
pub mod keys;
pub mod merge;
pub mod pipeline;
pub mod replay_cli;
pub mod respond;
pub mod stage_cli;
pub mod values;
pub mod worker_cli;
