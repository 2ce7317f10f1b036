//! The tokenized corpus as workers read it: chunks of token ids with
//! per-token (split, domain) spans, stored as `corpus/chunks.parquet` beside
//! `corpus/index.json` under the run.

use crate::split::{ChunkId, ChunkRange, Split};
use arrow::array::{
    Array, ArrayRef, Int32Builder, ListArray, ListBuilder, RecordBatch, UInt16Builder, UInt32Array,
    UInt32Builder, UInt8Builder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use crate::layout::corpus::{CHUNKS_FILE, INDEX_FILE};

/// A run of consecutive tokens of one (split, domain) inside a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// First token position in the chunk.
    pub start: u32,
    /// Number of tokens.
    pub len: u32,
    /// Fit or held-out.
    pub split: Split,
    /// Index into [`CorpusIndex::domains`].
    pub domain: u16,
}

/// One packed chunk of at most `n_ctx` tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Position in the schedule.
    pub id: ChunkId,
    /// Token ids.
    pub tokens: Vec<i32>,
    /// Spans covering every token exactly once, in order.
    pub spans: Vec<Span>,
}

impl Chunk {
    /// Checks that the spans tile the tokens and name known domains.
    pub fn validate(&self, n_domains: usize) -> Result<(), String> {
        let mut next = 0u32;
        for s in &self.spans {
            if s.start != next || s.len == 0 {
                return Err(format!(
                    "chunk {}: spans do not tile the tokens at {next}",
                    self.id
                ));
            }
            if s.domain as usize >= n_domains {
                return Err(format!(
                    "chunk {}: span names domain #{} of {n_domains}",
                    self.id, s.domain
                ));
            }
            next += s.len;
        }
        if next as usize != self.tokens.len() {
            return Err(format!(
                "chunk {}: spans cover {next} tokens, chunk has {}",
                self.id,
                self.tokens.len()
            ));
        }
        Ok(())
    }

    /// (split, domain index) of every token position.
    pub fn token_labels(&self) -> Vec<(Split, u16)> {
        self.spans
            .iter()
            .flat_map(|s| std::iter::repeat_n((s.split, s.domain), s.len as usize))
            .collect()
    }
}

/// `corpus/index.json`: what a worker needs besides the chunk table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CorpusIndex {
    /// Number of chunks; ids are `0..n_chunks`.
    pub n_chunks: u32,
    /// Context size the chunks were packed for.
    pub n_ctx: u32,
    /// Domain names, indexed by [`Span::domain`].
    pub domains: Vec<String>,
    /// Total tokens over all chunks.
    pub n_tokens: u64,
    /// SHA-256 of the chunk table's bytes.
    pub chunks_sha256: String,
}

impl CorpusIndex {
    /// Refuses a range that reaches past the last chunk, naming both.
    pub fn check_range(&self, range: ChunkRange) -> Result<(), String> {
        if range.end > self.n_chunks {
            return Err(format!(
                "chunk range {range} is out of bounds: the corpus has {} chunks (0..{})",
                self.n_chunks, self.n_chunks
            ));
        }
        Ok(())
    }
}

fn schema() -> SchemaRef {
    let list = |name: &str, dt: DataType| {
        Field::new(
            name,
            DataType::List(Arc::new(Field::new("item", dt, false))),
            false,
        )
    };
    Arc::new(Schema::new(vec![
        Field::new("chunk", DataType::UInt32, false),
        list("tokens", DataType::Int32),
        list("span_start", DataType::UInt32),
        list("span_len", DataType::UInt32),
        list("span_split", DataType::UInt8),
        list("span_domain", DataType::UInt16),
    ]))
}

