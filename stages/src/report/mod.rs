//! `coordinator report`: `report/report.md` with PNG plots: verification,
//! the score tables, per-layer slot replacement per method and K, layer x
//! expert heatmaps of counts and REAP scores and, when replay results
//! exist, miss-rate figures.
//!
//! - [`plots`]: the PNG charts (embedded font).
//! - [`panels`]: small multiples, a grid of panels with one legend.
//! - [`replay`]: miss-rate figures from `replay/results.json`, one per keep
//!   map, and `report/miss_rate.json`, the data they are drawn from.
//! - [`corpus`]: split shares and duplicates dropped, from `manifest.json`.
//! - [`responses`]: what the base model wrote for the sources that set
//!   `respond` (per source, and a few responses), from
//!   `corpus/responses/responses.jsonl`.
//! - [`eval`]: pruned candidates against the base model, from
//!   `eval/summary.json`, with the evaluation's table (`eval_table`), which
//!   `coordinator eval` prints too.
//! - [`vision`]: experts rare on text and live on images, when the run
//!   measured images.
//!
//! The report reads what the stages stored and writes only `report/`: a
//! stage that has not run (or ran on another `saliency.json`) is named as
//! missing, never run from here.

pub mod corpus;
pub mod domains;
pub mod eval;
mod eval_table;
pub mod panels;
pub mod plots;
pub mod prefetch;
pub mod replay;
pub mod responses;
pub mod vision;

use crate::score::{self, ScoreReport};
use crate::verify::{self, VerifyReport};
use crate::StagesError;
use ::replay::ReplayReport;
use numbers::peer_text::table_cell;
use numbers::Split;
use plots::Series;
use runfiles::layout;
use runfiles::store::RunStore;
use std::fmt::Write;

/// What `report` wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportOutput {
    /// Object name of the Markdown file.
    pub markdown: String,
    /// Object names of the PNG plots.
    pub plots: Vec<String>,
    /// Whether every invariant held.
    pub verified: bool,
    /// Inputs the report lacks (a stage not run, or run on other data), each
    /// with the command that makes it.
    pub missing: Vec<String>,
}

/// `replay/results.json`, when `replay` has run.
async fn replay_results(store: &RunStore) -> Result<Option<ReplayReport>, StagesError> {
    let Some(bytes) = store.get_opt(layout::REPLAY_RESULTS_JSON).await? else {
        return Ok(None);
    };
    Ok(Some(ReplayReport::from_json(
        &bytes,
        &store.url_of(layout::REPLAY_RESULTS_JSON),
    )?))
}

fn slot_series(r: &ScoreReport, k: u32) -> Vec<Series> {
    r.tables
        .iter()
        .filter(|t| t.k == k)
        .map(|t| Series {
            label: t.method.clone(),
            points: t
                .rows
                .iter()
                .map(|row| (row.layer as f64, row.slot_replacement))
                .collect(),
            intervals: Vec::new(),
        })
        .collect()
}

/// Builds the report of a run from what its stages stored and writes it
/// under `report/`; it writes nothing else. What is missing is named in the
/// report and in [`ReportOutput::missing`]. Verifies the run for its
/// verification section ([`report_verified`] takes a verification made).
pub async fn report(store: &RunStore) -> Result<ReportOutput, StagesError> {
    report_verified(store, &verify::verify(store).await?).await
}

