//! What the coordinator knows about one kind of lease: the task workers are
//! welcomed with, and the checks a result passes against what the
//! coordinator knows before it is merged. The runner (`run::runner`), the
//! hub (`net::hub`) and resume (`run::resume`) are written once over
//! [`LeaseKind`]; collection (`run::accept`) and evaluation (`eval::accept`)
//! are its two implementations. This module imports no stage.

use numbers::ChunkRange;
use protocol::wire::Task;
use runfiles::layout::LeaseLayout;
use runfiles::lease::LeaseOutput;
use runfiles::manifest::{Records, RunManifest};

/// A kind of lease, as the coordinator of one run sees it.
pub trait LeaseKind: Send + Sync + 'static {
    /// What a lease of this kind produces.
    type Output: LeaseOutput;

    /// What workers compute for each lease (sent in the welcome).
    fn task(&self) -> Task;

    /// The manifest's table of accepted results of this kind.
    fn table(manifest: &mut RunManifest) -> &mut Records;

    /// Where this lease's results are stored: the output kind's prefix
    /// unless the kind keeps its results elsewhere (shipping's evaluation).
    fn layout(&self) -> LeaseLayout {
        Self::Output::LAYOUT
    }

    /// What progress counts instead of tokens and leases: the plan's
    /// items (its chunks' ranges summed) under this name (`prompts`), or
    /// `None` to count tokens over the corpus.
    fn items(&self) -> Option<&'static str> {
        None
    }

    /// Reads `bytes` (bounded, trailing bytes refused) and checks them as
    /// the result of the units `units` (sorted, disjoint units of the lease
    /// plan: one lease, or every lease of a worker's checkpoint) against
    /// what the coordinator knows (chunks, model, corpus, settings, counts):
    /// what is held until it is added to the run's total. Serves results
    /// from workers and results read back on resume.
    fn decode_and_check(
        &self,
        units: &[ChunkRange],
        bytes: bytes::Bytes,
    ) -> Result<AddendOf<Self>, String>;
}

/// What a checked result of kind `K` is held as until it is merged.
pub type AddendOf<K> = <<K as LeaseKind>::Output as LeaseOutput>::Addend;

/// Whether a result (`what`: a partial, an eval partial) covers exactly the
/// chunks of `units`, as its sorted, coalesced `chunks` list.
pub fn check_covers(what: &str, units: &[ChunkRange], chunks: &[ChunkRange]) -> Result<(), String> {
    let want = numbers::split::coalesce(units)
        .map_err(|c| format!("the leases of one {what} cover chunk {c} twice"))?;
    if chunks == want.as_slice() {
        Ok(())
    } else {
        let leases = if units.len() == 1 {
            "the lease was"
        } else {
            "the leases were"
        };
        Err(format!(
            "{what} covers {}, {leases} {}",
            numbers::peer_text::summarise(chunks),
            numbers::peer_text::summarise(&want)
        ))
    }
}

/// The chunks from the first unit's start to the last one's end: a stored
/// result's name. Accepted results cover disjoint units, so no two share a
/// first chunk, hence a name.
pub fn span(units: &[ChunkRange]) -> ChunkRange {
    ChunkRange {
        start: units.first().map_or(0, |u| u.start),
        end: units.last().map_or(0, |u| u.end),
    }
}
