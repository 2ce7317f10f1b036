//! Format 9 of a partial: the bincode header (every field, with its exact
//! sums left out), then (from format 9) the projected outputs' header, an
//! `Option<OutputProjection>` whose layers hold no sums, then each
//! [`ExactSum`] column [`packed`] (zeros marked by block masks), in a fixed
//! order: per (split, domain) group and MoE layer the five statistics, per
//! projected split and MoE layer its `n_expert x dim` sums, then
//! each importance-matrix tensor's `in_sum2` and `in_sum`. Format 8 is the
//! same without the projection's header and columns. A column equal to
//! an earlier one (`ffn_gate_exps` and `ffn_up_exps` read the same input, so
//! their sums are equal; so are `attn_q`'s, `attn_k`'s and `attn_v`'s) is
//! stored as a reference to it.
//!
//! Column layout: a tag byte; `0` then the packed length (u64, little
//! endian) and the packed bytes; or `1` then the index of the earlier packed
//! column it equals (u32, little endian).
//!
//! A group key is stored as a tag naming its split and modality, then its
//! domain ([`crate::stats::GroupKey`]): a text key as `(split, domain)`, the
//! form of partials before image positions were measured, which therefore
//! decode unchanged.
//!
//! Decoding is bounded: each column's length comes from the header (the
//! layer's expert count, the tensor's `n_in x n_mat` for each of its two
//! sums), a packed column must be at least [`packed::min_bytes`] of its
//! length (at most 8 sums per input byte) and the copies hold no more sums
//! than the packed columns, so a decoded partial holds at most 16 sums (256
//! bytes) per input byte.

use super::{Partial, PARTIAL_FORMAT_VERSION};
use crate::exact::ExactSum;
use crate::imatrix::{add_columns, Imatrix, ImatrixEntry, Sums};
use crate::packed;
use crate::peer_text::peer_text;
use crate::projection::{OutputProjection, MAX_DIM};
use crate::stats::{ExpertAccum, GroupAccum, LayerAccum, MergeError};
use bytes::Bytes;
use rayon::prelude::*;
use std::collections::HashMap;
use std::ops::Range;

const PACKED: u8 = 0;
const COPY: u8 = 1;

/// The encoding of `p` (format [`PARTIAL_FORMAT_VERSION`]).
pub(super) fn encode(p: &Partial) -> Vec<u8> {
    let parts = encode_parts(p);
    let mut out = Vec::with_capacity(parts.iter().map(Bytes::len).sum());
    for part in parts {
        out.extend_from_slice(&part);
    }
    out
}

/// [`encode`] in pieces, in order: the header, then per column its tag and
/// length, and its packed bytes (or the index of the column it copies).
pub(super) fn encode_parts(p: &Partial) -> Vec<Bytes> {
    let head = header(p);
    let mut header = bincode::serde::encode_to_vec(&head, bincode::config::standard())
        .expect("partial header encodes");
    let projection = bincode::serde::encode_to_vec(&head.projection, bincode::config::standard())
        .expect("projection header encodes");
    header.extend_from_slice(&projection);
    let columns = columns(p);
    let sources = first_equal(&columns, stats_columns(p));
    let packed: Vec<Option<Vec<u8>>> = columns
        .par_iter()
        .zip(&sources)
        .map(|(c, source)| {
            source.is_none().then(|| {
                let mut b = Vec::with_capacity(c.len() * 8);
                packed::encode(c, &mut b);
                b
            })
        })
        .collect();
    let mut parts = vec![Bytes::from(header)];
    for (bytes, source) in packed.into_iter().zip(&sources) {
        match (bytes, source) {
            (Some(b), _) => {
                let mut tag = vec![PACKED];
                tag.extend_from_slice(&(b.len() as u64).to_le_bytes());
                parts.extend([Bytes::from(tag), Bytes::from(b)]);
            }
            (None, Some(j)) => {
                let mut tag = vec![COPY];
                tag.extend_from_slice(&(*j as u32).to_le_bytes());
                parts.push(Bytes::from(tag));
            }
            (None, None) => unreachable!("a column is packed or a copy"),
        }
    }
    parts
}

/// Decodes the format from the whole of `bytes`.
pub(super) fn decode(bytes: &[u8]) -> Result<Partial, String> {
    let Layout {
        mut header,
        lengths,
        columns,
        n_stats,
    } = layout(bytes)?;
    let mut slots = stats_columns_mut(&mut header);
    fill(bytes, &mut slots, &lengths[..n_stats], &columns[..n_stats])?;
    let imatrix = imatrix_columns(&columns[n_stats..], n_stats);
    fill_imatrix(bytes, &mut header, &imatrix, n_stats)?;
    Ok(header)
}

/// The importance matrix's columns of `columns` (from index `n_stats`), a
/// copy naming its source among them.
fn imatrix_columns(columns: &[Column], n_stats: usize) -> Vec<Column> {
    columns
        .iter()
        .map(|c| match c {
            Column::Copy(j) => Column::Copy(j - n_stats),
            packed => packed.clone(),
        })
        .collect()
}

