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
//!
//! Lookahead guesses ([`Lookahead`]) sit in nullable columns
//! `lookahead_dD_id` and `lookahead_dD_prob` per distance `D`: a part has
//! them when any of its rows carries a guess for `D`, and a row without one
//! (layer `L + D` is past the last MoE layer) is null there. Parts written
//! before lookahead existed, or with it off, simply lack the columns, and
//! read back with no guesses.

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
    /// Guesses of later layers' routing made from this layer's hidden state,
    /// one per distance, ascending by distance (empty: lookahead off).
    pub lookahead: Vec<Lookahead>,
}

/// Layer `L + distance`'s router applied to the residual stream after layer
/// `L` (with that layer's own input norm and routing rule): its top-N.
#[derive(Clone, Debug, PartialEq)]
pub struct Lookahead {
    /// Layers ahead (1: the next layer).
    pub distance: u8,
    /// Guessed expert ids, best first.
    pub ids: Vec<u16>,
    /// The router's probabilities (softmax or sigmoid) of `ids`.
    pub probs: Vec<f32>,
}

/// The lookahead columns of a part: `(distance, width)`, ascending.
pub type LookaheadLayout = Vec<(u8, usize)>;

/// Name of the ids column of lookahead distance `d`.
pub fn lookahead_id_column(d: u8) -> String {
    format!("lookahead_d{d}_id")
}

/// Name of the probabilities column of lookahead distance `d`.
pub fn lookahead_prob_column(d: u8) -> String {
    format!("lookahead_d{d}_prob")
}

/// The lookahead columns `rows` need: every distance any row carries, with
/// its width; an error if two rows disagree on a distance's width.
pub fn lookahead_layout(rows: &[TraceRow]) -> Result<LookaheadLayout, String> {
    let mut out: std::collections::BTreeMap<u8, usize> = Default::default();
    for r in rows {
        for g in &r.lookahead {
            if g.ids.len() != g.probs.len() {
                return Err(format!(
                    "trace row's lookahead d={} has {} ids and {} probabilities",
                    g.distance,
                    g.ids.len(),
                    g.probs.len()
                ));
            }
            let w = *out.entry(g.distance).or_insert(g.ids.len());
            if w != g.ids.len() {
                return Err(format!(
                    "trace rows disagree on lookahead d={} width: {w} and {}",
                    g.distance,
                    g.ids.len()
                ));
            }
        }
    }
    Ok(out.into_iter().collect())
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
    schema_with(k, n, encoding, &[])
}