/// Encodes chunks as a Parquet table (one row per chunk).
pub fn write_chunks(chunks: &[Chunk]) -> Result<Vec<u8>, String> {
    use parquet::arrow::ArrowWriter;
    fn item(dt: DataType) -> Field {
        Field::new("item", dt, false)
    }
    let mut tokens = ListBuilder::new(Int32Builder::new()).with_field(item(DataType::Int32));
    let mut start = ListBuilder::new(UInt32Builder::new()).with_field(item(DataType::UInt32));
    let mut len = ListBuilder::new(UInt32Builder::new()).with_field(item(DataType::UInt32));
    let mut split = ListBuilder::new(UInt8Builder::new()).with_field(item(DataType::UInt8));
    let mut domain = ListBuilder::new(UInt16Builder::new()).with_field(item(DataType::UInt16));
    for c in chunks {
        tokens.values().append_slice(&c.tokens);
        tokens.append(true);
        for s in &c.spans {
            start.values().append_value(s.start);
            len.values().append_value(s.len);
            split.values().append_value(s.split.code());
            domain.values().append_value(s.domain);
        }
        start.append(true);
        len.append(true);
        split.append(true);
        domain.append(true);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(chunks.iter().map(|c| c.id.0))),
        Arc::new(tokens.finish()),
        Arc::new(start.finish()),
        Arc::new(len.finish()),
        Arc::new(split.finish()),
        Arc::new(domain.finish()),
    ];
    let batch = RecordBatch::try_new(schema(), columns).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(&mut out, schema(), None).map_err(|e| e.to_string())?;
    w.write(&batch).map_err(|e| e.to_string())?;
    w.close().map_err(|e| e.to_string())?;
    Ok(out)
}

/// Decodes the chunks whose ids fall in `range` (all chunks for `None`).
pub fn read_chunks(bytes: bytes::Bytes, range: Option<ChunkRange>) -> Result<Vec<Chunk>, String> {
    use arrow::array::{Int32Array, UInt16Array, UInt8Array};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| format!("chunk table is not valid Parquet: {e}"))?
        .build()
        .map_err(|e| e.to_string())?;
    fn list<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a ListArray, String> {
        b.column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<ListArray>())
            .ok_or_else(|| format!("chunk table lacks list column {name:?}"))
    }
    fn values<T: 'static + Clone + Array>(l: &ListArray, i: usize) -> Result<T, String> {
        l.value(i)
            .as_any()
            .downcast_ref::<T>()
            .cloned()
            .ok_or_else(|| "chunk table column has the wrong item type".to_string())
    }
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| e.to_string())?;
        let ids = batch
            .column_by_name("chunk")
            .and_then(|c| c.as_any().downcast_ref::<UInt32Array>())
            .ok_or("chunk table lacks column \"chunk\"")?;
        let (tokens, start, len, split, domain) = (
            list(&batch, "tokens")?,
            list(&batch, "span_start")?,
            list(&batch, "span_len")?,
            list(&batch, "span_split")?,
            list(&batch, "span_domain")?,
        );
        for i in 0..batch.num_rows() {
            let id = ids.value(i);
            if range.is_some_and(|r| id < r.start || id >= r.end) {
                continue;
            }
            let t: Int32Array = values(tokens, i)?;
            let (s, l): (UInt32Array, UInt32Array) = (values(start, i)?, values(len, i)?);
            let (sp, d): (UInt8Array, UInt16Array) = (values(split, i)?, values(domain, i)?);
            let spans = (0..s.len())
                .map(|j| {
                    Ok(Span {
                        start: s.value(j),
                        len: l.value(j),
                        split: Split::from_code(sp.value(j)).ok_or_else(|| {
                            format!("chunk {id}: unknown split code {}", sp.value(j))
                        })?,
                        domain: d.value(j),
                    })
                })
                .collect::<Result<_, String>>()?;
            out.push(Chunk {
                id: ChunkId(id),
                tokens: t.values().to_vec(),
                spans,
            });
        }
    }
    out.sort_by_key(|c| c.id);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_table_round_trips_and_filters_by_range() {
        let chunks: Vec<Chunk> = (0..4)
            .map(|i| Chunk {
                id: ChunkId(i),
                tokens: vec![i as i32, 7, 8],
                spans: vec![
                    Span {
                        start: 0,
                        len: 1,
                        split: Split::Fit,
                        domain: 0,
                    },
                    Span {
                        start: 1,
                        len: 2,
                        split: Split::Heldout,
                        domain: 1,
                    },
                ],
            })
            .collect();
        let bytes = write_chunks(&chunks).unwrap();
        let all = read_chunks(bytes::Bytes::from(bytes.clone()), None).unwrap();
        assert_eq!(all, chunks);
        let some = read_chunks(
            bytes::Bytes::from(bytes),
            Some(ChunkRange { start: 1, end: 3 }),
        )
        .unwrap();
        assert_eq!(some, chunks[1..3]);
        assert!(some[0].validate(2).is_ok());
        assert!(some[0].validate(1).unwrap_err().contains("domain #1"));
    }
}
