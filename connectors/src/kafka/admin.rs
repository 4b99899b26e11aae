//! Topics and test data: what `sluice kafka produce` and `sluice bench kafka` need to
//! load generated events into a topic.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use sluice_common::pb;
use sluice_compute::connector::{SinkWriter, SourceReader, SubtaskInfo};
use sluice_compute::error::{Error, Result};

use super::KafkaWriter;
use crate::nexmark::NexmarkReader;

use super::{REQUEST_TIMEOUT, client_config, lookup_consumer, metadata};

/// Creates `topic` with `partitions` partitions unless it exists; returns its partition
/// count either way.
pub async fn ensure_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
    properties: &HashMap<String, String>,
) -> Result<usize> {
    let existing = {
        let (brokers, topic, properties) =
            (brokers.to_owned(), topic.to_owned(), properties.clone());
        tokio::task::spawn_blocking(move || -> Result<usize> {
            let consumer = lookup_consumer(&brokers, &properties)?;
            let meta = metadata(&consumer, &brokers, Some(&topic))?;
            Ok(meta
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none())
                .map_or(0, |t| t.partitions().len()))
        })
        .await
        .map_err(|e| Error::Internal(format!("Kafka lookup thread: {e}")))??
    };
    if existing > 0 {
        return Ok(existing);
    }
    let admin: AdminClient<DefaultClientContext> = client_config(brokers, &[], properties)
        .create()
        .map_err(|e| Error::Plan(format!("cannot configure a Kafka admin client: {e}")))?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new()
        .operation_timeout(Some(REQUEST_TIMEOUT))
        .request_timeout(Some(REQUEST_TIMEOUT + Duration::from_secs(5)));
    let results = admin
        .create_topics([&new], &options)
        .await
        .map_err(|e| super::unreachable(brokers, "create a topic", &e))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(Error::External(format!(
                    "Kafka brokers `{brokers}` refused to create topic `{name}`: {code}"
                )));
            }
        }
    }
    Ok(partitions as usize)
}

/// Writes the events of `source` (the built-in generator, as one subtask) to the topic
/// `sink` names, through the Kafka sink's writer; returns how many were written.
pub async fn produce_nexmark(source: &pb::NexmarkSource, sink: &pb::KafkaSink) -> Result<u64> {
    let info = SubtaskInfo {
        index: 0,
        parallelism: 1,
        fence: 0,
    };
    let mut reader = NexmarkReader::new(source, info, 8192)?;
    let mut writer = KafkaWriter::create(sink, reader.schema(), info).await?;
    let mut written = 0u64;
    while let Some(b) = reader.next_batch().await? {
        written += b.batch.num_rows() as u64;
        writer.write(&b.batch).await?;
    }
    writer.finish().await?;
    Ok(written)
}
