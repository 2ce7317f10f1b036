//! The distributed runtime: leases over the corpus's chunks ([`lease`]),
//! the QUIC hub that serves them to workers ([`net`]), the runner that holds
//! a run's lock, plan, resume, acceptance and running merge ([`run`]).
//!
//! It comes after the corpus in the data flow and before every analysis
//! stage: nothing here imports scoring, evaluation or the report. It may not
//! depend on the corpus crate or llama.cpp: the corpus reaches it as files.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod lease;
pub mod net;
pub mod run;
