//! Failover across real processes: worker processes of a `sluice run --workers 2` are
//! killed with SIGKILL at seeded random moments while a job with remote state and the
//! exactly-once file sink runs; the embedded coordinator restarts the job from its last
//! checkpoint each time, and the committed output must equal the output of the same job
//! run without failures: no duplicate, no gap. Once with the sink in a local directory,
//! once on S3 (SeaweedFS), and once with a `dedup` step, the operator written on the
//! state seam alone (no checkpoint code of its own). And `sluice run` without
//! `--workers`, whose worker runs in its own process: a task failure injected there
//! (`SLUICE_TEST_FAIL_ONCE_AFTER`) restarts the job from its last checkpoint with its
//! windows' state kept in memory, through the same coordinator code.

use std::path::Path;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use sluice_test_support::rng::rng_from_env;
use sluice_test_support::s3::s3_env;

use sluice_integration_tests::procs;
use sluice_integration_tests::{
    Row, assert_same_rows, parse_jsonl, read_jsonl_dir, run_sluice, run_sluice_env, tempdir,
    write_job, yaml_path, yaml_str,
};

/// A windowed count per auction on remote state, throttled so that the run lasts long
/// enough to be killed several times.
fn job(out: &Path, rate: u64) -> String {
    job_to(
        &format!("{{ path: {}, format: jsonl }}", yaml_path(out)),
        rate,
    )
}

/// The job with the file sink `sink` (a YAML mapping).
fn job_to(sink: &str, rate: u64) -> String {
    format!(
        "name: failover\nparallelism: 2\ncheckpoint: {{ interval: 300ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  nexmark: {{ stream: bid, events: 120000, seed: 11, splits: 4, max_events_per_second: {rate} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  file: {sink}\n"
    )
}

#[test]
fn killed_workers_are_replaced_and_the_output_is_exactly_once() {
    let dir = tempdir();
    let expected = reference(dir.path());
    let out = dir.path().join("out");
    run_with_kills(dir.path(), &job(&out, 12_000), 3);
    assert_same_rows(
        "output after worker kills",
        &read_jsonl_dir(&out),
        &expected,
    );
    let hidden: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        // Recoveries leave their fence marks (`.fence-<attempt>-<checkpoint>`), which
        // void what a zombie of an older attempt could leave after them.
        .filter(|n| n.starts_with('.') && !n.starts_with(".fence-"))
        .collect();
    assert!(
        hidden.is_empty(),
        "nothing pending or in progress is left: {hidden:?}"
    );
}

#[test]
fn killed_workers_leave_exactly_once_output_on_s3() {
    let Some(s3) = s3_env("failover-s3", "Failover with the exactly-once sink on S3") else {
        return;
    };
    let dir = tempdir();
    let expected = reference(dir.path());
    let url = format!("{}/out", s3.url());
    let sink = format!(
        "{{ path: {}, format: jsonl, endpoint: {}, allow_http: true }}",
        yaml_str(&url),
        yaml_str(&s3.endpoint)
    );
    run_with_kills(dir.path(), &job_to(&sink, 12_000), 2);
    let store = s3.bucket_store();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rows = rt.block_on(async {
        let prefix = ObjectPath::from(format!("{}/out", s3.prefix));
        let objects: Vec<_> = store
            .list(Some(&prefix))
            .try_collect()
            .await
            .expect("listing the output");
        let mut rows: Vec<Row> = Vec::new();
        for o in objects {
            let name = o.location.filename().expect("a name").to_owned();
            if name.starts_with(".fence-") {
                continue;
            }
            assert!(
                !name.starts_with('.'),
                "left pending or in progress: {name}"
            );
            let bytes = store
                .get(&o.location)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("bytes");
            rows.extend(parse_jsonl(
                std::str::from_utf8(&bytes).expect("UTF-8"),
                &name,
            ));
            store.delete(&o.location).await.expect("clean up");
        }
        rows
    });
    assert_same_rows("S3 output after worker kills", &rows, &expected);
}

