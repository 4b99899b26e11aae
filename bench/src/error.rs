//! Why a benchmark did not run to its end.

/// A benchmark's failure, by whose fault it is.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A mistake on the command line: the message says which flag and what it accepts.
    #[error("{0}")]
    Usage(String),
    /// The run failed (a process, an RPC, a job, a check of the results).
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

/// A benchmark's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A mistake on the command line.
    pub fn usage(message: impl Into<String>) -> Self {
        Self::Usage(message.into())
    }

    /// A failed run, with `message` saying what failed.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed(anyhow::anyhow!("{}", message.into()))
    }
}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        Self::Failed(e)
    }
}
