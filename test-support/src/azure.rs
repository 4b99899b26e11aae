//! The Azure Blob emulator of the test services (Azurite), as the tests that need it see
//! it.
//!
//! `scripts/test-services.sh start` exports `SLUICE_TEST_AZURE_ENDPOINT`,
//! `SLUICE_TEST_AZURE_CONTAINER` and the `AZURE_STORAGE_ACCOUNT_*` of Azurite's
//! development account. Without them an Azure test fails, saying how to start the
//! services, unless `SLUICE_SKIP_AZURE=1` asks to skip it loudly.

use crate::s3::unique_prefix;
use crate::service_env::{Service, service_env};

/// Where one test's blobs go.
#[derive(Debug, Clone)]
pub struct AzureEnv {
    /// `http://host:port/<account>` of the emulator.
    pub endpoint: String,
    /// The test container.
    pub container: String,
    /// This test's prefix (no leading or trailing slash), unique per run.
    pub prefix: String,
}

impl AzureEnv {
    /// `azblob://container/<prefix>?endpoint=...` (the account and its key come from the
    /// environment).
    pub fn url(&self) -> String {
        format!(
            "azblob://{}/{}?endpoint={}",
            self.container, self.prefix, self.endpoint
        )
    }
}

/// The Azure settings for `test`; `None` (after a loud message saying that `what` is
/// not tested) when `SLUICE_SKIP_AZURE=1`.
///
/// # Panics
/// When the test services are not configured and skipping was not asked for.
pub fn azure_env(test: &str, what: &str) -> Option<AzureEnv> {
    let service = Service {
        label: "Azure",
        endpoint_var: "SLUICE_TEST_AZURE_ENDPOINT",
        skip_var: "SLUICE_SKIP_AZURE",
        start_hint: "(it needs node for Azurite)",
        required: &[
            "SLUICE_TEST_AZURE_CONTAINER",
            "AZURE_STORAGE_ACCOUNT_NAME",
            "AZURE_STORAGE_ACCOUNT_KEY",
        ],
    };
    let (endpoint, mut values) = service_env(&service, test, what)?;
    Some(AzureEnv {
        endpoint,
        container: values.swap_remove(0),
        prefix: unique_prefix(test),
    })
}
