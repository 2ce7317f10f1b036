//! Why a run file could not be read: the store failed, or the bytes are not
//! the file's schema. Every typed reader of a run file returns it, naming the
//! file.

use crate::store::StoreError;

/// A run file that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The store could not give the bytes (missing object, backend).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The bytes are there but are not a valid file of this kind.
    #[error("{file} is not a valid {kind}: {problem}")]
    Invalid {
        /// Where the file is (a URL or a path).
        file: String,
        /// What it should be (`keep map`, `merge plan`, ...).
        kind: &'static str,
        /// What is wrong.
        problem: String,
    },
}

impl FileError {
    /// The error for `file`, not a valid `kind` because of `problem`.
    pub fn invalid(
        file: impl Into<String>,
        kind: &'static str,
        problem: impl Into<String>,
    ) -> Self {
        FileError::Invalid {
            file: file.into(),
            kind,
            problem: problem.into(),
        }
    }
}
