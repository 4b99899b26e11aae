//! The exactly-once Kafka sink: one transaction per subtask per checkpoint, written by a
//! small transactional producer of our own ([`client`]) so that the producer id and
//! epoch of a pre-committed transaction can be recorded with the checkpoint and a
//! restarted subtask can commit it ([`pending`]). librdkafka cannot resume a
//! transaction another process opened, which is why this path does not use it.
//!
//! A subtask owns [`POOL`] transactional ids, `<prefix>-<subtask>-<slot>`. Rows after a
//! barrier go to a transaction on a free slot (its epoch bumped first, so a recorded
//! epoch names exactly one transaction); at the next barrier everything is produced and
//! acknowledged (pre-commit) and the transaction waits, while rows go to the next slot;
//! when the checkpoint completes, it is committed (EndTxn) and its slot is free again.
//! Records are visible to `read_committed` consumers only after that commit, as with
//! Flink's two-phase Kafka sink.
//!
//! It knows rows, checkpoints and the Kafka protocol; it must not know tasks or state.

pub mod client;
pub mod committed;
pub mod pending;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use sluice_common::pb;
use sluice_compute::connector::{SinkWriter, SubtaskInfo};
use sluice_compute::error::{Error, Result};

use self::client::{Cluster, Ended, KeyValue, ProducerEpoch};
use self::pending::{Entry, POOL, PendingTxn, partition_of, transactional_id};
use super::REQUEST_TIMEOUT;
use super::sink::{encode, key_columns, records};

#[cfg(test)]
mod tests;

/// Bytes of records gathered for one partition before they are produced.
const BATCH_BYTES: usize = 512 << 10;

/// The default transaction timeout: the default most brokers allow at most
/// (`transaction.max.timeout.ms`).
pub const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// What a slot's transactional id holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Not initialised by this writer yet: taken over before the first transaction.
    Unused,
    /// Its last transaction ended; the next use bumps this epoch.
    Free(ProducerEpoch),
    /// Receiving rows, or pre-committed and waiting for its checkpoint.
    Busy,
}

/// The transaction receiving rows since the last barrier.
#[derive(Debug)]
struct Open {
    slot: usize,
    id: String,
    producer: ProducerEpoch,
    added: BTreeSet<i32>,
    sequences: BTreeMap<i32, i32>,
}

/// Writes one sink subtask's rows to a topic, exactly once.
pub struct ExactlyOnceWriter {
    cluster: Cluster,
    topic: String,
    format: pb::KafkaFormat,
    key_columns: Vec<usize>,
    prefix: String,
    subtask: SubtaskInfo,
    transaction_timeout: Duration,
    partitions: usize,
    next_partition: usize,
    slots: [Slot; POOL],
    open: Option<Open>,
    pending: VecDeque<(u64, Open)>,
    buffers: BTreeMap<i32, (Vec<KeyValue>, usize)>,
}

