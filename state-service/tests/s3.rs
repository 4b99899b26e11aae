//! The state service against the real S3 server (SeaweedFS) that
//! `scripts/test-services.sh start` runs.
//!
//! The script exports `SLUICE_TEST_S3_ENDPOINT`, `SLUICE_TEST_S3_BUCKET` and the `AWS_*`
//! credentials. Without them these tests fail, unless `SLUICE_SKIP_S3=1` asks to skip
//! them (loudly). Every test works below its own prefix.

mod common;
mod scenarios;

use std::io::Write;

/// `s3://bucket/prefix?endpoint=...` for `test`; `None`
/// when skipping.
fn s3_url(test: &str) -> Option<String> {
    let endpoint = std::env::var("SLUICE_TEST_S3_ENDPOINT").unwrap_or_default();
    if endpoint.is_empty() {
        if std::env::var("SLUICE_SKIP_S3").as_deref() == Ok("1") {
            let _ = writeln!(
                std::io::stderr(),
                "\n!!!!!!!! SKIPPED S3 test `{test}`: SLUICE_SKIP_S3=1 and no \
                 SLUICE_TEST_S3_ENDPOINT. S3 support is NOT tested. !!!!!!!!\n"
            );
            return None;
        }
        panic!(
            "SLUICE_TEST_S3_ENDPOINT is not set: start the test services first with\n    \
             eval \"$(scripts/test-services.sh start)\"\nor set SLUICE_SKIP_S3=1 to skip the \
             S3 tests"
        );
    }
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set although SLUICE_TEST_S3_ENDPOINT is: export everything `scripts/test-services.sh start` prints")
        })
    };
    let bucket = var("SLUICE_TEST_S3_BUCKET");
    var("AWS_ACCESS_KEY_ID");
    var("AWS_SECRET_ACCESS_KEY");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    Some(format!(
        "s3://{bucket}/sluice-state-it/{test}-{}-{nanos}?endpoint={endpoint}",
        std::process::id()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_commit_rollback_restore() {
    if let Some(url) = s3_url("commit_rollback_restore") {
        scenarios::commit_rollback_restore(&url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_snapshots_and_gc() {
    if let Some(url) = s3_url("snapshots_and_gc") {
        scenarios::snapshots_and_gc(&url).await;
    }
}
