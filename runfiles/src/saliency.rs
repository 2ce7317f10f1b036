//! `saliency.json`, the run's merged statistics as floats (the schema is
//! [`numbers::saliency::Saliency`]): decoded in one function here, written
//! by [`write`]. Every stage reads it through [`read`] (or [`read_opt`]);
//! `verify` through [`read_lenient`], which reads non-finite values as 0 and
//! lists them, so its checks can name them.

pub mod lenient;

use crate::file_error::FileError;
use crate::layout::SALIENCY_JSON;
use crate::store::{RunStore, StoreError};
use bytes::Bytes;
use lenient::{Lenient, LenientError};
use numbers::saliency::Saliency;

/// What the file is called in errors.
const KIND: &str = "saliency file";

/// The most bytes of `saliency.json` read back: ten per-expert columns of
/// each layer of each domain of each split, as text.
pub const MAX_SALIENCY_BYTES: u64 = 1 << 30;

/// The run's `saliency.json`, as read by [`read`].
#[derive(Clone, Debug)]
pub struct SaliencyFile {
    /// The document.
    pub saliency: Saliency,
    /// SHA-256 of its bytes: what keep maps and score reports name.
    pub sha256: String,
}

/// Reads the run's `saliency.json`, refusing one that is not a saliency
/// file or holds a non-finite value; the error names the file.
pub async fn read(store: &RunStore) -> Result<SaliencyFile, FileError> {
    let bytes = store.get_limited(SALIENCY_JSON, MAX_SALIENCY_BYTES).await?;
    let saliency = decode(&bytes, &store.url_of(SALIENCY_JSON), Strictness::Finite)?.saliency;
    Ok(SaliencyFile {
        saliency,
        sha256: gguf::hash::sha256_hex(&bytes),
    })
}

/// [`read`], `None` when the run has no `saliency.json` (before a merge).
pub async fn read_opt(store: &RunStore) -> Result<Option<SaliencyFile>, FileError> {
    match read(store).await {
        Ok(f) => Ok(Some(f)),
        Err(FileError::Store(StoreError::NotFound { .. })) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the run's `saliency.json` for checking it: non-finite values are
/// read as 0 and listed by their JSON path ([`Lenient::nonfinite`]); the
/// bytes come back too (their hash is what keep maps name).
pub async fn read_lenient(store: &RunStore) -> Result<(Lenient, Bytes), FileError> {
    let bytes = store.get_limited(SALIENCY_JSON, MAX_SALIENCY_BYTES).await?;
    let read = decode(&bytes, &store.url_of(SALIENCY_JSON), Strictness::Lenient)?;
    Ok((read, bytes))
}

/// Writes `saliency` as the run's `saliency.json` (its canonical bytes,
/// [`Saliency::to_json_bytes`]), replacing a stored one: a merge derives it
/// again from the merged partial.
pub async fn write(store: &RunStore, saliency: &Saliency) -> Result<(), StoreError> {
    store.put(SALIENCY_JSON, saliency.to_json_bytes()).await
}

/// Whether a non-finite value is refused ([`read`]) or read as 0 and
/// listed ([`read_lenient`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Strictness {
    Finite,
    Lenient,
}

/// The one decoder of `saliency.json` bytes: a saliency document whose
/// layers each have one entry per expert; errors name `file`.
fn decode(bytes: &[u8], file: &str, strictness: Strictness) -> Result<Lenient, FileError> {
    let invalid = |problem: String| FileError::invalid(file, KIND, problem);
    let read = if strictness == Strictness::Finite {
        let saliency: Saliency =
            serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        Lenient {
            saliency,
            nonfinite: Vec::new(),
        }
    } else {
        lenient::parse(bytes, file).map_err(|e| match e {
            LenientError::NotUtf8 { source, .. } => invalid(format!("not UTF-8 ({source})")),
            LenientError::NotJson { source, .. } => invalid(format!("not JSON ({source})")),
            LenientError::NotSaliency { source, .. } => invalid(source.to_string()),
        })?
    };
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use numbers::saliency::SplitStats;
    use numbers::{Gating, Split};
    use std::collections::BTreeMap;

    fn saliency() -> Saliency {
        Saliency {
            n_expert: 4,
            n_expert_used: 2,
            gating: Gating::Softmax,
            routing: Default::default(),
            trace_tokens_written: 0,
            nonfinite_drops: 0,
            nonfinite_drops_by_tensor: BTreeMap::new(),
            n_chunks: 1,
            splits: BTreeMap::from([(
                Split::Fit,
                SplitStats {
                    n_tokens: 3,
                    layers: Vec::new(),
                    domains: BTreeMap::new(),
                    modalities: BTreeMap::new(),
                },
            )]),
        }
    }

    #[tokio::test]
    async fn one_reader_round_trips_and_names_the_file_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
        assert!(read_opt(&store).await.unwrap().is_none());
        assert!(matches!(
            read(&store).await.unwrap_err(),
            FileError::Store(StoreError::NotFound { .. })
        ));
        let s = saliency();
        write(&store, &s).await.unwrap();
        let f = read(&store).await.unwrap();
        assert_eq!(f.saliency, s);
        assert_eq!(f.sha256, gguf::hash::sha256_hex(&s.to_json_bytes()));
        let (lenient, bytes) = read_lenient(&store).await.unwrap();
        assert_eq!((lenient.saliency, bytes.to_vec()), (s, s_bytes()));
        let url = store.url_of(SALIENCY_JSON);
        for (text, why) in [
            ("{\"n_expert\": 4", "EOF"),
            ("3", "invalid type"),
            ("{\"n_expert\": 4}", "missing field"),
        ] {
            store.put(SALIENCY_JSON, text.to_string()).await.unwrap();
            for e in [
                read(&store).await.err().unwrap(),
                read_lenient(&store).await.err().unwrap(),
            ] {
                let e = e.to_string();
                assert!(
                    e.contains(&url) && e.contains("not a valid saliency file") && e.contains(why),
                    "{text}: {e}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_non_finite_value_is_refused_or_listed() {
        let dir = tempfile::tempdir().unwrap();
        let store = RunStore::open(dir.path().to_str().unwrap()).unwrap();
        let layer = r#"{"layer": 0, "count": [1], "prob_sum": [null], "weight_sum": [0.5],
            "ean_sum": [1.0], "reap_l2_sum": [1.0], "reap_l2_sq_sum": [1.0]}"#;
        let text = format!(
            r#"{{"n_expert": 1, "n_expert_used": 1, "gating": "softmax", "trace_tokens_written": 0,
                "nonfinite_drops": 0, "splits": {{"fit": {{"n_tokens": 1, "layers": [{layer}], "domains": {{}}}}}}}}"#
        );
        store.put(SALIENCY_JSON, text).await.unwrap();
        let e = read(&store).await.unwrap_err().to_string();
        assert!(
            e.contains("not a valid saliency file") && e.contains("null"),
            "{e}"
        );
        let (lenient, _) = read_lenient(&store).await.unwrap();
        assert_eq!(lenient.nonfinite, ["splits.fit.layers[0].prob_sum[0]"]);
        let fit = lenient.saliency.split(Split::Fit).unwrap();
        assert_eq!(fit.layers[0].prob_sum, [0.0]);
    }

    fn s_bytes() -> Vec<u8> {
        saliency().to_json_bytes()
    }
}
