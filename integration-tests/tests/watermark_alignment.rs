//! Watermark alignment on a cluster of processes: a Kafka source subtask whose partition
//! runs ahead in event time pauses until the other subtask catches up, whether that one
//! runs in another worker process (the coordinator carries its watermark) or in the same
//! one; it still takes checkpoints meanwhile; and without alignment the same data is
//! read at once (the control that shows the pause is alignment's doing), and `sluice
//! doctor` names the drift, which it does not with alignment.

use std::time::Duration;

use serde_json::Value;
use sluice_integration_tests::cluster::MiniCluster;
use sluice_integration_tests::{run_sluice, tempdir, write_job};
use sluice_test_support::kafka::{KafkaEnv, kafka_env};

#[path = "common/kafka_topics.rs"]
#[expect(dead_code, reason = "only `bid` is used here")]
mod kafka_topics;

/// Event time of the first records.
const T0: i64 = 1_436_918_400_000;
/// Records the fast partition gets: ten per second of event time, 500 s of them.
const AHEAD: i64 = 5_000;
const DRIFT_MS: i64 = 5_000;
const WAIT: Duration = Duration::from_secs(60);

/// Writes bids at `per_second` a second of event time from `from_s` for `count`
/// records to `partition`.
fn produce(env: &KafkaEnv, topic: &str, partition: i32, from_s: i64, count: i64, per_second: i64) {
    let records: Vec<String> = (0..count)
        .map(|i| kafka_topics::bid(i % 50, T0 + from_s * 1000 + i * 1000 / per_second))
        .collect();
    for chunk in records.chunks(1000) {
        let chunk: Vec<(Option<&str>, &str)> = chunk.iter().map(|r| (None, r.as_str())).collect();
        env.produce(topic, partition, &chunk);
    }
}

fn job(topic: &str, brokers: &str, alignment: &str) -> String {
    format!(
        r#"name: aligned
parallelism: 2
checkpoint: {{ interval: 300ms }}
source:
  kafka:
    brokers: {brokers}
    topic: {topic}
    format: json
    schema: {{ auction: int64, price: int64, date_time: timestamp }}
  batch_size: 10
watermark:
  column: date_time
  max_out_of_orderness: 0s
  {alignment}
pipeline:
  - key_by: [auction]
  - window: {{ tumbling: 10s }}
    aggregate: ["count(*) AS bids"]
sink:
  blackhole: {{}}
"#
    )
}

/// The source task reading `partition` of `topic` (it names the partition as the
/// holder of its watermark, its only split).
fn source_task(status: &Value, topic: &str, partition: i32) -> Option<Value> {
    let holder = format!("{topic}/{partition}");
    status["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["watermark_held_by"] == holder.as_str())
        .cloned()
}

/// Both source tasks have a watermark and name their partitions: (fast, slow).
fn wait_for_sources(cluster: &MiniCluster, id: &str, topic: &str) -> (Value, Value) {
    cluster.wait_until("both source tasks with a watermark", WAIT, || {
        let s = cluster.status(id);
        let fast = source_task(&s, topic, 0)?;
        let slow = source_task(&s, topic, 1)?;
        (fast["watermark"].is_i64() && slow["watermark"].is_i64()).then_some((fast, slow))
    })
}

/// The pathologies `sluice doctor --json` names for job `id`.
fn doctor(cluster: &MiniCluster, dir: &std::path::Path, id: &str) -> Vec<String> {
    let url = cluster.url();
    let out = run_sluice(
        &[
            "doctor",
            id,
            "--coordinator",
            &url,
            "--sample-ms",
            "1000",
            "--json",
        ],
        dir,
    );
    out.assert_no_panic();
    let report: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}):\n{}\n{}",
            out.stdout, out.stderr
        )
    });
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["pathology"].as_str().map(str::to_owned))
        .collect()
}

fn start(env: &KafkaEnv, name: &str) -> String {
    let topic = env.topic(name);
    env.create_topic_blocking(&topic, 2);
    produce(env, &topic, 0, 0, 10, 10);
    produce(env, &topic, 1, 0, 10, 10);
    topic
}