/// Decodes the importance-matrix sums of `p` (a header: sums empty) from
/// `columns` of `bytes`: each packed column once, spread over the cores,
/// and each copy shares its source's memory ([`Sums`]), so a decoded
/// partial holds equal tensors once. `first` is the index of the first
/// column in the whole partial (for errors).
fn fill_imatrix(
    bytes: &[u8],
    p: &mut Partial,
    columns: &[Column],
    first: usize,
) -> Result<(), String> {
    let lengths = imatrix_lengths(p);
    let mut slots: Vec<&mut Sums> = p
        .imatrix
        .entries
        .values_mut()
        .flat_map(ImatrixEntry::sums_mut)
        .collect();
    slots
        .par_iter_mut()
        .zip(&lengths)
        .zip(columns)
        .enumerate()
        .try_for_each(|(i, ((slot, &n), column))| {
            if let Column::Packed(at) = column {
                **slot = packed::decode_vec(&bytes[at.clone()], n)
                    .map_err(|e| bad_column(first + i, e))?
                    .into();
            }
            Ok::<(), String>(())
        })?;
    for (i, column) in columns.iter().enumerate() {
        if let Column::Copy(j) = column {
            *slots[i] = slots[*j].clone();
        }
    }
    Ok(())
}

/// Decodes every column into `slots`, spread over the cores: a copy decodes
/// its source's bytes once more (about what copying the decoded sums costs,
/// and in parallel with the rest, where a copy after the decode ran on one
/// core).
fn fill(
    bytes: &[u8],
    slots: &mut [&mut Vec<ExactSum>],
    lengths: &[usize],
    columns: &[Column],
) -> Result<(), String> {
    slots
        .par_iter_mut()
        .zip(lengths)
        .zip(columns)
        .enumerate()
        .try_for_each(|(i, ((slot, &n), column))| {
            let at = packed_range(columns, column);
            **slot = packed::decode_vec(&bytes[at.clone()], n).map_err(|e| bad_column(i, e))?;
            Ok(())
        })
}

/// The packed bytes of `column` of `columns`: its own, or those of the
/// earlier packed column it is a copy of ([`read_columns`] checked that).
fn packed_range<'a>(columns: &'a [Column], column: &'a Column) -> &'a Range<usize> {
    match column {
        Column::Packed(at) => at,
        Column::Copy(j) => match &columns[*j] {
            Column::Packed(at) => at,
            Column::Copy(_) => unreachable!("a copy names a packed column"),
        },
    }
}

fn bad_column(i: usize, e: packed::PackedError) -> String {
    format!("not a moe-census partial: column {i}: {e}")
}

/// Where a column's sums are: packed bytes (a range of the whole input),
/// or the same as an earlier packed column.
#[derive(Clone, Debug)]
enum Column {
    Packed(Range<usize>),
    Copy(usize),
}

/// The format's bytes taken apart: the header (sums empty), each column's
/// length (from the header) and place; the first `n_stats` columns are the
/// statistics', the rest the importance matrix's.
struct Layout {
    header: Partial,
    lengths: Vec<usize>,
    columns: Vec<Column>,
    n_stats: usize,
}

fn layout(bytes: &[u8]) -> Result<Layout, String> {
    let (mut header, mut used) = crate::bounded::decode_prefix::<Partial>(bytes)
        .map_err(|e| format!("not a moe-census partial: {e}"))?;
    if header.format_version >= 9 {
        let (projection, more) =
            crate::bounded::decode_prefix::<Option<OutputProjection>>(&bytes[used..])
                .map_err(|e| format!("not a moe-census partial: projected outputs: {e}"))?;
        if let Some(p) = &projection {
            check_projection(p, header.experts.shape.moe_layers.len())?;
        }
        header.projection = projection;
        used += more;
    }
    let lengths = expected_lengths(&header)?;
    if columns(&header).iter().any(|c| !c.is_empty()) {
        return Err("not a moe-census partial: sums inside its header".into());
    }
    let n_stats = stats_columns(&header);
    let columns = read_columns(bytes, used, &lengths, n_stats)?;
    Ok(Layout {
        header,
        lengths,
        columns,
        n_stats,
    })
}

/// Splits the column section (from `at`) into its columns, checking every
/// bound before anything is allocated. A copy refers to an earlier packed
/// column of the same section (statistics or importance matrix).
fn read_columns(
    bytes: &[u8],
    mut at: usize,
    lengths: &[usize],
    n_stats: usize,
) -> Result<Vec<Column>, String> {
    let mut out: Vec<Column> = Vec::with_capacity(lengths.len());
    let (mut packed_sums, mut copied_sums) = (0usize, 0usize);
    for (i, &n) in lengths.iter().enumerate() {
        let bad = |what: String| format!("not a moe-census partial: column {i}: {what}");
        let rest = &bytes[at..];
        let (&tag, after) = rest
            .split_first()
            .ok_or_else(|| bad(format!("missing ({} columns expected)", lengths.len())))?;
        match tag {
            PACKED => {
                let (len, after) = take::<8>(after).ok_or_else(|| bad("truncated".into()))?;
                let len = u64::from_le_bytes(len);
                if len < packed::min_bytes(n) as u64 || len > after.len() as u64 {
                    return Err(bad(format!(
                        "{len} packed bytes for {n} sums, {} bytes left",
                        after.len()
                    )));
                }
                let start = at + 9;
                out.push(Column::Packed(start..start + len as usize));
                packed_sums += n;
                at = start + len as usize;
            }
            COPY => {
                let (j, _) = take::<4>(after).ok_or_else(|| bad("truncated".into()))?;
                let j = u32::from_le_bytes(j) as usize;
                let same_section = (j < n_stats) == (i < n_stats);
                if j >= i
                    || !same_section
                    || !matches!(out[j], Column::Packed(_))
                    || lengths[j] != n
                {
                    return Err(bad(format!(
                        "a copy of column {j}, which is no earlier packed column of {n} sums in its section"
                    )));
                }
                out.push(Column::Copy(j));
                copied_sums += n;
                at += 5;
            }
            t => return Err(bad(format!("tag {t}"))),
        }
    }
    if at != bytes.len() {
        return Err(format!(
            "not a moe-census partial: {} trailing bytes after the last column",
            bytes.len() - at
        ));
    }
    if copied_sums > packed_sums {
        return Err(format!(
            "not a moe-census partial: copies hold {copied_sums} sums, more than the {packed_sums} packed ones"
        ));
    }
    Ok(out)
}

