//! Progress: a bar on a terminal (tokens measured, tokens/s, ETA, and
//! per-worker throughput), and a line in the log every few seconds
//! ([`Report`]) for runs whose output goes to a file.

use crate::net::hub::WorkerInfo;
use indicatif::{ProgressBar, ProgressStyle};
use sched::Identity;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

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

/// `name 1234 tok/s` per worker, from busy time on the coordinator's clock.
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

/// A phase's progress line in the log, at most every `interval`: leases
/// and tokens done of the total, this process's rate, the ETA at that rate,
/// and the workers serving the phase. Plain text, so it reads the same in
/// a Slurm log or `kubectl logs`.
pub struct Report {
    phase: &'static str,
    units: usize,
    tokens: Option<u64>,
    /// Units and tokens done when the phase started (resumed from storage).
    resumed: (usize, u64),
    start: Instant,
    last: Instant,
    interval: Duration,
}

impl Report {
    /// A report of `phase` over `units` units (`tokens` tokens, when the
    /// total is known), `resumed` (units, tokens) of them already done.
    pub fn new(
        phase: &'static str,
        units: usize,
        tokens: Option<u64>,
        resumed: (usize, u64),
        interval: Duration,
    ) -> Report {
        let now = Instant::now();
        Report {
            phase,
            units,
            tokens,
            resumed,
            start: now,
            last: now,
            interval,
        }
    }

    /// Logs the line when `interval` has passed since the last one, with
    /// `done` units and `tokens` tokens done, `workers` serving the phase.
    pub fn tick(&mut self, done: usize, tokens: u64, workers: usize) {
        if self.last.elapsed() >= self.interval {
            self.last = Instant::now();
            tracing::info!("{}", self.line(done, tokens, workers, self.start.elapsed()));
        }
    }

    /// The line after `elapsed` of this phase.
    fn line(&self, done: usize, tokens: u64, workers: usize, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let rate = tokens.saturating_sub(self.resumed.1) as f64 / secs;
        let units_per_s = done.saturating_sub(self.resumed.0) as f64 / secs;
        let eta = match self.units.saturating_sub(done) {
            0 => "0s".to_string(),
            left if units_per_s > 0.0 => clock(left as f64 / units_per_s),
            _ => "unknown (no lease done yet)".to_string(),
        };
        let total = self.tokens.map_or(String::new(), |t| format!("/{t}"));
        format!(
            "{}: {done}/{} leases, {tokens}{total} tokens, {rate:.0} tokens/s, ETA {eta}, {workers} workers",
            self.phase, self.units
        )
    }
}

/// Seconds as `1h02m03s`, `2m03s` or `3s`.
fn clock(secs: f64) -> String {
    let s = secs.ceil() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// Whether the log goes to a terminal (where a bar can be drawn).
pub fn on_terminal() -> bool {
    std::io::stderr().is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_has_done_of_total_rate_eta_and_workers() {
        let r = Report::new(
            "collection",
            10,
            Some(5000),
            (2, 1000),
            Duration::from_secs(5),
        );
        // 4 more units and 2000 more tokens in 20 s: 100 tokens/s, 0.2
        // units/s, 4 units left.
        let line = r.line(6, 3000, 3, Duration::from_secs(20));
        assert_eq!(
            line,
            "collection: 6/10 leases, 3000/5000 tokens, 100 tokens/s, ETA 20s, 3 workers"
        );
        let eval = Report::new("evaluation", 200, None, (0, 0), Duration::from_secs(5));
        assert_eq!(
            eval.line(1, 50, 1, Duration::from_secs(10)),
            "evaluation: 1/200 leases, 50 tokens, 5 tokens/s, ETA 33m10s, 1 workers"
        );
        assert!(eval
            .line(0, 0, 0, Duration::from_secs(1))
            .contains("ETA unknown"));
        assert_eq!(clock(3723.0), "1h02m03s");
    }
}
