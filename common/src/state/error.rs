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
    /// A state key does not follow the layout of DESIGN §4: corruption or a bug.
    #[error("malformed state key: {0}")]
    MalformedKey(String),
    /// A backend broke its contract (wrong number of results, say): a bug, do not retry.
    #[error("state backend misbehaved: {0}")]
    Internal(String),
    /// The backend is unreachable or failed; a retry may help.
    #[error("state backend unavailable: {0}")]
    Unavailable(String),
    /// The request was refused (too large, wrong key group ...).
    #[error("state request rejected: {0}")]
    Rejected(String),
}
