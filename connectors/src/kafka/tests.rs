//! The Kafka source and sink against the test services' broker (tansu on 127.0.0.1).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use sluice_common::pb;
use sluice_compute::connector::{SinkWriter, SourceReader, SourceStep, SubtaskInfo};
use sluice_test_support::kafka::{KafkaEnv, kafka_env};

use super::position::PartitionPosition;
use super::{KafkaReader, KafkaWriter};

fn env(test: &str) -> Option<KafkaEnv> {
    kafka_env(test, "the Kafka source and sink")
}

fn json_source(env: &KafkaEnv, topic: &str) -> pb::KafkaSource {
    pb::KafkaSource {
        brokers: env.brokers.clone(),
        topics: vec![topic.to_owned()],
        format: pb::KafkaFormat::Json as i32,
        schema: vec![
            pb::Field {
                name: "id".into(),
                data_type: "int64".into(),
                nullable: true,
            },
            pb::Field {
                name: "name".into(),
                data_type: "string".into(),
                nullable: true,
            },
        ],
        bounded_latest: true,
        ..Default::default()
    }
}

fn subtask(index: usize, parallelism: usize) -> SubtaskInfo {
    SubtaskInfo {
        index,
        parallelism,
        fence: 0,
    }
}

/// `n` records per partition: id = partition * 1000 + i, keyed `k<partition>`.
async fn topic_with_records(env: &KafkaEnv, name: &str, partitions: i32, n: usize) -> String {
    let topic = env.topic(name);
    env.create_topic(&topic, partitions).await;
    for p in 0..partitions {
        let values: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"id": {}, "name": "n{i}"}}"#, p as usize * 1000 + i))
            .collect();
        let key = format!("k{p}");
        let records: Vec<(Option<&str>, &str)> = values
            .iter()
            .map(|v| (Some(key.as_str()), v.as_str()))
            .collect();
        env.produce(&topic, p, &records);
    }
    topic
}

/// Reads until the end (bounded) or until `limit` batches; returns the batches.
async fn read(reader: &mut KafkaReader, limit: usize) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < limit {
        assert!(Instant::now() < deadline, "the reader took more than 30 s");
        match reader.poll_batch(Duration::from_millis(200)).await.unwrap() {
            SourceStep::Batch(b) => out.push(b.batch),
            SourceStep::Pending => {}
            SourceStep::End => break,
        }
    }
    out
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    let mut ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let i = b.schema().index_of("id").unwrap();
            b.column(i).as_primitive::<Int64Type>().values().to_vec()
        })
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn two_subtasks_read_every_partition_once_with_its_metadata() {
    let Some(env) = env("kafka_two_subtasks") else {
        return;
    };
    let topic = topic_with_records(&env, "four", 4, 25).await;
    let spec = json_source(&env, &topic);
    let mut all = Vec::new();
    let mut owned = 0;
    for i in 0..2 {
        let mut reader = KafkaReader::open(&spec, &[], subtask(i, 2), 10)
            .await
            .unwrap();
        owned += reader.num_splits();
        let batches = read(&mut reader, usize::MAX).await;
        for b in &batches {
            let partition = b
                .column_by_name("_partition")
                .unwrap()
                .as_primitive::<Int32Type>();
            let offset = b
                .column_by_name("_offset")
                .unwrap()
                .as_primitive::<Int64Type>();
            let key = b.column_by_name("_key").unwrap().as_string::<i32>();
            let id = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
            let ts = b.column_by_name("_timestamp").unwrap();
            for r in 0..b.num_rows() {
                let p = partition.value(r);
                assert_eq!(
                    id.value(r),
                    p as i64 * 1000 + offset.value(r),
                    "offset of row {r}"
                );
                assert_eq!(key.value(r), format!("k{p}"));
                assert!(!ts.is_null(r), "the Kafka timestamp is there");
            }
        }
        all.extend(batches);
    }
    assert_eq!(owned, 4, "each partition has one owner");
    let expected: Vec<i64> = (0..4)
        .flat_map(|p| (0..25).map(move |i| p * 1000 + i))
        .collect();
    assert_eq!(ids(&all), expected);
}

