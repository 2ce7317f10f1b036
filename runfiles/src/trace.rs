//! Routing trace rows and their Parquet layout (DESIGN sections 3 and 10).
//!
//! One row per (token, MoE layer). Parts are written sorted by layer, one row
//! group per layer, so replay can stream a layer at a time.
//!
//! Parts are written [`Encoding::Compact`]: router probabilities and gate
//! weights as IEEE half floats (11 significant bits, relative error at most
//! 2^-11), expert ids as u16 under dictionary encoding (bit-packed to
//! ceil(log2 n_expert) bits), `split`, `domain`, `chunk` and `layer` as
//! dictionary runs, `pos` delta-encoded; the half floats are split into byte
//! streams and gzipped. [`Encoding::Full`] keeps f32 values
//! (the layout before the compact one); readers accept both.

use arrow::array::{
    Array, ArrayRef, FixedSizeListArray, FixedSizeListBuilder, Float16Array, Float16Builder,
    Float32Array, Float32Builder, Int32Array, RecordBatch, StringArray, UInt16Array, UInt16Builder,
    UInt32Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use numbers::split::Split;
use std::sync::Arc;

/// One traced (token, layer).
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRow {
    /// Fit or held-out.
    pub split: Split,
    /// Domain name.
    pub domain: String,
    /// Chunk id in the tokenized corpus.
    pub chunk: u32,
    /// Position of the token inside its chunk.
    pub pos: u32,
    /// The token id.
    pub token_id: i32,
    /// Model block index.
    pub layer: u32,
    /// Experts actually selected (router top-k), in selection order.
    pub selected: Vec<u16>,
    /// Gate weights of the selected experts.
    pub selected_weight: Vec<f32>,
    /// Router top-N expert ids by probability, descending.
    pub topn_id: Vec<u16>,
    /// Router probabilities of `topn_id`.
    pub topn_prob: Vec<f32>,
}

/// How a part stores router probabilities and gate weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// f32 values: the layout of the first trace parts.
    Full,
    /// f16 values and column encodings chosen for size; the default.
    Compact,
}

impl Encoding {
    fn float_type(self) -> DataType {
        match self {
            Encoding::Full => DataType::Float32,
            Encoding::Compact => DataType::Float16,
        }
    }
}

/// The Parquet/Arrow schema for `k` selected experts and router top-`n`.
pub fn schema(k: usize, n: usize, encoding: Encoding) -> SchemaRef {
    let list = |name: &str, dt: DataType, len: usize| {
        Field::new(
            name,
            DataType::FixedSizeList(Arc::new(Field::new("item", dt, false)), len as i32),
            false,
        )
    };
    let float = encoding.float_type();
    Arc::new(Schema::new(vec![
        Field::new("split", DataType::Utf8, false),
        Field::new("domain", DataType::Utf8, false),
        Field::new("chunk", DataType::UInt32, false),
        Field::new("pos", DataType::UInt32, false),
        Field::new("token_id", DataType::Int32, false),
        Field::new("layer", DataType::UInt32, false),
        list("selected", DataType::UInt16, k),
        list("selected_weight", float.clone(), k),
        list("topn_id", DataType::UInt16, n),
        list("topn_prob", float, n),
    ]))
}

/// A fixed-size list builder of f32 or f16 values.
enum FloatList {
    F32(FixedSizeListBuilder<Float32Builder>),
    F16(FixedSizeListBuilder<Float16Builder>),
}

impl FloatList {
    fn new(encoding: Encoding, len: usize) -> FloatList {
        let item = Field::new("item", encoding.float_type(), false);
        match encoding {
            Encoding::Full => FloatList::F32(
                FixedSizeListBuilder::new(Float32Builder::new(), len as i32).with_field(item),
            ),
            Encoding::Compact => FloatList::F16(
                FixedSizeListBuilder::new(Float16Builder::new(), len as i32).with_field(item),
            ),
        }
    }

    fn append(&mut self, values: &[f32]) {
        match self {
            FloatList::F32(b) => {
                b.values().append_slice(values);
                b.append(true);
            }
            FloatList::F16(b) => {
                for &v in values {
                    b.values().append_value(half::f16::from_f32(v));
                }
                b.append(true);
            }
        }
    }

    fn finish(self) -> ArrayRef {
        match self {
            FloatList::F32(mut b) => Arc::new(b.finish()),
            FloatList::F16(mut b) => Arc::new(b.finish()),
        }
    }
}

