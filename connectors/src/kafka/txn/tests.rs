//! The exactly-once sink against the test services' broker (tansu on 127.0.0.1): what it
//! asks the broker, in which order, at each step and after each failure; and what the
//! committed transactions hold.
//!
//! tansu shows records of aborted transactions to `read_committed` consumers, so these
//! tests read the partitions' logs and apply the transaction markers themselves
//! ([`CommittedReader`]), as a Kafka broker decides what `read_committed` returns.

use std::sync::{Arc, Mutex};

use arrow::array::{Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_common::pb;
use sluice_compute::connector::{SinkWriter, SubtaskInfo};
use sluice_test_support::kafka::{KafkaEnv, kafka_env};

use super::ExactlyOnceWriter;
use super::committed::CommittedReader;

fn env(test: &str) -> Option<KafkaEnv> {
    kafka_env(test, "the exactly-once Kafka sink")
}

fn subtask(index: usize, parallelism: usize) -> SubtaskInfo {
    SubtaskInfo {
        index,
        parallelism,
        fence: 0,
    }
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]))
}

/// Rows with ids `ids`.
fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter_values(ids.map(|i| format!("n{i}")))),
        ],
    )
    .unwrap()
}

fn spec(env: &KafkaEnv, topic: &str, prefix: &str) -> pb::KafkaSink {
    pb::KafkaSink {
        brokers: env.brokers.clone(),
        topic: topic.to_string(),
        format: pb::KafkaFormat::Json as i32,
        key_columns: vec!["id".into()],
        delivery: pb::KafkaDelivery::ExactlyOnce as i32,
        transactional_id_prefix: prefix.to_string(),
        ..Default::default()
    }
}

type Journal = Arc<Mutex<Vec<String>>>;

async fn writer(spec: &pb::KafkaSink, me: SubtaskInfo) -> (ExactlyOnceWriter, Journal) {
    let journal = Journal::default();
    let w = ExactlyOnceWriter::create_with(spec, schema(), me, Some(journal.clone()))
        .await
        .unwrap();
    (w, journal)
}

/// Whether `line` begins a transaction on `id`: its epoch bumped, or (brokers without
/// KIP-360, such as tansu 0.6) the id taken over again.
fn begins(line: &str, id: &str) -> bool {
    line.starts_with(&format!("init {id} bump -> producer "))
        || line.starts_with(&format!("init {id} takeover -> producer "))
}

/// The journal's lines with the verb `verb` (`init`, `add`, `end`), taken out.
fn drain(journal: &Journal, verb: &str) -> Vec<String> {
    let mut j = journal.lock().unwrap();
    let (taken, kept): (Vec<String>, Vec<String>) = j
        .drain(..)
        .partition(|l| l.starts_with(&format!("{verb} ")));
    *j = kept;
    taken
}