#[tokio::test]
async fn positions_resume_exactly_at_another_parallelism() {
    let Some(env) = env("kafka_resume") else {
        return;
    };
    let topic = topic_with_records(&env, "resume", 4, 40).await;
    let spec = json_source(&env, &topic);
    // Two subtasks read part of their partitions, then "fail".
    let mut first = Vec::new();
    let mut positions: HashMap<String, Bytes> = HashMap::new();
    for i in 0..2 {
        let mut reader = KafkaReader::open(&spec, &[], subtask(i, 2), 7)
            .await
            .unwrap();
        first.extend(read(&mut reader, 3).await);
        positions.extend(reader.positions().unwrap());
    }
    assert_eq!(
        positions.len(),
        4,
        "every partition has a position: {positions:?}"
    );
    // Three subtasks resume from those positions.
    let mut rest = Vec::new();
    for i in 0..3 {
        let mut reader = KafkaReader::open(&spec, &[], subtask(i, 3), 7)
            .await
            .unwrap();
        reader.restore(&positions).unwrap();
        rest.extend(read(&mut reader, usize::MAX).await);
    }
    let mut seen = ids(&first);
    let later = ids(&rest);
    let overlap: BTreeSet<i64> = seen
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .intersection(&later.iter().copied().collect())
        .copied()
        .collect();
    assert!(overlap.is_empty(), "records read twice: {overlap:?}");
    seen.extend(later);
    seen.sort_unstable();
    let expected: Vec<i64> = (0..4)
        .flat_map(|p| (0..40).map(move |i| p * 1000 + i))
        .collect();
    assert_eq!(seen, expected, "nothing lost, nothing repeated");
}

#[tokio::test]
async fn bad_records_follow_on_error() {
    let Some(env) = env("kafka_bad_records") else {
        return;
    };
    let topic = env.topic("bad");
    env.create_topic(&topic, 1).await;
    env.produce(
        &topic,
        0,
        &[
            (None, r#"{"id": 1, "name": "a"}"#),
            (None, r#"{"id": "not a number"}"#),
            (None, "{ torn"),
            (None, r#"{"id": 4, "name": "d"}"#),
        ],
    );
    let mut spec = json_source(&env, &topic);
    let mut reader = KafkaReader::open(&spec, &[], subtask(0, 1), 100)
        .await
        .unwrap();
    let err = loop {
        match reader.poll_batch(Duration::from_secs(5)).await {
            Err(e) => break e.to_string(),
            Ok(SourceStep::Batch(_)) => {}
            Ok(other) => panic!("expected a failure, got {other:?}"),
        }
    };
    assert!(
        err.contains(&format!("Kafka topic `{topic}` partition 0 offset 1")),
        "the error names the record: {err}"
    );

    spec.on_error = pb::OnError::Skip as i32;
    let mut reader = KafkaReader::open(&spec, &[], subtask(0, 1), 100)
        .await
        .unwrap();
    let batches = read(&mut reader, usize::MAX).await;
    assert_eq!(ids(&batches), vec![1, 4]);
    assert_eq!(reader.counters().skipped, 2);
    let offsets: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("_offset")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(offsets, vec![0, 3], "metadata stays with the good records");

    let dir = tempfile::tempdir().unwrap();
    spec.on_error = pb::OnError::DeadLetter as i32;
    spec.dead_letter_path = dir.path().to_str().unwrap().to_owned();
    let mut reader = KafkaReader::open(&spec, &["id".into()], subtask(0, 1), 100)
        .await
        .unwrap();
    assert_eq!(ids(&read(&mut reader, usize::MAX).await), vec![1, 4]);
    let letters = std::fs::read_to_string(dir.path().join("bad-0.txt")).unwrap();
    assert!(
        letters.contains("{ torn") && letters.contains("offset 2"),
        "{letters}"
    );
}

#[tokio::test]
async fn a_quiet_topic_lets_the_task_go_on_and_new_records_arrive() {
    let Some(env) = env("kafka_quiet") else {
        return;
    };
    let topic = env.topic("quiet");
    env.create_topic(&topic, 2).await;
    let mut spec = json_source(&env, &topic);
    spec.bounded_latest = false;
    spec.format = pb::KafkaFormat::Raw as i32;
    spec.schema.clear();
    let mut reader = KafkaReader::open(&spec, &["value".into()], subtask(0, 1), 100)
        .await
        .unwrap();
    let started = Instant::now();
    assert!(matches!(
        reader.poll_batch(Duration::from_millis(300)).await.unwrap(),
        SourceStep::Pending
    ));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the wait is bounded"
    );
    env.produce(&topic, 1, &[(None, "hello")]);
    let batch = loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the record never came"
        );
        if let SourceStep::Batch(b) = reader.poll_batch(Duration::from_millis(300)).await.unwrap() {
            break b;
        }
    };
    assert_eq!(batch.batch.column(0).as_string::<i32>().value(0), "hello");
}