/// [`report`] with the run's verification already made (by the pipeline,
/// which prints it), so a run is verified once.
pub async fn report_verified(
    store: &RunStore,
    verified: &VerifyReport,
) -> Result<ReportOutput, StagesError> {
    let runfiles::saliency::SaliencyFile {
        saliency: s,
        sha256: sha,
    } = runfiles::saliency::read(store).await?;
    let scored = score::stored_report(store, &sha).await?;
    let mut out = ReportOutput {
        markdown: layout::REPORT_MD.to_string(),
        plots: Vec::new(),
        verified: verified.ok(),
        missing: Vec::new(),
    };
    let mut md = header(store, &s, &sha);
    corpus::section(store, &mut md).await?;
    responses::section(store, &mut md).await?;
    verification_section(&mut md, verified);
    md.push_str("\n## Slot replacement per layer\n\nShare of top-k routing slots whose expert a keep map prunes (`1 - kept count share`), per layer.\n\n");
    match &scored {
        Ok(scored) => {
            for &k in &scored.ks {
                let name = format!("{}/slot_replacement_K{k}.png", layout::REPORT_DIR);
                let png = plots::line_chart(
                    &format!("Top-k slot replacement per layer, K={k}"),
                    "layer",
                    "slot replacement rate",
                    &slot_series(scored, k),
                )?;
                store.put(&name, png).await?;
                let _ = writeln!(md, "![slot replacement K={k}](slot_replacement_K{k}.png)\n");
                out.plots.push(name);
            }
        }
        Err(missing) => {
            let _ = writeln!(md, "Not shown: {missing}.\n");
        }
    }
    md.push_str("## Experts per layer\n\n");
    if let Some(fit) = s.split(Split::Fit) {
        let counts: Vec<(u32, Vec<f64>)> = fit
            .layers
            .iter()
            .map(|l| (l.layer, l.count.iter().map(|&c| c as f64).collect()))
            .collect();
        let reap: Vec<(u32, Vec<f64>)> = fit
            .layers
            .iter()
            .map(|l| {
                let mean = l.reap_l2_sum.iter().zip(&l.count);
                (
                    l.layer,
                    mean.map(|(&r, &c)| if c > 0 { r / c as f64 } else { 0.0 })
                        .collect(),
                )
            })
            .collect();
        for (name, title, unit, rows, text) in [
            (
                "expert_counts",
                "Tokens routed per layer and expert (fit split)",
                "tokens",
                &counts,
                "Tokens routed to each expert of each layer on the fit split (log colour scale; white: never routed).",
            ),
            (
                "expert_reap",
                "REAP score per layer and expert (fit split)",
                "reap_l2_sum / count",
                &reap,
                "REAP score (`reap_l2_sum / count`, the mean of gate weight x output norm over routed tokens) per expert and layer; white: never routed.",
            ),
        ] {
            let object = format!("{}/{name}.png", layout::REPORT_DIR);
            store.put(&object, plots::heatmap(title, unit, rows)?).await?;
            let _ = writeln!(md, "{text}\n\n![{}]({name}.png)\n", name.replace('_', " "));
            out.plots.push(object);
        }
    } else {
        md.push_str("No fit split in saliency.json.\n\n");
    }
    let by_domain = s
        .split(Split::Fit)
        .and_then(|fit| domains::layer_domains(fit, s.n_expert_used, s.n_expert));
    if let Some(layers) = by_domain {
        md.push_str(
            "## Domains and rare experts\n\nPer layer, each domain's most concentrated expert on the fit split: the share of the expert's tokens that come from the domain, against the domain's share of all routed tokens (1x: no specialisation).\n\n",
        );
        md.push_str(&domains::markdown(&layers));
        md.push('\n');
    }
    let vision = s
        .split(Split::Fit)
        .and_then(|fit| vision::vision_experts(fit, s.n_expert_used, s.n_expert));
    if let Some(layers) = vision {
        let _ = writeln!(
            md,
            "## Vision experts\n\nExperts of each layer that text routes to rarely (under {}% of the uniform share `k / n_expert`) and images at least at the uniform share, on the fit split: a text-only calibration would call them dead or rare.\n",
            100.0 * domains::RARE
        );
        md.push_str(&vision::markdown(&layers, 8));
        md.push('\n');
    }
    replay_section(store, &mut md, &mut out).await?;
    let slots = scored.as_ref().map_or(&[][..], |s| s.tables.as_slice());
    let eval_plots = eval::section(store, slots, &mut md).await?;
    out.plots.extend(eval_plots);
    md.push_str("## Scoring and keep maps\n\n");
    match scored {
        Ok(scored) => md.push_str(&score::render::markdown(&scored)),
        Err(missing) => {
            let _ = writeln!(md, "Not shown: {missing}.");
            out.missing.push(missing);
        }
    }
    store.put(layout::REPORT_MD, md).await?;
    Ok(out)
}

/// Says in `md` that the section of the missing object `name` is not shown
/// and what makes it (`hint`); returns what is missing, for the output.
fn not_shown(md: &mut String, store: &RunStore, name: &str, hint: &str) -> String {
    let missing = format!("{} is missing: {hint}", store.url_of(name));
    let _ = writeln!(md, "Not shown: {missing}.\n");
    missing
}

