//! Partial results: what a worker returns for a set of chunks, and the exact
//! merge that combines them into a run's result.

mod encoding;

pub use encoding::{ImatrixColumn, PackedPartial, SumsCheck};

use crate::imatrix::Imatrix;
use crate::projection::OutputProjection;
use crate::saliency::Saliency;
use crate::split::ChunkRange;
use crate::stats::{ChunkStats, ExpertAccum, MergeError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the partial encoding; bumped on any layout change (2: the
/// backend-to-host figure, [`BackendToHost`]; 3: the routing semantics in
/// the MoE shape, [`crate::routing::Routing`]; 4: exact sums packed in
/// columns apart from the bincode header, [`crate::packed`]; 5: each
/// importance-matrix tensor's `in_sum` column after its `in_sum2`; 6: zero
/// masks in the packed blocks, [`crate::packed`]; 7: each layer's
/// largest expert output norm, [`crate::stats::LayerAccum::ean_max`]; 8:
/// each layer's largest single output element, REAP's super-expert
/// statistic, [`crate::stats::LayerAccum::act_max`]; 9: the projected
/// expert outputs, [`OutputProjection`], after the header).
/// Version 8 still reads (without projected outputs); any other version is
/// refused with its version named: a version-7 partial lacks `act_max`,
/// which no later step can recover, so its chunks are collected again.
pub const PARTIAL_FORMAT_VERSION: u32 = 9;

/// The oldest format version still read: the last before projected outputs.
pub const OLDEST_READ_VERSION: u32 = 8;

/// Accumulators for a disjoint set of chunks of one model and corpus.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partial {
    /// [`PARTIAL_FORMAT_VERSION`] at writing time.
    pub format_version: u32,
    /// SHA-256 of the GGUF model file.
    pub model_sha256: String,
    /// SHA-256 of the corpus chunk table.
    pub corpus_sha256: String,
    /// Backends that computed the chunks (`cpu`, `cuda:NVIDIA H200`, ...).
    pub backends: Vec<String>,
    /// Chunks covered, sorted and disjoint.
    pub chunks: Vec<ChunkRange>,
    /// REAP statistics per (split, domain, layer, expert).
    pub experts: ExpertAccum,
    /// The importance matrix.
    pub imatrix: Imatrix,
    /// Non-finite values dropped, per graph tensor name.
    pub nonfinite_drops: BTreeMap<String, u64>,
    /// Tokens whose routing was traced.
    pub trace_tokens: u64,
    /// Trace rows written (tokens x MoE layers).
    pub trace_rows: u64,
    /// Trace part object names relative to the run, sorted.
    pub trace_parts: Vec<String>,
    /// Fit-split statistics per chunk, for bootstrap stability; sorted by chunk.
    pub chunk_stats: Vec<ChunkStats>,
    /// What the worker read out of the compute backend while measuring.
    pub backend_to_host: BackendToHost,
    /// Projected expert outputs per split (`[run] merge_projection`; None
    /// when off, and in version-8 partials). Encoded after the header, so
    /// the header reads the same in both versions.
    #[serde(skip)]
    pub projection: Option<OutputProjection>,
}

/// Bytes that crossed from the compute backend into the worker's memory,
/// and the tokens decoded meanwhile: the cost the observer adds on a GPU.
/// Additive over chunks, so merging partials adds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendToHost {
    /// Tokens decoded with the observer attached (measured chunks, and the
    /// prompts and generated tokens of decode traces).
    pub tokens: u64,
    /// Bytes the host read from graph tensors (copied from device buffers,
    /// read in place from host buffers) and from device-side reductions.
    pub bytes: u64,
}

impl BackendToHost {
    /// Bytes per decoded token (0 before any token).
    pub fn per_token(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.bytes as f64 / self.tokens as f64
        }
    }

    /// Adds another set of chunks' figures.
    pub fn add(&mut self, other: &BackendToHost) {
        self.tokens += other.tokens;
        self.bytes += other.bytes;
    }
}

