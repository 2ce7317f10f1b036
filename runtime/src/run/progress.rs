//! Progress: a bar on a terminal (tokens measured, tokens/s, ETA, and
//! per-worker throughput; or, for a phase counted in items such as the
//! response phase's prompts, items done, items/s and ETA, with the tokens
//! beside), and a line in the log every few seconds ([`Report`]) for runs
//! whose output goes to a file.

use crate::net::hub::WorkerInfo;
use indicatif::{ProgressBar, ProgressStyle};
use sched::Identity;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Progress over the corpus's tokens, or over a phase's items.
pub struct Progress {
    bar: ProgressBar,
    /// Tokens so far, when the bar counts items.
    tokens: Option<u64>,
}

impl Progress {
    /// A bar over `total` tokens, `done` of them resumed from storage.
    pub fn new(total: u64, done: u64) -> Progress {
        Progress::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {human_pos}/{human_len} tokens {per_sec} ETA {eta} {msg}",
            total,
            done,
            None,
        )
    }

    /// A bar over `total` items named `label` (`prompts`), `done` of them
    /// (and `tokens` tokens) resumed from storage.
    pub fn over_items(label: &str, total: u64, done: u64, tokens: u64) -> Progress {
        let template = format!(
            "{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{human_pos}}/{{human_len}} {label} {{per_sec}} ETA {{eta}} {{msg}}"
        );
        Progress::with_template(&template, total, done, Some(tokens))
    }

    fn with_template(template: &str, total: u64, done: u64, tokens: Option<u64>) -> Progress {
        let bar = ProgressBar::new(total)
            .with_style(ProgressStyle::with_template(template).expect("valid template"));
        bar.set_position(done);
        bar.reset_eta();
        Progress { bar, tokens }
    }

    /// Adds measured tokens (and sets the items done, on a bar of items)
    /// and refreshes the per-worker line.
    pub fn advance(
        &mut self,
        tokens: u64,
        items_done: u64,
        workers: &BTreeMap<Identity, WorkerInfo>,
    ) {
        match &mut self.tokens {
            Some(t) => {
                *t += tokens;
                self.bar.set_position(items_done);
                self.bar
                    .set_message(format!("{t} tokens | {}", worker_line(workers)));
            }
            None => {
                self.bar.inc(tokens);
                self.bar.set_message(worker_line(workers));
            }
        }
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
/// (or the phase's items, then leases) and tokens done of the total, this
/// process's rate, the ETA at that rate, and the workers serving the
/// phase. Plain text, so it reads the same in a Slurm log or `kubectl
/// logs`.
pub struct Report {
    phase: &'static str,
    units: usize,
    tokens: Option<u64>,
    /// The items counted instead of leases: label, total, resumed.
    items: Option<(&'static str, u64, u64)>,
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
            items: None,
            resumed,
            start: now,
            last: now,
            interval,
        }
    }

    /// The same report counting `total` items named `label` (`prompts`),
    /// `resumed` of them done before the phase started: the line leads
    /// with them and the ETA follows their rate.
    pub fn with_items(mut self, label: &'static str, total: u64, resumed: u64) -> Report {
        self.items = Some((label, total, resumed));
        self
    }

    /// Logs the line when `interval` has passed since the last one, with
    /// `done` units, `items` items and `tokens` tokens done, `workers`
    /// serving the phase.
    pub fn tick(&mut self, done: usize, items: u64, tokens: u64, workers: usize) {
        if self.last.elapsed() >= self.interval {
            self.last = Instant::now();
            let line = self.line(done, items, tokens, workers, self.start.elapsed());
            tracing::info!("{line}");
        }
    }

    /// The line after `elapsed` of this phase.
    fn line(
        &self,
        done: usize,
        items: u64,
        tokens: u64,
        workers: usize,
        elapsed: Duration,
    ) -> String {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let rate = tokens.saturating_sub(self.resumed.1) as f64 / secs;
        let (left, per_s) = match self.items {
            Some((_, total, resumed)) => (
                total.saturating_sub(items),
                items.saturating_sub(resumed) as f64 / secs,
            ),
            None => (
                self.units.saturating_sub(done) as u64,
                done.saturating_sub(self.resumed.0) as f64 / secs,
            ),
        };
        let eta = match left {
            0 => "0s".to_string(),
            left if per_s > 0.0 => clock(left as f64 / per_s),
            _ => "unknown (no lease done yet)".to_string(),
        };
        let total = self.tokens.map_or(String::new(), |t| format!("/{t}"));
        let counted = match self.items {
            Some((label, all, _)) => {
                format!("{items}/{all} {label} ({done}/{} leases)", self.units)
            }
            None => format!("{done}/{} leases", self.units),
        };
        format!(
            "{}: {counted}, {tokens}{total} tokens, {rate:.0} tokens/s, ETA {eta}, {workers} workers",
            self.phase
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
        let line = r.line(6, 0, 3000, 3, Duration::from_secs(20));
        assert_eq!(
            line,
            "collection: 6/10 leases, 3000/5000 tokens, 100 tokens/s, ETA 20s, 3 workers"
        );
        let eval = Report::new("evaluation", 200, None, (0, 0), Duration::from_secs(5));
        assert_eq!(
            eval.line(1, 0, 50, 1, Duration::from_secs(10)),
            "evaluation: 1/200 leases, 50 tokens, 5 tokens/s, ETA 33m10s, 1 workers"
        );
        assert!(eval
            .line(0, 0, 0, 0, Duration::from_secs(1))
            .contains("ETA unknown"));
        assert_eq!(clock(3723.0), "1h02m03s");
    }

    #[test]
    fn a_line_of_items_leads_with_them_and_takes_their_eta() {
        // 47 prompts in 6 leases, 8 prompts (1 lease) resumed; 16 more
        // prompts and 960 tokens in 8 s: 2 prompts/s, 23 prompts left.
        let r = Report::new("responses", 6, None, (1, 400), Duration::from_secs(5))
            .with_items("prompts", 47, 8);
        assert_eq!(
            r.line(3, 24, 1360, 2, Duration::from_secs(8)),
            "responses: 24/47 prompts (3/6 leases), 1360 tokens, 120 tokens/s, ETA 12s, 2 workers"
        );
    }
}