impl std::fmt::Debug for ExactlyOnceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExactlyOnceWriter")
            .field("topic", &self.topic)
            .field("prefix", &self.prefix)
            .field("subtask", &self.subtask.index)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl ExactlyOnceWriter {
    /// A writer of batches of `schema`; fails when the brokers do not answer or the
    /// topic does not exist.
    pub async fn create(
        spec: &pb::KafkaSink,
        schema: SchemaRef,
        subtask: SubtaskInfo,
    ) -> Result<Self> {
        Self::create_with(spec, schema, subtask, None).await
    }

    /// [`create`](Self::create), journaling every transactional request (tests).
    pub async fn create_with(
        spec: &pb::KafkaSink,
        schema: SchemaRef,
        subtask: SubtaskInfo,
        journal: Option<Arc<Mutex<Vec<String>>>>,
    ) -> Result<Self> {
        let key_columns = key_columns(spec, &schema)?;
        if spec.transactional_id_prefix.is_empty() {
            return Err(Error::Plan(
                "an exactly-once Kafka sink needs a transactional_id_prefix".into(),
            ));
        }
        let client_id = format!("sluice-sink-{}", subtask.index);
        let mut cluster = Cluster::new(&spec.brokers, &client_id, REQUEST_TIMEOUT);
        if let Some(j) = journal {
            cluster = cluster.with_journal(j);
        }
        // The first request fails fast: an unreachable broker or a missing topic is a
        // mistake in the job, not a moment to wait out.
        let partitions = cluster.partitions(&spec.topic, true).await?;
        let transaction_timeout = match spec.transaction_timeout_ms {
            0 => DEFAULT_TRANSACTION_TIMEOUT,
            ms => Duration::from_millis(ms),
        };
        Ok(Self {
            cluster,
            topic: spec.topic.clone(),
            format: spec.format(),
            key_columns,
            prefix: spec.transactional_id_prefix.clone(),
            subtask,
            transaction_timeout,
            partitions,
            next_partition: subtask.index,
            slots: [Slot::Unused; POOL],
            open: None,
            pending: VecDeque::new(),
            buffers: BTreeMap::new(),
        })
    }

    /// The open transaction, beginning one on a free slot when there is none.
    ///
    /// The first time, every slot's id is taken over at once (after
    /// [`recover`](SinkWriter::recover), which must commit before it takes over); from
    /// then on an id is only ever bumped from its own epoch, which fails once a newer
    /// attempt took it: a zombie cannot take an id back mid-run.
    async fn open(&mut self) -> Result<&mut Open> {
        if self.slots.contains(&Slot::Unused) {
            for slot in 0..POOL {
                if self.slots[slot] == Slot::Unused {
                    let id = transactional_id(&self.prefix, self.subtask.index, slot);
                    let producer = self
                        .cluster
                        .init(&id, None, self.transaction_timeout)
                        .await?;
                    self.slots[slot] = Slot::Free(producer);
                }
            }
        }
        if self.open.is_none() {
            let Some(slot) = self.slots.iter().position(|s| *s != Slot::Busy) else {
                return Err(Error::External(format!(
                    "the exactly-once Kafka sink for `{}` has {POOL} transactions waiting \
                     for their checkpoints to complete; checkpoints are not completing \
                     (see the job's checkpoint history)",
                    self.topic
                )));
            };
            let id = transactional_id(&self.prefix, self.subtask.index, slot);
            let Slot::Free(current) = self.slots[slot] else {
                return Err(Error::Internal(format!(
                    "Kafka sink slot {slot} is not free"
                )));
            };
            let producer = self
                .cluster
                .init(&id, Some(current), self.transaction_timeout)
                .await?;
            self.slots[slot] = Slot::Busy;
            self.open = Some(Open {
                slot,
                id,
                producer,
                added: BTreeSet::new(),
                sequences: BTreeMap::new(),
            });
        }
        Ok(self.open.as_mut().expect("opened above"))
    }

    /// Produces what is buffered for `partitions` (all when `None`) in the open
    /// transaction.
    async fn flush(&mut self, only: Option<i32>) -> Result<()> {
        let ready: Vec<i32> = match only {
            Some(p) => vec![p],
            None => self.buffers.keys().copied().collect(),
        };
        let ready: Vec<i32> = ready
            .into_iter()
            .filter(|p| self.buffers.get(p).is_some_and(|b| !b.0.is_empty()))
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        let topic = self.topic.clone();
        self.open().await?;
        let open = self.open.as_mut().expect("opened above");
        let new: Vec<i32> = ready
            .iter()
            .copied()
            .filter(|p| !open.added.contains(p))
            .collect();
        if !new.is_empty() {
            self.cluster
                .add_partitions(&open.id, open.producer, &topic, &new)
                .await?;
            open.added.extend(new);
        }
        for p in ready {
            let (records, _) = self.buffers.remove(&p).unwrap_or_default();
            let sequence = open.sequences.entry(p).or_insert(0);
            self.cluster
                .produce(&open.id, open.producer, &topic, p, *sequence, &records)
                .await?;
            *sequence = sequence.wrapping_add(records.len() as i32);
        }
        Ok(())
    }

    /// Commits the pre-committed transactions of checkpoints up to `checkpoint`.
    async fn commit_up_to(&mut self, checkpoint: u64) -> Result<()> {
        while self.pending.front().is_some_and(|(c, _)| *c <= checkpoint) {
            let (c, open) = self.pending.pop_front().expect("checked above");
            match self.cluster.end(&open.id, open.producer, true).await {
                Ok(Ended::Done) => self.slots[open.slot] = Slot::Free(open.producer),
                Ok(Ended::Superseded(why)) => {
                    return Err(Error::External(format!(
                        "the Kafka transaction `{}` of checkpoint {c} could not be committed: \
                         {why}; a newer attempt of this job (or another job with the same \
                         transactional_id_prefix) has taken its transactional id over",
                        open.id
                    )));
                }
                Err(e) => {
                    self.pending.push_front((c, open));
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The lines recorded for a checkpoint: this subtask, then what waits for a commit.
    fn state(&self) -> Vec<String> {
        let mut lines = vec![Entry::Subtask(self.subtask.index).line()];
        for (checkpoint, open) in &self.pending {
            lines.push(
                Entry::Pending(PendingTxn {
                    subtask: self.subtask.index,
                    checkpoint: *checkpoint,
                    id: open.id.clone(),
                    producer: open.producer,
                })
                .line(),
            );
        }
        lines
    }
}

#[async_trait]
impl SinkWriter for ExactlyOnceWriter {
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let csv = self.format == pb::KafkaFormat::Csv;
        let values = encode(batch, csv, Vec::new())?;
        let value_spans = records(&values, csv, batch.num_rows())?;
        let values = Bytes::from(values);
        let keys = if self.key_columns.is_empty() {
            None
        } else {
            let keys = encode(&batch.project(&self.key_columns)?, csv, Vec::new())?;
            let spans = records(&keys, csv, batch.num_rows())?;
            Some((Bytes::from(keys), spans))
        };
        // Unkeyed rows of one batch go to one partition, the next batch to the next.
        let sticky = (self.next_partition % self.partitions.max(1)) as i32;
        self.next_partition = self.next_partition.wrapping_add(1);
        let mut full = BTreeSet::new();
        for (row, (start, end)) in value_spans.into_iter().enumerate() {
            let value = values.slice(start..end);
            let (key, partition) = match &keys {
                Some((keys, spans)) => {
                    let key = keys.slice(spans[row].0..spans[row].1);
                    let p = partition_of(&key, self.partitions);
                    (Some(key), p)
                }
                None => (None, sticky),
            };
            let buffer = self.buffers.entry(partition).or_default();
            buffer.1 += value.len() + key.as_ref().map_or(0, Bytes::len);
            buffer.0.push((key, value));
            if buffer.1 >= BATCH_BYTES {
                full.insert(partition);
            }
        }
        for p in full {
            self.flush(Some(p)).await?;
        }
        Ok(())
    }

    async fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<String>> {
        self.flush(None).await?;
        if let Some(open) = self.open.take() {
            self.pending.push_back((checkpoint, open));
        }
        Ok(self.state())
    }

    async fn commit(&mut self, checkpoint: u64) -> Result<()> {
        self.commit_up_to(checkpoint).await
    }

    async fn recover(&mut self, last_committed: u64, state: &[String]) -> Result<()> {
        let plan = pending::plan(state, self.subtask, last_committed)?;
        for txn in &plan.commit {
            match self.cluster.end(&txn.id, txn.producer, true).await? {
                Ended::Done => tracing::info!(
                    id = %txn.id, checkpoint = txn.checkpoint,
                    "committed a Kafka transaction a failed attempt had pre-committed"
                ),
                Ended::Superseded(why) => tracing::info!(
                    id = %txn.id, checkpoint = txn.checkpoint, %why,
                    "a pre-committed Kafka transaction had been ended before"
                ),
            }
        }
        for subtask in plan.take_over {
            for slot in 0..POOL {
                let id = transactional_id(&self.prefix, subtask, slot);
                let producer = self
                    .cluster
                    .init(&id, None, self.transaction_timeout)
                    .await?;
                if subtask == self.subtask.index {
                    self.slots[slot] = Slot::Free(producer);
                }
            }
        }
        Ok(())
    }

    async fn finish(&mut self) -> Result<()> {
        // The end of a bounded input without a final checkpoint: everything is committed.
        self.flush(None).await?;
        if let Some(open) = self.open.take() {
            self.pending.push_back((u64::MAX, open));
        }
        self.commit_up_to(u64::MAX).await
    }
}
