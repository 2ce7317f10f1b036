//! The progress bar: tokens measured, tokens/s, ETA, and per-worker throughput.

use crate::net::hub::WorkerInfo;
use indicatif::{ProgressBar, ProgressStyle};
use sched::Identity;
use std::collections::BTreeMap;

/// Progress over the corpus's tokens.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar over `total` tokens, `done` of them resumed from storage.
    pub fn new(total: u64, done: u64) -> Progress {
        let bar = ProgressBar::new(total).with_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {human_pos}/{human_len} tokens {per_sec} ETA {eta} {msg}",
            )
            .expect("valid template"),
        );
        bar.set_position(done);
        bar.reset_eta();
        Progress { bar }
    }

    /// Adds measured tokens and refreshes the per-worker line.
    pub fn advance(&self, tokens: u64, workers: &BTreeMap<Identity, WorkerInfo>) {
        self.bar.inc(tokens);
        self.bar.set_message(worker_line(workers));
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// `name 1234 tok/s` per worker, from worker-side busy time.
pub fn worker_line(workers: &BTreeMap<Identity, WorkerInfo>) -> String {
    workers
        .values()
        .filter(|w| w.leases > 0)
        .map(|w| format!("{} {:.0} tok/s", w.name, throughput(w)))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Tokens per second of busy time.
pub fn throughput(w: &WorkerInfo) -> f64 {
    if w.busy_ms == 0 {
        0.0
    } else {
        w.tokens as f64 * 1000.0 / w.busy_ms as f64
    }
}