/// The ids in the values that committed transactions (or no transaction) hold, in every
/// partition of `topic`, sorted.
async fn committed_ids(env: &KafkaEnv, topic: &str, partitions: i32) -> Vec<i64> {
    let values = CommittedReader::read_all(&env.brokers, topic, partitions)
        .await
        .unwrap();
    let mut ids: Vec<i64> = values
        .iter()
        .map(|v| {
            let v = std::str::from_utf8(v).unwrap();
            let start = v.find("\"id\":").unwrap() + 5;
            let end = v[start..].find([',', '}']).unwrap() + start;
            v[start..end].parse().unwrap()
        })
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn a_checkpoints_transaction_commits_when_the_checkpoint_completes() {
    let Some(env) = env("kafka_eos_commit") else {
        return;
    };
    let topic = env.topic("eos-commit");
    env.create_topic(&topic, 3).await;
    let prefix = env.topic("txn");
    let (mut w, journal) = writer(&spec(&env, &topic, &prefix), subtask(0, 1)).await;

    w.write(&batch(0..500)).await.unwrap();
    let state = w.pre_commit(1).await.unwrap();
    let id = format!("{prefix}-0-0");
    // Every slot's id is taken over once, then the first is bumped for the transaction.
    let init = drain(&journal, "init");
    assert_eq!(init.len(), super::POOL + 1, "{init:?}");
    for (slot, line) in init.iter().take(super::POOL).enumerate() {
        let want = format!("init {prefix}-0-{slot} takeover -> producer ");
        assert!(line.starts_with(&want), "{init:?}");
    }
    assert!(begins(&init[super::POOL], &id), "{init:?}");
    assert_eq!(drain(&journal, "add").len(), 1);
    assert_eq!(state.len(), 2, "{state:?}");
    assert_eq!(state[0], "subtask 0");
    assert!(
        state[1].starts_with("txn subtask 0 checkpoint 1 producer "),
        "{state:?}"
    );
    assert!(state[1].ends_with(&format!(" id {id}")), "{state:?}");
    assert!(
        drain(&journal, "end").is_empty(),
        "nothing ends before the checkpoint completes"
    );
    assert!(committed_ids(&env, &topic, 3).await.is_empty());

    // Rows of the next checkpoint go to the next slot while the first waits.
    w.write(&batch(500..600)).await.unwrap();
    w.pre_commit(2).await.unwrap();
    let init = drain(&journal, "init");
    assert!(begins(&init[0], &format!("{prefix}-0-1")), "{init:?}");
    w.commit(1).await.unwrap();
    let end = drain(&journal, "end");
    assert_eq!(end.len(), 1);
    assert!(
        end[0].starts_with(&format!("end {id} producer ")) && end[0].ends_with(" commit -> done"),
        "{end:?}"
    );
    assert_eq!(
        committed_ids(&env, &topic, 3).await,
        (0..500).collect::<Vec<_>>()
    );
    w.commit(2).await.unwrap();

    // The freed first slot is used again; the end of the input commits what is open.
    w.write(&batch(600..700)).await.unwrap();
    w.finish().await.unwrap();
    let init = drain(&journal, "init");
    assert!(begins(&init[0], &id), "{init:?}");
    assert_eq!(
        committed_ids(&env, &topic, 3).await,
        (0..700).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_restart_commits_what_its_checkpoint_pre_committed_and_aborts_the_rest() {
    let Some(env) = env("kafka_eos_recover") else {
        return;
    };
    let topic = env.topic("eos-recover");
    env.create_topic(&topic, 2).await;
    let prefix = env.topic("txn");
    let spec = spec(&env, &topic, &prefix);

    // Two subtasks pre-commit checkpoints 1 and 2; checkpoint 2 completes, but both die
    // before they hear so; they had begun checkpoint 3.
    let mut states = Vec::new();
    let mut zombies = Vec::new();
    for i in 0..2usize {
        let (mut w, _) = writer(&spec, subtask(i, 2)).await;
        let base = i as i64 * 10_000;
        w.write(&batch(base..base + 100)).await.unwrap();
        w.pre_commit(1).await.unwrap();
        w.write(&batch(base + 100..base + 200)).await.unwrap();
        states.extend(w.pre_commit(2).await.unwrap());
        w.write(&batch(base + 200..base + 300)).await.unwrap();
        w.pre_commit(3).await.unwrap();
        zombies.push(w);
    }
    assert!(committed_ids(&env, &topic, 2).await.is_empty());

    // The job restarts from checkpoint 2 at parallelism 1: the one subtask inherits both.
    let (mut heir, journal) = writer(&spec, subtask(0, 1)).await;
    heir.recover(2, &states).await.unwrap();
    let lines = journal.lock().unwrap().clone();
    let ends: Vec<&String> = lines.iter().filter(|l| l.starts_with("end ")).collect();
    assert_eq!(ends.len(), 4, "{lines:#?}");
    // Oldest checkpoint first: checkpoint 1 was on slot 0 of both, checkpoint 2 on slot 1.
    for (k, end) in ends.iter().enumerate() {
        let (i, slot) = (k % 2, k / 2);
        assert!(
            end.starts_with(&format!("end {prefix}-{i}-{slot} "))
                && end.ends_with(" commit -> done"),
            "{lines:#?}"
        );
    }
    // Then every id of both old subtasks is taken over, after all the commits.
    let first_init = lines.iter().position(|l| l.starts_with("init ")).unwrap();
    let last_end = lines.iter().rposition(|l| l.starts_with("end ")).unwrap();
    assert!(last_end < first_init, "{lines:#?}");
    let inits: Vec<&String> = lines.iter().filter(|l| l.starts_with("init ")).collect();
    assert_eq!(inits.len(), 2 * super::POOL, "{lines:#?}");
    for i in 0..2 {
        for slot in 0..super::POOL {
            let line = format!("init {prefix}-{i}-{slot} takeover -> producer ");
            assert!(
                inits.iter().any(|l| l.starts_with(&line)),
                "{line} in {lines:#?}"
            );
        }
    }
    let want: Vec<i64> = (0..200).chain(10_000..10_200).collect();
    assert_eq!(committed_ids(&env, &topic, 2).await, want);

    // The old attempt is fenced: it cannot commit checkpoint 3, and (where the broker
    // bumps epochs) not begin another transaction either.
    let mut zombie = zombies.pop().unwrap();
    let err = zombie.commit(3).await.unwrap_err().to_string();
    assert!(err.contains("taken its transactional id over"), "{err}");
    zombie.write(&batch(0..10)).await.unwrap();
    let began = zombie.pre_commit(4).await;
    if zombie.cluster.bumps_epochs() {
        let err = began.unwrap_err().to_string();
        assert!(err.contains("took the transactional id over"), "{err}");
    }

    // The heir writes on from a clean slate.
    heir.write(&batch(50_000..50_010)).await.unwrap();
    heir.pre_commit(3).await.unwrap();
    heir.commit(3).await.unwrap();
    let want: Vec<i64> = (0..200)
        .chain(10_000..10_200)
        .chain(50_000..50_010)
        .collect();
    assert_eq!(committed_ids(&env, &topic, 2).await, want);
}

#[tokio::test]
async fn an_unreachable_broker_and_a_missing_topic_are_named() {
    let Some(env) = env("kafka_eos_bad") else {
        return;
    };
    let mut bad = spec(&env, &env.topic("absent"), "p");
    let err = ExactlyOnceWriter::create(&bad, schema(), subtask(0, 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
    // A port nothing listens on: refused at once, named.
    bad.brokers = "127.0.0.1:9".into();
    let started = std::time::Instant::now();
    let err = ExactlyOnceWriter::create(&bad, schema(), subtask(0, 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("127.0.0.1:9"), "{err}");
    assert!(
        started.elapsed() < super::REQUEST_TIMEOUT * 2,
        "{:?}",
        started.elapsed()
    );
}
