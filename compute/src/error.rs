//! The compute crate's one error type.
//!
//! Variants say whose fault an error is: the job's author ([`Error::Plan`],
//! [`Error::BadRecord`]), an external system ([`Error::Io`], [`Error::ObjectStore`]) or
//! Sluice itself ([`Error::Internal`]).

use arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use parquet::errors::ParquetError;
use sluice_common::state::StateError;

/// Result alias of the compute crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while planning or running a job.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The job is wrong (unknown column, type mismatch ...): the message names where.
    #[error("{0}")]
    Plan(String),
    /// A malformed input record, with the file and line (or offset) it came from.
    #[error("bad record at {location}: {message}")]
    BadRecord {
        /// `file:line` or another position the user can find.
        location: String,
        /// What was wrong.
        message: String,
    },
    /// Local I/O failed; `path` names the file.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// An object store (S3, local file system) request failed; a retry may help.
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    /// Arrow kernels or readers failed.
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),
    /// The Parquet reader or writer failed.
    #[error("parquet: {0}")]
    Parquet(#[from] ParquetError),
    /// DataFusion failed to plan or evaluate an expression.
    #[error("expression: {0}")]
    DataFusion(#[from] DataFusionError),
    /// The keyed-state backend failed.
    #[error("state: {0}")]
    State(#[from] StateError),
    /// A task failed; the message names the task.
    #[error("task {task} failed: {source}")]
    Task {
        /// `node-name[subtask]`.
        task: String,
        /// The underlying failure.
        source: Box<Error>,
    },
    /// The task stopped because another task of the job failed first.
    #[error("cancelled because another task failed")]
    Cancelled,
    /// A channel's other end is gone (its task ended or failed).
    #[error("channel closed: {0}")]
    Disconnected(&'static str),
    /// The data plane failed: a peer worker is gone, silent, or broke the protocol.
    /// `peer` names the worker (`worker 1 (127.0.0.1:4000)`).
    #[error("network: {peer}: {message}")]
    Network {
        /// The other end.
        peer: String,
        /// What went wrong.
        message: String,
    },
    /// An external system a connector talks to failed (a Kafka broker, say); the
    /// message names the system and what was asked of it.
    #[error("{0}")]
    External(String),
    /// A bug in Sluice: an invariant did not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// Builds an [`Error::Io`] naming `path`.
    pub fn io(path: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// True when this only reports that another task failed first (not a root cause).
    pub fn is_knock_on(&self) -> bool {
        match self {
            Error::Cancelled | Error::Disconnected(_) => true,
            Error::Task { source, .. } => source.is_knock_on(),
            _ => false,
        }
    }

    /// True when the job's author can fix this by changing the job or its input.
    pub fn is_user_error(&self) -> bool {
        match self {
            Error::Plan(_) | Error::BadRecord { .. } => true,
            Error::Task { source, .. } => source.is_user_error(),
            _ => false,
        }
    }

    /// Whether it is a dependency out of reach (a state node that does not answer),
    /// which the job waits for rather than counting as a failure of its own.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::State(StateError::Unavailable(_)) => true,
            Error::Task { source, .. } => source.is_unavailable(),
            _ => false,
        }
    }
}
