//! The file sink's two-phase commit end to end: `sluice run` with and without
//! `checkpoint:`, and the commit protocol against the real S3 server (SeaweedFS from
//! `scripts/test-services.sh start`).
//!
//! The S3 tests need `SLUICE_TEST_S3_ENDPOINT`, `SLUICE_TEST_S3_BUCKET` and the `AWS_*`
//! credentials; without them they fail, unless `SLUICE_SKIP_S3=1` skips them loudly
//! (as in `s3.rs`). Every S3 test writes below its own prefix and removes it when it
//! passes.

use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use sluice_common::pb;
use sluice_compute::connector::{SinkWriter, SourceBatch, SourceReader, SubtaskInfo};
use sluice_connectors::file::sink::extension;
use sluice_connectors::file::{FileReader, FileWriter};
use sluice_connectors::nexmark;
use sluice_integration_tests::{
    Row, assert_same_rows, parse_jsonl, read_jsonl_dir, run_sluice, tempdir, write_job, yaml_path,
    yaml_str,
};
use sluice_test_support::s3::{S3Env, s3_env};

// ---------------------------------------------------------------------------------------
// `sluice run`

// Throttled so that the job lasts about half a second whatever the machine's speed:
// barriers every 20 ms must fall inside the input, not after it has ended.
const BIDS: &str = "nexmark: { stream: bid, events: 300000, seed: 5, max_out_of_orderness: 2s, \
                    max_events_per_second: 600000 }";

fn job(out: &Path, checkpoint: &str) -> String {
    format!(
        "name: eo\nparallelism: 2\n{checkpoint}source:\n  {BIDS}\n  batch_size: 1024\n\
         pipeline:\n  - filter: \"price > 100\"\nsink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

/// `(visible, hidden)` file names in `dir`, sorted.
fn names(dir: &Path) -> (Vec<String>, Vec<String>) {
    let mut all: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().into_string().expect("UTF-8"))
        .collect();
    all.sort();
    all.into_iter().partition(|n| !n.starts_with('.'))
}

fn run(dir: &Path, name: &str, yaml: &str) {
    let job = write_job(dir, name, yaml);
    run_sluice(&["run", job.to_str().expect("UTF-8 path")], dir)
        .assert_success()
        .assert_no_panic();
}

#[test]
fn with_checkpoints_the_end_of_input_commits_every_part_and_nothing_else_changes() {
    let dir = tempdir();
    let plain = dir.path().join("plain");
    let checkpointed = dir.path().join("checkpointed");
    run(dir.path(), "plain.yaml", &job(&plain, ""));
    run(
        dir.path(),
        "checkpointed.yaml",
        &job(&checkpointed, "checkpoint: { interval: 20ms }\n"),
    );

    // Without checkpoints: one part per subtask under its old name, as before.
    assert_eq!(
        names(&plain),
        (
            vec!["part-0.jsonl".to_string(), "part-1.jsonl".to_string()],
            vec![]
        )
    );
    // With them: numbered parts, all committed at the end of input, none hidden.
    let (visible, hidden) = names(&checkpointed);
    assert!(hidden.is_empty(), "left behind: {hidden:?}");
    assert!(
        visible.len() > 2,
        "barriers should have cut the output into several parts: {visible:?}"
    );
    for name in &visible {
        let numbered = name
            .strip_prefix("part-")
            .and_then(|n| n.strip_suffix(".jsonl"))
            .and_then(|n| n.split_once('-'))
            .is_some_and(|(i, seq)| i.parse::<u32>().is_ok() && seq.parse::<u64>().is_ok());
        // A subtask whose input ended before the first barrier keeps the old name.
        assert!(
            numbered || name == "part-0.jsonl" || name == "part-1.jsonl",
            "{name}"
        );
    }
    let expected = read_jsonl_dir(&plain);
    assert!(!expected.is_empty());
    assert_same_rows(
        "checkpointed output",
        &read_jsonl_dir(&checkpointed),
        &expected,
    );
}

// ---------------------------------------------------------------------------------------
// The commit protocol on S3

struct S3 {
    endpoint: String,
    bucket: String,
    prefix: String,
    store: Arc<dyn ObjectStore>,
}

/// The S3 settings, `None` (after a loud message) when `SLUICE_SKIP_S3=1`.
fn s3(test: &str) -> Option<S3> {
    let env = s3_env(test, "The exactly-once sink on S3")?;
    let store = env.bucket_store();
    let S3Env {
        endpoint,
        bucket,
        prefix,
    } = env;
    Some(S3 {
        endpoint,
        bucket,
        prefix,
        store,
    })
}

impl S3 {
    fn url(&self, name: &str) -> String {
        format!("s3://{}/{}/{name}", self.bucket, self.prefix)
    }

    fn config(&self) -> pb::ObjectStoreConfig {
        pb::ObjectStoreConfig {
            endpoint: self.endpoint.clone(),
            allow_http: true,
            ..Default::default()
        }
    }

    /// `(visible, hidden)` object names directly below `<prefix>/<name>`, sorted.
    async fn names(&self, name: &str) -> (Vec<String>, Vec<String>) {
        let prefix = ObjectPath::from(format!("{}/{name}", self.prefix));
        let mut all: Vec<String> = self
            .store
            .list(Some(&prefix))
            .try_collect::<Vec<_>>()
            .await
            .unwrap_or_else(|e| panic!("listing {prefix}: {e}"))
            .into_iter()
            .map(|m| m.location.filename().expect("a file name").to_owned())
            .collect();
        all.sort();
        all.into_iter().partition(|n| !n.starts_with('.'))
    }

    async fn writer(&self, name: &str, format: pb::FileFormat, index: usize) -> FileWriter {
        let spec = pb::FileSink {
            path: self.url(name),
            format: format as i32,
            store: Some(self.config()),
            delay_per_batch_ms: 0,
            partition_by: Vec::new(),
        };
        FileWriter::create(
            &spec,
            nexmark::schema(pb::NexmarkStream::Bid),
            SubtaskInfo {
                index,
                parallelism: 1,
                fence: 0,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("opening the sink at {}: {e}", self.url(name)))
    }

    /// The batches of the visible parts below `<prefix>/<name>` in name order; each
    /// part is read whole.
    async fn visible(&self, name: &str, format: pb::FileFormat) -> Vec<SourceBatch> {
        if self.names(name).await.0.is_empty() {
            return Vec::new();
        }
        let schema = nexmark::schema(pb::NexmarkStream::Bid)
            .fields()
            .iter()
            .map(|f| pb::Field {
                name: f.name().clone(),
                data_type: match f.data_type().to_string().as_str() {
                    "Int64" => "int64",
                    "Utf8" => "string",
                    t if t.starts_with("Timestamp") => "timestamp",
                    other => panic!("no job type for {other}"),
                }
                .into(),
                nullable: f.is_nullable(),
            })
            .collect();
        let source = pb::FileSource {
            path: self.url(name),
            format: format as i32,
            store: Some(self.config()),
            schema,
            ..Default::default()
        };
        let sub = SubtaskInfo {
            index: 0,
            parallelism: 1,
            fence: 0,
        };
        let mut reader = FileReader::open(&source, &[], sub, BATCH)
            .await
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.url(name)));
        let mut batches = Vec::new();
        while let Some(b) = reader.next_batch().await.expect("a whole part") {
            batches.push(b);
        }
        // Parts are read in turns; within one, batches keep their order.
        batches.sort_by_key(|b| b.split);
        batches
    }

    async fn clean_up(&self) {
        let prefix = ObjectPath::from(self.prefix.as_str());
        let keys: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect::<Vec<_>>()
            .await
            .unwrap_or_default();
        for meta in keys {
            let _ = self.store.delete(&meta.location).await;
        }
    }
}