/// The values of an f32 or f16 array as f32 (f16 widens exactly).
pub fn float_values(values: &dyn Array) -> Result<std::borrow::Cow<'_, [f32]>, String> {
    if let Some(a) = values.as_any().downcast_ref::<Float32Array>() {
        return Ok(std::borrow::Cow::Borrowed(a.values()));
    }
    if let Some(a) = values.as_any().downcast_ref::<Float16Array>() {
        return Ok(std::borrow::Cow::Owned(
            a.values().iter().map(|v| v.to_f32()).collect(),
        ));
    }
    Err(format!(
        "expected f32 or f16 values, found {}",
        values.data_type()
    ))
}

/// Builds a record batch from rows that all have `k` selected and `n` top ids.
pub fn rows_to_batch(
    rows: &[TraceRow],
    k: usize,
    n: usize,
    encoding: Encoding,
) -> Result<RecordBatch, String> {
    let mut sel = FixedSizeListBuilder::new(UInt16Builder::new(), k as i32).with_field(Field::new(
        "item",
        DataType::UInt16,
        false,
    ));
    let mut selw = FloatList::new(encoding, k);
    let mut top = FixedSizeListBuilder::new(UInt16Builder::new(), n as i32).with_field(Field::new(
        "item",
        DataType::UInt16,
        false,
    ));
    let mut topp = FloatList::new(encoding, n);
    for r in rows {
        if r.selected.len() != k || r.selected_weight.len() != k {
            return Err(format!(
                "trace row has {} selected experts, expected {k}",
                r.selected.len()
            ));
        }
        if r.topn_id.len() != n || r.topn_prob.len() != n {
            return Err(format!(
                "trace row has {} top-N entries, expected {n}",
                r.topn_id.len()
            ));
        }
        sel.values().append_slice(&r.selected);
        sel.append(true);
        selw.append(&r.selected_weight);
        top.values().append_slice(&r.topn_id);
        top.append(true);
        topp.append(&r.topn_prob);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.split.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.domain.as_str()),
        )),
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.chunk))),
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.pos))),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|r| r.token_id),
        )),
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.layer))),
        Arc::new(sel.finish()),
        selw.finish(),
        Arc::new(top.finish()),
        topp.finish(),
    ];
    RecordBatch::try_new(schema(k, n, encoding), columns).map_err(|e| e.to_string())
}

/// Converts a record batch of the trace schema back into rows.
pub fn batch_to_rows(batch: &RecordBatch) -> Result<Vec<TraceRow>, String> {
    fn col<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Result<&'a T, String> {
        b.column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<T>())
            .ok_or_else(|| format!("trace batch lacks column {name:?} of the expected type"))
    }
    fn list<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Result<(&'a T, usize), String> {
        let l: &FixedSizeListArray = col(b, name)?;
        let width = l.value_length() as usize;
        let values = l
            .values()
            .as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| format!("trace column {name:?} has the wrong item type"))?;
        Ok((values, width))
    }
    fn floats<'a>(b: &'a RecordBatch, name: &str) -> Result<std::borrow::Cow<'a, [f32]>, String> {
        let l: &FixedSizeListArray = col(b, name)?;
        float_values(l.values().as_ref()).map_err(|e| format!("trace column {name:?}: {e}"))
    }
    let split: &StringArray = col(batch, "split")?;
    let domain: &StringArray = col(batch, "domain")?;
    let chunk: &UInt32Array = col(batch, "chunk")?;
    let pos: &UInt32Array = col(batch, "pos")?;
    let token: &Int32Array = col(batch, "token_id")?;
    let layer: &UInt32Array = col(batch, "layer")?;
    let (sel, k) = list::<UInt16Array>(batch, "selected")?;
    let selw = floats(batch, "selected_weight")?;
    let (top, n) = list::<UInt16Array>(batch, "topn_id")?;
    let topp = floats(batch, "topn_prob")?;
    (0..batch.num_rows())
        .map(|i| {
            Ok(TraceRow {
                split: Split::parse(split.value(i))
                    .ok_or_else(|| format!("unknown split {:?} in trace", split.value(i)))?,
                domain: domain.value(i).to_string(),
                chunk: chunk.value(i),
                pos: pos.value(i),
                token_id: token.value(i),
                layer: layer.value(i),
                selected: sel.values()[i * k..(i + 1) * k].to_vec(),
                selected_weight: selw[i * k..(i + 1) * k].to_vec(),
                topn_id: top.values()[i * n..(i + 1) * n].to_vec(),
                topn_prob: topp[i * n..(i + 1) * n].to_vec(),
            })
        })
        .collect()
}

