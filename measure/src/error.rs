//! The measuring stages' one public error type, [`MeasureError`]: their own
//! failures (an evaluation, a ship, the runtime's lease pipeline) and,
//! wrapped, the file-only stages' error where they call into those stages,
//! read a run file or refuse an argument or a local file (in the stages'
//! words: [`StagesError::Argument`], [`StagesError::Io`]).

use stages::StagesError;

/// Errors of eval and ship.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MeasureError {
    /// A file-only stage (score, prune, report), a run file, an argument
    /// or a local file failed; the error names it.
    #[error(transparent)]
    Stages(#[from] StagesError),
    /// The runtime (lock, runner, workers, manifest record) failed.
    #[error(transparent)]
    Run(#[from] runtime::run::RunError),
    /// An evaluation failed.
    #[error(transparent)]
    Eval(#[from] crate::eval::EvalRunError),
    /// A shipped file could not be made.
    #[error(transparent)]
    Ship(#[from] crate::ship::ShipError),
}

/// The earlier crates' errors the measuring stages meet reading the run
/// convert as the file-only stages' do ([`MeasureError::Stages`]).
macro_rules! through_stages {
    ($($error:ty),* $(,)?) => {$(
        impl From<$error> for MeasureError {
            fn from(e: $error) -> Self {
                MeasureError::Stages(e.into())
            }
        }
    )*};
}

through_stages!(
    runfiles::store::StoreError,
    runfiles::file_error::FileError,
    runfiles::manifest::ManifestError,
    gguf::read::GgufReadError,
    gguf::split::SplitError,
);
