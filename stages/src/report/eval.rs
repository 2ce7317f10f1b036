//! The evaluation section of the report: the evaluation's table (one row
//! per pruned candidate, [`table`]) and a plot of held-out KL against K,
//! one line per method. Reads `eval/summary.json` and `score/score.json`.

use super::plots::{self, Series};
pub use crate::eval::table::{size_points, size_table, slot_tables, table};
use crate::score::tables::MapTable;
use crate::StagesError;
use numbers::eval::choice;
use numbers::eval::EvalSummary;
use numbers::Split;
use runfiles::layout::eval as names;
use runfiles::store::RunStore;
use std::collections::BTreeMap;
use std::fmt::Write;

/// `ship/eval/summary.json`: the figures of the shipped files.
const SHIP_SUMMARY: &str = runfiles::layout::SHIP_EVAL.summary_json;

/// Object name of the plot of held-out KL against K.
pub use runfiles::layout::eval::KL_PLOT;

/// `eval/summary.json` of a run, if an evaluation finished there.
pub async fn load(store: &RunStore) -> Result<Option<EvalSummary>, StagesError> {
    let Some(bytes) = store.get_opt(names::SUMMARY_JSON).await? else {
        return Ok(None);
    };
    let s = StagesError::parse_json(
        &bytes,
        || store.url_of(names::SUMMARY_JSON),
        "an eval summary",
    )?;
    Ok(Some(s))
}

/// The size-versus-KL section: the evaluated candidates' sliced files and,
/// when `coordinator ship` evaluated its files (`ship/eval/summary.json`),
/// the shipped files (quantised ones among them), on one Pareto front.
async fn sizes(store: &RunStore, s: &EvalSummary) -> Result<String, StagesError> {
    let shipped: Option<EvalSummary> = match store.get_opt(SHIP_SUMMARY).await? {
        None => None,
        Some(bytes) => Some(StagesError::parse_json(
            &bytes,
            || store.url_of(SHIP_SUMMARY),
            "an eval summary",
        )?),
    };
    let split = choice::basis(s);
    let mut points = size_points(s, "eval", split);
    if let Some(ship) = &shipped {
        points.extend(size_points(ship, "ship", split));
    }
    if points.is_empty() {
        return Ok(String::new());
    }
    Ok(format!(
        "### Size against KL\n\nModel file bytes against {split} KL; the Pareto front holds the files no other file beats on both (`coordinator ship RUN --candidates pareto` ships the evaluated candidates on it).\n\n{}\n",
        size_table(&points, split)
    ))
}

/// Held-out mean KL against K, one series per method (methods with a
/// held-out figure only).
pub fn kl_series(s: &EvalSummary) -> Vec<Series> {
    let mut by_method: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for c in &s.candidates {
        if let Some(h) = c.splits.get(&Split::Heldout) {
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
) -> Result<Vec<String>, StagesError> {
    md.push_str("## Pruned candidates against the base model\n\n");
    let Some(s) = load(store).await? else {
        let hint = "run `coordinator eval RUN --keep-maps ...` to compare pruned models with the base model";
        super::not_shown(md, store, names::SUMMARY_JSON, hint);
        return Ok(Vec::new());
    };
    let _ = writeln!(
        md,
        "KL(base ‖ candidate) per scored position over the whole vocabulary, {} chunks, first {} positions of each chunk skipped; percentiles are exact, interpolated as llama-perplexity's. Intervals: {}. Figures: [eval/summary.json](../eval/summary.json).\n",
        s.n_chunks, s.skip_first, s.uncertainty
    );
    md.push_str(&table(&s, slots));
    md.push('\n');
    md.push_str(&sizes(store, &s).await?);
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
