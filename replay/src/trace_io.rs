//! Reading trace parts one layer at a time.
//!
//! Opening a set of parts reads only each part's footer and `layer` column;
//! [`TraceSet::read_layer`] then decodes just the row groups that hold that
//! layer, and only the columns replay needs, into flat arrays. Local runs are
//! read from the files by range, remote stores (`s3://`, ...) by ranged
//! requests for that layer's row groups ([`super::remote`]); only in-process
//! `memory://` stores hold whole parts.

use super::remote::Remote;
use crate::ReplayError;
use arrow::array::{Array, FixedSizeListArray, RecordBatch, StringArray, UInt32Array};
use bytes::Bytes;
use numbers::Split;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::reader::ChunkReader;
use parquet::file::statistics::Statistics;
use runfiles::store::RunStore;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

/// One layer's tokens of one split, in (chunk, position) order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawLayer {
    /// Selected experts per token.
    pub k: usize,
    /// Router top-N width.
    pub n: usize,
    /// Chunk of each token.
    pub chunk: Vec<u32>,
    /// Position of each token in its chunk.
    pub pos: Vec<u32>,
    /// Selected experts, `k` per token.
    pub selected: Vec<u16>,
    /// Router top-N ids, `n` per token, by probability.
    pub topn: Vec<u16>,
    /// Router top-N probabilities.
    pub topn_prob: Vec<f32>,
    /// Lookahead guesses made at this layer, one entry per distance the
    /// trace set has.
    pub ahead: Vec<Ahead>,
}

/// One lookahead distance's guesses of a layer's tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ahead {
    /// Layers ahead.
    pub distance: u8,
    /// Guesses per token.
    pub width: usize,
    /// Guessed ids, `width` per token, best first; [`crate::steps::NONE`]
    /// where the row has none (null, or a part without the column).
    pub ids: Vec<u16>,
}

impl RawLayer {
    /// Number of tokens.
    pub fn tokens(&self) -> usize {
        self.chunk.len()
    }
}

enum Source {
    Local(PathBuf),
    Memory(Bytes),
    /// A remote object read by range: the run's remote store, the part's
    /// name in it and its size.
    Remote(Arc<Remote>, String, u64),
}

struct Part {
    url: String,
    source: Source,
    meta: ArrowReaderMetadata,
    /// Row groups holding each layer.
    groups: BTreeMap<u32, Vec<usize>>,
}

/// The trace parts of one kind (prefill or decode) of a run.
pub struct TraceSet {
    parts: Vec<Part>,
    /// Selected experts per token.
    pub k: usize,
    /// Router top-N width.
    pub n: usize,
    /// Lookahead distances any part has, with the widest width seen.
    pub ahead: Vec<(u8, usize)>,
}

const COLUMNS: [&str; 7] = [
    "split",
    "chunk",
    "pos",
    "layer",
    "selected",
    "topn_id",
    "topn_prob",
];

impl TraceSet {
    /// Opens the parts `names` (relative to `store`); `None` if there are none.
    /// Only footers are read here (and a part's `layer` column when its
    /// statistics do not name one layer per row group).
    pub async fn open(store: &RunStore, names: &[String]) -> Result<Option<TraceSet>, ReplayError> {
        let local = url::Url::parse(store.url())
            .ok()
            .filter(|u| u.scheme() == "file")
            .and_then(|u| u.to_file_path().ok());
        // None for local files and memory: they are read otherwise.
        let remote = Remote::open(store)?.map(Arc::new);
        let mut parts = Vec::new();
        let mut shape: Option<(usize, usize)> = None;
        let mut ahead: BTreeMap<u8, usize> = BTreeMap::new();
        for name in names {
            let url = store.url_of(name);
            let part = if let Some(dir) = &local {
                let path = dir.join(name);
                let file = std::fs::File::open(&path).map_err(|source| ReplayError::TraceOpen {
                    url: url.clone(),
                    source,
                })?;
                open_part(&file, url.clone(), Source::Local(path))?
            } else if let Some(remote) = &remote {
                let (remote, name) = (remote.clone(), name.clone());
                let url = url.clone();
                tokio::task::spawn_blocking(move || -> Result<Part, ReplayError> {
                    let size = remote.size(&name)?;
                    let footer = remote.footer(&name, size).map_err(|source| {
                        ReplayError::TraceFooterFetch {
                            url: url.clone(),
                            source: Box::new(source),
                        }
                    })?;
                    open_part(&footer, url, Source::Remote(remote, name, size))
                })
                .await
                .map_err(|source| ReplayError::FooterTask { source })??
            } else {
                let bytes = store.get(name).await?;
                open_part(&bytes.clone(), url.clone(), Source::Memory(bytes))?
            };
            let this = (
                list_width(&part.meta, "selected", &url)?,
                list_width(&part.meta, "topn_id", &url)?,
            );
            match shape {
                Some(s) if s != this => {
                    return Err(ReplayError::TraceShape {
                        url,
                        k: this.0,
                        n: this.1,
                        other_k: s.0,
                        other_n: s.1,
                    })
                }
                _ => shape = Some(this),
            }
            for d in runfiles::trace::lookahead_distances(part.meta.schema()) {
                let w = list_width(&part.meta, &runfiles::trace::lookahead_id_column(d), &url)?;
                let at = ahead.entry(d).or_default();
                *at = (*at).max(w);
            }
            parts.push(part);
        }
        let ahead: Vec<(u8, usize)> = ahead.into_iter().collect();
        Ok(shape.map(|(k, n)| TraceSet { parts, k, n, ahead }))
    }