impl Partial {
    /// A partial of `model_sha256` and `corpus_sha256` over `chunks`,
    /// computed on `backend`, with no traces, drops or per-chunk figures yet
    /// (collection fills those in; fixtures and benches need none).
    pub fn new(
        model_sha256: String,
        corpus_sha256: String,
        backend: String,
        chunks: Vec<ChunkRange>,
        experts: ExpertAccum,
        imatrix: Imatrix,
    ) -> Partial {
        Partial {
            format_version: PARTIAL_FORMAT_VERSION,
            model_sha256,
            corpus_sha256,
            backends: vec![backend],
            chunks,
            experts,
            imatrix,
            nonfinite_drops: BTreeMap::new(),
            trace_tokens: 0,
            trace_rows: 0,
            trace_parts: Vec::new(),
            chunk_stats: Vec::new(),
            backend_to_host: BackendToHost::default(),
            projection: None,
        }
    }

    /// Total chunks covered.
    pub fn n_chunks(&self) -> u64 {
        self.chunks.iter().map(|r| r.len() as u64).sum()
    }

    /// Adds another partial; refuses a different model or corpus and any
    /// chunk covered twice. The statistics and the importance matrix's
    /// tensors are added in parallel; the result is the same bits.
    pub fn merge(&mut self, other: &Partial) -> Result<(), MergeError> {
        if self.model_sha256 != other.model_sha256 {
            return Err(MergeError::Shape(format!(
                "model {} vs {}",
                self.model_sha256, other.model_sha256
            )));
        }
        if self.corpus_sha256 != other.corpus_sha256 {
            return Err(MergeError::Shape(format!(
                "corpus {} vs {}",
                self.corpus_sha256, other.corpus_sha256
            )));
        }
        self.chunks = union_disjoint(&self.chunks, &other.chunks)?;
        let (experts, imatrix) = rayon::join(
            || self.experts.merge(&other.experts),
            || self.imatrix.merge(&other.imatrix),
        );
        experts?;
        imatrix?;
        for (name, n) in &other.nonfinite_drops {
            *self.nonfinite_drops.entry(name.clone()).or_default() += n;
        }
        for b in &other.backends {
            if !self.backends.contains(b) {
                self.backends.push(b.clone());
            }
        }
        self.backends.sort();
        self.trace_tokens += other.trace_tokens;
        self.trace_rows += other.trace_rows;
        self.trace_parts.extend(other.trace_parts.iter().cloned());
        self.trace_parts.sort();
        self.chunk_stats.extend(other.chunk_stats.iter().cloned());
        self.chunk_stats.sort_by_key(|c| c.chunk);
        self.backend_to_host.add(&other.backend_to_host);
        match (self.projection.as_mut(), other.projection.as_ref()) {
            (None, None) => {}
            (Some(a), Some(b)) => a.merge(b)?,
            (mine, _) => {
                return Err(MergeError::Shape(format!(
                    "projected expert outputs on {} side only (one partial was collected with \
                     `[run] merge_projection` and the other without)",
                    if mine.is_some() { "this" } else { "the other" }
                )))
            }
        }
        Ok(())
    }

    /// The float view written as `saliency.json`.
    pub fn saliency(&self) -> Result<Saliency, MergeError> {
        Saliency::from_accum(
            &self.experts,
            self.trace_tokens,
            &self.nonfinite_drops,
            self.n_chunks(),
        )
    }

    /// Binary encoding, format [`PARTIAL_FORMAT_VERSION`]: a bincode header
    /// without the exact sums, then the sums packed column by column
    /// (`encoding`); the same partial always gives the same bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        encoding::encode(self)
    }

    /// [`Partial::to_bytes`] in pieces (the header, each column's tag and
    /// packed bytes), for a store to write without one contiguous copy: at
    /// the real shape the encoding is 1 GB beside the partial's 2 GB.
    pub fn to_parts(&self) -> Vec<bytes::Bytes> {
        encoding::encode_parts(self)
    }

    /// Decodes a partial: the format version is read first (another version
    /// is refused before the rest is decoded), then the whole value under
    /// limits sized from `bytes.len()` ([`crate::bounded`], `encoding`);
    /// trailing bytes are refused, and every sum column must have the length
    /// its header gives it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Partial, String> {
        check_version(bytes)?;
        encoding::decode(bytes)
    }
}

