//! What a `read_committed` consumer sees, read from the partitions' logs with the
//! transaction markers applied here, as a Kafka broker applies them: a transactional
//! record counts once its producer's COMMIT marker follows it, never when an ABORT
//! marker does. tansu 0.6 hands aborted records to `read_committed` consumers, so the
//! tests and `sluice bench kafka`'s exactly-once latency read this way.
//!
//! It fetches from the first bootstrap broker: made for single-broker test setups.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use sluice_compute::error::{Error, Result};

use super::wire::Connection;

const FETCH_V: i16 = 11;

/// Where the reading of one partition stands.
#[derive(Debug, Default)]
struct Cursor {
    offset: i64,
    /// Per producer id, the values of its transaction not ended yet.
    open: BTreeMap<i64, Vec<Bytes>>,
}

/// Reads the committed records of a topic's partitions as they come.
#[derive(Debug)]
pub struct CommittedReader {
    conn: Connection,
    topic: String,
    cursors: Vec<Cursor>,
    /// How long the broker may hold a fetch waiting for records.
    pub max_wait: Duration,
}

impl CommittedReader {
    /// A reader of partitions `0..partitions` of `topic` from their start.
    pub async fn connect(brokers: &str, topic: &str, partitions: i32) -> Result<Self> {
        let addr = brokers.split(',').next().unwrap_or_default().trim();
        let conn =
            Connection::connect(addr, "sluice-committed-reader", super::REQUEST_TIMEOUT).await?;
        Ok(Self {
            conn,
            topic: topic.to_string(),
            cursors: (0..partitions.max(0)).map(|_| Cursor::default()).collect(),
            max_wait: Duration::from_millis(10),
        })
    }

    /// Fetches once from every partition; the values that became committed.
    pub async fn poll(&mut self) -> Result<Vec<Bytes>> {
        let mut out = Vec::new();
        for partition in 0..self.cursors.len() {
            self.fetch(partition, &mut out).await?;
        }
        Ok(out)
    }

    /// Every committed value of `topic` from the start, read until a poll brings
    /// nothing new.
    pub async fn read_all(brokers: &str, topic: &str, partitions: i32) -> Result<Vec<Bytes>> {
        let mut reader = Self::connect(brokers, topic, partitions).await?;
        let mut out = Vec::new();
        loop {
            let before: Vec<i64> = reader.cursors.iter().map(|c| c.offset).collect();
            out.extend(reader.poll().await?);
            if reader.cursors.iter().map(|c| c.offset).eq(before) {
                return Ok(out);
            }
        }
    }

    async fn fetch(&mut self, partition: usize, out: &mut Vec<Bytes>) -> Result<()> {
        let cursor = &mut self.cursors[partition];
        let mut request = FetchRequest::default();
        request.max_wait_ms = self.max_wait.as_millis().min(i32::MAX as u128) as i32;
        request.min_bytes = 1;
        request.max_bytes = 16 << 20;
        request.replica_id = (-1).into();
        let mut p = FetchPartition::default();
        p.partition = partition as i32;
        p.fetch_offset = cursor.offset;
        p.partition_max_bytes = 8 << 20;
        let mut t = FetchTopic::default();
        t.topic = TopicName(StrBytes::from_string(self.topic.clone()));
        t.partitions = vec![p];
        request.topics = vec![t];
        let response = self.conn.call(&request, FETCH_V).await?;
        let Some(data) = response
            .responses
            .first()
            .and_then(|t| t.partitions.first())
        else {
            return Err(Error::External(format!(
                "Kafka broker `{}` answered a fetch of `{}` without its partition",
                self.conn.addr(),
                self.topic
            )));
        };
        if data.error_code != 0 {
            return Err(Error::External(format!(
                "fetching partition {partition} of `{}` from `{}`: error {}",
                self.topic,
                self.conn.addr(),
                data.error_code
            )));
        }
        let Some(mut records) = data.records.clone() else {
            return Ok(());
        };
        let sets = RecordBatchDecoder::decode_all(&mut records)
            .map_err(|e| Error::External(format!("unreadable records of `{}`: {e}", self.topic)))?;
        for r in sets.into_iter().flat_map(|s| s.records) {
            // A fetch may answer from the start of a batch before the offset asked.
            if r.offset < cursor.offset {
                continue;
            }
            cursor.offset = r.offset + 1;
            if r.control {
                // A control record's key: version (i16), then type (i16): 0 abort, 1
                // commit.
                let key = r.key.unwrap_or_default();
                let values = cursor.open.remove(&r.producer_id).unwrap_or_default();
                if key.len() >= 4 && key[3] == 1 {
                    out.extend(values);
                }
            } else if r.transactional {
                cursor
                    .open
                    .entry(r.producer_id)
                    .or_default()
                    .extend(r.value);
            } else {
                out.extend(r.value);
            }
        }
        Ok(())
    }
}
