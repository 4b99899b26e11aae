//! Files on S3: the real SeaweedFS server that `scripts/test-services.sh start` runs.
//!
//! The script exports `SLUICE_TEST_S3_ENDPOINT`, `SLUICE_TEST_S3_BUCKET` and the `AWS_*`
//! credentials. Without them these tests fail (start the services, or set
//! `SLUICE_SKIP_S3=1` to skip them loudly). Every test writes below its own prefix
//! (`sluice-it/<test>-<pid>-<time>`), so reruns never collide, and removes it when it
//! passes.
//!
//! Objects are read back with `object_store` directly, and the expected rows come from
//! the same Nexmark events generated locally as CSV and parsed by the harness.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use sluice_integration_tests::{
    Bid, Outcome, Row, assert_same_rows, parse_jsonl, read_bids_csv, read_jsonl_dir, run_sluice,
    run_sluice_env, tempdir, write_job, yaml_path, yaml_str,
};
use sluice_test_support::s3::{S3Env, s3_env};

/// The test server and this test's place in it.
struct S3 {
    endpoint: String,
    bucket: String,
    /// This test's key prefix (no leading or trailing slash).
    prefix: String,
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Runtime,
}

/// The S3 settings, `None` (after a loud message) when `SLUICE_SKIP_S3=1`.
///
/// # Panics
/// When the test services are not configured and skipping was not asked for.
fn s3(test: &str) -> Option<S3> {
    let env = s3_env(test, "S3 support")?;
    let store = env.bucket_store();
    let S3Env {
        endpoint,
        bucket,
        prefix,
    } = env;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    Some(S3 {
        endpoint,
        bucket,
        prefix,
        store,
        rt,
    })
}

impl S3 {
    /// `s3://bucket/<prefix>/<name>`.
    fn url(&self, name: &str) -> String {
        format!("s3://{}/{}/{name}", self.bucket, self.prefix)
    }

    /// A `file` connector's settings for `s3://.../<name>` in `format`.
    fn connector(&self, name: &str, format: &str) -> String {
        format!(
            "file: {{ path: {}, format: {format}, endpoint: {}, allow_http: true }}",
            yaml_str(&self.url(name)),
            yaml_str(&self.endpoint)
        )
    }

    /// The environment that points a bare `s3://` URL (no job settings) at the server.
    fn env(&self) -> [(&'static str, &str); 2] {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
        ]
    }

    /// The objects below `<prefix>/<name>`, sorted by key.
    fn list(&self, name: &str) -> Vec<ObjectPath> {
        let prefix = ObjectPath::from(format!("{}/{name}", self.prefix));
        let mut keys: Vec<ObjectPath> = self
            .rt
            .block_on(self.store.list(Some(&prefix)).try_collect::<Vec<_>>())
            .unwrap_or_else(|e| panic!("listing {prefix}: {e}"))
            .into_iter()
            .map(|meta| meta.location)
            .collect();
        keys.sort();
        keys
    }

    /// The part files below `<prefix>/<name>` ending in `.ext`, asserting there are some.
    fn parts(&self, name: &str, ext: &str) -> Vec<ObjectPath> {
        let keys = self.list(name);
        let parts: Vec<ObjectPath> = keys
            .iter()
            .filter(|k| {
                k.filename()
                    .is_some_and(|f| f.starts_with("part-") && f.ends_with(&format!(".{ext}")))
            })
            .cloned()
            .collect();
        assert!(
            !parts.is_empty(),
            "no part-*.{ext} objects below {}; found {keys:?}",
            self.url(name)
        );
        parts
    }

    fn get(&self, key: &ObjectPath) -> Vec<u8> {
        self.rt
            .block_on(async { self.store.get(key).await?.bytes().await })
            .unwrap_or_else(|e| panic!("reading {key}: {e}"))
            .to_vec()
    }

    /// Every row of the `part-*.jsonl` objects below `<prefix>/<name>`.
    fn read_jsonl(&self, name: &str) -> Vec<Row> {
        let mut rows = Vec::new();
        for key in self.parts(name, "jsonl") {
            let text = String::from_utf8(self.get(&key)).expect("UTF-8 JSON lines");
            rows.extend(parse_jsonl(&text, &format!("s3://{}/{key}", self.bucket)));
        }
        rows
    }

    /// Copies the `part-*.<ext>` objects below `<prefix>/<name>` into `dir`.
    fn download(&self, name: &str, ext: &str, dir: &Path) {
        std::fs::create_dir_all(dir).expect("creating the download directory");
        for key in self.parts(name, ext) {
            let file = dir.join(key.filename().expect("a file name"));
            std::fs::write(&file, self.get(&key)).expect("writing a downloaded object");
        }
    }

    /// Removes everything below this test's prefix.
    fn clean_up(&self) {
        let prefix = ObjectPath::from(self.prefix.as_str());
        self.rt.block_on(async {
            let keys: Vec<_> = self
                .store
                .list(Some(&prefix))
                .try_collect::<Vec<_>>()
                .await
                .unwrap_or_default();
            for meta in keys {
                let _ = self.store.delete(&meta.location).await;
            }
        });
    }
}