/// Reads the format version that leads a partial's bytes and refuses any
/// but [`OLDEST_READ_VERSION`] to [`PARTIAL_FORMAT_VERSION`], before the
/// rest is decoded.
fn check_version(bytes: &[u8]) -> Result<u32, String> {
    let (version, _) = crate::bounded::decode_prefix::<u32>(bytes)
        .map_err(|e| format!("not a moe-census partial: {e}"))?;
    match version {
        OLDEST_READ_VERSION..=PARTIAL_FORMAT_VERSION => Ok(version),
        _ => Err(format!(
            "partial format version {version} (this build reads {OLDEST_READ_VERSION} to \
             {PARTIAL_FORMAT_VERSION})"
        )),
    }
}

/// Union of two sorted disjoint range lists; an overlap is an error.
fn union_disjoint(a: &[ChunkRange], b: &[ChunkRange]) -> Result<Vec<ChunkRange>, MergeError> {
    let all: Vec<ChunkRange> = a.iter().chain(b).copied().collect();
    crate::split::coalesce(&all).map_err(MergeError::Overlap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u32, end: u32) -> ChunkRange {
        ChunkRange { start, end }
    }

    fn small() -> Partial {
        Partial::new(
            "m".repeat(64),
            "c".repeat(64),
            "cpu".into(),
            vec![r(0, 2)],
            ExpertAccum::new(crate::stats::MoeShape {
                n_expert: 4,
                n_expert_used: 2,
                gating: crate::Gating::Softmax,
                moe_layers: vec![0, 1],
                routing: crate::routing::Routing::default(),
            }),
            Imatrix::default(),
        )
    }

    #[test]
    fn a_string_length_of_2_pow_40_is_an_error_not_an_allocation() {
        let good = small().to_bytes();
        assert_eq!(Partial::from_bytes(&good).unwrap(), small());
        // Byte 0 is the version (2), byte 1 the model hash's length (64):
        // make that length 2^40 (varint 0xfd + 8 bytes), keep the rest.
        let mut bad = vec![good[0], 0xfd];
        bad.extend_from_slice(&(1u64 << 40).to_le_bytes());
        bad.extend_from_slice(&good[2..]);
        bad.resize(160_000, b'x');
        let e = Partial::from_bytes(&bad).unwrap_err();
        assert!(e.starts_with("not a moe-census partial: malformed"), "{e}");
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = small().to_bytes();
        bytes.extend_from_slice(&[0; 700]);
        let e = Partial::from_bytes(&bytes).unwrap_err();
        assert!(e.contains("700 trailing bytes"), "{e}");
    }

    #[test]
    fn another_format_version_is_refused_before_the_rest_is_decoded() {
        // Version 1 (before the backend-to-host figure) followed by bytes
        // that are no partial at all.
        let e = Partial::from_bytes(&[1, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(e, "partial format version 1 (this build reads 8 to 9)");
    }

    #[test]
    fn chunk_ranges_coalesce_and_overlaps_are_refused() {
        assert_eq!(
            union_disjoint(&[r(0, 4)], &[r(4, 8)]).unwrap(),
            vec![r(0, 8)]
        );
        assert_eq!(
            union_disjoint(&[r(6, 8)], &[r(0, 2)]).unwrap(),
            vec![r(0, 2), r(6, 8)]
        );
        assert!(matches!(
            union_disjoint(&[r(0, 4)], &[r(3, 5)]),
            Err(MergeError::Overlap(3))
        ));
    }
}