/// Miss-rate curves from `replay/results.json`, or a line saying it is missing.
async fn replay_section(
    store: &RunStore,
    md: &mut String,
    out: &mut ReportOutput,
) -> Result<(), StagesError> {
    md.push_str("## Cache replay\n\n");
    let Some(results) = replay_results(store).await? else {
        let hint = "run `coordinator replay` for miss-rate curves";
        let missing = not_shown(md, store, layout::REPLAY_RESULTS_JSON, hint);
        out.missing.push(missing);
        return Ok(());
    };
    if store.exists(layout::REPLAY_REPORT_MD).await? {
        md.push_str("Full replay tables: [replay/report.md](../replay/report.md).\n\n");
    }
    let rates = replay::miss_rates(&results);
    if rates.figures.is_empty() {
        md.push_str("The replay results hold no rows.\n\n");
        return Ok(());
    }
    md.push_str(
        "Miss rate (forced misses count as misses) against the resident experts per layer: \
         one figure per keep map, one panel per split (columns) and trace and step mode \
         (rows), one line per policy in the same colour in every figure; markers sit at the \
         replayed capacities, and LRU's line passes through every integer capacity between \
         them (its one-pass curve). The numbers behind every line: \
         [miss_rate.json](miss_rate.json).\n\n",
    );
    for figure in &rates.figures {
        let name = format!("{}/{}", layout::REPORT_DIR, figure.png);
        store.put(&name, replay::draw(figure)?).await?;
        let _ = writeln!(
            md,
            "### Keep map `{}`\n\n![miss rate, keep map {}]({})\n\nResident under this keep map: {}.\n",
            figure.keep_map,
            figure.keep_map,
            figure.png,
            replay::resident_line(figure)
        );
        out.plots.push(name);
    }
    let json = StagesError::encode_json(layout::REPORT_MISS_RATES_JSON, &rates)?;
    store.put(layout::REPORT_MISS_RATES_JSON, json).await?;
    if let Some(png) = prefetch::draw(&results)? {
        let name = format!("{}/prefetch.png", layout::REPORT_DIR);
        store.put(&name, png).await?;
        md.push_str(
            "### Prefetch

Hit rate against bytes moved per token (demand and prefetch \
             loads of the model's expert bytes), one point per replayed capacity: LRU alone, \
             LRU loading `m = k` guessed experts before each token, LRU with the oracle \
             prefetcher (the ceiling) and Belady. Tables and the predictors' recall: \
             [replay/report.md](../replay/report.md).\n\n![prefetch](prefetch.png)\n\n",
        );
        out.plots.push(name);
    }
    Ok(())
}

fn header(store: &RunStore, s: &numbers::saliency::Saliency, sha: &str) -> String {
    let mut md = format!(
        "# moe-census report\n\nRun `{}`; saliency.json SHA-256 `{sha}`.\n\n{} experts per layer, top-{} routing, {:?} gating, {} chunks.\n\n| split | tokens | domains |\n|---|---|---|\n",
        store.url(),
        s.n_expert,
        s.n_expert_used,
        s.gating,
        s.n_chunks
    );
    for (name, st) in &s.splits {
        let domains: Vec<String> = st
            .domains
            .iter()
            .map(|(d, ds)| format!("{} ({})", table_cell(d), ds.n_tokens))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            name,
            st.n_tokens,
            domains.join(", ")
        );
    }
    md
}

fn verification_section(md: &mut String, v: &VerifyReport) {
    let verdict = if v.ok() {
        "every invariant holds"
    } else {
        "SOME INVARIANTS FAIL"
    };
    let _ = writeln!(
        md,
        "\n## Verification: {verdict}\n\n| status | invariant | figure |\n|---|---|---|"
    );
    for c in &v.checks {
        let figure = c.figure.replace('|', "\\|");
        let _ = writeln!(md, "| {:?} | {} | {figure} |", c.status, c.invariant);
    }
}

#[cfg(test)]
mod replay_run_tests;
#[cfg(test)]
mod test_stats;
#[cfg(test)]
mod tests;