/// Rows per generated batch; the reader reads the same, so batches compare one to one.
const BATCH: usize = 10;

/// 30 bids in batches of [`BATCH`] (`SourceBatch` only to name the batch type).
fn bids() -> Vec<SourceBatch> {
    let spec = pb::NexmarkSource {
        stream: pb::NexmarkStream::Bid as i32,
        events: 30,
        seed: 11,
        ..Default::default()
    };
    nexmark::generate_all(&spec, BATCH)
        .map(|batch| SourceBatch { split: 0, batch })
        .collect()
}

/// Whether `got` holds exactly the batches `expected`, in order.
fn same(got: &[SourceBatch], expected: &[SourceBatch]) -> bool {
    got.len() == expected.len() && got.iter().zip(expected).all(|(a, b)| a.batch == b.batch)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Checkpoint 1 committed and notified (batch 0), 2 pre-committed (batch 1), batch 2 in
/// progress, then the writer dropped without finishing, as a killed process would.
async fn crash(s3: &S3, name: &str, format: pb::FileFormat, bids: &[SourceBatch]) {
    let mut w = s3.writer(name, format, 0).await;
    w.write(&bids[0].batch).await.expect("write");
    assert!(s3.visible(name, format).await.is_empty());
    let pending = w.pre_commit(1).await.expect("pre-commit 1");
    assert_eq!(pending.len(), 1);
    assert!(s3.visible(name, format).await.is_empty());
    w.commit(1).await.expect("commit 1");
    assert!(same(&s3.visible(name, format).await, &bids[..1]));
    w.write(&bids[1].batch).await.expect("write");
    w.pre_commit(2).await.expect("pre-commit 2");
    w.write(&bids[2].batch).await.expect("write");
    drop(w);
    let ext = extension(format);
    assert_eq!(
        s3.names(name).await,
        (
            vec![format!("part-0-0.{ext}")],
            // The in-progress part lives in memory only on S3.
            vec![format!(".part-0-1.{ext}.pending-2")]
        )
    );
    assert!(same(&s3.visible(name, format).await, &bids[..1]));
}

fn two_phase_commit_on_s3(test: &str, format: pb::FileFormat) {
    let Some(s3) = s3(test) else { return };
    let bids = bids();
    rt().block_on(async {
        let ext = extension(format);
        // Checkpoint 2 was committed but not notified: its part becomes visible.
        crash(&s3, "c2", format, &bids).await;
        let mut w = s3.writer("c2", format, 0).await;
        w.recover(2, &[]).await.expect("recover 2");
        assert_eq!(
            s3.names("c2").await,
            (
                vec![format!("part-0-0.{ext}"), format!("part-0-1.{ext}")],
                vec![]
            )
        );
        assert!(same(&s3.visible("c2", format).await, &bids[..2]));
        // The replay from checkpoint 2.
        w.write(&bids[2].batch).await.expect("write");
        w.pre_commit(3).await.expect("pre-commit 3");
        assert_eq!(
            s3.names("c2").await.1,
            [format!(".part-0-2.{ext}.pending-3")]
        );
        w.commit(3).await.expect("commit 3");
        w.finish().await.expect("finish");
        assert!(same(&s3.visible("c2", format).await, &bids));

        // Checkpoint 2 did not complete: its pending part is deleted.
        crash(&s3, "c1", format, &bids).await;
        let mut w = s3.writer("c1", format, 0).await;
        w.recover(1, &[]).await.expect("recover 1");
        assert_eq!(
            s3.names("c1").await,
            (vec![format!("part-0-0.{ext}")], vec![])
        );
        // The replay from checkpoint 1.
        w.write(&bids[1].batch).await.expect("write");
        w.pre_commit(2).await.expect("pre-commit 2");
        w.write(&bids[2].batch).await.expect("write");
        w.finish().await.expect("finish");
        let (visible, hidden) = s3.names("c1").await;
        assert!(hidden.is_empty(), "{hidden:?}");
        // Numbers continue after the discarded pending part's.
        assert_eq!(
            visible,
            [
                format!("part-0-0.{ext}"),
                format!("part-0-2.{ext}"),
                format!("part-0-3.{ext}")
            ]
        );
        assert!(same(&s3.visible("c1", format).await, &bids));

        // A commit that copied but did not delete (a crash in between) is done again
        // without a duplicate.
        crash(&s3, "copied", format, &bids).await;
        let pending = ObjectPath::from(format!("{}/copied/.part-0-1.{ext}.pending-2", s3.prefix));
        let visible = ObjectPath::from(format!("{}/copied/part-0-1.{ext}", s3.prefix));
        s3.store.copy(&pending, &visible).await.expect("copy");
        let mut w = s3.writer("copied", format, 0).await;
        w.recover(2, &[]).await.expect("recover 2");
        assert_eq!(
            s3.names("copied").await,
            (
                vec![format!("part-0-0.{ext}"), format!("part-0-1.{ext}")],
                vec![]
            )
        );
        assert!(same(&s3.visible("copied", format).await, &bids[..2]));
        s3.clean_up().await;
    });
}

#[test]
fn two_phase_commit_on_s3_jsonl() {
    two_phase_commit_on_s3("eo-jsonl", pb::FileFormat::Jsonl);
}

#[test]
fn two_phase_commit_on_s3_parquet() {
    two_phase_commit_on_s3("eo-parquet", pb::FileFormat::Parquet);
}

#[test]
fn sluice_run_with_checkpoints_commits_everything_on_s3() {
    let Some(s3) = s3("eo-run") else { return };
    let dir = tempdir();
    let plain = dir.path().join("plain");
    run(dir.path(), "plain.yaml", &job(&plain, ""));
    let yaml = format!(
        "name: eo\nparallelism: 2\ncheckpoint: {{ interval: 20ms }}\nsource:\n  {BIDS}\n  \
         batch_size: 1024\npipeline:\n  - filter: \"price > 100\"\nsink:\n  file: {{ path: {}, \
         format: jsonl, endpoint: {}, allow_http: true }}\n",
        yaml_str(&s3.url("out")),
        yaml_str(&s3.endpoint)
    );
    run(dir.path(), "s3.yaml", &yaml);
    rt().block_on(async {
        let (visible, hidden) = s3.names("out").await;
        assert!(hidden.is_empty(), "left behind: {hidden:?}");
        // At least a part per subtask; more when checkpoints completed while it ran
        // (the coordinator's timing decides how many).
        assert!(visible.len() >= 2, "{visible:?}");
        let mut rows: Vec<Row> = Vec::new();
        for name in visible {
            let key = ObjectPath::from(format!("{}/out/{name}", s3.prefix));
            let bytes = s3
                .store
                .get(&key)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("bytes");
            let text = String::from_utf8(bytes.to_vec()).expect("UTF-8");
            rows.extend(parse_jsonl(&text, &name));
        }
        assert_same_rows("S3 checkpointed output", &rows, &read_jsonl_dir(&plain));
        s3.clean_up().await;
    });
}
