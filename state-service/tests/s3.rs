//! The state service against the real S3 server (SeaweedFS) that
//! `scripts/test-services.sh start` runs.
//!
//! The script exports `SLUICE_TEST_S3_ENDPOINT`, `SLUICE_TEST_S3_BUCKET` and the `AWS_*`
//! credentials. Without them these tests fail, unless `SLUICE_SKIP_S3=1` asks to skip
//! them (loudly). Every test works below its own prefix.

mod common;
mod scenarios;

/// `s3://bucket/prefix?endpoint=...` for `test`; `None` when skipping.
fn s3_url(test: &str) -> Option<String> {
    sluice_test_support::s3::s3_env(test, "S3 support").map(|s3| s3.url_with_endpoint())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_commit_rollback_restore() {
    if let Some(url) = s3_url("commit_rollback_restore") {
        scenarios::commit_rollback_restore(&url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_checkpoint_committed_while_its_node_was_down_is_restored() {
    if let Some(url) = s3_url("committed_while_down") {
        scenarios::checkpoint_committed_while_its_node_was_down(&url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_snapshots_and_gc() {
    if let Some(url) = s3_url("snapshots_and_gc") {
        scenarios::snapshots_and_gc(&url).await;
    }
}
