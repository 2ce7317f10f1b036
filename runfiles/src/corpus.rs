//! The tokenized corpus as workers read it: chunks of token ids with
//! per-token (split, domain, document, group) spans, stored as
//! `corpus/chunks.parquet` beside `corpus/index.json` under the run.
//!
//! A chunk may carry images ([`ImageSpan`]): the positions an image takes
//! in the model's input (mtmd's count for the model's mmproj), each holding
//! the image's marker token ([`image_token`]); the image's bytes are stored
//! as `corpus/images/<sha256>` ([`crate::layout::corpus::image`]).

use crate::file_error::FileError;
use crate::store::{RunStore, StoreError};
use arrow::array::{
    Array, ArrayRef, Int32Builder, ListArray, ListBuilder, RecordBatch, StringBuilder,
    UInt16Builder, UInt32Array, UInt32Builder, UInt8Builder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use numbers::split::{ChunkId, ChunkRange, Split};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use crate::layout::corpus::{CHUNKS_FILE, INDEX_FILE};

/// A run of consecutive tokens of one document inside a chunk.
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
    /// The document's index in `corpus/documents.jsonl` order, so a
    /// figure can be traced (and clustered) back to its document.
    pub doc: u32,
    /// Index into [`CorpusIndex::groups`]: the unit the held-out split
    /// samples, and so the unit intervals cluster by.
    pub group: u32,
}

/// One document group of the corpus ([`CorpusIndex::groups`]): every
/// document of a group lands on the same side of the held-out split.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// Index into [`CorpusIndex::domains`].
    pub domain: u16,
    /// The side of the split the group landed on.
    pub split: Split,
    /// The group key's value; `doc:<where>` for a document of a domain
    /// without a group key, `eval:<where>` for an eval-set document.
    pub key: String,
}

/// The positions one image takes in a chunk (or a document): `len`
/// positions from `start`, each holding [`image_token`] of the image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSpan {
    /// First position.
    pub start: u32,
    /// Number of positions (mtmd's `n_tokens` of the image's chunk).
    pub len: u32,
    /// SHA-256 of the image file's bytes (lowercase hex).
    pub sha256: String,
}

/// The token id every position of the image with SHA-256 `sha256_hex`
/// holds: minus one minus the first 31 bits of the hash, so it is negative
/// (never a vocabulary id), two different images almost never share one
/// (near-duplicate shingles tell them apart) and one image used twice gets
/// the same id both times.
pub fn image_token(sha256_hex: &str) -> i32 {
    let head = sha256_hex
        .get(..8)
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .unwrap_or(0);
    -1 - (head >> 1) as i32
}

/// One packed chunk of at most `n_ctx` tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Position in the schedule.
    pub id: ChunkId,
    /// Token ids (an image's positions hold its [`image_token`]).
    pub tokens: Vec<i32>,
    /// Spans covering every token exactly once, in order.
    pub spans: Vec<Span>,
    /// Its images, in order; empty for text.
    pub images: Vec<ImageSpan>,
}

impl Chunk {
    /// Checks that the spans tile the tokens and name known domains, and
    /// that the image spans lie inside the chunk, do not overlap, and that
    /// negative (image marker) tokens are exactly on them.
    pub fn validate(&self, n_domains: usize) -> Result<(), String> {
        self.validate_spans(n_domains)?;
        self.validate_images()
    }

    fn validate_images(&self) -> Result<(), String> {
        let mut next = 0usize;
        for im in &self.images {
            let (start, end) = (im.start as usize, im.start as usize + im.len as usize);
            let bad = |why: &str| {
                Err(format!(
                    "chunk {}: image {} at {start}..{end}: {why}",
                    self.id, im.sha256
                ))
            };
            if im.len == 0 || end > self.tokens.len() {
                return bad(&format!(
                    "is empty or reaches past the chunk's {} tokens",
                    self.tokens.len()
                ));
            }
            if start < next {
                return bad("overlaps the image before it (or is out of order)");
            }
            if im.sha256.len() != 64 || !im.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad("is not named by a SHA-256");
            }
            if self.tokens[next..start].iter().any(|&t| t < 0) {
                return bad("a marker token precedes it outside any image");
            }
            let marker = image_token(&im.sha256);
            if self.tokens[start..end].iter().any(|&t| t != marker) {
                return bad(&format!(
                    "its positions do not all hold its marker {marker}"
                ));
            }
            next = end;
        }
        if self.tokens[next..].iter().any(|&t| t < 0) {
            return Err(format!(
                "chunk {}: a marker token lies outside every image span",
                self.id
            ));
        }
        Ok(())
    }

    fn validate_spans(&self, n_domains: usize) -> Result<(), String> {
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

    /// How many of `span`'s positions belong to the chunk's images.
    pub fn image_positions_in(&self, span: &Span) -> u32 {
        let (start, end) = (span.start, span.start + span.len);
        self.images
            .iter()
            .map(|im| {
                (im.start + im.len)
                    .min(end)
                    .saturating_sub(im.start.max(start))
            })
            .sum()
    }

    /// (split, domain index) of every token position.
    pub fn token_labels(&self) -> Vec<(Split, u16)> {
        self.spans
            .iter()
            .flat_map(|s| std::iter::repeat_n((s.split, s.domain), s.len as usize))
            .collect()
    }
}

