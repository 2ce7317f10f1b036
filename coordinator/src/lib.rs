//! The `coordinator` binary's library: the command line ([`cli`]) and the
//! whole run ([`pipeline`]) over the crates that do the work, in data-flow
//! order: `config`, `corpus`, `runtime` (leases, QUIC, resume, merge) and
//! `stages` (score, verify, prune, eval, report, ship).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cli;
pub mod pipeline;