#[tokio::test]
async fn an_unreachable_broker_and_a_missing_topic_are_named() {
    let Some(env) = env("kafka_errors") else {
        return;
    };
    let mut spec = json_source(&env, &env.topic("never-created"));
    let err = KafkaReader::open(&spec, &[], subtask(0, 1), 100)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not exist") && err.contains("never-created"),
        "{err}"
    );

    spec.brokers = "127.0.0.1:1".into();
    let started = Instant::now();
    let err = KafkaReader::open(&spec, &[], subtask(0, 1), 100)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("127.0.0.1:1") && err.contains("did not answer"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "no hang: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_sink_writes_keyed_records_the_source_reads_back() {
    let Some(env) = env("kafka_sink") else {
        return;
    };
    let topic = env.topic("out");
    env.create_topic(&topic, 3).await;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..500)),
            Arc::new(StringArray::from_iter_values(
                (0..500).map(|i| format!("line\n{i}")),
            )),
        ],
    )
    .unwrap();
    let sink = pb::KafkaSink {
        brokers: env.brokers.clone(),
        topic: topic.clone(),
        format: pb::KafkaFormat::Json as i32,
        key_columns: vec!["id".into()],
        ..Default::default()
    };
    let mut writer = KafkaWriter::create(&sink, schema.clone(), subtask(0, 1))
        .await
        .unwrap();
    writer.write(&batch).await.unwrap();
    writer.pre_commit(1).await.unwrap();
    writer.write(&batch.slice(0, 10)).await.unwrap();
    writer.finish().await.unwrap();

    // The producer batched, so tansu's end offsets are wrong (see test-support): read
    // unbounded until everything came.
    let mut spec = json_source(&env, &topic);
    spec.bounded_latest = false;
    let mut reader = KafkaReader::open(&spec, &[], subtask(0, 1), 64)
        .await
        .unwrap();
    let mut batches = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while batches.iter().map(RecordBatch::num_rows).sum::<usize>() < 510 {
        assert!(Instant::now() < deadline, "records missing after 30 s");
        if let SourceStep::Batch(b) = reader.poll_batch(Duration::from_millis(200)).await.unwrap() {
            batches.push(b.batch);
        }
    }
    let mut expected: Vec<i64> = (0..500).chain(0..10).collect();
    expected.sort_unstable();
    assert_eq!(ids(&batches), expected);
    for b in &batches {
        let id = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let key = b.column_by_name("_key").unwrap().as_string::<i32>();
        let name = b.column_by_name("name").unwrap().as_string::<i32>();
        for r in 0..b.num_rows() {
            assert_eq!(key.value(r), format!("{{\"id\":{}}}", id.value(r)));
            assert_eq!(name.value(r), format!("line\n{}", id.value(r)));
        }
    }

    let missing = pb::KafkaSink {
        topic: env.topic("absent"),
        ..sink
    };
    let err = KafkaWriter::create(&missing, schema, subtask(0, 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
}

#[tokio::test]
async fn topics_created_while_reading_are_discovered() {
    let Some(env) = env("kafka_discovery") else {
        return;
    };
    let first = env.topic("disc-a");
    env.create_topic(&first, 1).await;
    env.produce(&first, 0, &[(None, "a0")]);
    let spec = pb::KafkaSource {
        brokers: env.brokers.clone(),
        topic_pattern: format!("{}.*", env.topic("disc-")),
        format: pb::KafkaFormat::Raw as i32,
        discovery_interval_ms: 300,
        ..Default::default()
    };
    let mut reader = KafkaReader::open(&spec, &["value".into()], subtask(0, 1), 100)
        .await
        .unwrap();
    assert_eq!(reader.num_splits(), 1);
    let second = env.topic("disc-b");
    env.create_topic(&second, 2).await;
    env.produce(&second, 1, &[(None, "b1")]);
    let mut seen = BTreeSet::new();
    let started = Instant::now();
    while seen.len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the new topic was not discovered: {seen:?}"
        );
        if let SourceStep::Batch(b) = reader.poll_batch(Duration::from_millis(200)).await.unwrap() {
            let values = b.batch.column(0).as_string::<i32>();
            seen.extend((0..values.len()).map(|i| values.value(i).to_owned()));
        }
    }
    assert_eq!(seen, BTreeSet::from(["a0".to_owned(), "b1".to_owned()]));
    let names: Vec<String> = reader
        .positions()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names.len(),
        3,
        "the new topic's partitions are splits with positions: {names:?}"
    );
}

