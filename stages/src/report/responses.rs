//! The responses section of the report, for a run whose corpus sources were
//! written by the base model (`respond`): per responded source, what the
//! response phase made (prompts, responses, tokens, where they stopped,
//! what the perplexity filter dropped, the median perplexity), then the
//! first few responses, their text escaped and cut short (it is the
//! model's output, and a user's report must not be forged or flooded by it).

use crate::StagesError;
use numbers::peer_text::{escape_peer_text, table_cell};
use runfiles::respond::{
    by_source, read_responses, StoredResponse, MAX_FILE_BYTES, RESPONSES_FILE,
};
use runfiles::store::RunStore;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Responses shown.
pub const SAMPLES: usize = 3;

/// Characters of a shown response kept.
pub const SAMPLE_CHARS: usize = 240;

/// Appends the section to `md`; nothing when the run stored no responses.
pub async fn section(store: &RunStore, md: &mut String) -> Result<(), StagesError> {
    let Some(bytes) = store
        .get_opt_limited(RESPONSES_FILE, MAX_FILE_BYTES as u64)
        .await?
    else {
        return Ok(());
    };
    let responses = read_responses(&bytes).map_err(|problem| StagesError::Artifact {
        url: store.url_of(RESPONSES_FILE),
        problem,
    })?;
    md.push_str(&markdown(&responses));
    Ok(())
}

/// The section's Markdown (nothing for no responses).
pub fn markdown(responses: &[StoredResponse]) -> String {
    if responses.is_empty() {
        return String::new();
    }
    let mut perplexities: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in responses {
        perplexities
            .entry(&r.source)
            .or_default()
            .push(r.perplexity);
    }
    let mut md = format!(
        "\n## Responses\n\nSources whose text the base model wrote (`respond`, stored in `{RESPONSES_FILE}`): \
         per source, its prompts and responses, the tokens generated, the responses that stopped \
         at an end-of-generation token and at `max_tokens`, those the perplexity filter \
         (`drop_ppl_quantile`) dropped, and the median perplexity under the base model.\n\n\
         | source | prompts | responses | tokens | at end of generation | at max_tokens | dropped | median perplexity |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (source, f) in by_source(responses) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} |",
            table_cell(source),
            f.prompts,
            f.responses,
            f.tokens,
            f.at_eog,
            f.at_max_tokens,
            f.dropped,
            median(
                perplexities
                    .get_mut(source)
                    .expect("each source has responses")
            ),
        );
    }
    let _ = write!(
        md,
        "\nThe first {} of {} responses (escaped, at most {SAMPLE_CHARS} characters each):\n\n\
         | source | record | turn | sample | tokens | perplexity | response |\n\
         |---|---|---:|---:|---:|---:|---|\n",
        SAMPLES.min(responses.len()),
        responses.len()
    );
    for r in responses.iter().take(SAMPLES) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} | {} |",
            table_cell(&r.source),
            table_cell(&r.at),
            r.turn,
            r.sample,
            r.tokens.len(),
            r.perplexity,
            escape_peer_text(&r.text, SAMPLE_CHARS).replace('|', "\\|"),
        );
    }
    md
}

/// The median of `v` (not empty; the mean of the middle two when even).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(source: &str, at: &str, sample: u32, text: &str, ppl: f64) -> StoredResponse {
        StoredResponse {
            source: source.into(),
            at: at.into(),
            turn: 1,
            sample,
            prompt_sha256: "p".into(),
            model_sha256: "m".into(),
            settings: serde_json::Value::Null,
            seed: 0,
            tokens: vec![1, 2, 3],
            text: text.into(),
            stopped_at_eog: sample == 0,
            perplexity: ppl,
            dropped: ppl > 10.0,
        }
    }

    #[test]
    fn sources_are_summed_and_samples_escaped_and_capped() {
        let long = "x".repeat(SAMPLE_CHARS + 50);
        let rs = vec![
            response(
                "chat.jsonl",
                "chat.jsonl:1",
                0,
                "line one\n| forged | row |",
                2.0,
            ),
            response("chat.jsonl", "chat.jsonl:1", 1, &long, 12.0),
            response("chat.jsonl", "chat.jsonl:2", 0, "ok", 4.0),
            response("other.jsonl", "other.jsonl:1", 0, "fine", 3.0),
        ];
        let md = markdown(&rs);
        // chat: 2 prompts, 3 responses, 9 tokens, 2 at EOG, 1 at max, 1
        // dropped, median of 2, 4, 12 = 4.
        assert!(
            md.contains("| chat.jsonl | 2 | 3 | 9 | 2 | 1 | 1 | 4.00 |"),
            "{md}"
        );
        assert!(
            md.contains("| other.jsonl | 1 | 1 | 3 | 1 | 0 | 0 | 3.00 |"),
            "{md}"
        );
        assert!(md.contains("The first 3 of 4 responses"), "{md}");
        assert!(md.contains("line one\\n\\| forged \\| row \\|"), "{md}");
        assert!(md.contains("...(50 more characters)"), "{md}");
        assert!(
            !md.contains("| fine |"),
            "only the first three are shown: {md}"
        );
        // Every table row stays one line: no response text starts a row.
        assert!(md.lines().all(|l| !l.starts_with("| forged")), "{md}");
        assert_eq!(markdown(&[]), "");
    }
}