/// [`schema`] with the nullable lookahead columns of `lookahead`.
pub fn schema_with(k: usize, n: usize, encoding: Encoding, lookahead: &[(u8, usize)]) -> SchemaRef {
    let list_of = |name: &str, dt: DataType, len: usize, nullable: bool| {
        Field::new(
            name,
            DataType::FixedSizeList(Arc::new(Field::new("item", dt, false)), len as i32),
            nullable,
        )
    };
    let list = |name: &str, dt: DataType, len: usize| list_of(name, dt, len, false);
    let float = encoding.float_type();
    let mut fields = vec![
        Field::new("split", DataType::Utf8, false),
        Field::new("domain", DataType::Utf8, false),
        Field::new("chunk", DataType::UInt32, false),
        Field::new("pos", DataType::UInt32, false),
        Field::new("token_id", DataType::Int32, false),
        Field::new("layer", DataType::UInt32, false),
        list("selected", DataType::UInt16, k),
        list("selected_weight", float.clone(), k),
        list("topn_id", DataType::UInt16, n),
        list("topn_prob", float.clone(), n),
    ];
    for &(d, w) in lookahead {
        fields.push(list_of(&lookahead_id_column(d), DataType::UInt16, w, true));
        fields.push(list_of(&lookahead_prob_column(d), float.clone(), w, true));
    }
    Arc::new(Schema::new(fields))
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

    /// A null entry (`len` placeholder values, as fixed-size lists need).
    fn append_null(&mut self, len: usize) {
        match self {
            FloatList::F32(b) => {
                b.values().append_slice(&vec![0.0; len]);
                b.append(false);
            }
            FloatList::F16(b) => {
                for _ in 0..len {
                    b.values().append_value(half::f16::ZERO);
                }
                b.append(false);
            }
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
    rows_to_batch_with(rows, k, n, encoding, &lookahead_layout(rows)?)
}

/// [`rows_to_batch`] with the lookahead columns of `layout` (a part's, so
/// every row group has the same schema even where a layer has no guesses).
fn rows_to_batch_with(
    rows: &[TraceRow],
    k: usize,
    n: usize,
    encoding: Encoding,
    layout: &[(u8, usize)],
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
    let mut ahead: Vec<_> = layout
        .iter()
        .map(|&(_, w)| {
            let ids = FixedSizeListBuilder::new(UInt16Builder::new(), w as i32)
                .with_field(Field::new("item", DataType::UInt16, false));
            (ids, FloatList::new(encoding, w))
        })
        .collect();
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
        for (&(d, w), (ids, probs)) in layout.iter().zip(&mut ahead) {
            match r.lookahead.iter().find(|g| g.distance == d) {
                Some(g) if g.ids.len() != w || g.probs.len() != w => {
                    return Err(format!(
                        "trace row has {} lookahead d={d} guesses, expected {w}",
                        g.ids.len()
                    ))
                }
                Some(g) => {
                    ids.values().append_slice(&g.ids);
                    ids.append(true);
                    probs.append(&g.probs);
                }
                None => {
                    ids.values().append_slice(&vec![0; w]);
                    ids.append(false);
                    probs.append_null(w);
                }
            }
        }
    }
    let mut columns: Vec<ArrayRef> = vec![
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
    for (mut ids, probs) in ahead {
        columns.push(Arc::new(ids.finish()));
        columns.push(probs.finish());
    }
    RecordBatch::try_new(schema_with(k, n, encoding, layout), columns).map_err(|e| e.to_string())
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
    let ahead = lookahead_columns(batch)?;
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
                lookahead: ahead
                    .iter()
                    .filter(|c| c.ids.is_valid(i))
                    .map(|c| Lookahead {
                        distance: c.distance,
                        ids: c.id_values[i * c.width..(i + 1) * c.width].to_vec(),
                        probs: c.probs[i * c.width..(i + 1) * c.width].to_vec(),
                    })
                    .collect(),
            })
        })
        .collect()
}

/// One distance's lookahead columns of a batch, decoded.
pub struct LookaheadColumns<'a> {
    /// Layers ahead.
    pub distance: u8,
    /// Guesses per row.
    pub width: usize,
    /// The ids list column (its validity says which rows have a guess).
    pub ids: &'a FixedSizeListArray,
    /// Flat ids, `width` per row (placeholders where null).
    pub id_values: &'a [u16],
    /// Flat probabilities, `width` per row.
    pub probs: std::borrow::Cow<'a, [f32]>,
}

/// The distances a schema has lookahead id columns for, ascending.
pub fn lookahead_distances(schema: &Schema) -> Vec<u8> {
    let mut out: Vec<u8> = schema
        .fields()
        .iter()
        .filter_map(|f| {
            f.name()
                .strip_prefix("lookahead_d")?
                .strip_suffix("_id")?
                .parse()
                .ok()
        })
        .collect();
    out.sort_unstable();
    out
}