/// A projection header's dimension and layer counts against the bounds and
/// the partial's MoE shape.
fn check_projection(p: &OutputProjection, n_layers: usize) -> Result<(), String> {
    if p.dim == 0 || p.dim > MAX_DIM {
        return Err(format!(
            "not a moe-census partial: outputs projected to {} dimensions (1 to {MAX_DIM})",
            p.dim
        ));
    }
    for (split, layers) in &p.splits {
        if layers.len() != n_layers || layers.iter().any(|l| !l.is_empty()) {
            return Err(format!(
                "not a moe-census partial: {split} projected outputs of {} layers (with sums in \
                 the header) for {n_layers} MoE layers",
                layers.len()
            ));
        }
    }
    Ok(())
}

fn take<const N: usize>(bytes: &[u8]) -> Option<([u8; N], &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<N>()?;
    Some((*head, rest))
}

/// A partial whose statistics are decoded and whose importance-matrix sums
/// are still packed (checked, not kept): what the coordinator checks
/// ([`PackedPartial::header`]) and adds into its running total straight
/// from the packed bytes ([`PackedPartial::merge_into`]), so it never holds
/// a second decoded importance matrix (1.8 GB at the real shape).
#[derive(Clone, Debug)]
pub struct PackedPartial {
    header: Partial,
    bytes: Bytes,
    /// Per importance-matrix column (each tensor's `in_sum2` and `in_sum`,
    /// in order): its packed bytes, or the index (among these) of the
    /// column it equals.
    imatrix: Vec<Column>,
}

/// One importance-matrix sum column as a [`SumsCheck`] sees it: its
/// tensor's name and entry (sums empty: shape and counts), and whether it
/// holds the sums of squares (`in_sum2`) or the sums (`in_sum`).
#[derive(Clone, Copy, Debug)]
pub struct ImatrixColumn<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Its entry without sums.
    pub entry: &'a ImatrixEntry,
    /// `in_sum2` (else `in_sum`).
    pub squares: bool,
}

/// Value checks of importance-matrix sums made as the packed bytes are
/// unpacked ([`PackedPartial::parse_checked`]), so that the sums are checked
/// without being materialised.
pub trait SumsCheck: Sync {
    /// Whether the packed block of `len` sums of `column` from sum `start`
    /// on, whose header says `bounds`, needs its sums checked (false: the
    /// header shows they pass, and they are not built).
    fn needs_values(
        &self,
        column: ImatrixColumn<'_>,
        start: usize,
        len: usize,
        bounds: packed::BlockBounds,
    ) -> bool;

    /// Checks `values`, the sums of `column` from sum `start` on.
    fn block(
        &self,
        column: ImatrixColumn<'_>,
        start: usize,
        values: &[ExactSum],
    ) -> Result<(), String>;

    /// Whether `copy`, a column stored as a copy of `source`, passes exactly
    /// when `source` does (then its sums are not walked a second time).
    fn same_rules(&self, source: ImatrixColumn<'_>, copy: ImatrixColumn<'_>) -> bool;
}

/// No value checks: the format's own only.
impl SumsCheck for () {
    fn needs_values(
        &self,
        _: ImatrixColumn<'_>,
        _: usize,
        _: usize,
        _: packed::BlockBounds,
    ) -> bool {
        false
    }

    fn block(&self, _: ImatrixColumn<'_>, _: usize, _: &[ExactSum]) -> Result<(), String> {
        Ok(())
    }

    fn same_rules(&self, _: ImatrixColumn<'_>, _: ImatrixColumn<'_>) -> bool {
        true
    }
}

/// Why a walk over a packed column stopped: its bytes, or a value check.
enum Walk {
    Format(packed::PackedError),
    Value(String),
}

impl From<packed::PackedError> for Walk {
    fn from(e: packed::PackedError) -> Walk {
        Walk::Format(e)
    }
}

impl PackedPartial {
    /// Reads a partial from `bytes`: the same checks and limits as
    /// [`Partial::from_bytes`] (every column is decoded once to check it).
    pub fn parse(bytes: Bytes) -> Result<PackedPartial, String> {
        PackedPartial::parse_checked(bytes, |_| Ok(()))
    }

    /// [`PackedPartial::parse`], with the caller's checks folded in: once
    /// the header and the statistics are decoded, `check` sees them (the
    /// importance matrix's sums empty) and returns the [`SumsCheck`] every
    /// importance-matrix sum then passes as it is unpacked, tensor by tensor
    /// on the cores. Of several failing tensors, the first in name order is
    /// the one named.
    pub fn parse_checked<C: SumsCheck>(
        bytes: Bytes,
        check: impl FnOnce(&Partial) -> Result<C, String>,
    ) -> Result<PackedPartial, String> {
        super::check_version(&bytes)?;
        let Layout {
            mut header,
            lengths,
            columns,
            n_stats,
        } = layout(&bytes)?;
        let mut slots = stats_columns_mut(&mut header);
        fill(&bytes, &mut slots, &lengths[..n_stats], &columns[..n_stats])?;
        let sums = check(&header)?;
        let imatrix = imatrix_columns(&columns[n_stats..], n_stats);
        let described: Vec<ImatrixColumn> = header
            .imatrix
            .entries
            .iter()
            .flat_map(|(name, entry)| {
                [true, false].map(|squares| ImatrixColumn {
                    name,
                    entry,
                    squares,
                })
            })
            .collect();
        let checked: Vec<Result<(), String>> = imatrix
            .par_iter()
            .enumerate()
            .map(|(i, column)| {
                let source = match column {
                    Column::Packed(_) => i,
                    Column::Copy(j) if sums.same_rules(described[*j], described[i]) => {
                        return Ok(())
                    }
                    Column::Copy(j) => *j,
                };
                let at = packed_range(&imatrix, &imatrix[source]);
                let n = lengths[n_stats + i];
                let needs = |block, len, bounds| {
                    sums.needs_values(described[i], block * packed::BLOCK, len, bounds)
                };
                packed::visit(&bytes[at.clone()], n, needs, |block, values| {
                    sums.block(described[i], block * packed::BLOCK, values)
                        .map_err(Walk::Value)
                })
                .map_err(|e| match e {
                    Walk::Format(e) => bad_column(n_stats + source, e),
                    Walk::Value(why) => why,
                })
            })
            .collect();
        checked.into_iter().collect::<Result<(), String>>()?;
        drop(described);
        Ok(PackedPartial {
            header,
            bytes,
            imatrix,
        })
    }