/// Distinct (bidder, auction bucket) pairs, deduplicated in keyed remote state.
fn dedup_job(out: &Path, rate: u64) -> String {
    format!(
        "name: dedup-failover\nparallelism: 2\ncheckpoint: {{ interval: 300ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  nexmark: {{ stream: bid, events: 120000, seed: 5, splits: 4, max_events_per_second: {rate} }}\n\
         pipeline:\n  - select: [\"bidder\", \"auction % 7 AS bucket\"]\n  - dedup: [bidder, bucket]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

#[test]
fn a_dedup_step_keeps_each_key_once_across_worker_kills() {
    let dir = tempdir();
    let reference = dir.path().join("reference");
    let job = write_job(dir.path(), "ref.yaml", &dedup_job(&reference, 0));
    run_sluice(&["run", job.to_str().unwrap()], dir.path())
        .assert_success()
        .assert_no_panic();
    let expected = read_jsonl_dir(&reference);
    assert!(expected.len() > 1000, "{} distinct pairs", expected.len());
    let out = dir.path().join("out");
    run_with_kills(dir.path(), &dedup_job(&out, 12_000), 2);
    assert_same_rows(
        "dedup output after worker kills",
        &read_jsonl_dir(&out),
        &expected,
    );
}

/// A windowed count per auction on memory state, checkpointed, throttled a little so
/// that checkpoints complete before the injected failure.
fn memory_job(out: &Path, rate: u64) -> String {
    format!(
        "name: in-process\nparallelism: 2\ncheckpoint: {{ interval: 200ms }}\n\
         source:\n  nexmark: {{ stream: bid, events: 60000, seed: 3, splits: 4, max_events_per_second: {rate} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

#[test]
fn an_in_process_run_restarts_from_its_checkpoint_with_memory_state() {
    let dir = tempdir();
    let reference = dir.path().join("reference");
    let job = write_job(dir.path(), "ref.yaml", &memory_job(&reference, 0));
    run_sluice(&["run", job.to_str().unwrap()], dir.path())
        .assert_success()
        .assert_no_panic();
    let expected = read_jsonl_dir(&reference);
    assert!(!expected.is_empty());
    let out = dir.path().join("out");
    let job = write_job(dir.path(), "job.yaml", &memory_job(&out, 20_000));
    let run = run_sluice_env(
        &["run", job.to_str().unwrap()],
        dir.path(),
        &[("SLUICE_TEST_FAIL_ONCE_AFTER", "15000")],
    );
    run.assert_success().assert_no_panic();
    let summary = sluice_integration_tests::summary_line(&run.stderr)
        .unwrap_or_else(|| panic!("no summary:\n{}", run.stderr));
    assert!(summary.ends_with(", 1 restarts"), "{summary}");
    assert!(
        run.stderr.contains("a failure injected after"),
        "{}",
        run.stderr
    );
    assert_same_rows(
        "in-process output after a restart",
        &read_jsonl_dir(&out),
        &expected,
    );
}

/// The job's output without failures (one process, no throttle).
fn reference(dir: &Path) -> Vec<Row> {
    let reference = dir.join("reference");
    let job = write_job(dir, "ref.yaml", &job(&reference, 0));
    run_sluice(&["run", job.to_str().unwrap()], dir)
        .assert_success()
        .assert_no_panic();
    let rows = read_jsonl_dir(&reference);
    assert!(!rows.is_empty());
    rows
}

/// Runs `yaml` under `sluice run --workers 2` with `kills` worker kills at seeded moments.
fn run_with_kills(dir: &Path, yaml: &str, kills: usize) {
    let path = write_job(dir, "failover.yaml", yaml);
    let mut rng = rng_from_env("SLUICE_FAILOVER_SEED", 0x5eed_f00d);
    procs::run_with_kills(dir, &path, kills, &mut |n| rng.below(n));
}
