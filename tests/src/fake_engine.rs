//! A deterministic stand-in engine for protocol and scheduling tests: the
//! partials of [`synth::fake::FakeModel`], computed in the worker's place,
//! with settings to delay or hang a lease.

use numbers::partial::Partial;
use protocol::wire::JobInfo;
use runfiles::corpus::{Chunk, CorpusIndex};
use runfiles::trace::TraceRow;
use std::ops::{Deref, DerefMut};
use std::time::Duration;
use synth::fake::FakeModel;
use worker::images::ImageBytes;
use worker::join::engine::{Engine, EngineLoader};

/// A fake engine: the model it pretends to run and how it behaves.
#[derive(Clone, Debug)]
pub struct FakeEngine {
    /// The model: its hash, shape and partials.
    pub model: FakeModel,
    /// Sleep per chunk, to keep leases in flight.
    pub delay_per_chunk: Duration,
    /// Never return from `measure` (a worker that stops answering).
    pub hang: bool,
    /// Told each time `measure` starts (a test waits on it instead of
    /// sleeping until the worker holds a lease).
    pub measuring: Option<std::sync::Arc<tokio::sync::Notify>>,
}

impl FakeEngine {
    /// A fake of [`FakeModel::new`]'s model, without delay.
    pub fn new(model_sha256: &str) -> FakeEngine {
        FakeEngine {
            model: FakeModel::new(model_sha256),
            delay_per_chunk: Duration::ZERO,
            hang: false,
            measuring: None,
        }
    }
}

impl Deref for FakeEngine {
    type Target = FakeModel;
    fn deref(&self) -> &FakeModel {
        &self.model
    }
}

impl DerefMut for FakeEngine {
    fn deref_mut(&mut self) -> &mut FakeModel {
        &mut self.model
    }
}

impl Engine for FakeEngine {
    fn model_sha256(&self) -> String {
        self.model_sha256.clone()
    }

    fn trace_shape(&self) -> (usize, usize) {
        (self.k as usize, self.n_expert as usize)
    }

    fn measure(
        &mut self,
        index: &CorpusIndex,
        chunks: &[Chunk],
        _images: &ImageBytes,
    ) -> Result<(Partial, Vec<TraceRow>), String> {
        runfiles::corpus::refuse_images(chunks, "the fake engine")?;
        if let Some(n) = &self.measuring {
            n.notify_one();
        }
        if self.hang {
            loop {
                std::thread::park();
            }
        }
        std::thread::sleep(self.delay_per_chunk * chunks.len() as u32);
        Ok((self.partial(index, chunks)?, Vec::new()))
    }
}

impl EngineLoader for FakeEngine {
    type Engine = FakeEngine;

    fn backend(&self) -> String {
        "fake".to_string()
    }

    fn load(self, _job: &JobInfo) -> Result<FakeEngine, String> {
        Ok(self)
    }
}