#[tokio::test]
async fn start_positions_follow_latest_and_group_offsets() {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let Some(env) = env("kafka_start") else {
        return;
    };
    let topic = env.topic("start");
    env.create_topic(&topic, 1).await;
    let first: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"id": {i}, "name": "old"}}"#))
        .collect();
    let first: Vec<(Option<&str>, &str)> = first.iter().map(|v| (None, v.as_str())).collect();
    env.produce(&topic, 0, &first);

    let mut spec = json_source(&env, &topic);
    spec.bounded_latest = false;
    spec.start = pb::KafkaStart::Latest as i32;
    let mut latest = KafkaReader::open(&spec, &[], subtask(0, 1), 100)
        .await
        .unwrap();
    // `start: { timestamp }` asks ListOffsets by time, which tansu answers with offset 0
    // for every timestamp: that start is not verified here (see the README).

    // A group that committed offset 3.
    let group = env.topic("group");
    let committer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.brokers)
        .set("group.id", &group)
        .create()
        .unwrap();
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(&topic, 0, Offset::Offset(3))
        .unwrap();
    committer.commit(&offsets, CommitMode::Sync).unwrap();
    spec.start = pb::KafkaStart::GroupOffsets as i32;
    spec.group_id = group;
    let mut grouped = KafkaReader::open(&spec, &[], subtask(0, 1), 100)
        .await
        .unwrap();

    let second: Vec<String> = (5..8)
        .map(|i| format!(r#"{{"id": {i}, "name": "new"}}"#))
        .collect();
    let second: Vec<(Option<&str>, &str)> = second.iter().map(|v| (None, v.as_str())).collect();
    env.produce(&topic, 0, &second);

    async fn until(reader: &mut KafkaReader, n: usize) -> Vec<i64> {
        let mut batches = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while batches.iter().map(RecordBatch::num_rows).sum::<usize>() < n {
            assert!(Instant::now() < deadline, "records missing after 30 s");
            if let SourceStep::Batch(b) =
                reader.poll_batch(Duration::from_millis(200)).await.unwrap()
            {
                batches.push(b.batch);
            }
        }
        ids(&batches)
    }
    assert_eq!(
        until(&mut latest, 3).await,
        vec![5, 6, 7],
        "latest: only what came after"
    );
    assert_eq!(
        until(&mut grouped, 5).await,
        vec![3, 4, 5, 6, 7],
        "the group's offset"
    );
}

#[tokio::test]
async fn committed_checkpoints_commit_their_offsets_to_the_group() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let Some(env) = env("kafka_commit_offsets") else {
        return;
    };
    let topic = topic_with_records(&env, "commit", 2, 10).await;
    let group = env.topic("monitor");
    let mut spec = json_source(&env, &topic);
    spec.commit_offsets = true;
    spec.group_id = group.clone();
    let mut reader = KafkaReader::open(&spec, &[], subtask(0, 1), 4)
        .await
        .unwrap();
    read(&mut reader, 2).await;
    let positions = reader.positions().unwrap();
    reader.checkpoint_committed(&positions);

    let expected: Vec<i64> = {
        let mut v: Vec<(String, i64)> = positions
            .iter()
            .map(|(n, b)| (n.clone(), PartitionPosition::decode(n, b).unwrap().next))
            .collect();
        v.sort();
        v.into_iter().map(|(_, next)| next).collect()
    };
    assert!(
        expected.iter().sum::<i64>() > 0,
        "something was read: {expected:?}"
    );
    let reader_of_group: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.brokers)
        .set("group.id", &group)
        .create()
        .unwrap();
    let started = Instant::now();
    loop {
        let mut list = TopicPartitionList::new();
        list.add_partition(&topic, 0);
        list.add_partition(&topic, 1);
        let found = reader_of_group
            .committed_offsets(list, Duration::from_secs(5))
            .unwrap();
        let got: Vec<i64> = (0..2)
            .map(
                |p| match found.find_partition(&topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => -1,
                },
            )
            .collect();
        if got == expected {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the group has {got:?}, the checkpoint {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
