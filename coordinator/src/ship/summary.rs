//! The summary of a `coordinator ship`: one row per shipped file (size,
//! what it is, held-out and fit KL, same top-1, RMS Δp, perplexity ratio,
//! slot replacement), the files that are best at their size (no file of at
//! most their size has a lower held-out KL), and a plot of size against
//! held-out KL. Written as `ship.md`, `ship.json` and `ship_size_vs_kl.png`
//! in the output directory.

use super::card::ModelCard;
use common::eval::Figures;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// File name of the summary table.
pub const TABLE_MD: &str = "ship.md";
/// File name of the summary as JSON.
pub const SUMMARY_JSON: &str = "ship.json";
/// File name of the plot.
pub const PLOT_PNG: &str = "ship_size_vs_kl.png";

/// One shipped file in the summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Its name.
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// What it is, in words.
    pub description: String,
    /// Held-out figures (whole split).
    pub heldout: Option<Figures>,
    /// Fit figures (whole split).
    pub fit: Option<Figures>,
    /// Mean slot replacement of its keep map.
    pub slot_replacement: Option<f64>,
    /// No file of at most its size has a lower held-out KL.
    pub best_at_size: bool,
}

/// `ship.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShipSummary {
    /// Base model name and SHA-256.
    pub base: String,
    /// One row per shipped file, in ship order.
    pub rows: Vec<Row>,
}

/// The KL a file is ranked by: held-out, or fit when nothing is held out.
fn rank_kl(r: &Row) -> Option<f64> {
    r.heldout.as_ref().or(r.fit.as_ref()).map(|f| f.kl.mean)
}

/// Marks the rows no other row beats: none of at most their size has a
/// lower KL (at equal KL the smaller file wins).
fn mark_best_at_size(rows: &mut [Row]) {
    let best: Vec<bool> = rows
        .iter()
        .map(|r| {
            let Some(kl) = rank_kl(r) else { return false };
            !rows.iter().any(|o| {
                rank_kl(o).is_some_and(|o_kl| {
                    o.name != r.name
                        && o.bytes <= r.bytes
                        && (o_kl < kl || (o_kl == kl && o.bytes < r.bytes))
                })
            })
        })
        .collect();
    for (r, b) in rows.iter_mut().zip(best) {
        r.best_at_size = b;
    }
}

impl ShipSummary {
    /// The rows of `cards`, with the best file at each size marked.
    pub fn of(cards: &[ModelCard]) -> ShipSummary {
        let mut rows: Vec<Row> = cards
            .iter()
            .map(|c| Row {
                name: c.name.clone(),
                bytes: c.bytes,
                description: c.describe(),
                heldout: c.measured.splits.get("heldout").map(|s| s.all.clone()),
                fit: c.measured.splits.get("fit").map(|s| s.all.clone()),
                slot_replacement: c.pruning.as_ref().map(|p| p.slot_replacement_mean),
                best_at_size: false,
            })
            .collect();
        mark_best_at_size(&mut rows);
        ShipSummary {
            base: cards
                .first()
                .map_or(String::new(), |c| format!("{} (SHA-256 {})", c.base.name, c.base.sha256)),
            rows,
        }
    }

    /// Pretty JSON.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a summary serialises");
        v.push(b'\n');
        v
    }

    /// The Markdown table; `★` marks the best file at its size.
    pub fn table(&self) -> String {
        let mut md = String::from(
            "| file | size (MiB) | held-out KL mean ± se (p99) | fit KL mean ± se | same top-1 (held-out) | RMS Δp (held-out) | ppl ratio (held-out) | slot replacement | best at its size |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        let kl = |f: Option<&Figures>, p99: bool| {
            f.map_or("-".into(), |f| match p99 {
                true => format!("{:.4} ± {:.4} ({:.4})", f.kl.mean, f.kl.se, f.kl.p99),
                false => format!("{:.4} ± {:.4}", f.kl.mean, f.kl.se),
            })
        };
        for r in &self.rows {
            let main = r.heldout.as_ref().or(r.fit.as_ref());
            let _ = writeln!(
                md,
                "| {} | {:.2} | {} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.bytes as f64 / 1048576.0,
                kl(r.heldout.as_ref(), true),
                kl(r.fit.as_ref(), false),
                main.map_or("-".into(), |f| format!("{:.2}%", 100.0 * f.top1_same)),
                main.map_or("-".into(), |f| format!("{:.3}%", 100.0 * f.dprob_rms)),
                main.map_or("-".into(), |f| format!("{:.4}", f.ppl_ratio)),
                r.slot_replacement
                    .map_or("-".into(), |s| format!("{:.1}%", 100.0 * s)),
                if r.best_at_size { "★" } else { "" }
            );
        }
        md
    }

    /// The plot of file size (MiB) against held-out KL, the best files at
    /// their size joined by a line.
    pub fn plot(&self) -> anyhow::Result<Vec<u8>> {
        let points: Vec<crate::report::plots::Point> = self
            .rows
            .iter()
            .filter_map(|r| {
                rank_kl(r).map(|kl| crate::report::plots::Point {
                    label: r.name.clone(),
                    x: r.bytes as f64 / 1048576.0,
                    y: kl,
                    highlight: r.best_at_size,
                })
            })
            .collect();
        crate::report::plots::scatter(
            "Shipped files: size against held-out KL (best at each size joined)",
            "file size (MiB)",
            "held-out KL(base ‖ file), nats",
            &points,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, bytes: u64, kl: f64) -> Row {
        let mut f = Figures::default();
        f.kl.mean = kl;
        Row {
            name: name.into(),
            bytes,
            description: String::new(),
            heldout: Some(f),
            fit: None,
            slot_replacement: None,
            best_at_size: false,
        }
    }

    #[test]
    fn the_best_files_are_those_no_smaller_file_beats() {
        let mut rows = vec![
            row("big", 100, 0.01),
            row("mid_bad", 60, 0.2),
            row("mid", 50, 0.05),
            row("small", 20, 0.3),
            row("small_tie", 20, 0.3),
            row("smaller_tie", 10, 0.3),
        ];
        mark_best_at_size(&mut rows);
        let best: Vec<&str> = rows.iter().filter(|r| r.best_at_size).map(|r| r.name.as_str()).collect();
        assert_eq!(best, ["big", "mid", "smaller_tie"]);
        let s = ShipSummary {
            base: String::new(),
            rows,
        };
        assert_eq!(s.table().matches('★').count(), 3);
    }
}
