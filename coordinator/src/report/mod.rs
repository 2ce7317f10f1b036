//! `coordinator report`: `report/report.md` with PNG plots: verification,
//! the score tables, per-layer slot replacement per method and K, layer x
//! expert heatmaps of counts and REAP scores and, when replay results
//! exist, miss-rate curves.
//!
//! - [`plots`]: the PNG charts (embedded font).
//! - [`replay`]: miss-rate curves read from `replay/*.json`.

pub mod plots;
pub mod replay;

use crate::score::{self, ScoreOptions, ScoreReport};
use crate::verify::{self, VerifyReport};
use anyhow::Context;
use clap::Args;
use common::store::RunStore;
use common::Split;
use plots::Series;
use std::fmt::Write;
use std::process::ExitCode;

/// Object name of the Markdown report.
pub const REPORT_MD: &str = "report/report.md";

/// Most miss-rate curves drawn in one plot (a legend beyond that is unreadable).
pub const MAX_CURVES: usize = 16;

/// What `report` wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportOutput {
    /// Object name of the Markdown file.
    pub markdown: String,
    /// Object names of the PNG plots.
    pub plots: Vec<String>,
    /// Whether every invariant held.
    pub verified: bool,
}

/// Score results for the report: `score/score.json` when it matches the
/// current saliency, else a fresh scoring with default options.
async fn score_results(store: &RunStore) -> anyhow::Result<(ScoreReport, Option<String>)> {
    let (_, sha) = score::load_saliency(store).await?;
    if let Some(bytes) = store.get_opt(score::outputs::REPORT_JSON).await? {
        let stored: ScoreReport = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{} is not a score report",
                store.url_of(score::outputs::REPORT_JSON)
            )
        })?;
        if stored.saliency_sha256 == sha {
            return Ok((stored, None));
        }
    }
    let fresh = score::score(store, &ScoreOptions::default()).await?;
    Ok((
        fresh,
        Some(
            "`score` had not been run on this saliency.json; it was run now with default options"
                .into(),
        ),
    ))
}

async fn replay_docs(store: &RunStore) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut docs = Vec::new();
    for name in store
        .list("replay")
        .await?
        .into_iter()
        .filter(|n| n.ends_with(".json"))
    {
        let bytes = store.get(&name).await?;
        // A file that is not JSON is not a curve; the report says nothing of it.
        if let Ok(v) = serde_json::from_slice(&bytes) {
            docs.push(v);
        }
    }
    Ok(docs)
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
        })
        .collect()
}

/// Builds the report of a run and writes it under `report/`.
pub async fn report(store: &RunStore) -> anyhow::Result<ReportOutput> {
    let verified = verify::verify(store).await?;
    let (s, sha) = score::load_saliency(store).await?;
    let (scored, score_note) = score_results(store).await?;
    let mut plots_written = Vec::new();
    let mut md = header(store, &s, &sha);
    verification_section(&mut md, &verified);
    md.push_str("\n## Slot replacement per layer\n\nShare of top-k routing slots whose expert a keep map prunes (`1 - kept count share`), per layer.\n\n");
    for &k in &scored.ks {
        let name = format!("report/slot_replacement_K{k}.png");
        let png = plots::line_chart(
            &format!("Top-k slot replacement per layer, K={k}"),
            "layer",
            "slot replacement rate",
            &slot_series(&scored, k),
        )?;
        store.put(&name, png).await?;
        let _ = writeln!(md, "![slot replacement K={k}](slot_replacement_K{k}.png)\n");
        plots_written.push(name);
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
            let object = format!("report/{name}.png");
            store.put(&object, plots::heatmap(title, unit, rows)?).await?;
            let _ = writeln!(md, "{text}\n\n![{}]({name}.png)\n", name.replace('_', " "));
            plots_written.push(object);
        }
    } else {
        md.push_str("No fit split in saliency.json.\n\n");
    }
    md.push_str("## Cache replay\n\n");
    let mut curves = replay::curves(&replay_docs(store).await?);
    if store.exists("replay/report.md").await? {
        md.push_str("Full replay tables: [replay/report.md](../replay/report.md).\n\n");
    }
    if curves.len() > MAX_CURVES {
        let _ = writeln!(
            md,
            "Showing the first {MAX_CURVES} of {} miss-rate curves.\n",
            curves.len()
        );
        curves.truncate(MAX_CURVES);
    }
    if curves.is_empty() {
        md.push_str("No replay results with miss rates over several capacities under `replay/`; run `coordinator replay` for miss-rate curves.\n\n");
    } else {
        let name = "report/miss_rate.png".to_string();
        store
            .put(
                &name,
                plots::line_chart(
                    "Expert cache miss rate by capacity",
                    "capacity (experts per layer)",
                    "miss rate",
                    &curves,
                )?,
            )
            .await?;
        md.push_str("![miss rate](miss_rate.png)\n\n");
        plots_written.push(name);
    }
    md.push_str("## Scoring and keep maps\n\n");
    if let Some(note) = score_note {
        let _ = writeln!(md, "Note: {note}.\n");
    }
    md.push_str(&score::render::markdown(&scored));
    store.put(REPORT_MD, md).await?;
    Ok(ReportOutput {
        markdown: REPORT_MD.to_string(),
        plots: plots_written,
        verified: verified.ok(),
    })
}

fn header(store: &RunStore, s: &common::saliency::Saliency, sha: &str) -> String {
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
            .map(|(d, ds)| format!("{d} ({})", ds.n_tokens))
            .collect();
        let _ = writeln!(md, "| {name} | {} | {} |", st.n_tokens, domains.join(", "));
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
        let _ = writeln!(
            md,
            "| {:?} | {} | {} |",
            c.status,
            c.invariant,
            c.figure.replace('|', "\\|")
        );
    }
}

/// Builds the report of the run at `run` (path or URL); library entry point.
/// It runs its own runtime: call it outside any async context (inside one,
/// await [`report()`]).
pub fn report_run(run: &str) -> anyhow::Result<ReportOutput> {
    let store = RunStore::open(run)?;
    tokio::runtime::Runtime::new()?.block_on(report(&store))
}

/// Arguments of `coordinator report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Run location (path or URL).
    pub run: String,
}

/// Entry point of `coordinator report`.
pub fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let out = report_run(&args.run)?;
    println!(
        "wrote {} and {} plots under {}",
        out.markdown,
        out.plots.len(),
        args.run
    );
    if !out.verified {
        println!("warning: some invariants fail; see the verification section");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests;
