//! The Kafka sink: one record per row, acknowledged at every checkpoint barrier.
//!
//! Rows are encoded a batch at a time (JSON lines or CSV without a header) and cut into
//! records with the file scanner's rules, so a CSV field holding a newline stays in its
//! record. The key, when the sink names key columns, is those columns encoded the same
//! way. The producer is idempotent, so librdkafka's own retries do not duplicate; what
//! is not acknowledged when a barrier arrives is waited for before the barrier passes,
//! so a completed checkpoint never covers a record the brokers might not have: at least
//! once. A record that cannot be delivered fails the job, which restarts from its last
//! checkpoint.

use std::collections::VecDeque;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use sluice_common::pb;
use sluice_compute::connector::{SinkWriter, SubtaskInfo};
use sluice_compute::error::{Error, Result};

use super::{client_config, lookup_consumer, metadata};
use crate::file::records::RecordScanner;

/// Records awaiting acknowledgement before the writer waits for the oldest.
const MAX_IN_FLIGHT: usize = 100_000;

/// Writes one sink subtask's rows to a topic.
pub struct KafkaWriter {
    producer: FutureProducer,
    topic: String,
    brokers: String,
    format: pb::KafkaFormat,
    key_columns: Vec<usize>,
    in_flight: VecDeque<DeliveryFuture>,
    values: Vec<u8>,
    keys: Vec<u8>,
}

impl std::fmt::Debug for KafkaWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaWriter")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

impl KafkaWriter {
    /// A writer of batches of `schema`; fails when the topic does not exist or the
    /// brokers do not answer.
    pub async fn create(
        spec: &pb::KafkaSink,
        schema: SchemaRef,
        subtask: SubtaskInfo,
    ) -> Result<Self> {
        if spec.format() == pb::KafkaFormat::Raw {
            return Err(Error::Plan(
                "the Kafka sink writes json or csv records, not raw".into(),
            ));
        }
        let key_columns = key_columns(spec, &schema)?;
        {
            let spec = spec.clone();
            tokio::task::spawn_blocking(move || check_topic(&spec))
                .await
                .map_err(|e| Error::Internal(format!("Kafka lookup thread: {e}")))??;
        }
        let client_id = format!("sluice-sink-{}", subtask.index);
        let producer: FutureProducer = client_config(
            &spec.brokers,
            &[
                ("client.id", client_id.as_str()),
                ("enable.idempotence", "true"),
                ("linger.ms", "5"),
                ("message.timeout.ms", "60000"),
            ],
            &spec.properties,
        )
        .create()
        .map_err(|e| {
            Error::Plan(format!(
                "cannot configure a Kafka producer for `{}`: {e}",
                spec.brokers
            ))
        })?;
        Ok(KafkaWriter {
            producer,
            topic: spec.topic.clone(),
            brokers: spec.brokers.clone(),
            format: spec.format(),
            key_columns,
            in_flight: VecDeque::new(),
            values: Vec::with_capacity(64 * 1024),
            keys: Vec::new(),
        })
    }

    /// Waits for the oldest `n` records in flight; an undelivered one is an error.
    async fn settle(&mut self, n: usize) -> Result<()> {
        for _ in 0..n.min(self.in_flight.len()) {
            let Some(delivery) = self.in_flight.pop_front() else {
                break;
            };
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(self.failed(&e)),
                Err(_) => {
                    return Err(Error::External(format!(
                        "the Kafka producer for topic `{}` went away before acknowledging",
                        self.topic
                    )));
                }
            }
        }
        Ok(())
    }

    fn failed(&self, e: &KafkaError) -> Error {
        Error::External(format!(
            "writing to Kafka topic `{}` on brokers `{}` failed: {e}",
            self.topic, self.brokers
        ))
    }
}

