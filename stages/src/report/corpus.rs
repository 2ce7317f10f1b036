//! The corpus section of the report, from `manifest.json`: per domain, the
//! fit and held-out shares against their targets and the documents dropped
//! as exact copies and near-duplicates of held-out and eval-set documents.

use crate::StagesError;
use ::runfiles::manifest::Manifest;
use numbers::peer_text::table_cell;
use runfiles::store::RunStore;
use std::fmt::Write;

/// Appends the corpus section to `md`; nothing when the run has no
/// manifest or its manifest lists no domain.
pub async fn section(store: &RunStore, md: &mut String) -> Result<(), StagesError> {
    let Some(m) = ::runfiles::manifest::read(store).await? else {
        return Ok(());
    };
    md.push_str(&markdown(&m.corpus));
    Ok(())
}

/// The section's Markdown.
pub fn markdown(m: &Manifest) -> String {
    if m.domains.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n## Corpus\n\nPer domain: its share of the fit split against the target, the held-out \
         share of its tokens against the configured fraction (never more than twice it), and \
         the documents dropped: exact copies (same token sequence) and near-duplicates \
         (shingle overlap) of held-out and eval-set documents, and repeated exact copies within \
         a split (the first copy is kept).\n\n\
         | domain | fit tokens | fit share | target | held-out tokens | held-out share | fraction | \
         exact of held-out | near of held-out | exact of eval | near of eval | repeats within split |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let pct = |x: f64| format!("{:.2}%", 100.0 * x);
    for d in &m.domains {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            table_cell(&d.shares.domain),
            d.fit_tokens,
            pct(d.fit_share),
            d.shares.target.map_or("-".into(), pct),
            d.heldout_tokens,
            pct(d.heldout_share),
            pct(d.heldout_fraction),
            d.dropped_exact_heldout,
            d.dropped_near_heldout,
            d.dropped_exact_eval,
            d.dropped_near_eval,
            d.dropped_exact_within,
        );
    }
    md.push_str(&over_share(m));
    md
}

/// What `[corpus] shares = "sample"` left out of each domain's fit split to
/// reach the target shares; nothing when it left nothing out.
fn over_share(m: &Manifest) -> String {
    let left: Vec<String> = m
        .domains
        .iter()
        .filter(|d| d.over_share_docs > 0)
        .map(|d| {
            format!(
                "{} {} tokens in {} documents",
                table_cell(&d.shares.domain),
                d.over_share_tokens,
                d.over_share_docs
            )
        })
        .collect();
    if left.is_empty() {
        return String::new();
    }
    format!(
        "\nLeft out of the fit split to reach the target shares (`shares = \"sample\"`, whole groups; listed as `over_share` in `corpus/documents.jsonl`): {}.\n",
        left.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::runfiles::manifest::DomainInfo;

    #[test]
    fn the_table_carries_shares_and_every_drop_count() {
        let mut d = DomainInfo::default();
        d.shares.domain = "web".into();
        d.shares.target = Some(0.5);
        (d.fit_tokens, d.fit_share, d.heldout_tokens, d.heldout_share) = (900, 0.48, 100, 0.1);
        d.heldout_fraction = 0.1;
        (d.dropped_exact_heldout, d.dropped_near_heldout) = (35, 19);
        (
            d.dropped_exact_eval,
            d.dropped_near_eval,
            d.dropped_exact_within,
        ) = (20, 1, 4);
        let m = Manifest {
            domains: vec![d],
            ..Manifest::default()
        };
        let md = markdown(&m);
        assert!(
            md.contains(
                "| web | 900 | 48.00% | 50.00% | 100 | 10.00% | 10.00% | 35 | 19 | 20 | 1 | 4 |"
            ),
            "{md}"
        );
        assert!(!md.contains("Left out"), "{md}");
        let mut sampled = m.clone();
        (
            sampled.domains[0].over_share_docs,
            sampled.domains[0].over_share_tokens,
        ) = (3, 1200);
        assert!(
            markdown(&sampled).contains("Left out of the fit split")
                && markdown(&sampled).contains("web 1200 tokens in 3 documents"),
            "{}",
            markdown(&sampled)
        );
        assert_eq!(markdown(&Manifest::default()), "");
    }
}
