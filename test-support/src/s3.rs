//! The S3 server of the test services, as the tests that need it see it.
//!
//! `scripts/test-services.sh start` exports `SLUICE_TEST_S3_ENDPOINT`,
//! `SLUICE_TEST_S3_BUCKET` and the `AWS_*` credentials. Without them an S3 test fails,
//! saying how to start the services, unless `SLUICE_SKIP_S3=1` asks to skip it loudly.

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use sluice_storage::{Store, StoreOptions};

use crate::service_env::{Service, service_env};

/// Where one test's objects go.
#[derive(Debug, Clone)]
pub struct S3Env {
    /// `http://host:port` of the server.
    pub endpoint: String,
    /// The test bucket.
    pub bucket: String,
    /// This test's key prefix (no leading or trailing slash), unique per run.
    pub prefix: String,
}

impl S3Env {
    /// `s3://bucket/<prefix>`: the endpoint comes from the environment the test
    /// services exported (`AWS_ENDPOINT_URL` for processes that a test starts with it).
    pub fn url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// `s3://bucket/<prefix>?endpoint=...`: a URL that works without any endpoint in
    /// the environment.
    pub fn url_with_endpoint(&self) -> String {
        format!("{}?endpoint={}", self.url(), self.endpoint)
    }

    /// A store on the test bucket, rooted at this test's prefix.
    ///
    /// # Panics
    /// When the store cannot be configured (the environment is broken).
    pub fn store(&self) -> Store {
        Store::open(&self.url_with_endpoint(), &StoreOptions::default())
            .unwrap_or_else(|e| panic!("the test S3 store: {e}"))
    }

    /// A store on the whole test bucket (no root prefix), for tests that name keys
    /// themselves.
    ///
    /// # Panics
    /// When the store cannot be configured (the environment is broken).
    pub fn bucket_store(&self) -> std::sync::Arc<dyn object_store::ObjectStore> {
        let url = format!("s3://{}?endpoint={}", self.bucket, self.endpoint);
        let store = Store::open(&url, &StoreOptions::default())
            .unwrap_or_else(|e| panic!("the test S3 bucket: {e}"));
        std::sync::Arc::clone(store.store())
    }

    /// Removes every object below this test's prefix (what a passing test wrote).
    ///
    /// # Panics
    /// When listing or deleting fails.
    pub async fn remove_all(&self) {
        let store = self.store();
        let objects: Vec<_> = store
            .store()
            .list(Some(store.root()))
            .try_collect()
            .await
            .unwrap_or_else(|e| panic!("listing {}: {e}", store.display()));
        for o in objects {
            store
                .store()
                .delete(&o.location)
                .await
                .unwrap_or_else(|e| panic!("deleting {}: {e}", o.location));
        }
    }

    /// The object `rel` below this test's prefix.
    pub fn location(&self, rel: &str) -> Path {
        sluice_storage::child(&Path::from(self.prefix.as_str()), rel)
    }
}

/// The S3 settings for `test`; `None` (after a loud message saying that `what` is not
/// tested) when `SLUICE_SKIP_S3=1`.
///
/// # Panics
/// When the test services are not configured and skipping was not asked for.
pub fn s3_env(test: &str, what: &str) -> Option<S3Env> {
    let service = Service {
        label: "S3",
        endpoint_var: "SLUICE_TEST_S3_ENDPOINT",
        skip_var: "SLUICE_SKIP_S3",
        start_hint: "(scripts/test does this)",
        required: &[
            "SLUICE_TEST_S3_BUCKET",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        ],
    };
    let (endpoint, mut values) = service_env(&service, test, what)?;
    Some(S3Env {
        endpoint,
        bucket: values.swap_remove(0),
        prefix: unique_prefix(test),
    })
}

/// `sluice-it/<test>-<pid>-<nanos>`: a key prefix no other run uses.
pub fn unique_prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("sluice-it/{test}-{}-{nanos}", std::process::id())
}
