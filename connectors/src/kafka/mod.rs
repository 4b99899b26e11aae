//! Kafka as a source and a sink, on librdkafka (the `rdkafka` crate, built from source
//! and linked statically).
//!
//! # Source
//!
//! Every partition of the topics a source names is a split, and Sluice, not a consumer
//! group, decides who reads it: partition `p` of topic `t` belongs to subtask
//! `(hash(t) + p) mod parallelism` ([`assign::owner`]), which every subtask computes
//! alone from the brokers' metadata, so new partitions found while running
//! ([`fetch`]) land on exactly one subtask with no coordination. A split's position is
//! the offset of the next record not yet returned and, for `bounded: latest`, the offset
//! it stops at ([`position`]); a checkpoint records them under `topic/partition`, and a
//! restored reader (at any parallelism) seeks each of its partitions there. No offset is
//! committed to a consumer group.
//!
//! Records are polled by one thread per reader ([`fetch`]), gathered per partition into
//! chunks, and decoded by the task ([`source`]) with the same per-record error handling
//! as files: a record that does not decode is named by topic, partition and offset.
//!
//! # Sink
//!
//! [`sink`] writes each row as one record (JSON or CSV, optionally keyed by columns) with
//! an idempotent producer, and waits for every acknowledgement at each checkpoint
//! barrier and at the end: at least once. [`txn`] writes the same records exactly once:
//! one transaction per subtask per checkpoint, committed when the checkpoint completes,
//! by a transactional producer of its own whose pre-committed transactions a restarted
//! subtask can still commit.
//!
//! This module owns the Kafka client and what records mean; it must not know about
//! watermarks, tasks or state.

pub mod admin;
pub mod assign;
pub mod fetch;
pub mod position;
pub mod sink;
pub mod source;
pub mod txn;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use sluice_common::pb;
use sluice_compute::error::{Error, Result};

pub use sink::KafkaWriter;
pub use source::KafkaReader;

/// How long a request to the brokers (metadata, offsets) may take before the job is told
/// they cannot be reached.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The metadata columns every Kafka source offers after the value's columns.
pub const KEY_COLUMN: &str = "_key";
/// The partition a record came from.
pub const PARTITION_COLUMN: &str = "_partition";
/// The record's offset in its partition.
pub const OFFSET_COLUMN: &str = "_offset";
/// The record's Kafka timestamp (create or log-append time), in milliseconds.
pub const TIMESTAMP_COLUMN: &str = "_timestamp";

/// The schema a Kafka source produces before projection: the value's columns, then the
/// metadata columns.
pub fn source_schema(spec: &pb::KafkaSource) -> Result<SchemaRef> {
    let mut fields: Vec<Field> = match spec.format() {
        pb::KafkaFormat::Raw => vec![Field::new("value", DataType::Utf8, true)],
        pb::KafkaFormat::Json | pb::KafkaFormat::Csv => {
            if spec.schema.is_empty() {
                return Err(Error::Plan(
                    "a Kafka source of json or csv records needs a `schema:` naming the \
                     value's columns and types"
                        .into(),
                ));
            }
            let schema = crate::file::schema::explicit_schema(&spec.schema)?;
            schema.fields().iter().map(|f| f.as_ref().clone()).collect()
        }
    };
    for meta in [
        KEY_COLUMN,
        PARTITION_COLUMN,
        OFFSET_COLUMN,
        TIMESTAMP_COLUMN,
    ] {
        if fields.iter().any(|f| f.name() == meta) {
            return Err(Error::Plan(format!(
                "the Kafka source's schema has a column `{meta}`, which is the name of a \
                 metadata column; rename it"
            )));
        }
    }
    fields.extend([
        Field::new(KEY_COLUMN, DataType::Utf8, true),
        Field::new(PARTITION_COLUMN, DataType::Int32, false),
        Field::new(OFFSET_COLUMN, DataType::Int64, false),
        Field::new(
            TIMESTAMP_COLUMN,
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        ),
    ]);
    Ok(Arc::new(Schema::new(fields)))
}