/// Writes rows (any order) as a compact Parquet part sorted by (layer,
/// chunk, pos), one row group per layer.
pub fn write_part(rows: &mut [TraceRow], k: usize, n: usize) -> Result<Vec<u8>, String> {
    write_part_as(rows, k, n, Encoding::Compact)
}

/// [`write_part`] with a chosen [`Encoding`].
pub fn write_part_as(
    rows: &mut [TraceRow],
    k: usize,
    n: usize,
    encoding: Encoding,
) -> Result<Vec<u8>, String> {
    use parquet::arrow::ArrowWriter;
    rows.sort_by_key(|r| (r.layer, r.chunk, r.pos));
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema(k, n, encoding), Some(props(encoding)))
        .map_err(|e| e.to_string())?;
    for layer_rows in rows.chunk_by(|a, b| a.layer == b.layer) {
        let batch = rows_to_batch(layer_rows, k, n, encoding)?;
        writer.write(&batch).map_err(|e| e.to_string())?;
        writer.flush().map_err(|e| e.to_string())?;
    }
    writer.close().map_err(|e| e.to_string())?;
    Ok(out)
}

/// Writer settings: the first layout's plain Snappy for [`Encoding::Full`];
/// for [`Encoding::Compact`], dictionary runs for the repeated columns and
/// the ids, deltas for positions, and half floats split into byte streams
/// under gzip.
fn props(encoding: Encoding) -> parquet::file::properties::WriterProperties {
    use parquet::basic::{Compression, Encoding as Pq};
    use parquet::file::properties::WriterProperties;
    use parquet::schema::types::ColumnPath;
    let builder = WriterProperties::builder().set_compression(Compression::SNAPPY);
    if encoding == Encoding::Full {
        return builder.build();
    }
    let path = |p: &[&str]| ColumnPath::new(p.iter().map(|s| s.to_string()).collect());
    let mut builder = builder
        .set_column_dictionary_enabled(path(&["pos"]), false)
        .set_column_encoding(path(&["pos"]), Pq::DELTA_BINARY_PACKED);
    for name in ["selected_weight", "topn_prob"] {
        // The high bytes of sorted half floats repeat (a few bits each under
        // Huffman coding); the low bytes are noise.
        let p = path(&[name, "list", "item"]);
        builder = builder
            .set_column_dictionary_enabled(p.clone(), false)
            .set_column_encoding(p.clone(), Pq::BYTE_STREAM_SPLIT)
            .set_column_compression(p, Compression::GZIP(Default::default()));
    }
    builder.build()
}

/// Reads every row of a Parquet trace part.
pub fn read_part(bytes: bytes::Bytes) -> Result<Vec<TraceRow>, String> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| e.to_string())?
        .build()
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for batch in reader {
        rows.extend(batch_to_rows(&batch.map_err(|e| e.to_string())?)?);
    }
    Ok(rows)
}

