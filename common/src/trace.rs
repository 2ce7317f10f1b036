//! Routing trace rows and their Parquet layout (DESIGN sections 3 and 10).
//!
//! One row per (token, MoE layer). Parts are written sorted by layer, one row
//! group per layer, so replay can stream a layer at a time.

use crate::split::Split;
use arrow::array::{
    Array, ArrayRef, FixedSizeListArray, FixedSizeListBuilder, Float32Array, Float32Builder,
    Int32Array, RecordBatch, StringArray, UInt16Array, UInt16Builder, UInt32Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
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

/// The Parquet/Arrow schema for `k` selected experts and router top-`n`.
pub fn schema(k: usize, n: usize) -> SchemaRef {
    let list = |name: &str, dt: DataType, len: usize| {
        Field::new(
            name,
            DataType::FixedSizeList(Arc::new(Field::new("item", dt, false)), len as i32),
            false,
        )
    };
    Arc::new(Schema::new(vec![
        Field::new("split", DataType::Utf8, false),
        Field::new("domain", DataType::Utf8, false),
        Field::new("chunk", DataType::UInt32, false),
        Field::new("pos", DataType::UInt32, false),
        Field::new("token_id", DataType::Int32, false),
        Field::new("layer", DataType::UInt32, false),
        list("selected", DataType::UInt16, k),
        list("selected_weight", DataType::Float32, k),
        list("topn_id", DataType::UInt16, n),
        list("topn_prob", DataType::Float32, n),
    ]))
}

/// Builds a record batch from rows that all have `k` selected and `n` top ids.
pub fn rows_to_batch(rows: &[TraceRow], k: usize, n: usize) -> Result<RecordBatch, String> {
    let mut sel = FixedSizeListBuilder::new(UInt16Builder::new(), k as i32).with_field(Field::new(
        "item",
        DataType::UInt16,
        false,
    ));
    let mut selw = FixedSizeListBuilder::new(Float32Builder::new(), k as i32)
        .with_field(Field::new("item", DataType::Float32, false));
    let mut top = FixedSizeListBuilder::new(UInt16Builder::new(), n as i32).with_field(Field::new(
        "item",
        DataType::UInt16,
        false,
    ));
    let mut topp = FixedSizeListBuilder::new(Float32Builder::new(), n as i32)
        .with_field(Field::new("item", DataType::Float32, false));
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
        selw.values().append_slice(&r.selected_weight);
        selw.append(true);
        top.values().append_slice(&r.topn_id);
        top.append(true);
        topp.values().append_slice(&r.topn_prob);
        topp.append(true);
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
        Arc::new(selw.finish()),
        Arc::new(top.finish()),
        Arc::new(topp.finish()),
    ];
    RecordBatch::try_new(schema(k, n), columns).map_err(|e| e.to_string())
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
    let split: &StringArray = col(batch, "split")?;
    let domain: &StringArray = col(batch, "domain")?;
    let chunk: &UInt32Array = col(batch, "chunk")?;
    let pos: &UInt32Array = col(batch, "pos")?;
    let token: &Int32Array = col(batch, "token_id")?;
    let layer: &UInt32Array = col(batch, "layer")?;
    let (sel, k) = list::<UInt16Array>(batch, "selected")?;
    let (selw, _) = list::<Float32Array>(batch, "selected_weight")?;
    let (top, n) = list::<UInt16Array>(batch, "topn_id")?;
    let (topp, _) = list::<Float32Array>(batch, "topn_prob")?;
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
                selected_weight: selw.values()[i * k..(i + 1) * k].to_vec(),
                topn_id: top.values()[i * n..(i + 1) * n].to_vec(),
                topn_prob: topp.values()[i * n..(i + 1) * n].to_vec(),
            })
        })
        .collect()
}

/// Writes rows (any order) as a Parquet part sorted by (layer, chunk, pos),
/// one row group per layer.
pub fn write_part(rows: &mut [TraceRow], k: usize, n: usize) -> Result<Vec<u8>, String> {
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    rows.sort_by_key(|r| (r.layer, r.chunk, r.pos));
    let props = WriterProperties::builder()
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut out = Vec::new();
    let mut writer =
        ArrowWriter::try_new(&mut out, schema(k, n), Some(props)).map_err(|e| e.to_string())?;
    for layer_rows in rows.chunk_by(|a, b| a.layer == b.layer) {
        let batch = rows_to_batch(layer_rows, k, n)?;
        writer.write(&batch).map_err(|e| e.to_string())?;
        writer.flush().map_err(|e| e.to_string())?;
    }
    writer.close().map_err(|e| e.to_string())?;
    Ok(out)
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
        let bytes = write_part(&mut rows, 2, 3).unwrap();
        let back = read_part(bytes::Bytes::from(bytes)).unwrap();
        assert_eq!(back, vec![row(1, 0), row(5, 0), row(5, 1)]);
    }
}