    /// Adds this partial into a running `total` (it becomes the total when
    /// there is none yet: decoded once, as the accumulator must be).
    pub fn add_to(self, total: &mut Option<Partial>) -> Result<(), MergeError> {
        match total {
            None => *total = Some(self.decode()),
            Some(t) => self.merge_into(t)?,
        }
        Ok(())
    }

    /// The encoded bytes it was read from.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The partial without its importance-matrix sums (every `in_sum2` and
    /// `in_sum` is empty; the tensors' shapes and counts are there).
    pub fn header(&self) -> &Partial {
        &self.header
    }

    /// The whole partial, importance-matrix sums decoded (equal tensors
    /// sharing their memory).
    pub fn decode(&self) -> Partial {
        let mut p = self.header.clone();
        let n_stats = stats_columns(&p);
        fill_imatrix(&self.bytes, &mut p, &self.imatrix, n_stats)
            .expect("columns checked at parse");
        p
    }

    /// Adds this partial into `total` (as [`Partial::merge`] would add the
    /// decoded partial), the importance matrix's sums straight from their
    /// packed bytes, tensor by tensor in parallel. A column stored as a copy
    /// is added into the total once where the total shares its tensors'
    /// memory ([`add_columns`]).
    pub fn merge_into(&self, total: &mut Partial) -> Result<(), MergeError> {
        // Tensors the total lacks start at zero, so that the merge below
        // (which adds this header's counts, and no sums: its sums are
        // empty) and the sums after it find them.
        for (name, e) in &self.header.imatrix.entries {
            if !total.imatrix.entries.contains_key(name) {
                let zero = ImatrixEntry::new(e.n_in, e.n_mat);
                total.imatrix.entries.insert(name.clone(), zero);
            }
        }
        total.merge(&self.header)?;
        // Each of the total's columns that this partial covers, with the
        // packed column it adds: its own, or the one it is a copy of.
        let mut into: Vec<&mut Sums> = Vec::new();
        let mut names = self.header.imatrix.entries.keys().peekable();
        for (name, e) in total.imatrix.entries.iter_mut() {
            if names.next_if(|n| *n == name).is_some() {
                into.extend(e.sums_mut());
            }
        }
        let source_of: Vec<usize> = (0..into.len())
            .map(|i| match self.imatrix[i] {
                Column::Copy(j) => j,
                Column::Packed(_) => i,
            })
            .collect();
        add_columns(into, &source_of, |src, outs| {
            let Column::Packed(at) = &self.imatrix[src] else {
                unreachable!("a source is a packed column")
            };
            packed::decode_add(&self.bytes[at.clone()], outs).map_err(|e| match e {
                packed::PackedError::Overflow { value, .. } => {
                    MergeError::Exact(crate::exact::ExactError::Overflow(value))
                }
                other => unreachable!("columns checked at parse: {other}"),
            })
        })
    }
}

/// The lengths of `p`'s importance-matrix columns (two per tensor).
fn imatrix_lengths(p: &Partial) -> Vec<usize> {
    p.imatrix
        .entries
        .values()
        .flat_map(|e| [e.n_in as usize * e.n_mat as usize; 2])
        .collect()
}

/// How many of [`columns`] are the statistics' (the rest are the
/// importance matrix's).
fn stats_columns(p: &Partial) -> usize {
    let projected: usize = p
        .projection
        .iter()
        .flat_map(|x| x.splits.values())
        .map(Vec::len)
        .sum();
    p.experts
        .groups
        .values()
        .map(|g| 5 * g.layers.len())
        .sum::<usize>()
        + projected
}

/// For each column of [`columns`], the length the header gives it: the
/// layer's expert count (its `count` vector), the tensor's `n_in x n_mat`
/// twice (whose `counts` must hold `n_mat` entries).
fn expected_lengths(p: &Partial) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for g in p.experts.groups.values() {
        for l in &g.layers {
            out.extend([l.count.len(); 5]);
        }
    }
    if let Some(x) = &p.projection {
        let n = (p.experts.shape.n_expert as usize)
            .checked_mul(x.dim as usize)
            .ok_or("not a moe-census partial: projected outputs overflow")?;
        for layers in x.splits.values() {
            out.extend(std::iter::repeat_n(n, layers.len()));
        }
    }
    for (name, e) in &p.imatrix.entries {
        if e.counts.len() != e.n_mat as usize {
            return Err(format!(
                "not a moe-census partial: imatrix \"{}\" has {} counts for {} matrices",
                peer_text(name),
                e.counts.len(),
                e.n_mat
            ));
        }
    }
    out.extend(imatrix_lengths(p));
    Ok(out)
}

