//! An evaluation's `summary.json` (the schema is
//! [`numbers::eval::EvalSummary`]), under `eval/` or `ship/eval/`
//! ([`EvalLayout::summary_json`]): decoded in one function here, read
//! through [`read_opt`], written through [`write`] (create-only: it marks
//! the evaluation complete) or, by a one-process `worker eval` into a
//! location of its own, [`replace`].

use crate::file_error::FileError;
use crate::layout::EvalLayout;
use crate::store::{RunStore, StoreError};
use numbers::eval::EvalSummary;

/// What the file is called in errors.
const KIND: &str = "eval summary";

/// The most bytes of an eval summary read back (one entry per candidate,
/// domain and paired comparison).
pub const MAX_SUMMARY_BYTES: u64 = 256 << 20;

/// Reads the summary of the evaluation laid out as `layout`, `None` when
/// that evaluation has not finished (no summary).
pub async fn read_opt(
    store: &RunStore,
    layout: &EvalLayout,
) -> Result<Option<EvalSummary>, FileError> {
    let object = layout.summary_json;
    match store.get_opt_limited(object, MAX_SUMMARY_BYTES).await? {
        None => Ok(None),
        Some(bytes) => decode(&bytes, &store.url_of(object)).map(Some),
    }
}

/// Writes the summary of the evaluation laid out as `layout`; refused
/// where one is stored (an evaluation removes its old summary first).
pub async fn write(
    store: &RunStore,
    layout: &EvalLayout,
    summary: &EvalSummary,
) -> Result<(), StoreError> {
    store
        .put_new(layout.summary_json, summary.to_json_bytes())
        .await
}

/// Writes the summary of the evaluation laid out as `layout`, replacing a
/// stored one: `worker eval --out` writes into a location of its own.
pub async fn replace(
    store: &RunStore,
    layout: &EvalLayout,
    summary: &EvalSummary,
) -> Result<(), StoreError> {
    store
        .put(layout.summary_json, summary.to_json_bytes())
        .await
}

/// The one decoder of an eval summary's bytes: the schema, and each eval
/// set one of the summary's domains (where it lists them); errors name
/// `file`.
fn decode(bytes: &[u8], file: &str) -> Result<EvalSummary, FileError> {
    let invalid = |problem: String| FileError::invalid(file, KIND, problem);
    let s: EvalSummary = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    if !s.domains.is_empty() {
        if let Some(set) = s.eval_sets.iter().find(|e| !s.domains.contains(e)) {
            return Err(invalid(format!(
                "eval set {set:?} is not one of its domains {:?}",
                s.domains
            )));
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{EVAL, SHIP_EVAL};

    fn summary() -> EvalSummary {
        EvalSummary {
            base_sha256: "ab".into(),
            corpus_sha256: "cd".into(),
            skip_first: 4,
            n_chunks: 2,
            backends: vec!["cpu".into()],
            uncertainty: numbers::eval::summary::UNCERTAINTY.into(),
            candidates: Vec::new(),
            budget: None,
            eval_sets: vec!["quiz".into()],
            domains: vec!["web".into(), "quiz".into()],
            pairs: Vec::new(),
            generation_noise: None,
            generation_unprompted: Default::default(),
        }
    }

    #[tokio::test]
    async fn one_reader_round_trips_writes_once_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
        assert_eq!(read_opt(&store, &EVAL).await.unwrap(), None);
        let s = summary();
        write(&store, &EVAL, &s).await.unwrap();
        assert_eq!(read_opt(&store, &EVAL).await.unwrap(), Some(s.clone()));
        assert_eq!(read_opt(&store, &SHIP_EVAL).await.unwrap(), None);
        assert!(write(&store, &EVAL, &s).await.is_err());
        let mut other = s.clone();
        other.n_chunks = 3;
        replace(&store, &EVAL, &other).await.unwrap();
        assert_eq!(read_opt(&store, &EVAL).await.unwrap(), Some(other));
        let url = store.url_of(EVAL.summary_json);
        let mut bad = s.clone();
        bad.eval_sets = vec!["code".into()];
        for (text, why) in [
            (r#"{"base_sha256": "ab""#.to_string(), "EOF"),
            (r#"{"base_sha256": "ab"}"#.to_string(), "missing field"),
            (
                String::from_utf8(bad.to_json_bytes()).unwrap(),
                "eval set \"code\" is not one of its domains",
            ),
        ] {
            store.put(EVAL.summary_json, text.clone()).await.unwrap();
            let e = read_opt(&store, &EVAL).await.unwrap_err().to_string();
            assert!(
                e.contains(&url) && e.contains("is not a valid eval summary") && e.contains(why),
                "{text}: {e}"
            );
        }
    }
}
