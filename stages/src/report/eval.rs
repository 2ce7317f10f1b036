//! The evaluation section of the report: the evaluation's table (one row
//! per pruned candidate, [`table`]), a plot of held-out KL against K, one
//! line per method with each 95% interval drawn as a bar, and, with a KL
//! budget, the same in the domain that binds each method's pick. Reads
//! `eval/summary.json` and `score/score.json`.

pub use super::eval_table::{size_points, size_table, slot_tables, table};
use super::plots::{self, Series};
use crate::score::tables::MapTable;
use crate::StagesError;
use numbers::eval::choice;
use numbers::eval::summary::CandidateSummary;
use numbers::eval::{EvalSummary, Figures};
use numbers::Split;
use runfiles::eval_summary;
use runfiles::layout::eval as names;
use runfiles::store::RunStore;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Object names of the plots of held-out KL against K (pooled, and in the
/// domains that bind the budget).
pub use runfiles::layout::eval::{KL_BINDING_PLOT, KL_PLOT};

/// The size-versus-KL section: the evaluated candidates' sliced files and,
/// when `coordinator ship` evaluated its files (`ship/eval/summary.json`),
/// the shipped files (quantised ones among them), on one Pareto front.
async fn sizes(store: &RunStore, s: &EvalSummary) -> Result<String, StagesError> {
    let shipped = eval_summary::read_opt(store, &runfiles::layout::SHIP_EVAL).await?;
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
/// held-out figure only), each point with its 95% interval.
pub fn kl_series(s: &EvalSummary) -> Vec<Series> {
    series_of(
        s,
        |c| c.splits.get(&Split::Heldout).map(|h| &h.all),
        |m| Some(m.to_string()),
    )
}

/// Held-out KL against K in the domain that binds each method's budget
/// pick ([`numbers::eval::Binding`]), one series per method; empty without
/// a budget or a binding domain.
pub fn binding_series(s: &EvalSummary) -> Vec<Series> {
    let Some(b) = &s.budget else {
        return Vec::new();
    };
    let domain = |m: &str| {
        b.binding
            .get(m)
            .and_then(Option::as_ref)
            .map(|x| x.domain.clone())
    };
    let mut out = Vec::new();
    for method in b.picks.keys() {
        let Some(d) = domain(method) else {
            continue;
        };
        let series = series_of(
            s,
            |c| {
                let held = c.splits.get(&Split::Heldout)?;
                match d == choice::POOLED {
                    true => Some(&held.all),
                    false => held.domains.get(&d),
                }
            },
            |m| (m == method.as_str()).then(|| format!("{m}: {d}")),
        );
        out.extend(series);
    }
    out
}

/// Mean KL against K per method from the figures `figures` picks, each
/// with its interval; `label` names a method's series (`None` leaves the
/// method out).
fn series_of<'a>(
    s: &'a EvalSummary,
    figures: impl Fn(&'a CandidateSummary) -> Option<&'a Figures>,
    label: impl Fn(&str) -> Option<String>,
) -> Vec<Series> {
    let mut by_method: BTreeMap<&str, Vec<(f64, f64, f64, f64)>> = BTreeMap::new();
    for c in &s.candidates {
        if let Some(f) = figures(c).filter(|f| f.n > 0) {
            by_method.entry(&c.method).or_default().push((
                f64::from(c.k),
                f.kl.mean,
                f.kl.lo,
                f.kl.hi,
            ));
        }
    }
    by_method
        .into_iter()
        .filter_map(|(m, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Some(Series {
                label: label(m)?,
                points: points.iter().map(|p| (p.0, p.1)).collect(),
                intervals: points.iter().map(|p| (p.0, p.2, p.3)).collect(),
            })
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
    let Some(s) = eval_summary::read_opt(store, &runfiles::layout::EVAL).await? else {
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
        "Held-out KL(base ‖ pruned) against K, 95% intervals by group",
        "K (experts kept per layer)",
        "mean KL (nats)",
        &series,
    )?;
    store.put(KL_PLOT, png).await?;
    md.push_str("![held-out KL against K](eval_kl_vs_k.png)\n\n");
    let mut written = vec![KL_PLOT.to_string()];
    let binding = binding_series(&s);
    if !binding.is_empty() {
        let png = plots::line_chart(
            "Held-out KL against K where the KL budget binds, 95% intervals by group",
            "K (experts kept per layer)",
            "mean KL (nats)",
            &binding,
        )?;
        store.put(KL_BINDING_PLOT, png).await?;
        md.push_str(
            "![held-out KL against K in the domain that binds each method's budget pick](eval_kl_binding.png)\n\n",
        );
        written.push(KL_BINDING_PLOT.to_string());
    }
    Ok(written)
}
