//! The crate's error type and its mapping to gRPC status codes.
//!
//! Each variant says whose fault it is: the caller's request (`InvalidArgument`,
//! `OutOfRange`, `NotFound`, `FailedPrecondition`, `TooLarge`), the object store
//! (`Unavailable`, retryable), corrupt stored data (`Corrupt`, names the object) or this
//! process (`Internal`). This module knows nothing about shards or RocksDB beyond
//! wrapping their errors.

use tonic::{Code, Status};

/// Everything that can go wrong in the state service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (bad job id, empty key, bad range ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A key's key group lies outside the shard it was sent to.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// The shard is not open on this node, or a checkpoint does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The request contradicts the shard's state (an epoch not newer than the committed
    /// checkpoint, a rollback below it ...).
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// A batch or a page exceeds the configured limits.
    #[error("too large: {0}")]
    TooLarge(String),
    /// The object store did not answer or refused: retry later; nothing acknowledged is
    /// lost.
    #[error("object store unavailable: {0}")]
    Unavailable(String),
    /// A stored object (delta, manifest, snapshot file) fails its checks.
    #[error("corrupt object {object}: {reason}")]
    Corrupt {
        /// The object's path.
        object: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The configuration cannot be used (bad URL, unusable directory).
    #[error("configuration: {0}")]
    Config(String),
    /// RocksDB failed.
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// Local file I/O failed.
    #[error("i/o on {path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A bug or an unexpected condition in this process.
    #[error("internal: {0}")]
    Internal(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps a local I/O error with the path it concerns.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    /// Wraps an object-store error for `what` (an operation and object path).
    pub fn store(what: &str, e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { .. } => Self::NotFound(format!("{what}: {e}")),
            other => Self::Unavailable(format!("{what}: {other}")),
        }
    }

    /// Whether retrying the same request later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::NotFound(_) => Code::NotFound,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::TooLarge(_) => Code::ResourceExhausted,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Corrupt { .. } => Code::DataLoss,
            Error::Config(_) | Error::Rocks(_) | Error::Io { .. } | Error::Internal(_) => {
                Code::Internal
            }
        };
        Status::new(code, e.to_string())
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Self::Internal(format!("blocking task failed: {e}"))
    }
}
