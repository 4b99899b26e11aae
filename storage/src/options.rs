//! Settings of a store that do not belong in its URL: credentials, timeouts, retries.

use std::time::Duration;

/// How a store is opened, beyond what its URL says. URL parameters win over these, and
/// these over the environment.
#[derive(Clone, Default)]
pub struct StoreOptions {
    /// The server to talk to (an S3-compatible server, a storage emulator).
    pub endpoint: Option<String>,
    /// The S3 region.
    pub region: Option<String>,
    /// S3 access key id; from the environment when `None`.
    pub access_key_id: Option<String>,
    /// S3 secret access key; from the environment when `None`. Never displayed.
    pub secret_access_key: Option<String>,
    /// Creates a local root directory that does not exist yet.
    pub create_local_root: bool,
    /// Timeouts and retries of remote stores.
    pub client: ClientOptions,
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOptions")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id.as_ref().map(|_| "***"))
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "***"),
            )
            .field("create_local_root", &self.create_local_root)
            .field("client", &self.client)
            .finish()
    }
}

/// Timeouts and retries of a remote store's HTTP client.
///
/// While a store is unreachable an operation fails after at most `max_retries + 1`
/// attempts of `request_timeout` each plus the back-off between them (100 ms, doubling,
/// at most 15 s per wait), and never waits past `retry_timeout` in back-off in total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time for one whole request, from connecting to the end of the response.
    pub request_timeout: Duration,
    /// Retries of a failed request (0: none).
    pub max_retries: usize,
    /// The back-off waits of one operation add up to no more than this.
    pub retry_timeout: Duration,
}

impl Default for ClientOptions {
    /// object_store's defaults: 5 s to connect, 30 s per request, 10 retries within
    /// 3 minutes.
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            max_retries: 10,
            retry_timeout: Duration::from_secs(180),
        }
    }
}

/// First back-off wait.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest back-off wait.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(15);

impl ClientOptions {
    /// Retries whose back-off waits (100 ms, doubling, at most 15 s each) fit in
    /// `retry_timeout`, and at most `max_retries`.
    pub fn effective_retries(&self) -> usize {
        let mut waited = Duration::ZERO;
        let mut wait = FIRST_BACKOFF;
        for n in 0..self.max_retries {
            waited += wait;
            if waited > self.retry_timeout {
                return n;
            }
            wait = (wait * 2).min(MAX_BACKOFF);
        }
        self.max_retries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_fit_in_the_retry_timeout() {
        let c = |max_retries, secs| ClientOptions {
            max_retries,
            retry_timeout: Duration::from_millis(secs),
            ..ClientOptions::default()
        };
        assert_eq!(c(3, 10_000).effective_retries(), 3);
        // 100 + 200 + 400 + 800 = 1500 ms.
        assert_eq!(c(10, 1_500).effective_retries(), 4);
        assert_eq!(c(10, 50).effective_retries(), 0);
        assert_eq!(c(0, 10_000).effective_retries(), 0);
        assert_eq!(ClientOptions::default().effective_retries(), 10);
    }

    #[test]
    fn secrets_are_not_displayed() {
        let o = StoreOptions {
            secret_access_key: Some("SECRETVALUE".into()),
            access_key_id: Some("KEYID".into()),
            ..StoreOptions::default()
        };
        let shown = format!("{o:?}");
        assert!(
            !shown.contains("SECRETVALUE") && !shown.contains("KEYID"),
            "{shown}"
        );
    }
}