/// The aligned job on `workers` workers: the subtask of partition 0 may run 5 s of
/// event time ahead of the other.
fn aligned(cluster: &MiniCluster, env: &KafkaEnv, dir: &std::path::Path, workers: usize) {
    let topic = start(env, &format!("aligned-{workers}"));
    let text = job(
        &topic,
        &env.brokers,
        "alignment: { max_drift: 5s, update_interval: 100ms }",
    );
    let file = write_job(dir, &format!("aligned-{workers}.yaml"), &text);
    let id = cluster.submit(dir, &file, workers);
    let (fast, slow) = wait_for_sources(cluster, &id, &topic);
    if workers > 1 {
        assert_ne!(
            fast["worker"], slow["worker"],
            "the two sources should run in different worker processes"
        );
    } else {
        assert_eq!(fast["worker"], slow["worker"]);
    }
    produce(env, &topic, 0, 1, AHEAD, 10);
    // The fast subtask pauses a drift ahead of the slow one's watermark (about T0 + 1 s),
    // and stays there while checkpoints go on.
    let paused = cluster.wait_until("the fast source paused by alignment", WAIT, || {
        let s = cluster.status(&id);
        let fast = source_task(&s, &topic, 0)?;
        (fast["alignment_paused_ms_per_s"].as_u64()? > 500).then_some(s)
    });
    let before = paused["last_checkpoint"].as_u64().unwrap_or(0);
    std::thread::sleep(Duration::from_secs(2));
    let s = cluster.status(&id);
    let fast = source_task(&s, &topic, 0).expect("fast source");
    let slow_wm = source_task(&s, &topic, 1).expect("slow source")["watermark"]
        .as_i64()
        .expect("slow watermark");
    let fast_wm = fast["watermark"].as_i64().expect("fast watermark");
    assert!(
        fast_wm <= slow_wm + DRIFT_MS + 2_000,
        "the fast source ran {} ms ahead of the slow one (max drift {DRIFT_MS} ms)\n{s:#}",
        fast_wm - slow_wm
    );
    let read = fast["records_in"].as_i64().expect("records_in");
    eprintln!(
        "{workers} worker(s), paused: fast source {} ms ahead of the slow one, {read} records read, checkpoints {before} -> {}",
        fast_wm - slow_wm,
        s["last_checkpoint"]
    );
    assert!(
        read < 10 + AHEAD / 10,
        "the fast source read {read} of {} records while paused\n{s:#}",
        10 + AHEAD
    );
    assert!(
        s["last_checkpoint"].as_u64().unwrap_or(0) >= before + 2,
        "checkpoints stopped while a source paused\n{s:#}"
    );
    let found = doctor(cluster, dir, &id);
    assert!(
        !found.iter().any(|f| f == "source drift"),
        "aligned sources drift? {found:?}"
    );

    // The slow partition moves on 60 s: the fast source follows, still within the drift.
    produce(env, &topic, 1, 1, 600, 10);
    let s = cluster.wait_until("the fast source following the slow one", WAIT, || {
        let s = cluster.status(&id);
        let fast = source_task(&s, &topic, 0)?["watermark"].as_i64()?;
        (fast >= T0 + 55_000).then_some(s)
    });
    let fast_wm = source_task(&s, &topic, 0).unwrap()["watermark"]
        .as_i64()
        .unwrap();
    assert!(
        fast_wm <= T0 + 61_000 + DRIFT_MS + 2_000,
        "the fast source ran past the slow one's 61 s by more than the drift: {} ms\n{s:#}",
        fast_wm - T0
    );
    cluster.cancel(dir, &id);
}

#[test]
fn a_source_ahead_of_its_group_pauses_until_the_other_catches_up_on_one_worker_or_two() {
    let Some(env) = kafka_env("watermark-alignment", "watermark alignment") else {
        return;
    };
    let dir = tempdir();
    let dir = dir.path();
    let cluster = MiniCluster::start(dir, 2, |_| Vec::new(), &[]);
    // Across workers the coordinator carries the other worker's watermark; on one
    // worker the tasks see each other's.
    aligned(&cluster, &env, dir, 2);
    aligned(&cluster, &env, dir, 1);

    // Not aligned: the same data, read at once.
    let topic = start(&env, "unaligned");
    let text = job(&topic, &env.brokers, "");
    let id = cluster.submit(dir, &write_job(dir, "unaligned.yaml", &text), 2);
    wait_for_sources(&cluster, &id, &topic);
    produce(&env, &topic, 0, 1, AHEAD, 10);
    cluster.wait_until("the unaligned source reading everything", WAIT, || {
        let s = cluster.status(&id);
        let fast = source_task(&s, &topic, 0)?;
        (fast["records_in"].as_i64()? >= 10 + AHEAD).then_some(())
    });
    // The window's tasks name the keys they see most (sampled batches).
    let status = cluster.status(&id);
    let hot: Vec<&str> = status["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["task"].as_str().is_some_and(|n| n.starts_with("window")))
        .flat_map(|t| t["hot_keys"].as_array().into_iter().flatten())
        .filter_map(|h| h["key"].as_str())
        .collect();
    assert!(
        !hot.is_empty() && hot.iter().all(|k| k.starts_with("auction=")),
        "hot keys: {hot:?}\n{status:#}"
    );
    // The doctor names the drift and alignment as its fix.
    let found = doctor(&cluster, dir, &id);
    assert!(
        found.iter().any(|f| f == "source drift"),
        "no source drift found in {found:?}\n{:#}",
        cluster.status(&id)
    );
    cluster.cancel(dir, &id);
}
