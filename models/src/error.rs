//! The one error type of pace-models.

use std::path::Path;

/// Errors from loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A model, tokenizer or config file is malformed.
    #[error("malformed model file: {0}")]
    Format(String),
    /// The file is well-formed but uses something pace does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// Tokenizer failure.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Chat template failure (rendering or syntax).
    #[error("chat template: {0}")]
    Template(String),
    /// Invalid argument from the caller.
    #[error("{0}")]
    Invalid(String),
    /// Fetching the default model failed.
    #[error("fetching the default model: {0}")]
    Fetch(String),
    /// An error with added context.
    #[error("{context}: {source}")]
    Context {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: Box<Error>,
    },
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io { path: path.display().to_string(), source }
    }

    /// Wraps the error with what was being done.
    pub fn context(self, context: impl Into<String>) -> Self {
        Self::Context { context: context.into(), source: Box::new(self) }
    }
}
