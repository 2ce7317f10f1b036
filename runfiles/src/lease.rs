//! What a lease produces: one trait over the kinds of lease result (a
//! collection [`Partial`], an evaluation [`EvalPartial`]), so the
//! coordinator's runner, hub and resume and the worker's loop are written
//! once. A new kind of lease (image chunks, say) is one more implementation.
//!
//! Each kind has its object prefix under the run ([`LeaseLayout`]), a
//! bounded decoder, an encoder, an exact merge and a test of agreement
//! between two workers' results of the same chunks.

use crate::layout::LeaseLayout;
use numbers::eval::{EvalError, EvalPartial};
use numbers::partial::{PackedPartial, Partial};
use numbers::respond::{ResponseMergeError, ResponsePartial};
use numbers::stats::MergeError;

/// The names a kind of result goes by in logs and errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Labels {
    /// The encoded result (`partial`, `eval partial`).
    pub output: &'static str,
    /// A worker's report of it (`result`, `eval result`).
    pub result: &'static str,
    /// A lease of this kind (`lease`, `eval lease`).
    pub lease: &'static str,
}

/// A kind of lease result.
pub trait LeaseOutput: Sized + Send + Sync + 'static {
    /// Where results are stored and recorded.
    const LAYOUT: LeaseLayout;
    /// How logs and errors name them.
    const LABELS: Labels;
    /// Why two results do not merge.
    type MergeError: std::error::Error + Send + Sync + 'static;

    /// Decodes bytes from a peer or storage under a limit sized from their
    /// length; trailing bytes and other format versions are refused.
    fn decode(bytes: &[u8]) -> Result<Self, String>;
    /// The encoding [`LeaseOutput::decode`] reads.
    fn encode(&self) -> Vec<u8>;
    /// Adds another result exactly (disjoint chunks of the same run).
    fn merge(&mut self, other: &Self) -> Result<(), Self::MergeError>;
    /// Whether another worker's result of the same chunks agrees with this
    /// one; the error names the first difference.
    fn agree(&self, other: &Self) -> Result<(), String>;
    /// Tokens (or scored positions) the result covers, for progress and
    /// per-worker figures.
    fn measured(&self) -> u64;
    /// The chunks it covers, sorted, disjoint, adjacent ranges joined.
    fn chunks(&self) -> &[numbers::split::ChunkRange];

    /// A result as checked and held until it is added to a running total:
    /// the decoded result, or for a collection partial its packed bytes
    /// (added straight from them, never materialised).
    type Addend: Addend<Self>;
}

/// A checked result on its way into the running total of its kind `T`.
pub trait Addend<T: LeaseOutput>: Sized + Send + Sync + std::fmt::Debug + 'static {
    /// Tokens (or scored positions) it covers ([`LeaseOutput::measured`]).
    fn measured(&self) -> u64;
    /// Whether another worker's result of the same chunks agrees with this
    /// one ([`LeaseOutput::agree`]).
    fn agree(&self, other: &Self) -> Result<(), String>;
    /// Adds it exactly into `total` (it becomes the total when there is none).
    fn add_to(self, total: &mut Option<T>) -> Result<(), T::MergeError>;
}

impl LeaseOutput for Partial {
    const LAYOUT: LeaseLayout = crate::layout::PARTIALS;
    const LABELS: Labels = Labels {
        output: "partial",
        result: "result",
        lease: "lease",
    };
    type MergeError = MergeError;
    type Addend = PackedPartial;

    fn decode(bytes: &[u8]) -> Result<Partial, String> {
        Partial::from_bytes(bytes)
    }

    fn encode(&self) -> Vec<u8> {
        self.to_bytes()
    }

    fn merge(&mut self, other: &Partial) -> Result<(), MergeError> {
        Partial::merge(self, other)
    }

    fn agree(&self, other: &Partial) -> Result<(), String> {
        numbers::compare::agree(self, other)
    }

    fn measured(&self) -> u64 {
        self.experts.groups.values().map(|g| g.n_tokens).sum()
    }

