//! Errors of the keyed-state API.

/// Result alias of the state API.
pub type StateResult<T> = std::result::Result<T, StateError>;

/// What can go wrong reading or writing keyed state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A stored value could not be decoded: corruption or a codec mismatch (a bug).
    #[error("cannot decode state `{state}`: {message}")]
    Decode {
        /// The state's name.
        state: String,
        /// What was wrong.
        message: String,
    },
    /// The backend is unreachable or failed; a retry may help.
    #[error("state backend unavailable: {0}")]
    Unavailable(String),
    /// The request was refused (too large, wrong key group ...).
    #[error("state request rejected: {0}")]
    Rejected(String),
}