    /// Every layer any part holds, ascending.
    pub fn layers(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self
            .parts
            .iter()
            .flat_map(|p| p.groups.keys().copied())
            .collect();
        set.into_iter().collect()
    }

    /// Decodes one layer: the fit and held-out tokens, each in (chunk, pos)
    /// order. Expert ids must be below `n_expert`.
    pub fn read_layer(&self, layer: u32, n_expert: usize) -> Result<[RawLayer; 2], ReplayError> {
        let empty = || Decoded {
            key: Vec::new(),
            raw: RawLayer {
                k: self.k,
                n: self.n,
                ahead: self
                    .ahead
                    .iter()
                    .map(|&(distance, width)| Ahead {
                        distance,
                        width,
                        ids: Vec::new(),
                    })
                    .collect(),
                ..RawLayer::default()
            },
        };
        let mut out = [empty(), empty()];
        for part in &self.parts {
            let Some(groups) = part.groups.get(&layer) else {
                continue;
            };
            let mut names: Vec<String> = COLUMNS.iter().map(|c| c.to_string()).collect();
            names.extend(
                runfiles::trace::lookahead_distances(part.meta.schema())
                    .into_iter()
                    .map(runfiles::trace::lookahead_id_column),
            );
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let columns = column_indices(part, &names)?;
            for batch in &read_batches(part, groups, &columns)? {
                append(&mut out, batch, layer, self.k, self.n, n_expert).map_err(|source| {
                    ReplayError::TraceLayer {
                        url: part.url.clone(),
                        layer,
                        source: Box::new(source),
                    }
                })?;
            }
        }
        Ok(out.map(Decoded::sorted))
    }
}

fn list_width(meta: &ArrowReaderMetadata, name: &str, url: &str) -> Result<usize, ReplayError> {
    match meta
        .schema()
        .field_with_name(name)
        .map(|f| f.data_type().clone())
    {
        Ok(arrow::datatypes::DataType::FixedSizeList(_, w)) => Ok(w as usize),
        _ => Err(ReplayError::ListColumn {
            url: url.to_string(),
            column: name.to_string(),
        }),
    }
}

fn column_indices(part: &Part, names: &[&str]) -> Result<Vec<usize>, ReplayError> {
    let schema = part.meta.schema();
    names
        .iter()
        .map(|c| {
            schema
                .index_of(c)
                .map_err(|source| ReplayError::TraceColumn {
                    url: part.url.clone(),
                    column: c.to_string(),
                    source,
                })
        })
        .collect()
}