/// Every lookahead distance of a batch (none for parts written without
/// lookahead), checked: ids and probabilities of equal width and nulls.
pub fn lookahead_columns(batch: &RecordBatch) -> Result<Vec<LookaheadColumns<'_>>, String> {
    lookahead_distances(&batch.schema())
        .into_iter()
        .map(|d| {
            let get = |name: String| {
                batch
                    .column_by_name(&name)
                    .and_then(|c| c.as_any().downcast_ref::<FixedSizeListArray>())
                    .ok_or_else(|| {
                        format!("trace batch lacks list column {name:?} (lookahead d={d})")
                    })
            };
            let ids = get(lookahead_id_column(d))?;
            let probs = get(lookahead_prob_column(d))?;
            let width = ids.value_length() as usize;
            if probs.value_length() as usize != width || ids.nulls() != probs.nulls() {
                return Err(format!(
                    "trace columns {:?} and {:?} disagree in width or nulls",
                    lookahead_id_column(d),
                    lookahead_prob_column(d)
                ));
            }
            let id_values = ids
                .values()
                .as_any()
                .downcast_ref::<UInt16Array>()
                .ok_or_else(|| {
                    format!(
                        "trace column {:?} has the wrong item type",
                        lookahead_id_column(d)
                    )
                })?
                .values();
            let probs = float_values(probs.values().as_ref())
                .map_err(|e| format!("trace column {:?}: {e}", lookahead_prob_column(d)))?;
            Ok(LookaheadColumns {
                distance: d,
                width,
                ids,
                id_values,
                probs,
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
    let layout = lookahead_layout(rows)?;
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(
        &mut out,
        schema_with(k, n, encoding, &layout),
        Some(props(encoding, &layout)),
    )
    .map_err(|e| e.to_string())?;
    for layer_rows in rows.chunk_by(|a, b| a.layer == b.layer) {
        let batch = rows_to_batch_with(layer_rows, k, n, encoding, &layout)?;
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
fn props(
    encoding: Encoding,
    lookahead: &[(u8, usize)],
) -> parquet::file::properties::WriterProperties {
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
    let prob_columns: Vec<String> = ["selected_weight".to_string(), "topn_prob".to_string()]
        .into_iter()
        .chain(lookahead.iter().map(|&(d, _)| lookahead_prob_column(d)))
        .collect();
    for name in &prob_columns {
        // The high bytes of sorted half floats repeat (a few bits each under
        // Huffman coding); the low bytes are noise.
        let p = path(&[name.as_str(), "list", "item"]);
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
            lookahead: Vec::new(),
        }
    }

    fn guess(distance: u8, first: u16) -> Lookahead {
        Lookahead {
            distance,
            ids: vec![first, first + 1],
            probs: vec![0.625, 0.25],
        }
    }

    #[test]
    fn lookahead_columns_round_trip_with_nulls_past_the_last_layer() {
        // Layers 0..3: layer 1 guesses d=1 only, layer 2 (the last) none.
        let with = |layer, g: Vec<Lookahead>| {
            let mut r = row(layer, 0);
            // Exact in f16, so both encodings round-trip every value.
            r.topn_prob = vec![0.5, 0.25, 0.125];
            r.lookahead = g;
            r
        };
        let rows = vec![
            with(0, vec![guess(1, 4), guess(2, 7)]),
            with(1, vec![guess(1, 9)]),
            with(2, vec![]),
        ];
        for encoding in [Encoding::Full, Encoding::Compact] {
            let bytes = write_part_as(&mut rows.clone(), 2, 3, encoding).unwrap();
            let bytes = bytes::Bytes::from(bytes);
            let names: Vec<String> =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                    bytes.clone(),
                )
                .unwrap()
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().to_string())
                .collect();
            for c in [
                "lookahead_d1_id",
                "lookahead_d1_prob",
                "lookahead_d2_id",
                "lookahead_d2_prob",
            ] {
                assert!(names.iter().any(|n| n == c), "{c} missing from {names:?}");
            }
            assert_eq!(read_part(bytes).unwrap(), rows, "{encoding:?}");
        }
    }

    #[test]
    fn parts_without_lookahead_keep_the_old_layout_and_read_with_no_guesses() {
        let mut rows = vec![row(1, 0), row(2, 0)];
        let bytes = write_part(&mut rows, 2, 3).unwrap();
        let bytes = bytes::Bytes::from(bytes);
        let reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
                .unwrap();
        assert_eq!(reader.schema().fields().len(), 10);
        assert_eq!(
            reader.schema().as_ref(),
            schema(2, 3, Encoding::Compact).as_ref()
        );
        assert!(read_part(bytes)
            .unwrap()
            .iter()
            .all(|r| r.lookahead.is_empty()));
    }

    #[test]
    fn rows_disagreeing_on_a_lookahead_width_are_refused() {
        let mut a = row(0, 0);
        a.lookahead = vec![guess(1, 1)];
        let mut b = row(1, 0);
        b.lookahead = vec![Lookahead {
            distance: 1,
            ids: vec![3],
            probs: vec![0.5],
        }];
        let err = write_part(&mut [a, b], 2, 3).unwrap_err();
        assert!(err.contains("lookahead d=1 width"), "{err}");
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
                    lookahead: Vec::new(),
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
