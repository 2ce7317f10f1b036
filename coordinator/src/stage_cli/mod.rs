//! The stages' command lines: `coordinator verify`, `score`, `report`,
//! `prune` (the file-only stages of the `stages` crate), `eval` and `ship`
//! (the `measure` crate's). Each parses its flags into the library's plain
//! request and runs the library's async function on a tokio runtime made
//! here; the libraries parse no command line and start no runtime.

pub mod eval;
pub mod prune;
pub mod report;
pub mod score;
pub mod ship;
pub mod verify;

use anyhow::Context;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

/// The tokio runtime a stage's command runs its I/O on.
fn async_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new().context("starting the async runtime")
}

/// A library enum's values as a flag takes them: each value, its name on
/// the command line and its help.
type Named<T> = [(T, &'static str, &'static str)];

/// Parses a flag into one of `values` by name (listing the names in the
/// help and in the refusal of another, as clap's value enums do).
fn named<T: Copy + Send + Sync + 'static>(
    values: &'static Named<T>,
) -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(
        values
            .iter()
            .map(|&(_, name, help)| PossibleValue::new(name).help(help)),
    )
    .map(move |name| {
        values
            .iter()
            .find(|(_, n, _)| *n == name)
            .map(|&(value, _, _)| value)
            .expect("the parser accepts only listed names")
    })
}

/// The name `values` gives `value` (for a flag's default).
fn name_of<T: PartialEq>(values: &Named<T>, value: T) -> &'static str {
    values
        .iter()
        .find(|(v, _, _)| *v == value)
        .map(|&(_, name, _)| name)
        .expect("every value is listed")
}

/// `--split-max-size`, which `prune` and `ship` share.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SplitMaxSizeArg {
    /// Write each model file larger than this as llama.cpp's `gguf-split`
    /// files of at most this much tensor data (`48G`, `500M`: decimal, as
    /// `llama-gguf-split --split-max-size`; Hugging Face caps a file at
    /// 50 GB): `<stem>-00001-of-0000N.gguf`, ...
    #[arg(long = "split-max-size", value_name = "SIZE")]
    pub text: Option<String>,
}

impl From<SplitMaxSizeArg> for stages::prune::SplitMaxSize {
    fn from(a: SplitMaxSizeArg) -> Self {
        stages::prune::SplitMaxSize { text: a.text }
    }
}
