//! The crate's error type.
//!
//! Variants say whose fault it is: the caller's input (`InvalidName`), stored data that
//! fails its checks (`Corrupt`, names the object; a retry does not help), the object
//! store (`Store`, usually worth a retry), configuration (`Config`), or a driver that
//! asked the job lifecycle for something impossible (`IllegalTransition`, a bug or a
//! request that does not fit the job's state).

use crate::checkpoint::metadata::MetadataError;
use crate::job::IllegalTransition;

/// Everything that can go wrong in the coordinator library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A job id or savepoint name that cannot be used in an object path.
    #[error("invalid {what} '{value}': {reason}")]
    InvalidName {
        /// "job id", "savepoint name" ...
        what: &'static str,
        /// The offending value.
        value: String,
        /// What is wrong and what is allowed.
        reason: &'static str,
    },
    /// A `_metadata` object that does not decode (corrupt, truncated, foreign).
    #[error("checkpoint metadata {path} is unusable: {source}")]
    Corrupt {
        /// The object's path below the store's root.
        path: String,
        /// Which check failed.
        source: MetadataError,
    },
    /// The object does not exist (a savepoint path that was never written).
    #[error("no checkpoint metadata at {0}")]
    NotFound(String),
    /// The object store failed or did not answer; retrying may help.
    #[error("object store: {op}: {source}")]
    Store {
        /// What was being done ("creating jobs/j/checkpoints/…/_metadata").
        op: String,
        /// The underlying error.
        source: object_store::Error,
    },
    /// A store URL or setting that cannot be used.
    #[error("configuration: {0}")]
    Config(String),
    /// A job lifecycle transition that is not allowed.
    #[error(transparent)]
    IllegalTransition(#[from] IllegalTransition),
}

impl Error {
    pub(crate) fn store(op: impl Into<String>, source: object_store::Error) -> Self {
        Error::Store {
            op: op.into(),
            source,
        }
    }

    /// Whether retrying the same operation may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Store { .. })
    }
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