/// A client configuration for `brokers` with the user's `properties` on top of Sluice's
/// defaults.
pub(crate) fn client_config(
    brokers: &str,
    defaults: &[(&str, &str)],
    properties: &HashMap<String, String>,
) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    // A broker that cannot be reached is reported, not retried silently for minutes.
    config.set("socket.connection.setup.timeout.ms", "10000");
    for (key, value) in defaults {
        config.set(*key, *value);
    }
    for (key, value) in properties {
        config.set(key, value);
    }
    config
}

/// A consumer for metadata and offset lookups (it never subscribes).
pub(crate) fn lookup_consumer(
    brokers: &str,
    properties: &HashMap<String, String>,
) -> Result<BaseConsumer> {
    client_config(brokers, &[("enable.auto.commit", "false")], properties)
        .create()
        .map_err(|e| {
            Error::Plan(format!(
                "cannot configure a Kafka client for `{brokers}`: {e}"
            ))
        })
}

/// The brokers' metadata for `topic` (all topics when `None`), with an error that says
/// which brokers could not be reached.
pub(crate) fn metadata(
    consumer: &BaseConsumer,
    brokers: &str,
    topic: Option<&str>,
) -> Result<Metadata> {
    consumer
        .fetch_metadata(topic, REQUEST_TIMEOUT)
        .map_err(|e| unreachable(brokers, "fetch metadata", &e))
}

/// The error of a request the brokers did not answer.
pub(crate) fn unreachable(brokers: &str, what: &str, e: &KafkaError) -> Error {
    Error::External(format!(
        "Kafka brokers `{brokers}` did not answer a request to {what} within {} s: {e}",
        REQUEST_TIMEOUT.as_secs()
    ))
}

/// The partitions of each topic the spec names (or whose name matches its pattern), in
/// topic then partition order; an error names a topic that does not exist.
pub(crate) fn partitions(
    consumer: &BaseConsumer,
    spec: &pb::KafkaSource,
) -> Result<Vec<(String, i32)>> {
    let brokers = spec.brokers.as_str();
    let mut found = Vec::new();
    if spec.topic_pattern.is_empty() {
        // Only the named topics: this runs at every discovery, and a cluster's full
        // metadata can be large.
        for topic in &spec.topics {
            let meta = metadata(consumer, brokers, Some(topic))?;
            let Some(t) = meta.topics().iter().find(|t| t.name() == topic) else {
                return Err(missing_topic(brokers, topic));
            };
            if t.error().is_some() || t.partitions().is_empty() {
                return Err(missing_topic(brokers, topic));
            }
            found.extend(t.partitions().iter().map(|p| (topic.clone(), p.id())));
        }
    } else {
        let meta = metadata(consumer, brokers, None)?;
        let pattern = regex::Regex::new(&format!("^(?:{})$", spec.topic_pattern))
            .map_err(|e| Error::Plan(format!("bad `topic_pattern`: {e}")))?;
        for t in meta.topics() {
            if pattern.is_match(t.name()) && t.error().is_none() {
                found.extend(t.partitions().iter().map(|p| (t.name().to_owned(), p.id())));
            }
        }
        if found.is_empty() {
            return Err(Error::Plan(format!(
                "no topic on Kafka brokers `{brokers}` matches `topic_pattern: {}`",
                spec.topic_pattern
            )));
        }
    }
    found.sort();
    found.dedup();
    Ok(found)
}

fn missing_topic(brokers: &str, topic: &str) -> Error {
    Error::Plan(format!(
        "Kafka topic `{topic}` does not exist on brokers `{brokers}`; create it (for test \
         data: `sluice kafka produce --topic {topic} --partitions N ...`)"
    ))
}

/// A sink's topic does not exist (both Kafka sinks say it alike).
pub(crate) fn missing_output_topic(brokers: &str, topic: &str) -> Error {
    Error::Plan(format!(
        "Kafka topic `{topic}` does not exist on brokers `{brokers}`; create it first"
    ))
}

#[cfg(test)]
mod tests;
