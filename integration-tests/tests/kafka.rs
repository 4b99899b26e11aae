//! Kafka across real processes, against the test services' broker (tansu on 127.0.0.1):
//! `sluice kafka produce` loads a 4-partition topic, and a windowed job on remote state
//! reads it with `sluice run --workers 2` while workers are SIGKILLed at seeded moments;
//! its committed output (the exactly-once file sink) must equal the same job's output
//! without failures, so partition offsets in checkpoints neither lose nor repeat a
//! record. A partition that receives nothing holds every window back unless the source
//! declares `idleness`. And bad input: a missing topic, an unreachable broker, and
//! malformed records under `on_error`. Topics are loaded as `common/kafka_topics.rs`
//! says (tansu's end offsets need the last record of each partition alone in a batch).

use std::path::Path;
use std::time::{Duration, Instant};

use sluice_connectors::kafka::txn::committed::CommittedReader;
use sluice_integration_tests::procs::{self, Background};
use sluice_integration_tests::{
    Row, assert_same_rows, part_files, read_jsonl_dir, run_sluice, tempdir, write_job, yaml_path,
};
use sluice_test_support::kafka::{KafkaEnv, kafka_env};
use sluice_test_support::rng::rng_from_env;

#[path = "common/kafka_topics.rs"]
mod kafka_topics;
use kafka_topics::{bid, load};

fn env(test: &str, what: &str) -> Option<KafkaEnv> {
    kafka_env(test, what)
}

/// A windowed count and sum per auction on remote state, reading `topic`.
fn job(env: &KafkaEnv, topic: &str, out: &Path) -> String {
    format!(
        "name: kafka-failover\nparallelism: 2\ncheckpoint: {{ interval: 300ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  kafka:\n    brokers: {}\n    topic: {topic}\n    \
         schema: {{ auction: int64, price: int64, date_time: timestamp }}\n    \
         bounded: latest\n  batch_size: 512\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        env.brokers,
        yaml_path(out)
    )
}

#[test]
fn killed_workers_reading_kafka_leave_exactly_once_output() {
    let Some(env) = env(
        "kafka-failover",
        "Kafka offsets in checkpoints under worker kills",
    ) else {
        return;
    };
    let dir = tempdir();
    // Enough records that the job outlasts both kills (1.2 to 2.7 s apart) and a restart
    // on a fast machine: 400 K ran in 3.7 s and ended before the second kill.
    let topic = load(&env, dir.path(), "bids", 1_000_000);

    let reference = dir.path().join("reference");
    let job_file = write_job(dir.path(), "ref.yaml", &job(&env, &topic, &reference));
    run_sluice(&["run", job_file.to_str().unwrap()], dir.path())
        .assert_success()
        .assert_no_panic()
        .assert_stderr_contains("1000004 records in");
    let expected: Vec<Row> = read_jsonl_dir(&reference);
    assert!(expected.len() > 1000, "windows fired: {}", expected.len());

    let out = dir.path().join("out");
    let job_file = write_job(dir.path(), "failover.yaml", &job(&env, &topic, &out));
    let mut rng = rng_from_env("SLUICE_FAILOVER_SEED", 0x5eed_f00d);
    procs::run_with_kills(dir.path(), &job_file, 2, &mut |n| rng.below(n));
    assert_same_rows(
        "output read from Kafka after worker kills",
        &read_jsonl_dir(&out),
        &expected,
    );
}

/// An unbounded job over `topic` whose windows show up in `out` as checkpoints commit.
fn idle_job(env: &KafkaEnv, topic: &str, out: &Path, idleness: &str) -> String {
    format!(
        "name: kafka-idle\nparallelism: 1\ncheckpoint: {{ interval: 200ms }}\n\
         source:\n  kafka:\n    brokers: {}\n    topic: {topic}\n    \
         schema: {{ auction: int64, date_time: timestamp }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 1s{idleness} }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    \
         aggregate: [\"count(*) AS bids\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        env.brokers,
        yaml_path(out)
    )
}

