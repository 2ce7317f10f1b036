//! What the coordinator knows about one kind of lease: the task workers are
//! welcomed with, and the checks a result passes against what the
//! coordinator knows before it is merged. The runner (`run::runner`), the
//! hub (`net::hub`) and resume (`run::resume`) are written once over
//! [`LeaseKind`]; collection (`run::accept`) and evaluation (`eval::accept`)
//! are its two implementations. This module imports no stage.

use crate::corpus::manifest::{Records, RunManifest};
use common::layout::LeaseLayout;
use common::lease::LeaseOutput;
use common::wire::Task;
use common::ChunkRange;

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

    /// Checks a decoded result as the result of the unit `range` against
    /// what the coordinator knows (chunks, model, corpus, settings, counts).
    /// Serves results from workers and results read back on resume.
    fn check(&self, range: ChunkRange, output: &Self::Output) -> Result<(), String>;

    /// Decodes `bytes` (bounded, trailing bytes refused) and checks them as
    /// the result of `range`.
    fn decode_and_check(&self, range: ChunkRange, bytes: &[u8]) -> Result<Self::Output, String> {
        let output = Self::Output::decode(bytes)?;
        self.check(range, &output)?;
        Ok(output)
    }
}
