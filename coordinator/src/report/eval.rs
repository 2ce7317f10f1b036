//! The evaluation section of the report: one row per pruned candidate
//! (held-out and fit KL, same top-1, perplexities, per-domain held-out KL,
//! the candidate's slot replacement from `score`), and a plot of held-out
//! KL against K, one line per method. Reads `eval/summary.json` only.

use super::plots::{self, Series};
use crate::score::tables::MapTable;
use common::eval::{names, EvalSummary, Figures};
use common::store::RunStore;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Object name of the plot of held-out KL against K.
pub use common::layout::eval::KL_PLOT;

/// `score`'s per-(method, K) tables from `score/score.json`, for the slot
/// replacement column; none when scoring has not run (the column reads `-`).
pub async fn slot_tables(store: &RunStore) -> anyhow::Result<Vec<MapTable>> {
    let name = crate::score::outputs::REPORT_JSON;
    let Some(bytes) = store.get_opt(name).await? else {
        return Ok(Vec::new());
    };
    let r: crate::score::ScoreReport = serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("{} is not a score report: {e}", store.url_of(name)))?;
    Ok(r.tables)
}

/// `eval/summary.json` of a run, if an evaluation finished there.
pub async fn load(store: &RunStore) -> anyhow::Result<Option<EvalSummary>> {
    let Some(bytes) = store.get_opt(names::SUMMARY_JSON).await? else {
        return Ok(None);
    };
    let s = serde_json::from_slice(&bytes).map_err(|e| {
        anyhow::anyhow!(
            "{} is not an eval summary: {e}",
            store.url_of(names::SUMMARY_JSON)
        )
    })?;
    Ok(Some(s))
}

fn kl(f: Option<&Figures>) -> String {
    f.map_or("-".into(), |f| {
        format!(
            "{:.4} ± {:.4} (p50 {:.4}, p90 {:.4}, p99 {:.4}, p99.9 {:.4}, max {:.4})",
            f.kl.mean, f.kl.se, f.kl.p50, f.kl.p90, f.kl.p99, f.kl.p999, f.kl.max
        )
    })
}

/// The Markdown table of an evaluation; `slots` are `score`'s tables (the
/// slot replacement column reads `-` for a candidate without one).
pub fn table(s: &EvalSummary, slots: &[MapTable]) -> String {
    let mut md = String::from(
        "| candidate | K | held-out KL mean ± se (percentiles) | fit KL mean ± se (percentiles) | same top-1 (held-out) | ppl base / candidate / ratio (held-out) | held-out KL per domain | slot replacement |\n|---|---|---|---|---|---|---|---|\n",
    );
    for c in &s.candidates {
        let held = c.splits.get("heldout").map(|x| &x.all);
        let fit = c.splits.get("fit").map(|x| &x.all);
        let main = held.or(fit);
        let domains: Vec<String> = c
            .splits
            .get("heldout")
            .map(|x| {
                x.domains
                    .iter()
                    .map(|(d, f)| format!("{} {:.4}", super::cell(d), f.kl.mean))
                    .collect()
            })
            .unwrap_or_default();
        let slot = slots
            .iter()
            .find(|t| t.method == c.method && t.k == c.k)
            .map_or("-".into(), |t| {
                format!("{:.1}%", 100.0 * t.slot_replacement_mean)
            });
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            c.name,
            c.k,
            kl(held),
            kl(fit),
            main.map_or("-".into(), |f| format!("{:.2}%", 100.0 * f.top1_same)),
            main.map_or("-".into(), |f| format!(
                "{:.3} / {:.3} / {:.4}",
                f.ppl_base, f.ppl_candidate, f.ppl_ratio
            )),
            if domains.is_empty() {
                "-".into()
            } else {
                domains.join(", ")
            },
            slot
        );
    }
    md
}

/// Held-out mean KL against K, one series per method (methods with a
/// held-out figure only).
pub fn kl_series(s: &EvalSummary) -> Vec<Series> {
    let mut by_method: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for c in &s.candidates {
        if let Some(h) = c.splits.get("heldout") {
            by_method
                .entry(&c.method)
                .or_default()
                .push((f64::from(c.k), h.all.kl.mean));
        }
    }
    by_method
        .into_iter()
        .map(|(m, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                label: m.to_string(),
                points,
            }
        })
        .collect()
}

/// Appends the evaluation section to `md`, writing the plot; returns the
/// plots written.
pub async fn section(
    store: &RunStore,
    slots: &[MapTable],
    md: &mut String,
) -> anyhow::Result<Vec<String>> {
    md.push_str("## Pruned candidates against the base model\n\n");
    let Some(s) = load(store).await? else {
        let missing = format!(
            "{} is missing: run `coordinator eval RUN --keep-maps ...` to compare pruned models with the base model",
            store.url_of(names::SUMMARY_JSON)
        );
        let _ = writeln!(md, "Not shown: {missing}.\n");
        return Ok(Vec::new());
    };
    let _ = writeln!(
        md,
        "KL(base ‖ candidate) per scored position over the whole vocabulary, {} chunks, first {} positions of each chunk skipped; percentiles are exact (nearest rank). Figures: [eval/summary.json](../eval/summary.json).\n",
        s.n_chunks, s.skip_first
    );
    md.push_str(&table(&s, slots));
    md.push('\n');
    let series = kl_series(&s);
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let png = plots::line_chart(
        "Held-out KL(base ‖ pruned) against K",
        "K (experts kept per layer)",
        "mean KL (nats)",
        &series,
    )?;
    store.put(KL_PLOT, png).await?;
    md.push_str("![held-out KL against K](eval_kl_vs_k.png)\n\n");
    Ok(vec![KL_PLOT.to_string()])
}
