//! The `coordinator` binary's library: the command line ([`cli`], the
//! stages' in [`stage_cli`]), the whole run ([`pipeline`]) with its response phase ([`respond`]), the exact merge of stored partials ([`merge`])
//! and the cluster's credentials ([`keys`]) over the crates that do the work, in data-flow
//! order: `config`, `corpus`, `runtime` (leases, QUIC, resume, running merge),
//! `stages` (score, verify, prune, report: files only) and `measure` (eval,
//! ship: over the runtime's workers).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cli;
pub mod keys;
pub mod merge;
pub mod pipeline;
pub mod respond;
pub mod stage_cli;