    fn chunks(&self) -> &[numbers::split::ChunkRange] {
        &self.chunks
    }
}

impl LeaseOutput for EvalPartial {
    const LAYOUT: LeaseLayout = crate::layout::EVAL_PARTIALS;
    const LABELS: Labels = Labels {
        output: "eval partial",
        result: "eval result",
        lease: "eval lease",
    };
    type MergeError = EvalError;
    type Addend = EvalPartial;

    fn decode(bytes: &[u8]) -> Result<EvalPartial, String> {
        EvalPartial::from_bytes(bytes).map_err(|e| e.to_string())
    }

    fn encode(&self) -> Vec<u8> {
        self.to_bytes()
    }

    fn merge(&mut self, other: &EvalPartial) -> Result<(), EvalError> {
        EvalPartial::merge(self, other)
    }

    /// Eval sums are exact and a chunk's logits are the same on every
    /// worker of one backend: results of one backend agree when they are
    /// equal, of others within stated tolerances ([`numbers::eval::agree`]).
    fn agree(&self, other: &EvalPartial) -> Result<(), String> {
        numbers::eval::agree::agree(self, other)
    }

    fn measured(&self) -> u64 {
        self.n_scored()
    }

    fn chunks(&self) -> &[numbers::split::ChunkRange] {
        &self.chunks
    }
}

impl Addend<Partial> for PackedPartial {
    fn measured(&self) -> u64 {
        self.header().measured()
    }

    /// Equal bytes agree without decoding (the encoding is a function of
    /// the values); otherwise both are decoded and compared.
    fn agree(&self, other: &PackedPartial) -> Result<(), String> {
        if self.bytes() == other.bytes() {
            return Ok(());
        }
        numbers::compare::agree(&self.decode(), &other.decode())
    }

    fn add_to(self, total: &mut Option<Partial>) -> Result<(), MergeError> {
        PackedPartial::add_to(self, total)
    }
}

impl Addend<EvalPartial> for EvalPartial {
    fn measured(&self) -> u64 {
        self.n_scored()
    }

    fn agree(&self, other: &EvalPartial) -> Result<(), String> {
        LeaseOutput::agree(self, other)
    }

    fn add_to(self, total: &mut Option<EvalPartial>) -> Result<(), EvalError> {
        match total {
            None => *total = Some(self),
            Some(t) => t.merge(&self)?,
        }
        Ok(())
    }
}

impl LeaseOutput for ResponsePartial {
    const LAYOUT: LeaseLayout = crate::layout::RESPONSE_PARTIALS;
    const LABELS: Labels = Labels {
        output: "response partial",
        result: "response result",
        lease: "response lease",
    };
    type MergeError = ResponseMergeError;
    type Addend = ResponsePartial;

    fn decode(bytes: &[u8]) -> Result<ResponsePartial, String> {
        ResponsePartial::from_bytes(bytes)
    }

    fn encode(&self) -> Vec<u8> {
        self.to_bytes()
    }

    fn merge(&mut self, other: &ResponsePartial) -> Result<(), ResponseMergeError> {
        ResponsePartial::merge(self, other)
    }

    /// Generation on one backend is deterministic: two workers' responses
    /// of the same prompts agree when they are equal.
    fn agree(&self, other: &ResponsePartial) -> Result<(), String> {
        ResponsePartial::agree(self, other)
    }

    /// Tokens generated.
    fn measured(&self) -> u64 {
        self.generated()
    }

    fn chunks(&self) -> &[numbers::split::ChunkRange] {
        &self.chunks
    }
}

impl Addend<ResponsePartial> for ResponsePartial {
    fn measured(&self) -> u64 {
        self.generated()
    }

    fn agree(&self, other: &ResponsePartial) -> Result<(), String> {
        ResponsePartial::agree(self, other)
    }

    fn add_to(self, total: &mut Option<ResponsePartial>) -> Result<(), ResponseMergeError> {
        match total {
            None => *total = Some(self),
            Some(t) => t.merge(&self)?,
        }
        Ok(())
    }
}