/// `sluice nexmark gen` of bids as CSV into `dir/bids`, parsed.
fn local_bids(dir: &Path, events: u64, seed: u64) -> Vec<Bid> {
    let out = dir.join("bids");
    let args = gen_args(events, seed, "csv", out.to_str().expect("UTF-8 path"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_sluice(&args, dir).assert_success();
    let bids = read_bids_csv(&out);
    assert_eq!(bids.len() as u64, events);
    bids
}

fn gen_args(events: u64, seed: u64, format: &str, out: &str) -> Vec<String> {
    [
        "nexmark",
        "gen",
        "--stream",
        "bid",
        "--events",
        &events.to_string(),
        "--seed",
        &seed.to_string(),
        "--max-out-of-orderness",
        "2s",
        "--format",
        format,
        "--files",
        "2",
        "--out",
        out,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn run_job(dir: &Path, name: &str, yaml: &str) -> Outcome {
    let job = write_job(dir, name, yaml);
    let outcome = run_sluice(&["run", job.to_str().expect("UTF-8 path")], dir);
    outcome.assert_success().assert_no_panic();
    outcome
}

#[test]
fn parquet_from_s3_windowed_to_s3() {
    let Some(s3) = s3("parquet") else { return };
    const EVENTS: u64 = 50_000;
    let dir = tempdir();
    let bids = local_bids(dir.path(), EVENTS, 7);

    // The same events as Parquet on S3; the bare URL finds the server from the environment.
    let args = gen_args(EVENTS, 7, "parquet", &s3.url("bids"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_sluice_env(&args, dir.path(), &s3.env())
        .assert_success()
        .assert_no_panic();
    assert_eq!(s3.parts("bids", "parquet").len(), 2);

    let yaml = format!(
        "name: s3-parquet\nparallelism: 2\nsource:\n  {}\nwatermark: {{ column: date_time, max_out_of_orderness: 4s }}\npipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    aggregate: [\"count(*) AS bids\"]\nsink:\n  {}\n",
        s3.connector("bids", "parquet"),
        s3.connector("out", "jsonl")
    );
    let outcome = run_job(dir.path(), "job.yaml", &yaml);
    let summary = outcome.summary();
    assert_eq!((summary.records_in, summary.late), (EVENTS, 0));

    let size = 10_000;
    let mut counts: HashMap<(i64, i64), i64> = HashMap::new();
    for b in &bids {
        let start = b.date_time - b.date_time.rem_euclid(size);
        *counts.entry((b.auction, start)).or_default() += 1;
    }
    let expected: Vec<Row> = counts
        .into_iter()
        .map(|((auction, start), n)| {
            let mut r = Row::new();
            r.insert("auction".into(), auction.into());
            r.insert("window_start".into(), start.into());
            r.insert("window_end".into(), (start + size).into());
            r.insert("bids".into(), n.into());
            r
        })
        .collect();
    assert_same_rows(
        "tumbling counts read from S3",
        &s3.read_jsonl("out"),
        &expected,
    );
    s3.clean_up();
}

/// Local CSV bids to S3 in `format` and back to a local JSON-lines sink, checking the
/// objects themselves and the rows read back through a `file` source on S3.
fn round_trip(test: &str, format: &str) {
    let Some(s3) = s3(test) else { return };
    const EVENTS: u64 = 20_000;
    let dir = tempdir();
    let bids = local_bids(dir.path(), EVENTS, 11);
    let expected: Vec<Row> = bids.iter().map(Bid::to_row).collect();

    let up = format!(
        "name: to-s3\nparallelism: 2\nsource:\n  file: {{ path: {}, format: csv }}\nsink:\n  {}\n",
        yaml_path(&dir.path().join("bids")),
        s3.connector("data", format)
    );
    let summary = run_job(dir.path(), "up.yaml", &up).summary();
    assert_eq!((summary.records_in, summary.records_out), (EVENTS, EVENTS));

    // The objects as written.
    let downloaded = dir.path().join("downloaded");
    s3.download("data", format, &downloaded);
    let written = match format {
        "csv" => read_bids_csv(&downloaded).iter().map(Bid::to_row).collect(),
        _ => read_jsonl_dir(&downloaded),
    };
    assert_same_rows(&format!("{format} objects on S3"), &written, &expected);

    // Read back through the engine.
    let back = dir.path().join("back");
    let down = format!(
        "name: from-s3\nparallelism: 2\nsource:\n  {}\nsink:\n  file: {{ path: {}, format: jsonl }}\n",
        s3.connector("data", format),
        yaml_path(&back)
    );
    let summary = run_job(dir.path(), "down.yaml", &down).summary();
    assert_eq!(summary.records_in, EVENTS);
    assert_same_rows(
        &format!("{format} read back from S3"),
        &read_jsonl_dir(&back),
        &expected,
    );
    s3.clean_up();
}

#[test]
fn csv_round_trip_through_s3() {
    round_trip("csv", "csv");
}

#[test]
fn jsonl_round_trip_through_s3() {
    round_trip("jsonl", "jsonl");
}

#[test]
fn missing_s3_prefix_is_a_clear_error() {
    let Some(s3) = s3("missing") else { return };
    let dir = tempdir();
    let yaml = format!(
        "name: missing\nsource:\n  {}\nsink:\n  blackhole: {{}}\n",
        s3.connector("nothing-here", "csv")
    );
    let job = write_job(dir.path(), "job.yaml", &yaml);
    let outcome = run_sluice(&["run", job.to_str().expect("UTF-8 path")], dir.path());
    outcome
        .assert_code(2)
        .assert_no_panic()
        .assert_stderr_contains("no files found")
        .assert_stderr_contains(&s3.url("nothing-here"));
}
