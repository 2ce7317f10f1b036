//! Writing a result's artifacts under a run: `saliency.json`,
//! `saliency.parquet` and `imatrix.gguf`, all derived from one [`Partial`].

use crate::store::{RunStore, StoreError};
use arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use numbers::partial::Partial;
use numbers::saliency::{LayerStats, Saliency};
use numbers::stats::{N_SUMS, SUM_NAMES};
use std::sync::Arc;

/// Errors while deriving or writing artifacts.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The accumulators could not be combined.
    #[error(transparent)]
    Merge(#[from] numbers::stats::MergeError),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Parquet encoding failed.
    #[error("saliency.parquet: {0}")]
    Parquet(String),
}

/// One row per (split, domain, layer, expert); domain `*` is the split total.
pub fn saliency_table(s: &Saliency) -> Result<Vec<u8>, String> {
    let mut split = Vec::new();
    let mut domain = Vec::new();
    let mut layer = Vec::new();
    let mut expert = Vec::new();
    let mut count = Vec::new();
    let mut cols: [Vec<f64>; N_SUMS + 2] = Default::default();
    let mut push = |sp: &str, dom: &str, l: &LayerStats| {
        for e in 0..l.count.len() {
            split.push(sp.to_string());
            domain.push(dom.to_string());
            layer.push(l.layer);
            expert.push(e as u32);
            count.push(l.count[e]);
            for (c, v) in cols
                .iter_mut()
                .zip(l.sums().into_iter().chain([&l.ean_max, &l.act_max]))
            {
                c.push(v.get(e).copied().unwrap_or(0.0));
            }
        }
    };
    for (sp, st) in &s.splits {
        st.layers.iter().for_each(|l| push(sp.as_str(), "*", l));
        for (dom, ds) in &st.domains {
            ds.layers.iter().for_each(|l| push(sp.as_str(), dom, l));
        }
    }
    let mut fields = vec![
        Field::new("split", DataType::Utf8, false),
        Field::new("domain", DataType::Utf8, false),
        Field::new("layer", DataType::UInt32, false),
        Field::new("expert", DataType::UInt32, false),
        Field::new("count", DataType::UInt64, false),
    ];
    fields.extend(
        SUM_NAMES
            .iter()
            .chain(&["ean_max", "act_max"])
            .map(|n| Field::new(*n, DataType::Float64, false)),
    );
    let mut arrays: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(split)),
        Arc::new(StringArray::from(domain)),
        Arc::new(UInt32Array::from(layer)),
        Arc::new(UInt32Array::from(expert)),
        Arc::new(UInt64Array::from(count)),
    ];
    arrays.extend(
        cols.into_iter()
            .map(|c| Arc::new(Float64Array::from(c)) as ArrayRef),
    );
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema, arrays).map_err(|e| e.to_string())?;
    crate::parquet_out::parquet_bytes(&batch)
}

/// Writes `saliency.json`, `saliency.parquet` and `imatrix.gguf` for `p`.
/// `saliency.json` is written last: its presence marks the set complete.
/// The imatrix names its dataset by the corpus hash, so the bytes depend only
/// on what was measured.
pub async fn write_results(store: &RunStore, p: &Partial) -> Result<Saliency, ArtifactError> {
    let saliency = p.saliency()?;
    let datasets = [format!("moe-census corpus {}", p.corpus_sha256)];
    store
        .put_parts(
            crate::layout::IMATRIX_GGUF,
            p.imatrix.to_gguf_parts(&datasets),
        )
        .await?;
    store
        .put(
            crate::layout::SALIENCY_PARQUET,
            saliency_table(&saliency).map_err(ArtifactError::Parquet)?,
        )
        .await?;
    crate::saliency::write(store, &saliency).await?;
    Ok(saliency)
}