#[async_trait]
impl SinkWriter for KafkaWriter {
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let csv = self.format == pb::KafkaFormat::Csv;
        let values = std::mem::take(&mut self.values);
        let values = encode(batch, csv, values)?;
        let value_spans = records(&values, csv, batch.num_rows())?;
        let keys = std::mem::take(&mut self.keys);
        let (keys, key_spans) = if self.key_columns.is_empty() {
            (keys, Vec::new())
        } else {
            let keys = encode(&batch.project(&self.key_columns)?, csv, keys)?;
            let spans = records(&keys, csv, batch.num_rows())?;
            (keys, spans)
        };
        let topic = self.topic.clone();
        let mut result = Ok(());
        for (row, value) in value_spans.iter().enumerate() {
            let mut record =
                FutureRecord::<[u8], [u8]>::to(&topic).payload(&values[value.0..value.1]);
            if let Some(key) = key_spans.get(row) {
                record = record.key(&keys[key.0..key.1]);
            }
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        self.in_flight.push_back(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        // librdkafka's queue is full: wait for the oldest half.
                        record = back;
                        let half = self.in_flight.len().div_ceil(2).max(1);
                        if let Err(e) = self.settle(half).await {
                            result = Err(e);
                            break;
                        }
                        if self.in_flight.is_empty() {
                            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                        }
                    }
                    Err((e, _)) => {
                        result = Err(self.failed(&e));
                        break;
                    }
                }
            }
            if result.is_err() {
                break;
            }
            if self.in_flight.len() >= MAX_IN_FLIGHT {
                result = self.settle(MAX_IN_FLIGHT / 2).await;
                if result.is_err() {
                    break;
                }
            }
        }
        self.values = values;
        self.keys = keys;
        result
    }

    async fn pre_commit(&mut self, _checkpoint: u64) -> Result<Vec<String>> {
        self.settle(usize::MAX).await?;
        Ok(Vec::new())
    }

    async fn finish(&mut self) -> Result<()> {
        self.settle(usize::MAX).await
    }
}

/// The indices of the sink's key columns in `schema`; an error names a missing one.
pub(super) fn key_columns(spec: &pb::KafkaSink, schema: &SchemaRef) -> Result<Vec<usize>> {
    spec.key_columns
        .iter()
        .map(|c| {
            schema.index_of(c).map_err(|_| {
                Error::Plan(format!(
                    "the Kafka sink's key column `{c}` is not in its input; it has {}",
                    schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })
        .collect()
}

/// `batch` encoded into `out` (cleared first), one line per row.
pub(super) fn encode(batch: &RecordBatch, csv: bool, mut out: Vec<u8>) -> Result<Vec<u8>> {
    out.clear();
    if csv {
        let mut w = arrow::csv::WriterBuilder::new()
            .with_header(false)
            .build(&mut out);
        w.write(batch)?;
    } else {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut out);
        w.write(batch)?;
        w.finish()?;
    }
    Ok(out)
}

/// The byte range of each of the `rows` records in `data`.
pub(super) fn records(data: &[u8], csv: bool, rows: usize) -> Result<Vec<(usize, usize)>> {
    let mut found = Vec::with_capacity(rows);
    RecordScanner::new(csv).scan(data, rows + 1, &mut found);
    let spans: Vec<(usize, usize)> = found.iter().map(|s| (s.start, s.end)).collect();
    if spans.len() != rows {
        return Err(Error::Internal(format!(
            "encoded {rows} rows for Kafka but found {} records",
            spans.len()
        )));
    }
    Ok(spans)
}

/// Fails unless the topic exists (blocking: it asks the brokers).
fn check_topic(spec: &pb::KafkaSink) -> Result<()> {
    let consumer = lookup_consumer(&spec.brokers, &spec.properties)?;
    let meta = metadata(&consumer, &spec.brokers, Some(&spec.topic))?;
    let exists = meta
        .topics()
        .iter()
        .any(|t| t.name() == spec.topic && t.error().is_none() && !t.partitions().is_empty());
    if exists {
        Ok(())
    } else {
        Err(super::missing_output_topic(&spec.brokers, &spec.topic))
    }
}
