//! The crate's errors. Each names the URL it is about; none carries a credential.

/// What went wrong while opening a store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The user wrote something that is not a store URL (user input; not retryable).
    #[error("store URL '{url}': {reason}")]
    InvalidUrl {
        /// The URL as written.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A URL of a scheme this build does not serve (user input).
    #[error(
        "store URL '{url}': unsupported scheme '{scheme}' (use {})",
        crate::Scheme::SUPPORTED
    )]
    UnsupportedScheme {
        /// The URL as written.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// A remote URL without a bucket or container (user input).
    #[error("store URL '{url}' names no bucket (write scheme://bucket/prefix)")]
    MissingBucket {
        /// The URL as written.
        url: String,
    },
    /// A query parameter the scheme does not take (user input).
    #[error("store URL '{url}': unknown parameter '{name}' (known: {known})")]
    UnknownParameter {
        /// The URL as written.
        url: String,
        /// The parameter.
        name: String,
        /// The parameters the scheme takes.
        known: String,
    },
    /// The settings do not make a working client: a missing account, an unusable
    /// endpoint, a local root that cannot be created (configuration; not retryable).
    #[error("store URL '{url}': {reason}")]
    Config {
        /// The URL as written.
        url: String,
        /// What is missing or wrong.
        reason: String,
    },
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