/// Every exact-sum column of `p`, in the encoding's order.
fn columns(p: &Partial) -> Vec<&[ExactSum]> {
    let mut out: Vec<&[ExactSum]> = Vec::new();
    for g in p.experts.groups.values() {
        for l in &g.layers {
            out.extend(l.sums().map(Vec::as_slice));
        }
    }
    for layers in p.projection.iter().flat_map(|x| x.splits.values()) {
        out.extend(layers.iter().map(Vec::as_slice));
    }
    for e in p.imatrix.entries.values() {
        out.extend(e.sums().map(|s| s.as_slice()));
    }
    out
}

/// The statistics' columns of [`columns`], writable (the importance
/// matrix's are [`fill_imatrix`]'s).
fn stats_columns_mut(p: &mut Partial) -> Vec<&mut Vec<ExactSum>> {
    let mut out: Vec<&mut Vec<ExactSum>> = Vec::new();
    for g in p.experts.groups.values_mut() {
        for l in &mut g.layers {
            out.extend(l.sums_mut());
        }
    }
    for layers in p.projection.iter_mut().flat_map(|x| x.splits.values_mut()) {
        out.extend(layers.iter_mut());
    }
    out
}

/// For each column, the first earlier column of its section (the first
/// `n_stats` columns, or the rest) equal to it (compared in full when a few
/// sampled sums match), as long as the copies so far hold no more sums than
/// the packed columns before them (the bound the decoder enforces); past
/// it, an equal column is packed again. A lease without fit tokens has an
/// importance matrix of zeros only, every tensor equal to the first of its
/// shape: those are mostly copies, and some are packed (zeros pack small).
fn first_equal(columns: &[&[ExactSum]], n_stats: usize) -> Vec<Option<usize>> {
    type Key = (bool, usize, [i128; 4]);
    let mut seen: HashMap<Key, Vec<usize>> = HashMap::new();
    let (mut packed, mut copied) = (0usize, 0usize);
    columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let n = c.len();
            if n == 0 {
                return None;
            }
            let key = (
                i < n_stats,
                n,
                [c[0].0, c[n / 3].0, c[2 * n / 3].0, c[n - 1].0],
            );
            let same = seen.entry(key).or_default();
            let found = (copied + n <= packed)
                .then(|| same.iter().copied().find(|&j| columns[j] == *c))
                .flatten();
            match found {
                Some(_) => copied += n,
                None => {
                    same.push(i);
                    packed += n;
                }
            }
            found
        })
        .collect()
}

