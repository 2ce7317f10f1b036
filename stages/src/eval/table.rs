//! The table of an evaluation: one row per pruned candidate (held-out and
//! fit KL, same top-1, perplexities, per-domain held-out KL, the
//! candidate's slot replacement from `score`), and after it, when images
//! were evaluated, the KL of each candidate per modality. `coordinator
//! eval` prints it and the report shows it.

use crate::score::{self, tables::MapTable};
use crate::StagesError;
use common::eval::{EvalSummary, Figures};
use common::peer_text::table_cell;
use common::store::RunStore;
use std::fmt::Write;

/// `score`'s per-(method, K) tables from `score/score.json`, for the slot
/// replacement column: none when scoring has not run (the column reads `-`),
/// why not when the stored tables were scored from another saliency.
pub async fn slot_tables(store: &RunStore) -> Result<Result<Vec<MapTable>, String>, StagesError> {
    if !store.exists(score::outputs::REPORT_JSON).await? {
        return Ok(Ok(Vec::new()));
    }
    let (_, sha) = score::load_saliency(store).await?;
    Ok(score::stored_report(store, &sha).await?.map(|r| r.tables))
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
    // Same top-1 and perplexity come from the held-out split, or from the
    // fit split in a run without one (and say so).
    let scored = |f: &&Figures| f.n > 0;
    let (basis, basis_label) = if s
        .candidates
        .iter()
        .any(|c| c.splits.get("heldout").is_some_and(|h| h.all.n > 0))
    {
        ("heldout", "held-out")
    } else {
        ("fit", "fit: no held-out split")
    };
    let mut md = format!(
        "| candidate | K | held-out KL mean ± se (percentiles) | fit KL mean ± se (percentiles) | same top-1 ({basis_label}) | ppl base / candidate / ratio ({basis_label}) | held-out KL per domain | slot replacement |\n|---|---|---|---|---|---|---|---|\n",
    );
    for c in &s.candidates {
        let held = c.splits.get("heldout").map(|x| &x.all).filter(scored);
        let fit = c.splits.get("fit").map(|x| &x.all).filter(scored);
        let main = c.splits.get(basis).map(|x| &x.all).filter(scored);
        let domains: Vec<String> = c
            .splits
            .get("heldout")
            .map(|x| {
                x.domains
                    .iter()
                    .map(|(d, f)| format!("{} {:.4}", table_cell(d), f.kl.mean))
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
    md.push_str(&modality_table(s));
    md
}

/// Per candidate and split, the KL on text positions and on
/// image-conditioned ones (positions whose context holds an image); empty
/// when the evaluation scored no image-conditioned position.
fn modality_table(s: &EvalSummary) -> String {
    let rows: Vec<_> = s
        .candidates
        .iter()
        .flat_map(|c| c.splits.iter().map(move |(split, f)| (c, split, f)))
        .filter(|(_, _, f)| !f.modalities.is_empty() && f.all.n > 0)
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\nKL per modality (image: positions whose context holds an image, the text after it included):\n\n| candidate | K | split | text KL mean ± se (percentiles) | text positions | image KL mean ± se (percentiles) | image positions |\n|---|---|---|---|---|---|---|\n",
    );
    for (c, split, f) in rows {
        let (text, image) = (f.modalities.get("text"), f.modalities.get("image"));
        let n = |f: Option<&Figures>| f.map_or(0, |f| f.n);
        let _ = writeln!(
            md,
            "| {} | {} | {split} | {} | {} | {} | {} |",
            c.name,
            c.k,
            kl(text.filter(|f| f.n > 0)),
            n(text),
            kl(image.filter(|f| f.n > 0)),
            n(image)
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::eval::summary::{CandidateSummary, SplitFigures};
    use std::collections::BTreeMap;

    fn summary(splits: &[(&str, f64)]) -> EvalSummary {
        let figures = |top1| SplitFigures {
            all: Figures {
                n: 10,
                top1_same: top1,
                ..Figures::default()
            },
            domains: BTreeMap::new(),
            modalities: BTreeMap::new(),
        };
        EvalSummary {
            base_sha256: String::new(),
            corpus_sha256: String::new(),
            skip_first: 0,
            n_chunks: 1,
            backends: Vec::new(),
            candidates: vec![CandidateSummary {
                name: "frequency_K2".into(),
                method: "frequency".into(),
                k: 2,
                sha256: String::new(),
                splits: splits
                    .iter()
                    .map(|&(s, top1)| (s.to_string(), figures(top1)))
                    .collect(),
            }],
        }
    }

    #[test]
    fn same_top1_and_perplexity_name_the_split_they_come_from() {
        let both = table(&summary(&[("fit", 0.25), ("heldout", 0.5)]), &[]);
        assert!(both.contains("same top-1 (held-out)"), "{both}");
        assert!(both.contains("| 50.00% |"), "held-out figure: {both}");
        let fit_only = table(&summary(&[("fit", 0.25)]), &[]);
        assert!(!fit_only.contains("(held-out)"), "{fit_only}");
        assert!(
            fit_only.contains("same top-1 (fit: no held-out split)"),
            "{fit_only}"
        );
        assert!(fit_only.contains("| 25.00% |"), "fit figure: {fit_only}");
        // A held-out split without scored positions is no basis either.
        let mut empty = summary(&[("fit", 0.25), ("heldout", 0.5)]);
        empty.candidates[0].splits.get_mut("heldout").unwrap().all.n = 0;
        let md = table(&empty, &[]);
        assert!(md.contains("same top-1 (fit: no held-out split)"), "{md}");
        assert!(md.contains("| 25.00% |"), "{md}");
    }

    #[test]
    fn a_text_evaluation_has_no_modality_table_and_an_image_one_has_it() {
        let mut s = summary(&[("fit", 0.25)]);
        assert!(!table(&s, &[]).contains("KL per modality"));
        let f = |n, mean| Figures {
            n,
            kl: common::eval::KlFigures {
                mean,
                ..Default::default()
            },
            ..Figures::default()
        };
        let fit = s.candidates[0].splits.get_mut("fit").unwrap();
        fit.modalities =
            BTreeMap::from([("text".into(), f(6, 0.125)), ("image".into(), f(4, 0.5))]);
        let md = table(&s, &[]);
        assert!(md.contains("KL per modality"), "{md}");
        assert!(
            md.contains("| frequency_K2 | 2 | fit | 0.1250 ± 0.0000 (p50 0.0000, p90 0.0000, p99 0.0000, p99.9 0.0000, max 0.0000) | 6 | 0.5000 ± 0.0000"),
            "{md}"
        );
        assert!(md.contains("| 4 |"), "{md}");
    }
}
