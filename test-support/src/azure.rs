//! The Azure Blob emulator of the test services (Azurite), as the tests that need it see
//! it.
//!
//! `scripts/test-services.sh start` exports `SLUICE_TEST_AZURE_ENDPOINT`,
//! `SLUICE_TEST_AZURE_CONTAINER` and the `AZURE_STORAGE_ACCOUNT_*` of Azurite's
//! development account. Without them an Azure test fails, saying how to start the
//! services, unless `SLUICE_SKIP_AZURE=1` asks to skip it loudly.

use std::io::Write;

use crate::s3::unique_prefix;

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
    let endpoint = std::env::var("SLUICE_TEST_AZURE_ENDPOINT").unwrap_or_default();
    if endpoint.is_empty() {
        if std::env::var("SLUICE_SKIP_AZURE").as_deref() == Ok("1") {
            let _ = writeln!(
                std::io::stderr(),
                "\n!!!!!!!! SKIPPED Azure test `{test}`: SLUICE_SKIP_AZURE=1 and no \
                 SLUICE_TEST_AZURE_ENDPOINT. {what} is NOT tested. !!!!!!!!\n"
            );
            return None;
        }
        panic!(
            "SLUICE_TEST_AZURE_ENDPOINT is not set: start the test services first with\n    \
             eval \"$(scripts/test-services.sh start)\"\n(it needs node for Azurite), or set \
             SLUICE_SKIP_AZURE=1 to skip the Azure tests"
        );
    }
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set although SLUICE_TEST_AZURE_ENDPOINT is: export everything \
                 `scripts/test-services.sh start` prints"
            )
        })
    };
    let container = var("SLUICE_TEST_AZURE_CONTAINER");
    var("AZURE_STORAGE_ACCOUNT_NAME");
    var("AZURE_STORAGE_ACCOUNT_KEY");
    Some(AzureEnv {
        endpoint,
        container,
        prefix: unique_prefix(test),
    })
}