/// Refuses chunks that carry images for `what` (a stage that does not feed
/// images through the model's mmproj yet), naming the first one: reading
/// the marker tokens as text would give wrong figures without a warning.
pub fn refuse_images(chunks: &[Chunk], what: &str) -> Result<(), String> {
    match chunks.iter().find(|c| !c.images.is_empty()) {
        Some(c) => Err(format!(
            "chunk {} carries {} image(s) (the first, {}, at positions {}..{}): {what} does not \
             feed image positions through the model's mmproj (mtmd) yet",
            c.id,
            c.images.len(),
            c.images[0].sha256,
            c.images[0].start,
            c.images[0].start + c.images[0].len
        )),
        None => Ok(()),
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
    /// The domains (the last ones) that are eval sets
    /// (`[[corpus.eval_sets]]`): held out whole, evaluated apart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eval_sets: Vec<String>,
    /// Every document group, indexed by [`Span::group`] (empty in an index
    /// written before spans named their groups, whose chunk table
    /// [`read_chunks`] refuses).
    #[serde(default)]
    pub groups: Vec<GroupInfo>,
}

/// What the index is called in errors.
const INDEX_KIND: &str = "corpus index";

/// The most bytes of `corpus/index.json` read back (it lists every
/// document group).
pub const MAX_INDEX_BYTES: u64 = 1 << 30;

impl CorpusIndex {
    /// Reads `index.json` of the corpus at `corpus` (the run's `corpus/`,
    /// or a corpus location of its own) through [`CorpusIndex::decode`].
    pub async fn read(corpus: &RunStore) -> Result<CorpusIndex, FileError> {
        let bytes = corpus.get_limited(INDEX_FILE, MAX_INDEX_BYTES).await?;
        CorpusIndex::decode(&bytes, &corpus.url_of(INDEX_FILE))
    }

    /// [`CorpusIndex::read`], `None` when `corpus` has no `index.json`.
    pub async fn read_opt(corpus: &RunStore) -> Result<Option<CorpusIndex>, FileError> {
        match CorpusIndex::read(corpus).await {
            Ok(index) => Ok(Some(index)),
            Err(FileError::Store(StoreError::NotFound { .. })) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The exact bytes stored as `index.json` (pretty JSON; the manifest
    /// records their hash).
    pub fn encode(&self) -> String {
        serde_json::to_string_pretty(self).expect("a corpus index encodes")
    }

    /// Writes `index.json` of the corpus at `corpus` ([`CorpusIndex::encode`]),
    /// replacing a stored one: a corpus prepared again replaces its files.
    pub async fn write(&self, corpus: &RunStore) -> Result<(), StoreError> {
        corpus.put(INDEX_FILE, self.encode()).await
    }

    /// The one decoder of `index.json` bytes: the index's schema, each
    /// eval set one of its domains, each group in one of them; errors name
    /// `file`.
    pub fn decode(bytes: &[u8], file: &str) -> Result<CorpusIndex, FileError> {
        let invalid = |problem: String| FileError::invalid(file, INDEX_KIND, problem);
        let index: CorpusIndex =
            serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        if let Some(set) = index.eval_sets.iter().find(|s| !index.domains.contains(s)) {
            return Err(invalid(format!(
                "eval set {set:?} is not one of its domains {:?}",
                index.domains
            )));
        }
        if let Some((i, g)) = index
            .groups
            .iter()
            .enumerate()
            .find(|(_, g)| usize::from(g.domain) >= index.domains.len())
        {
            return Err(invalid(format!(
                "group {i} ({:?}) names domain {}, of {} domains",
                g.key,
                g.domain,
                index.domains.len()
            )));
        }
        Ok(index)
    }

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

/// Columns of a chunk's images, present only in a table where some chunk
/// has images (so a text corpus's table keeps its bytes).
const IMAGE_COLUMNS: [&str; 3] = ["image_start", "image_len", "image_sha256"];

/// The span columns naming each span's document and group (corpus format 3).
const SPAN_DOC: &str = "span_doc";
const SPAN_GROUP: &str = "span_group";

fn schema(images: bool) -> SchemaRef {
    let list = |name: &str, dt: DataType| {
        Field::new(
            name,
            DataType::List(Arc::new(Field::new("item", dt, false))),
            false,
        )
    };
    let mut fields = vec![
        Field::new("chunk", DataType::UInt32, false),
        list("tokens", DataType::Int32),
        list("span_start", DataType::UInt32),
        list("span_len", DataType::UInt32),
        list("span_split", DataType::UInt8),
        list("span_domain", DataType::UInt16),
        list(SPAN_DOC, DataType::UInt32),
        list(SPAN_GROUP, DataType::UInt32),
    ];
    if images {
        fields.extend([
            list(IMAGE_COLUMNS[0], DataType::UInt32),
            list(IMAGE_COLUMNS[1], DataType::UInt32),
            list(IMAGE_COLUMNS[2], DataType::Utf8),
        ]);
    }
    Arc::new(Schema::new(fields))
}

/// Encodes chunks as a Parquet table (one row per chunk).
pub fn write_chunks(chunks: &[Chunk]) -> Result<Vec<u8>, String> {
    fn item(dt: DataType) -> Field {
        Field::new("item", dt, false)
    }
    let mut tokens = ListBuilder::new(Int32Builder::new()).with_field(item(DataType::Int32));
    let mut start = ListBuilder::new(UInt32Builder::new()).with_field(item(DataType::UInt32));
    let mut len = ListBuilder::new(UInt32Builder::new()).with_field(item(DataType::UInt32));
    let mut split = ListBuilder::new(UInt8Builder::new()).with_field(item(DataType::UInt8));
    let mut domain = ListBuilder::new(UInt16Builder::new()).with_field(item(DataType::UInt16));
    let mut doc = ListBuilder::new(UInt32Builder::new()).with_field(item(DataType::UInt32));
    let mut group = ListBuilder::new(UInt32Builder::new()).with_field(item(DataType::UInt32));
    for c in chunks {
        tokens.values().append_slice(&c.tokens);
        tokens.append(true);
        for s in &c.spans {
            start.values().append_value(s.start);
            len.values().append_value(s.len);
            split.values().append_value(s.split.code());
            domain.values().append_value(s.domain);
            doc.values().append_value(s.doc);
            group.values().append_value(s.group);
        }
        start.append(true);
        len.append(true);
        split.append(true);
        domain.append(true);
        doc.append(true);
        group.append(true);
    }
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(chunks.iter().map(|c| c.id.0))),
        Arc::new(tokens.finish()),
        Arc::new(start.finish()),
        Arc::new(len.finish()),
        Arc::new(split.finish()),
        Arc::new(domain.finish()),
        Arc::new(doc.finish()),
        Arc::new(group.finish()),
    ];
    let images = chunks.iter().any(|c| !c.images.is_empty());
    if images {
        let mut start = ListBuilder::new(UInt32Builder::new()).with_field(item(DataType::UInt32));
        let mut len = ListBuilder::new(UInt32Builder::new()).with_field(item(DataType::UInt32));
        let mut sha = ListBuilder::new(StringBuilder::new()).with_field(item(DataType::Utf8));
        for c in chunks {
            for im in &c.images {
                start.values().append_value(im.start);
                len.values().append_value(im.len);
                sha.values().append_value(&im.sha256);
            }
            start.append(true);
            len.append(true);
            sha.append(true);
        }
        columns.extend([
            Arc::new(start.finish()) as ArrayRef,
            Arc::new(len.finish()),
            Arc::new(sha.finish()),
        ]);
    }
    let batch = RecordBatch::try_new(schema(images), columns).map_err(|e| e.to_string())?;
    crate::parquet_out::parquet_bytes(&batch)
}

/// Decodes the chunks whose ids fall in `range` (all chunks for `None`).
pub fn read_chunks(bytes: bytes::Bytes, range: Option<ChunkRange>) -> Result<Vec<Chunk>, String> {
    use arrow::array::{Int32Array, StringArray, UInt16Array, UInt8Array};
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
        if batch.column_by_name(SPAN_DOC).is_none() {
            return Err(format!(
                "chunk table lacks the column {SPAN_DOC:?}: it was written before corpus format \
                 3, whose spans name their document and group (what intervals cluster by); \
                 prepare the corpus again (run with --force, or choose another --out)"
            ));
        }
        let (docs, groups) = (list(&batch, SPAN_DOC)?, list(&batch, SPAN_GROUP)?);
        let images = match batch.column_by_name(IMAGE_COLUMNS[0]) {
            Some(_) => Some((
                list(&batch, IMAGE_COLUMNS[0])?,
                list(&batch, IMAGE_COLUMNS[1])?,
                list(&batch, IMAGE_COLUMNS[2])?,
            )),
            None => None,
        };
        for i in 0..batch.num_rows() {
            let id = ids.value(i);
            if range.is_some_and(|r| id < r.start || id >= r.end) {
                continue;
            }
            let t: Int32Array = values(tokens, i)?;
            let (s, l): (UInt32Array, UInt32Array) = (values(start, i)?, values(len, i)?);
            let (sp, d): (UInt8Array, UInt16Array) = (values(split, i)?, values(domain, i)?);
            let (doc, g): (UInt32Array, UInt32Array) = (values(docs, i)?, values(groups, i)?);
            if [l.len(), sp.len(), d.len(), doc.len(), g.len()]
                .iter()
                .any(|&n| n != s.len())
            {
                return Err(format!("chunk {id}: span columns differ in length"));
            }
            let spans = (0..s.len())
                .map(|j| {
                    Ok(Span {
                        start: s.value(j),
                        len: l.value(j),
                        split: Split::from_code(sp.value(j)).ok_or_else(|| {
                            format!("chunk {id}: unknown split code {}", sp.value(j))
                        })?,
                        domain: d.value(j),
                        doc: doc.value(j),
                        group: g.value(j),
                    })
                })
                .collect::<Result<_, String>>()?;
            let images = match images {
                Some((start, len, sha)) => {
                    let (s, l): (UInt32Array, UInt32Array) = (values(start, i)?, values(len, i)?);
                    let h: StringArray = values(sha, i)?;
                    if l.len() != s.len() || h.len() != s.len() {
                        return Err(format!("chunk {id}: image columns differ in length"));
                    }
                    (0..s.len())
                        .map(|j| ImageSpan {
                            start: s.value(j),
                            len: l.value(j),
                            sha256: h.value(j).to_string(),
                        })
                        .collect()
                }
                None => Vec::new(),
            };
            out.push(Chunk {
                id: ChunkId(id),
                tokens: t.values().to_vec(),
                spans,
                images,
            });
        }
    }
    out.sort_by_key(|c| c.id);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_index_reader_round_trips_and_refuses_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = RunStore::open(dir.path().to_str().unwrap()).unwrap();
        assert_eq!(CorpusIndex::read_opt(&corpus).await.unwrap(), None);
        let index = CorpusIndex {
            n_chunks: 2,
            n_ctx: 8,
            domains: vec!["web".into(), "quiz".into()],
            n_tokens: 16,
            chunks_sha256: "ab".into(),
            eval_sets: vec!["quiz".into()],
            groups: vec![GroupInfo {
                domain: 1,
                split: Split::Heldout,
                key: "eval:q.jsonl:1".into(),
            }],
        };
        index.write(&corpus).await.unwrap();
        assert_eq!(CorpusIndex::read(&corpus).await.unwrap(), index);
        let url = corpus.url_of(INDEX_FILE);
        for (text, why) in [
            (r#"{"n_chunks": 2"#, "EOF"),
            (r#"{"n_chunks": 2}"#, "missing field"),
            (
                r#"{"n_chunks":1,"n_ctx":8,"domains":["web"],"n_tokens":8,"chunks_sha256":"ab","eval_sets":["quiz"]}"#,
                "eval set \"quiz\" is not one of its domains",
            ),
            (
                r#"{"n_chunks":1,"n_ctx":8,"domains":["web"],"n_tokens":8,"chunks_sha256":"ab","groups":[{"domain":1,"split":"fit","key":"k"}]}"#,
                "group 0 (\"k\") names domain 1, of 1 domains",
            ),
        ] {
            corpus.put(INDEX_FILE, text.to_string()).await.unwrap();
            let e = CorpusIndex::read(&corpus).await.unwrap_err().to_string();
            assert!(
                e.contains(&url) && e.contains("is not a valid corpus index") && e.contains(why),
                "{text}: {e}"
            );
        }
    }

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
                        doc: 2 * i,
                        group: 0,
                    },
                    Span {
                        start: 1,
                        len: 2,
                        split: Split::Heldout,
                        domain: 1,
                        doc: 2 * i + 1,
                        group: 7 + i,
                    },
                ],
                images: Vec::new(),
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
        assert!(refuse_images(&all, "evaluation").is_ok());
        let text_columns = read_columns(&bytes_of(&chunks));
        assert!(!text_columns.iter().any(|c| c.starts_with("image_")));
    }

    #[test]
    fn a_table_whose_spans_name_no_document_is_refused_by_name() {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let chunk = image_chunk();
        let bytes = bytes::Bytes::from(bytes_of(std::slice::from_ref(&chunk)));
        // The same table as corpus format 2 wrote it: without the span
        // document and group columns.
        let mut reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap();
        let batch = reader.next().unwrap().unwrap();
        let keep: Vec<usize> = (0..batch.num_columns())
            .filter(|&i| !batch.schema().field(i).name().starts_with("span_doc"))
            .filter(|&i| batch.schema().field(i).name() != SPAN_GROUP)
            .collect();
        let old = crate::parquet_out::parquet_bytes(&batch.project(&keep).unwrap()).unwrap();
        assert!(!read_columns(&old).contains(&SPAN_DOC.to_string()));
        let err = read_chunks(bytes::Bytes::from(old), None).unwrap_err();
        assert!(
            err.contains("\"span_doc\"")
                && err.contains("corpus format 3")
                && err.contains("--force"),
            "{err}"
        );
    }

    fn bytes_of(chunks: &[Chunk]) -> Vec<u8> {
        write_chunks(chunks).unwrap()
    }

    fn read_columns(bytes: &[u8]) -> Vec<String> {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let b =
            ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes.to_vec())).unwrap();
        b.schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// A chunk of 10 tokens: text, one image of 4 positions at 2, text.
    fn image_chunk() -> Chunk {
        let sha = "ab01".repeat(16);
        let m = image_token(&sha);
        Chunk {
            id: ChunkId(3),
            tokens: vec![5, 6, m, m, m, m, 7, 8, 9, 10],
            spans: vec![Span {
                start: 0,
                len: 10,
                split: Split::Fit,
                domain: 0,
                doc: 4,
                group: 1,
            }],
            images: vec![ImageSpan {
                start: 2,
                len: 4,
                sha256: sha,
            }],
        }
    }

    #[test]
    fn image_spans_round_trip_and_are_validated() {
        let chunk = image_chunk();
        assert!(chunk.tokens[2] < 0);
        chunk.validate(1).unwrap();
        let other = image_token(&"12cd".repeat(16));
        assert_ne!(other, chunk.tokens[2], "another image, another marker");
        let bytes = bytes_of(std::slice::from_ref(&chunk));
        assert!(read_columns(&bytes).contains(&"image_sha256".to_string()));
        assert_eq!(
            read_chunks(bytes::Bytes::from(bytes), None).unwrap(),
            std::slice::from_ref(&chunk)
        );
        let err = refuse_images(std::slice::from_ref(&chunk), "evaluation").unwrap_err();
        assert!(
            err.contains("chunk 3 carries 1 image") && err.contains("evaluation does not feed"),
            "{err}"
        );

        let broken = |f: &dyn Fn(&mut Chunk)| {
            let mut c = chunk.clone();
            f(&mut c);
            c.validate(1).unwrap_err()
        };
        assert!(broken(&|c| c.images[0].len = 9).contains("reaches past"));
        assert!(broken(&|c| c.tokens[4] = 1).contains("do not all hold its marker"));
        assert!(broken(&|c| c.tokens[8] = -5).contains("outside every image span"));
        assert!(broken(&|c| {
            let mut second = c.images[0].clone();
            second.start = 4;
            c.images.push(second);
        })
        .contains("overlaps"));
        assert!(broken(&|c| c.images[0].sha256 = "x".into()).contains("SHA-256"));
    }
}