/// `p` without its exact sums: the header of the encoding.
fn header(p: &Partial) -> Partial {
    let Partial {
        format_version: _,
        model_sha256,
        corpus_sha256,
        backends,
        chunks,
        experts,
        imatrix,
        nonfinite_drops,
        trace_tokens,
        trace_rows,
        trace_parts,
        chunk_stats,
        backend_to_host,
        projection,
    } = p;
    let layer = |l: &LayerAccum| LayerAccum {
        layer: l.layer,
        count: l.count.clone(),
        ean_max: l.ean_max.clone(),
        act_max: l.act_max.clone(),
        ..LayerAccum::new(l.layer, 0)
    };
    Partial {
        format_version: PARTIAL_FORMAT_VERSION,
        model_sha256: model_sha256.clone(),
        corpus_sha256: corpus_sha256.clone(),
        backends: backends.clone(),
        chunks: chunks.clone(),
        experts: ExpertAccum {
            shape: experts.shape.clone(),
            groups: experts
                .groups
                .iter()
                .map(|(k, g)| {
                    let layers = g.layers.iter().map(layer).collect();
                    let group = GroupAccum {
                        n_tokens: g.n_tokens,
                        layers,
                    };
                    (k.clone(), group)
                })
                .collect(),
        },
        imatrix: Imatrix {
            entries: imatrix
                .entries
                .iter()
                .map(|(name, e)| {
                    let entry = ImatrixEntry {
                        in_sum2: Sums::default(),
                        in_sum: Sums::default(),
                        counts: e.counts.clone(),
                        ..*e
                    };
                    (name.clone(), entry)
                })
                .collect(),
            chunk_count: imatrix.chunk_count,
            chunk_size: imatrix.chunk_size,
        },
        nonfinite_drops: nonfinite_drops.clone(),
        trace_tokens: *trace_tokens,
        trace_rows: *trace_rows,
        trace_parts: trace_parts.clone(),
        chunk_stats: chunk_stats.clone(),
        backend_to_host: *backend_to_host,
        projection: projection.as_ref().map(|x| OutputProjection {
            dim: x.dim,
            seed: x.seed,
            splits: x
                .splits
                .iter()
                .map(|(s, layers)| (*s, vec![Vec::new(); layers.len()]))
                .collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::BackendToHost;
    use super::*;
    use crate::stats::MoeShape;
    use crate::{ChunkRange, Gating, Split};
    use std::collections::BTreeMap;

    /// A partial with statistics in two groups and three imatrix tensors,
    /// two of them equal (as `ffn_gate_exps` and `ffn_up_exps` are).
    fn sample() -> Partial {
        let mut experts = ExpertAccum::new(MoeShape {
            n_expert: 6,
            n_expert_used: 2,
            gating: Gating::Softmax,
            moe_layers: vec![1, 3],
            routing: crate::routing::Routing::default(),
        });
        let mut x = 0.37f64;
        let mut next = move || {
            x = (x * 3.9 * (1.0 - x)).clamp(1e-9, 1.0 - 1e-9);
            x
        };
        for (split, domain) in [(Split::Fit, "a"), (Split::Heldout, "b")] {
            let g = experts.group_mut(split, domain);
            g.n_tokens = 9;
            for l in &mut g.layers {
                l.count = vec![3, 3, 3, 3, 3, 3];
                l.ean_max = (0..6).map(|_| next() * 40.0).collect();
                l.act_max = l.ean_max.iter().map(|m| m * next()).collect();
                for v in l.sums_mut() {
                    v.iter_mut()
                        .for_each(|s| *s = ExactSum::from_f64(next() * 40.0 - 3.0).unwrap());
                }
            }
        }
        let entry = |n_in: u32, n_mat: u32, next: &mut dyn FnMut() -> f64| ImatrixEntry {
            n_in,
            n_mat,
            in_sum2: (0..n_in * n_mat)
                .map(|_| ExactSum::from_f64(next() * 1e4).unwrap())
                .collect(),
            in_sum: (0..n_in * n_mat)
                .map(|_| ExactSum::from_f64(next() * 200.0 - 100.0).unwrap())
                .collect(),
            counts: vec![5; n_mat as usize],
        };
        let gate = entry(40, 6, &mut next);
        let down = entry(12, 6, &mut next);
        let entries = BTreeMap::from([
            ("blk.1.ffn_down_exps.weight".to_string(), down),
            ("blk.1.ffn_gate_exps.weight".to_string(), gate.clone()),
            ("blk.1.ffn_up_exps.weight".to_string(), gate),
        ]);
        Partial {
            format_version: PARTIAL_FORMAT_VERSION,
            model_sha256: "m".repeat(64),
            corpus_sha256: "c".repeat(64),
            backends: vec!["cpu".into()],
            chunks: vec![ChunkRange { start: 4, end: 9 }],
            experts,
            imatrix: Imatrix {
                entries,
                chunk_count: 5,
                chunk_size: 256,
            },
            nonfinite_drops: BTreeMap::from([("t".to_string(), 2)]),
            trace_tokens: 7,
            trace_rows: 14,
            trace_parts: vec!["trace/x.parquet".into()],
            chunk_stats: Vec::new(),
            backend_to_host: BackendToHost {
                tokens: 9,
                bytes: 99,
            },
            projection: None,
        }
    }

    /// [`sample`] with outputs projected to 3 dimensions in the fit split.
    fn projected(seed: f64) -> Partial {
        let mut p = sample();
        let mut x = OutputProjection::new(3);
        for (i, s) in x
            .split_mut(Split::Fit, 2, 6)
            .iter_mut()
            .flatten()
            .enumerate()
        {
            *s = ExactSum::from_f64((i as f64 * seed).sin() * 7.0).unwrap();
        }
        p.projection = Some(x);
        p
    }

    /// Byte offset of column `i`'s tag in `bytes`.
    fn column_at(bytes: &[u8], i: usize) -> usize {
        let (_, mut at) = crate::bounded::decode_prefix::<Partial>(bytes).unwrap();
        let (_, projection) =
            crate::bounded::decode_prefix::<Option<OutputProjection>>(&bytes[at..]).unwrap();
        at += projection;
        for _ in 0..i {
            at += match bytes[at] {
                PACKED => {
                    9 + u64::from_le_bytes(bytes[at + 1..at + 9].try_into().unwrap()) as usize
                }
                _ => 5,
            };
        }
        at
    }

    #[test]
    fn partials_round_trip_and_equal_tensors_are_stored_once() {
        let p = sample();
        let bytes = p.to_bytes();
        assert_eq!(Partial::from_bytes(&bytes).unwrap(), p);
        assert_eq!(p.to_bytes(), bytes, "the same partial gives the same bytes");
        assert_eq!(p.to_parts().concat(), bytes, "its pieces are its bytes");
        // 20 statistics columns, then in_sum2 and in_sum of down, gate, up:
        // up's are copies of gate's.
        for (column, source) in [(24, 22), (25, 23)] {
            let at = column_at(&bytes, column);
            assert_eq!(bytes[at], COPY, "column {column}");
            assert_eq!(
                u32::from_le_bytes(bytes[at + 1..at + 5].try_into().unwrap()),
                source
            );
        }
        assert_eq!(column_at(&bytes, 25) + 5, bytes.len());
        let old = bincode::serde::encode_to_vec(&p, bincode::config::standard()).unwrap();
        assert!(
            bytes.len() * 2 < old.len(),
            "{} vs {}",
            bytes.len(),
            old.len()
        );
    }

    #[test]
    fn partials_of_another_format_are_refused_with_the_version_named() {
        let p = sample();
        let mut bytes = p.to_bytes();
        assert_eq!(bytes[0], 9);
        assert_eq!(Partial::from_bytes(&bytes).unwrap(), p);
        // Format 7 had no largest activation elements (act_max), format 6
        // no output maxima either: refused, not misread.
        for old in [7, 6] {
            bytes[0] = old;
            let e = Partial::from_bytes(&bytes).unwrap_err();
            assert!(
                e.contains(&format!("format version {old} (this build reads 8 to 9)")),
                "{e}"
            );
            assert!(PackedPartial::parse(bytes.clone().into()).is_err());
        }
    }

    #[test]
    fn a_version_8_partial_reads_without_projected_outputs() {
        // Format 8 is format 9 without the projection's header (None: one
        // byte after the partial's header) and columns.
        let p = sample();
        let bytes = p.to_bytes();
        let (_, at) = crate::bounded::decode_prefix::<Partial>(&bytes).unwrap();
        assert_eq!(bytes[at], 0, "no projection");
        let mut old = bytes[..at].to_vec();
        old.extend_from_slice(&bytes[at + 1..]);
        old[0] = 8;
        let back = Partial::from_bytes(&old).unwrap();
        assert_eq!(back.format_version, 8);
        assert_eq!(back.projection, None);
        assert_eq!(
            Partial {
                format_version: 9,
                ..back
            },
            p
        );
        let packed = PackedPartial::parse(old.into()).unwrap();
        assert_eq!(packed.decode().experts, p.experts);
    }

    #[test]
    fn projected_outputs_round_trip_and_merge_exactly() {
        let (a, mut b) = (projected(0.3), projected(1.7));
        b.chunks = vec![ChunkRange { start: 9, end: 12 }];
        let bytes = a.to_bytes();
        assert_eq!(Partial::from_bytes(&bytes).unwrap(), a);
        assert!(bytes.len() > sample().to_bytes().len());
        // The packed path adds the projection as the decoded one does.
        let mut decoded = a.clone();
        decoded.merge(&b).unwrap();
        let mut packed = a.clone();
        PackedPartial::parse(b.to_bytes().into())
            .unwrap()
            .merge_into(&mut packed)
            .unwrap();
        assert_eq!(packed, decoded);
        let sum = |p: &Partial| p.projection.as_ref().unwrap().splits[&Split::Fit][1][4].to_f64();
        assert_eq!(sum(&decoded), sum(&a) + sum(&b));
        // A partial without the projection does not merge into one with it.
        let mut plain = sample();
        plain.chunks = vec![ChunkRange { start: 20, end: 21 }];
        let e = decoded.clone().merge(&plain).unwrap_err();
        assert!(e.to_string().contains("merge_projection"), "{e}");
        // A header claiming more layers than the model has is refused.
        let mut bad = a.clone();
        let layers = bad
            .projection
            .as_mut()
            .unwrap()
            .splits
            .get_mut(&Split::Fit)
            .unwrap();
        layers.push(layers[0].clone());
        let e = Partial::from_bytes(&bad.to_bytes()).unwrap_err();
        assert!(e.contains("fit projected outputs of 3 layers"), "{e}");
    }

    #[test]
    fn a_lease_without_fit_tokens_round_trips() {
        // Its importance matrix is zeros only: every tensor equals the
        // first of its shape, far more copied sums than packed ones unless
        // the encoder packs some again.
        let mut p = sample();
        let zeros = |n_in: u32, n_mat: u32| ImatrixEntry {
            n_in,
            n_mat,
            in_sum2: vec![ExactSum::ZERO; (n_in * n_mat) as usize].into(),
            in_sum: vec![ExactSum::ZERO; (n_in * n_mat) as usize].into(),
            counts: vec![0; n_mat as usize],
        };
        p.imatrix.entries = (0..8)
            .flat_map(|b| {
                [
                    (format!("blk.{b}.ffn_gate_exps.weight"), zeros(40, 6)),
                    (format!("blk.{b}.ffn_up_exps.weight"), zeros(40, 6)),
                    (format!("blk.{b}.attn_q.weight"), zeros(40, 1)),
                ]
            })
            .collect();
        let bytes = p.to_bytes();
        assert_eq!(Partial::from_bytes(&bytes).unwrap(), p);
        assert_eq!(PackedPartial::parse(bytes.into()).unwrap().decode(), p);
    }

    #[test]
    fn bad_columns_are_refused_before_allocating() {
        let bytes = sample().to_bytes();
        let up = column_at(&bytes, 24);
        // A copy of a later column, and of a column of another length.
        let mut bad = bytes.clone();
        bad[up + 1..up + 5].copy_from_slice(&24u32.to_le_bytes());
        let e = Partial::from_bytes(&bad).unwrap_err();
        assert!(e.contains("column 24: a copy of column 24"), "{e}");
        bad[up + 1..up + 5].copy_from_slice(&20u32.to_le_bytes());
        let e = Partial::from_bytes(&bad).unwrap_err();
        assert!(e.contains("no earlier packed column of 240 sums"), "{e}");
        // A packed length claiming more bytes than there are.
        let down = column_at(&bytes, 20);
        let mut bad = bytes.clone();
        bad[down + 1..down + 9].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let e = Partial::from_bytes(&bad).unwrap_err();
        assert!(
            e.contains("column 20: 1099511627776 packed bytes for 72 sums"),
            "{e}"
        );
        // An unknown tag, a missing column, trailing bytes.
        let mut bad = bytes.clone();
        bad[up] = 7;
        assert!(Partial::from_bytes(&bad)
            .unwrap_err()
            .contains("column 24: tag 7"));
        let e = Partial::from_bytes(&bytes[..up]).unwrap_err();
        assert!(
            e.contains("column 24: missing (26 columns expected)"),
            "{e}"
        );
        let mut long = bytes.clone();
        long.push(0);
        let e = Partial::from_bytes(&long).unwrap_err();
        assert!(e.contains("1 trailing bytes after the last column"), "{e}");
        // A header claiming 2^31 x 2^31 sums with no bytes for them.
        let mut huge = sample();
        huge.experts.groups.clear();
        let e = huge.imatrix.entries.values_mut().next().unwrap();
        (e.n_in, e.n_mat, e.in_sum2, e.counts) = (1 << 31, 1, Sums::default(), vec![0]);
        let mut bytes =
            bincode::serde::encode_to_vec(header(&huge), bincode::config::standard()).unwrap();
        // No projected outputs (None), then the column.
        bytes.extend_from_slice(&[0, PACKED, 255, 255, 255, 255, 0, 0, 0, 0]);
        bytes.resize(bytes.len() + 1000, 0);
        let e = Partial::from_bytes(&bytes).unwrap_err();
        assert!(
            e.contains("column 0: 4294967295 packed bytes for 2147483648 sums, 1000 bytes left"),
            "{e}"
        );
    }

    #[test]
    fn a_count_vector_that_disagrees_with_its_tensor_is_refused() {
        let mut p = sample();
        p.imatrix.entries.values_mut().next().unwrap().counts.pop();
        let e = Partial::from_bytes(&p.to_bytes()).unwrap_err();
        assert!(e.contains("has 5 counts for 6 matrices"), "{e}");
    }

    #[test]
    fn a_packed_partial_merges_into_a_total_as_the_decoded_one_does() {
        let a = sample();
        let mut b = sample();
        b.chunks = vec![ChunkRange { start: 0, end: 4 }];
        b.imatrix.entries.insert(
            "blk.3.attn_q.weight".into(),
            ImatrixEntry {
                n_in: 3,
                n_mat: 1,
                in_sum2: vec![ExactSum(5), ExactSum(-6), ExactSum(7)].into(),
                in_sum: vec![ExactSum(-2), ExactSum(0), ExactSum(9)].into(),
                counts: vec![4],
            },
        );
        for v in b
            .imatrix
            .entries
            .values_mut()
            .flat_map(|e| e.sums_mut().into_iter().flat_map(|s| s.iter_mut()))
        {
            v.0 = v.0 * 3 - 11;
        }
        let mut by_decoding = a.clone();
        by_decoding.merge(&b).unwrap();
        let packed = PackedPartial::parse(Bytes::from(b.to_bytes())).unwrap();
        assert!(packed
            .header()
            .imatrix
            .entries
            .values()
            .all(|e| e.in_sum2.is_empty() && e.in_sum.is_empty()));
        assert_eq!(packed.header().experts, b.experts);
        assert_eq!(packed.decode(), b);
        let mut total = a.clone();
        packed.merge_into(&mut total).unwrap();
        assert_eq!(total, by_decoding);
        assert_eq!(total.to_bytes(), by_decoding.to_bytes());
        // A damaged importance-matrix column (attn_q's in_sum2, the last
        // tensor's first) is refused at parse.
        let mut bad = b.to_bytes();
        let at = column_at(&bad, 26);
        let len = u64::from_le_bytes(bad[at + 1..at + 9].try_into().unwrap()) as usize;
        bad[at + 8 + len] ^= 0x80;
        let e = PackedPartial::parse(Bytes::from(bad)).unwrap_err();
        assert!(e.contains("column 26"), "{e}");
    }

    /// Each tensor's two sum columns, summed over `parts` sum by sum (the
    /// plain reference of a merge).
    fn summed(parts: &[&Partial]) -> BTreeMap<String, [Vec<i128>; 2]> {
        let mut out: BTreeMap<String, [Vec<i128>; 2]> = BTreeMap::new();
        for p in parts {
            for (name, e) in &p.imatrix.entries {
                let sums = out
                    .entry(name.clone())
                    .or_insert_with(|| [vec![0; e.in_sum2.len()], vec![0; e.in_sum.len()]]);
                for (acc, column) in sums.iter_mut().zip(e.sums()) {
                    for (a, b) in acc.iter_mut().zip(column.iter()) {
                        *a += b.0;
                    }
                }
            }
        }
        out
    }

    fn sums_of(p: &Partial) -> BTreeMap<String, [Vec<i128>; 2]> {
        summed(&[p])
    }

    /// Whether `ffn_gate_exps` and `ffn_up_exps` of `p` are held once.
    fn gate_and_up_shared(p: &Partial) -> bool {
        let e = &p.imatrix.entries;
        let (gate, up) = (
            &e["blk.1.ffn_gate_exps.weight"],
            &e["blk.1.ffn_up_exps.weight"],
        );
        gate.in_sum2.is_shared_with(&up.in_sum2) && gate.in_sum.is_shared_with(&up.in_sum)
    }

    #[test]
    fn a_running_total_holds_equal_tensors_once_until_a_partial_makes_them_differ() {
        let a = sample();
        let mut b = sample();
        b.chunks = vec![ChunkRange { start: 0, end: 4 }];
        for e in b.imatrix.entries.values_mut() {
            for column in e.sums_mut() {
                column.iter_mut().for_each(|v| v.0 = v.0 * 3 - 11);
            }
        }
        let mut c = sample();
        c.chunks = vec![ChunkRange { start: 9, end: 12 }];
        let up = c
            .imatrix
            .entries
            .get_mut("blk.1.ffn_up_exps.weight")
            .unwrap();
        up.in_sum2[3].0 += 1;
        let packed = |p: &Partial| PackedPartial::parse(Bytes::from(p.to_bytes())).unwrap();

        let mut total = None;
        packed(&a).add_to(&mut total).unwrap();
        assert!(gate_and_up_shared(total.as_ref().unwrap()));
        packed(&b).add_to(&mut total).unwrap();
        let total_ab = total.clone().unwrap();
        assert!(gate_and_up_shared(&total_ab));
        assert_eq!(sums_of(&total_ab), summed(&[&a, &b]));
        // The decoded path shares and merges alike.
        let mut decoded = Partial::from_bytes(&a.to_bytes()).unwrap();
        assert!(gate_and_up_shared(&decoded));
        decoded
            .merge(&Partial::from_bytes(&b.to_bytes()).unwrap())
            .unwrap();
        assert!(gate_and_up_shared(&decoded));
        assert_eq!(decoded, total_ab);

        packed(&c).add_to(&mut total).unwrap();
        let total = total.unwrap();
        assert!(!gate_and_up_shared(&total));
        assert_eq!(sums_of(&total), summed(&[&a, &b, &c]));
        assert!(
            gate_and_up_shared(&total_ab),
            "a clone of the total is not written"
        );
        assert_eq!(sums_of(&total_ab), summed(&[&a, &b]));
    }
}