/// The trace parts stored in a run: `(prefill, decode)` Parquet object
/// names, sorted; decode parts (tokens the model generated itself) are
/// those under [`crate::layout::DECODE_TRACE_DIR`].
pub async fn stored_parts(
    store: &crate::store::RunStore,
) -> Result<(Vec<String>, Vec<String>), crate::store::StoreError> {
    let decode_dir = format!("{}/", crate::layout::DECODE_TRACE_DIR);
    let (decode, prefill) = store
        .list(crate::layout::TRACE_DIR)
        .await?
        .into_iter()
        .filter(|n| n.ends_with(".parquet"))
        .partition(|n| n.starts_with(&decode_dir));
    Ok((prefill, decode))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(layer: u32, pos: u32) -> TraceRow {
        TraceRow {
            split: Split::Heldout,
            domain: "ja".into(),
            chunk: 3,
            pos,
            token_id: 42,
            layer,
            selected: vec![1, 2],
            selected_weight: vec![0.75, 0.25],
            topn_id: vec![1, 2, 3],
            topn_prob: vec![0.5, 0.2, 0.1],
        }
    }

    #[test]
    fn parquet_part_round_trips_sorted_by_layer() {
        let mut rows = vec![row(5, 1), row(1, 0), row(5, 0)];
        let bytes = write_part_as(&mut rows, 2, 3, Encoding::Full).unwrap();
        let back = read_part(bytes::Bytes::from(bytes)).unwrap();
        assert_eq!(back, vec![row(1, 0), row(5, 0), row(5, 1)]);
    }

    #[test]
    fn compact_part_round_trips_with_half_precision_values() {
        let mut rows = vec![row(5, 1), row(1, 0), row(5, 0)];
        for r in &mut rows {
            r.topn_prob = vec![0.512_345, 0.2, 1e-3];
            r.selected_weight = vec![0.712_345_6, 0.287_654_4];
        }
        let bytes = write_part(&mut rows.clone(), 2, 3).unwrap();
        let back = read_part(bytes::Bytes::from(bytes)).unwrap();
        assert_eq!(back.len(), 3);
        for (got, want) in back.iter().zip([&rows[1], &rows[2], &rows[0]]) {
            assert_eq!((got.layer, got.pos), (want.layer, want.pos));
            assert_eq!(got.topn_id, want.topn_id);
            assert_eq!(got.selected, want.selected);
            for (g, w) in got
                .topn_prob
                .iter()
                .chain(&got.selected_weight)
                .zip(want.topn_prob.iter().chain(&want.selected_weight))
            {
                // f16 keeps 11 significant bits: relative error <= 2^-11.
                assert!((g - w).abs() <= w.abs() / 2048.0, "{g} vs {w}");
                assert_ne!(g, w, "a value not representable in f16 came back exact");
            }
        }
    }

    /// Rows shaped like the real model: 48 layers, 512 experts, top-10 of a
    /// softmax over Gaussian logits, router top-64.
    fn wide_rows(tokens: u32) -> Vec<TraceRow> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut gauss = move || {
            let mut u = || {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
            };
            let (a, b) = (u(), u());
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        };
        let mut rows = Vec::new();
        for layer in 0..48u32 {
            for pos in 0..tokens {
                let logits: Vec<f64> = (0..512).map(|_| 2.0 * gauss()).collect();
                let max = logits.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                let probs: Vec<f32> = logits
                    .iter()
                    .map(|l| ((l - max).exp() / z) as f32)
                    .collect();
                let mut order: Vec<u16> = (0..512).collect();
                order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]));
                let sel = &order[..10];
                let mass: f32 = sel.iter().map(|&e| probs[e as usize]).sum();
                rows.push(TraceRow {
                    split: if pos % 5 == 0 {
                        Split::Heldout
                    } else {
                        Split::Fit
                    },
                    domain: ["prose", "code", "chat"][(pos / 700) as usize % 3].into(),
                    chunk: pos / 2048,
                    pos: pos % 2048,
                    token_id: (pos * 7919 % 6000) as i32,
                    layer,
                    selected: sel.to_vec(),
                    selected_weight: sel.iter().map(|&e| probs[e as usize] / mass).collect(),
                    topn_id: order[..64].to_vec(),
                    topn_prob: order[..64].iter().map(|&e| probs[e as usize]).collect(),
                });
            }
        }
        rows
    }

    /// DESIGN section 11's shape: the compact layout must take well under
    /// half the f32 layout's bytes (the absolute figure, at most a third of
    /// the f32 layout's 25 KB per token, is checked on the real `wide` model
    /// in `tests/tests/wide_shape.rs`).
    #[test]
    fn compact_part_at_the_real_shape_is_under_0_4_of_the_f32_layout() {
        let tokens = 1024;
        let rows = wide_rows(tokens);
        let full = write_part_as(&mut rows.clone(), 10, 64, Encoding::Full).unwrap();
        let compact = write_part(&mut rows.clone(), 10, 64).unwrap();
        let (full_per, compact_per) = (
            full.len() as f64 / f64::from(tokens),
            compact.len() as f64 / f64::from(tokens),
        );
        eprintln!("bytes per traced token: full {full_per:.0}, compact {compact_per:.0}");
        assert!(
            full_per > 20_000.0,
            "the f32 layout takes {full_per:.0} B per token"
        );
        assert!(
            compact_per <= 0.4 * full_per,
            "compact layout takes {compact_per:.0} B per traced token, f32 {full_per:.0}"
        );
    }
}