/// Reads the footer and maps each layer to its row groups: from the `layer`
/// column's statistics when a row group holds one layer (as parts are
/// written), else by reading that column.
fn open_part<T: ChunkReader + 'static>(
    footer: &T,
    url: String,
    source: Source,
) -> Result<Part, ReplayError> {
    let meta =
        ArrowReaderMetadata::load(footer, ArrowReaderOptions::default()).map_err(|source| {
            ReplayError::TraceFooter {
                url: url.clone(),
                source,
            }
        })?;
    let mut part = Part {
        url,
        source,
        meta,
        groups: BTreeMap::new(),
    };
    let layer_col = column_indices(&part, &["layer"])?;
    let leaf = part
        .meta
        .parquet_schema()
        .columns()
        .iter()
        .position(|c| c.path().string() == "layer")
        .ok_or_else(|| ReplayError::NoLayerColumn {
            url: part.url.clone(),
        })?;
    for rg in 0..part.meta.metadata().num_row_groups() {
        let stats = part.meta.metadata().row_group(rg).column(leaf).statistics();
        let single = match stats {
            Some(Statistics::Int32(s)) => match (s.min_opt(), s.max_opt()) {
                (Some(a), Some(b)) if a == b => Some(*a as u32),
                _ => None,
            },
            _ => None,
        };
        let layers: BTreeSet<u32> = match single {
            Some(l) => BTreeSet::from([l]),
            None => {
                let mut layers = BTreeSet::new();
                for batch in read_batches(&part, &[rg], &layer_col)? {
                    let col = batch
                        .column(0)
                        .as_any()
                        .downcast_ref::<UInt32Array>()
                        .ok_or_else(|| ReplayError::LayerColumnType {
                            url: part.url.clone(),
                        })?;
                    layers.extend(col.values().iter().copied());
                }
                layers
            }
        };
        for l in layers {
            part.groups.entry(l).or_default().push(rg);
        }
    }
    Ok(part)
}

/// Decodes the root columns `columns` of row groups `groups` of a part,
/// fetching only those bytes from a remote store.
fn read_batches(
    part: &Part,
    groups: &[usize],
    columns: &[usize],
) -> Result<Vec<RecordBatch>, ReplayError> {
    match &part.source {
        Source::Local(path) => {
            let file = std::fs::File::open(path).map_err(|source| ReplayError::TraceOpen {
                url: part.url.clone(),
                source,
            })?;
            decode(file, part, groups, columns)
        }
        Source::Memory(bytes) => decode(bytes.clone(), part, groups, columns),
        Source::Remote(remote, name, size) => {
            let (start, end) = byte_span(part, groups, columns);
            let window = remote.range(name, start, end, *size).map_err(|source| {
                ReplayError::TraceFetch {
                    url: part.url.clone(),
                    source: Box::new(source),
                }
            })?;
            decode(window, part, groups, columns)
        }
    }
}

/// The byte range that covers the chunks of `columns` in `groups`.
fn byte_span(part: &Part, groups: &[usize], columns: &[usize]) -> (u64, u64) {
    let descr = part.meta.parquet_schema();
    let (mut start, mut end) = (u64::MAX, 0u64);
    for &rg in groups {
        let rg = part.meta.metadata().row_group(rg);
        for leaf in 0..descr.num_columns() {
            if !columns.contains(&descr.get_column_root_idx(leaf)) {
                continue;
            }
            let (s, len) = rg.column(leaf).byte_range();
            start = start.min(s);
            end = end.max(s + len);
        }
    }
    (start.min(end), end)
}

fn decode<T: ChunkReader + 'static>(
    reader: T,
    part: &Part,
    groups: &[usize],
    columns: &[usize],
) -> Result<Vec<RecordBatch>, ReplayError> {
    let mask = ProjectionMask::roots(part.meta.parquet_schema(), columns.iter().copied());
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(reader, part.meta.clone())
        .with_projection(mask)
        .with_row_groups(groups.to_vec())
        .with_batch_size(16 * 1024)
        .build()
        .map_err(|source| ReplayError::TraceReader {
            url: part.url.clone(),
            source,
        })?;
    reader
        .map(|b| {
            b.map_err(|source| ReplayError::TraceDecode {
                url: part.url.clone(),
                source,
            })
        })
        .collect()
}

/// Tokens of one split as decoded, with their sort keys.
struct Decoded {
    key: Vec<u64>,
    raw: RawLayer,
}

impl Decoded {
    fn sorted(self) -> RawLayer {
        let Decoded { key, raw } = self;
        if key.is_sorted() {
            return raw;
        }
        let mut order: Vec<usize> = (0..key.len()).collect();
        order.sort_by_key(|&i| key[i]);
        let (k, n) = (raw.k, raw.n);
        let mut out = RawLayer {
            k,
            n,
            ahead: raw
                .ahead
                .iter()
                .map(|a| Ahead {
                    ids: Vec::with_capacity(a.ids.len()),
                    ..*a
                })
                .collect(),
            ..RawLayer::default()
        };
        for &i in &order {
            out.chunk.push(raw.chunk[i]);
            out.pos.push(raw.pos[i]);
            for (o, a) in out.ahead.iter_mut().zip(&raw.ahead) {
                o.ids
                    .extend_from_slice(&a.ids[i * a.width..(i + 1) * a.width]);
            }
            out.selected
                .extend_from_slice(&raw.selected[i * k..(i + 1) * k]);
            out.topn.extend_from_slice(&raw.topn[i * n..(i + 1) * n]);
            out.topn_prob
                .extend_from_slice(&raw.topn_prob[i * n..(i + 1) * n]);
        }
        out
    }
}