/// Runs `job` (unbounded, printing task metrics) for at most `limit`, until `out` holds
/// a committed row; the rows found, and the process's stderr.
fn rows_within(dir: &Path, job: &Path, out: &Path, limit: Duration) -> (Vec<Row>, String) {
    let mut run = Background::spawn(
        &["run", job.to_str().unwrap(), "--metrics-interval-ms", "300"],
        dir,
    );
    let started = Instant::now();
    let mut rows = Vec::new();
    while started.elapsed() < limit {
        if let Some(status) = run.try_wait() {
            panic!("an unbounded job ended: {status}");
        }
        if out.exists() && !part_files(out, "jsonl").is_empty() {
            rows = read_jsonl_dir(out);
            if !rows.is_empty() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if !rows.is_empty() {
        // Let what follows a completed checkpoint (offsets committed to a group) happen.
        std::thread::sleep(Duration::from_secs(1));
    }
    let stderr = run.kill();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (rows, stderr)
}

#[test]
fn a_silent_partition_holds_windows_back_unless_the_source_has_idleness() {
    let Some(env) = env("kafka-idle", "watermark idleness of Kafka partitions") else {
        return;
    };
    let dir = tempdir();
    let topic = env.topic("three-of-four");
    env.create_topic_blocking(&topic, 4);
    // Partitions 0..3 get a minute of event time; partition 3 gets nothing.
    for p in 0..3 {
        let records: Vec<String> = (0..60)
            .map(|s| bid(p as i64, 1_436_918_400_000 + s * 1000))
            .collect();
        let records: Vec<(Option<&str>, &str)> =
            records.iter().map(|r| (None, r.as_str())).collect();
        env.produce(&topic, p, &records);
    }

    let held = dir.path().join("held");
    let job_file = write_job(dir.path(), "held.yaml", &idle_job(&env, &topic, &held, ""));
    let (rows, stderr) = rows_within(dir.path(), &job_file, &held, Duration::from_secs(8));
    assert!(
        rows.is_empty(),
        "without idleness the silent partition must hold every window: {rows:?}\n{stderr}"
    );
    // The task's metrics say which partition holds the watermark.
    let holder = format!("watermark_held_by={topic}/3");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("metrics ") && l.contains(&holder)),
        "no metrics line names {holder}:\n{stderr}"
    );

    let fired = dir.path().join("fired");
    let group = env.topic("monitor");
    let job_file = write_job(
        dir.path(),
        "fired.yaml",
        &idle_job(&env, &topic, &fired, ", idleness: 1s").replace(
            "    schema:",
            &format!("    group_id: {group}\n    commit_offsets: true\n    schema:"),
        ),
    );
    let (rows, stderr) = rows_within(dir.path(), &job_file, &fired, Duration::from_secs(60));
    assert!(
        !rows.is_empty(),
        "with idleness the silent partition is ignored and windows fire:\n{stderr}"
    );
    // Output is visible once a checkpoint completed, and completed checkpoints commit
    // their offsets to the group: all 60 records of partitions 0..3, none of 3.
    // The commit is asynchronous: give it a moment.
    let started = Instant::now();
    loop {
        let committed = env.committed(&topic, &group, 4);
        if committed == [60, 60, 60, 0] {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the group's offsets are {committed:?}, not [60, 60, 60, 0]"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn bad_kafka_input_fails_or_is_skipped_as_the_job_says() {
    let Some(env) = env("kafka-bad-input", "bad Kafka input across processes") else {
        return;
    };
    let dir = tempdir();
    let topic = env.topic("mixed");
    env.create_topic_blocking(&topic, 1);
    let good = bid(7, 1_436_918_400_000);
    env.produce(
        &topic,
        0,
        &[
            (None, good.as_str()),
            (None, "{not json"),
            (None, good.as_str()),
        ],
    );
    let job = |name: &str, brokers: &str, topic: &str, on_error: &str| {
        let out = dir.path().join(format!("{name}-out"));
        let yaml = format!(
            "name: {name}\nsource:\n  kafka:\n    brokers: {brokers}\n    topic: {topic}\n    \
             schema: {{ auction: int64, date_time: timestamp }}\n    bounded: latest\n    \
             on_error: {on_error}\n\
             sink:\n  file: {{ path: {}, format: jsonl }}\n",
            yaml_path(&out)
        );
        (write_job(dir.path(), &format!("{name}.yaml"), &yaml), out)
    };

    let (fail, _) = job("fail", &env.brokers, &topic, "fail");
    run_sluice(&["run", fail.to_str().unwrap()], dir.path())
        .assert_code(1)
        .assert_no_panic()
        .assert_stderr_contains(&format!("Kafka topic `{topic}` partition 0 offset 1"));

    let (skip, out) = job("skip", &env.brokers, &topic, "skip");
    run_sluice(&["run", skip.to_str().unwrap()], dir.path())
        .assert_success()
        .assert_stderr_contains("1 skipped");
    assert_eq!(read_jsonl_dir(&out).len(), 2);

    let (missing, _) = job("missing", &env.brokers, &env.topic("absent"), "fail");
    run_sluice(&["run", missing.to_str().unwrap()], dir.path())
        .assert_code(1)
        .assert_stderr_contains("does not exist on brokers");

    let (unreachable, _) = job("unreachable", "127.0.0.1:1", &topic, "fail");
    let started = Instant::now();
    run_sluice(&["run", unreachable.to_str().unwrap()], dir.path())
        .assert_code(1)
        .assert_no_panic()
        .assert_stderr_contains("Kafka brokers `127.0.0.1:1` did not answer");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "an unreachable broker is reported, not waited on: {:?}",
        started.elapsed()
    );
}

/// Tumbling windows of 120 000 Nexmark bids (throttled to `rate` per second when not 0)
/// on remote state, into `sink`.
fn windowed_bids(sink: &str, rate: u64) -> String {
    let throttle = if rate > 0 {
        format!(", max_events_per_second: {rate}")
    } else {
        String::new()
    };
    format!(
        "name: kafka-sink\nparallelism: 2\ncheckpoint: {{ interval: 300ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  nexmark: {{ stream: bid, events: 120000, seed: 11, splits: 4{throttle} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  {sink}\n"
    )
}

/// The windows of [`windowed_bids`] written to a file sink without failures.
fn reference_windows(dir: &Path) -> Vec<Row> {
    let reference = dir.join("reference");
    let file = write_job(
        dir,
        "ref.yaml",
        &windowed_bids(
            &format!("file: {{ path: {}, format: jsonl }}", yaml_path(&reference)),
            0,
        ),
    );
    run_sluice(&["run", file.to_str().unwrap()], dir).assert_success();
    read_jsonl_dir(&reference)
}

#[test]
fn the_exactly_once_kafka_sink_commits_each_record_once_through_worker_kills() {
    let Some(env) = env(
        "kafka-eos-failover",
        "the exactly-once Kafka sink under worker kills",
    ) else {
        return;
    };
    let dir = tempdir();
    let expected = reference_windows(dir.path());
    assert!(expected.len() > 1000, "windows fired: {}", expected.len());

    let topic = env.topic("eos-windows");
    env.create_topic_blocking(&topic, 3);
    let file = write_job(
        dir.path(),
        "eos.yaml",
        &windowed_bids(
            &format!(
                "kafka: {{ brokers: {}, topic: {topic}, format: json, key: [auction], \
                 delivery: exactly_once }}",
                env.brokers
            ),
            12_000,
        ),
    );
    let mut rng = rng_from_env("SLUICE_FAILOVER_SEED", 0x5eed_f00d);
    procs::run_with_kills(dir.path(), &file, 2, &mut |n| rng.below(n));

    // What committed transactions hold: each window exactly once. (tansu also shows
    // the records of aborted transactions to read_committed consumers, so the test
    // applies the transaction markers itself.)
    let committed = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(CommittedReader::read_all(&env.brokers, &topic, 3))
        .unwrap();
    let written: Vec<Row> = committed
        .iter()
        .flat_map(|v| sluice_integration_tests::parse_jsonl(&String::from_utf8_lossy(v), &topic))
        .collect();
    assert_same_rows(
        "windows in committed Kafka transactions after worker kills",
        &written,
        &expected,
    );
    let everything = env.read_values(&topic, 3, expected.len(), Duration::from_secs(60));
    eprintln!(
        "{} windows committed once; the topic's log holds {} records (aborted ones included)",
        written.len(),
        everything.len()
    );
}

#[test]
fn the_kafka_sink_keeps_every_record_through_worker_kills() {
    let Some(env) = env(
        "kafka-sink-failover",
        "the at-least-once Kafka sink under worker kills",
    ) else {
        return;
    };
    let dir = tempdir();
    // Windows of throttled Nexmark bids on remote state; a kill replays the windows
    // after the last checkpoint, so the topic may hold some twice but must miss none.
    let expected = reference_windows(dir.path());

    let topic = env.topic("windows");
    env.create_topic_blocking(&topic, 2);
    let file = write_job(
        dir.path(),
        "sink.yaml",
        &windowed_bids(
            &format!(
                "kafka: {{ brokers: {}, topic: {topic}, format: json, key: [auction] }}",
                env.brokers
            ),
            12_000,
        ),
    );
    let mut rng = rng_from_env("SLUICE_FAILOVER_SEED", 0x5eed_f00d);
    procs::run_with_kills(dir.path(), &file, 2, &mut |n| rng.below(n));

    let unique = |rows: &[Row]| -> std::collections::BTreeSet<String> {
        rows.iter()
            .map(|r| {
                serde_json::Value::Object(sluice_integration_tests::normalize_row(r)).to_string()
            })
            .collect()
    };
    let want = unique(&expected);
    // The reader stops after 2 s without a message once it has as many values as
    // expected; repeated windows count toward that, and a broker slowed by a loaded
    // machine can pause longer. The job has finished, so a second read from the start
    // sees everything the topic will ever hold: what is missing then is lost.
    let mut written: Vec<Row> = Vec::new();
    for _ in 0..2 {
        let values = env.read_values(&topic, 2, expected.len(), Duration::from_secs(60));
        written = values
            .iter()
            .flat_map(|v| sluice_integration_tests::parse_jsonl(v, &topic))
            .collect();
        if want.is_subset(&unique(&written)) {
            break;
        }
    }
    let got = unique(&written);
    let missing: Vec<&String> = want.difference(&got).take(5).collect();
    let foreign: Vec<&String> = got.difference(&want).take(5).collect();
    assert!(
        missing.is_empty() && foreign.is_empty(),
        "{} of {} windows missing (e.g. {missing:?}), {} not in the reference (e.g. {foreign:?})",
        want.difference(&got).count(),
        want.len(),
        got.difference(&want).count()
    );
    assert!(
        written.len() >= expected.len(),
        "at least once: {} < {}",
        written.len(),
        expected.len()
    );
    eprintln!(
        "{} windows, {} records in the topic ({} repeated after restarts)",
        expected.len(),
        written.len(),
        written.len() - expected.len()
    );
}