fn column<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> Result<&'a T, ReplayError> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| ReplayError::Column {
            column: name.to_string(),
            reason: "is missing or has the wrong type",
        })
}

/// The flat values of row `i` of a fixed-size list column.
fn list<'a, T: arrow::datatypes::ArrowPrimitiveType>(
    b: &'a RecordBatch,
    name: &str,
) -> Result<(&'a FixedSizeListArray, &'a [T::Native]), ReplayError> {
    let l: &FixedSizeListArray = column(b, name)?;
    let values = l
        .values()
        .as_any()
        .downcast_ref::<arrow::array::PrimitiveArray<T>>()
        .ok_or_else(|| ReplayError::Column {
            column: name.to_string(),
            reason: "has the wrong item type",
        })?;
    Ok((l, values.values()))
}

fn append(
    out: &mut [Decoded; 2],
    b: &RecordBatch,
    layer: u32,
    k: usize,
    n: usize,
    n_expert: usize,
) -> Result<(), ReplayError> {
    use arrow::datatypes::UInt16Type;
    let split: &StringArray = column(b, "split")?;
    let chunk: &UInt32Array = column(b, "chunk")?;
    let pos: &UInt32Array = column(b, "pos")?;
    let layers: &UInt32Array = column(b, "layer")?;
    let (sel_list, sel) = list::<UInt16Type>(b, "selected")?;
    let (top_list, top) = list::<UInt16Type>(b, "topn_id")?;
    let prob_list: &FixedSizeListArray = column(b, "topn_prob")?;
    let prob = runfiles::trace::float_values(prob_list.values().as_ref()).map_err(|reason| {
        ReplayError::ColumnValues {
            column: "topn_prob".to_string(),
            reason,
        }
    })?;
    // Per distance of the set: this batch's ids column, if it has one.
    let mut guess_cols = Vec::new();
    for a in &out[0].raw.ahead {
        let name = runfiles::trace::lookahead_id_column(a.distance);
        guess_cols.push(match b.column_by_name(&name) {
            None => None,
            Some(_) => Some(list::<UInt16Type>(b, &name)?),
        });
    }
    for i in 0..b.num_rows() {
        if layers.value(i) != layer {
            continue;
        }
        let s = match Split::parse(split.value(i)) {
            Some(Split::Fit) => 0,
            Some(Split::Heldout) => 1,
            None => {
                return Err(ReplayError::UnknownSplit {
                    split: split.value(i).to_string(),
                })
            }
        };
        let (so, to) = (sel_list.value_offset_at(i), top_list.value_offset_at(i));
        let (sel, top, prob) = (&sel[so..so + k], &top[to..to + n], &prob[to..to + n]);
        if let Some(&bad) = sel.iter().chain(top).find(|&&e| e as usize >= n_expert) {
            return Err(ReplayError::ExpertId {
                chunk: chunk.value(i),
                pos: pos.value(i),
                expert: bad,
                n_expert,
            });
        }
        let d = &mut out[s];
        for (a, col) in d.raw.ahead.iter_mut().zip(&guess_cols) {
            let before = a.ids.len();
            if let Some((l, ids)) = col.as_ref().filter(|(l, _)| l.is_valid(i)) {
                let (o, w) = (l.value_offset_at(i), l.value_length() as usize);
                let ids = &ids[o..o + w.min(a.width)];
                if let Some(&bad) = ids.iter().find(|&&e| e as usize >= n_expert) {
                    return Err(ReplayError::ExpertId {
                        chunk: chunk.value(i),
                        pos: pos.value(i),
                        expert: bad,
                        n_expert,
                    });
                }
                a.ids.extend_from_slice(ids);
            }
            a.ids.resize(before + a.width, crate::steps::NONE);
        }
        d.key
            .push((u64::from(chunk.value(i)) << 32) | u64::from(pos.value(i)));
        d.raw.chunk.push(chunk.value(i));
        d.raw.pos.push(pos.value(i));
        d.raw.selected.extend_from_slice(sel);
        d.raw.topn.extend_from_slice(top);
        d.raw.topn_prob.extend_from_slice(prob);
    }
    Ok(())
}
