//! The reader of one Kafka source subtask: which partitions it owns, where each starts,
//! and turning the fetch thread's chunks into batches.
//!
//! Opening a reader asks the brokers for the topics' partitions and, for those this
//! subtask owns, the offsets `start` names (and, for `bounded: latest`, the current end),
//! so a checkpoint taken before the first record already holds exact offsets. The fetch
//! thread starts at the first poll, after a restore had its say.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{
    ArrayRef, Int32Array, Int64Array, RecordBatchOptions, StringArray, TimestampMillisecondArray,
};
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use sluice_common::pb;
use sluice_compute::connector::{
    SourceBatch, SourceCounters, SourceReader, SourceStep, SubtaskInfo,
};
use sluice_compute::error::{Error, Result};

use super::fetch::{Assigned, Chunk, FetchOptions, Fetched, Fetcher};
use super::position::PartitionPosition;
use super::{
    KEY_COLUMN, OFFSET_COLUMN, PARTITION_COLUMN, REQUEST_TIMEOUT, TIMESTAMP_COLUMN, assign,
    lookup_consumer, partitions, source_schema, unreachable,
};
use crate::file::dead_letter::DeadLetter;
use crate::file::decode::{BadRecords, TextDecoder, TextFormat, handle_bad};

/// One output column and where it comes from.
#[derive(Debug, Clone, Copy)]
enum Column {
    /// A decoded value column, by its index in the decoded batch.
    Value(usize),
    Key,
    Partition,
    Offset,
    Timestamp,
}

/// How values become columns.
enum Values {
    /// JSON or CSV through arrow's decoders (only the columns the job reads).
    Text(TextDecoder),
    /// The whole value as a string.
    Raw,
    /// The job reads no value column: nothing is decoded.
    Unread,
}

#[derive(Debug, Clone)]
struct Split {
    topic: String,
    partition: i32,
    position: PartitionPosition,
    /// The partition's earliest offset when the reader opened: where a partition the
    /// restored checkpoint does not know starts.
    earliest: i64,
    finished: bool,
}

/// Reads the partitions one source subtask owns.
pub struct KafkaReader {
    spec: pb::KafkaSource,
    subtask: SubtaskInfo,
    schema: SchemaRef,
    columns: Vec<Column>,
    values: Values,
    splits: Vec<Split>,
    batch_size: usize,
    fetcher: Option<Fetcher>,
    ended: bool,
    finished_since: Vec<usize>,
    counters: SourceCounters,
    dead_letter: Option<DeadLetter>,
    /// Commits checkpointed offsets to the source's group (`commit_offsets`).
    committer: Option<BaseConsumer>,
}

impl std::fmt::Debug for KafkaReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaReader")
            .field("brokers", &self.spec.brokers)
            .field("subtask", &self.subtask)
            .field("splits", &self.splits)
            .finish_non_exhaustive()
    }
}

impl KafkaReader {
    /// Opens the reader of `subtask` producing `columns` (all when empty).
    pub async fn open(
        spec: &pb::KafkaSource,
        columns: &[String],
        subtask: SubtaskInfo,
        batch_size: usize,
    ) -> Result<Self> {
        let full = source_schema(spec)?;
        let wanted: Vec<String> = if columns.is_empty() {
            full.fields().iter().map(|f| f.name().clone()).collect()
        } else {
            columns.to_vec()
        };
        let value_fields = full.fields().len() - 4;
        let mut value_indices = Vec::new();
        for name in &wanted {
            let i = full
                .index_of(name)
                .map_err(|_| Error::Plan(format!("the Kafka source has no column `{name}`")))?;
            if i < value_fields && !value_indices.contains(&i) {
                value_indices.push(i);
            }
        }
        value_indices.sort_unstable();
        let columns = wanted
            .iter()
            .map(|name| match name.as_str() {
                KEY_COLUMN => Column::Key,
                PARTITION_COLUMN => Column::Partition,
                OFFSET_COLUMN => Column::Offset,
                TIMESTAMP_COLUMN => Column::Timestamp,
                _ => {
                    let i = full.index_of(name).unwrap_or_default();
                    Column::Value(
                        value_indices
                            .iter()
                            .position(|&v| v == i)
                            .unwrap_or_default(),
                    )
                }
            })
            .collect();
        let indices: Vec<usize> = wanted
            .iter()
            .map(|n| full.index_of(n).unwrap_or_default())
            .collect();
        let schema = Arc::new(full.project(&indices)?);
        let values = if value_indices.is_empty() {
            Values::Unread
        } else {
            match spec.format() {
                pb::KafkaFormat::Raw => Values::Raw,
                format => {
                    let text = if format == pb::KafkaFormat::Csv {
                        TextFormat::Csv
                    } else {
                        TextFormat::JsonLines
                    };
                    let value_schema =
                        Arc::new(full.project(&(0..value_fields).collect::<Vec<_>>())?);
                    Values::Text(
                        TextDecoder::new(text, value_schema, batch_size)
                            .with_projection(value_indices)?,
                    )
                }
            }
        };
        let dead_letter = match spec.on_error() {
            pb::OnError::DeadLetter => Some(DeadLetter::new(
                &spec.dead_letter_path,
                None,
                subtask.index,
            )?),
            _ => None,
        };
        let splits = {
            let spec = spec.clone();
            tokio::task::spawn_blocking(move || owned_splits(&spec, subtask))
                .await
                .map_err(|e| Error::Internal(format!("Kafka lookup thread: {e}")))??
        };
        Ok(KafkaReader {
            spec: spec.clone(),
            subtask,
            schema,
            columns,
            values,
            splits,
            batch_size,
            fetcher: None,
            ended: false,
            finished_since: Vec::new(),
            counters: SourceCounters::default(),
            dead_letter,
            committer: None,
        })
    }

    fn start_fetching(&mut self) -> Result<()> {
        let assigned = self
            .splits
            .iter()
            .enumerate()
            .map(|(index, s)| Assigned {
                index,
                topic: s.topic.clone(),
                partition: s.partition,
                position: s.position,
            })
            .collect();
        let options = FetchOptions {
            spec: self.spec.clone(),
            subtask: self.subtask.index,
            parallelism: self.subtask.parallelism,
            batch_size: self.batch_size,
            with_keys: self.columns.iter().any(|c| matches!(c, Column::Key)),
            with_timestamps: self.columns.iter().any(|c| matches!(c, Column::Timestamp)),
        };
        self.fetcher = Some(Fetcher::start(options, assigned)?);
        Ok(())
    }

    /// The batch of a chunk's good records, and the partition's new position.
    fn decode(&mut self, chunk: Chunk) -> Result<Option<SourceBatch>> {
        let split = &self.splits[chunk.index];
        let (topic, partition) = (split.topic.clone(), split.partition);
        let locate =
            |offset: u64| format!("Kafka topic `{topic}` partition {partition} offset {offset}");
        let mut bad = BadRecords {
            policy: self.spec.on_error(),
            dead_letter: self.dead_letter.as_mut(),
            skipped: &mut self.counters.skipped,
        };
        let (values, kept): (Option<RecordBatch>, Option<Vec<usize>>) = match &mut self.values {
            Values::Unread => (None, None),
            Values::Text(decoder) => {
                match decoder.decode_rows(&chunk.data, &chunk.spans, &locate, &mut bad)? {
                    Some((batch, kept)) => (Some(batch), kept),
                    None => (None, Some(Vec::new())),
                }
            }
            Values::Raw => {
                let mut strings = Vec::with_capacity(chunk.spans.len());
                let mut kept = Vec::with_capacity(chunk.spans.len());
                for (i, span) in chunk.spans.iter().enumerate() {
                    let raw = &chunk.data[span.start..span.end];
                    match std::str::from_utf8(raw) {
                        Ok(s) => {
                            strings.push(s);
                            kept.push(i);
                        }
                        Err(e) => handle_bad(locate(span.line), raw, e.to_string(), &mut bad)?,
                    }
                }
                let all = kept.len() == chunk.spans.len();
                let array: ArrayRef = Arc::new(StringArray::from(strings));
                let batch = RecordBatch::try_new(
                    Arc::new(arrow::datatypes::Schema::new(vec![
                        arrow::datatypes::Field::new(
                            "value",
                            arrow::datatypes::DataType::Utf8,
                            true,
                        ),
                    ])),
                    vec![array],
                )?;
                (Some(batch), (!all).then_some(kept))
            }
        };
        let split = &mut self.splits[chunk.index];
        split.position.next = split.position.next.max(chunk.next);
        let rows: Vec<usize> = match &kept {
            Some(kept) => kept.clone(),
            None => (0..chunk.spans.len()).collect(),
        };
        if rows.is_empty() {
            return Ok(None);
        }
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for column in &self.columns {
            let array: ArrayRef = match column {
                Column::Value(i) => match &values {
                    Some(batch) => batch.column(*i).clone(),
                    None => return Err(Error::Internal("Kafka value column not decoded".into())),
                },
                Column::Key => {
                    let keys: StringArray = rows
                        .iter()
                        .map(|&r| {
                            chunk.keys.get(r).copied().flatten().map(|(s, e)| {
                                String::from_utf8_lossy(&chunk.key_data[s..e]).into_owned()
                            })
                        })
                        .collect();
                    Arc::new(keys)
                }
                Column::Partition => Arc::new(Int32Array::from(vec![partition; rows.len()])),
                Column::Offset => Arc::new(Int64Array::from_iter_values(
                    rows.iter().map(|&r| chunk.spans[r].line as i64),
                )),
                Column::Timestamp => Arc::new(
                    rows.iter()
                        .map(|&r| chunk.timestamps[r])
                        .collect::<TimestampMillisecondArray>(),
                ),
            };
            arrays.push(array);
        }
        let batch = RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some(rows.len())),
        )?;
        self.counters.records += batch.num_rows() as u64;
        Ok(Some(SourceBatch {
            split: chunk.index,
            batch,
        }))
    }
}

#[async_trait]
impl SourceReader for KafkaReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn num_splits(&self) -> usize {
        self.splits.len()
    }

    fn splits_read_concurrently(&self) -> bool {
        true
    }

    fn split_name(&self, split: usize) -> Option<String> {
        self.splits
            .get(split)
            .map(|s| assign::split_name(&s.topic, s.partition))
    }

    async fn next_batch(&mut self) -> Result<Option<SourceBatch>> {
        loop {
            match self.poll_batch(Duration::from_secs(1)).await? {
                SourceStep::Batch(batch) => return Ok(Some(batch)),
                SourceStep::End => return Ok(None),
                SourceStep::Pending => {}
            }
        }
    }

    async fn poll_batch(&mut self, wait: Duration) -> Result<SourceStep> {
        if self.ended {
            return Ok(SourceStep::End);
        }
        if self.fetcher.is_none() {
            self.start_fetching()?;
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let Some(fetcher) = self.fetcher.as_mut() else {
                return Err(Error::Internal("Kafka fetcher missing".into()));
            };
            let item = match tokio::time::timeout_at(deadline, fetcher.rx.recv()).await {
                Err(_) => return Ok(SourceStep::Pending),
                Ok(item) => item,
            };
            match item {
                None => {
                    // The thread ends only when every bounded partition finished.
                    self.ended = true;
                    if let Some(dead_letter) = self.dead_letter.as_mut() {
                        dead_letter.finish().await?;
                    }
                    return Ok(SourceStep::End);
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(Fetched::Added {
                    index,
                    topic,
                    partition,
                    next,
                })) => {
                    if index != self.splits.len() {
                        return Err(Error::Internal("Kafka split numbering diverged".into()));
                    }
                    self.splits.push(Split {
                        topic,
                        partition,
                        position: PartitionPosition { next, end: None },
                        earliest: next,
                        finished: false,
                    });
                }
                Some(Ok(Fetched::Finished { index })) => {
                    let split = &mut self.splits[index];
                    split.finished = true;
                    if let Some(end) = split.position.end {
                        split.position.next = split.position.next.max(end);
                    }
                    self.finished_since.push(index);
                }
                Some(Ok(Fetched::Chunk(chunk))) => {
                    if let Some(batch) = self.decode(chunk)? {
                        return Ok(SourceStep::Batch(batch));
                    }
                }
            }
        }
    }

    fn checkpoint_committed(&mut self, positions: &[(String, Bytes)]) {
        if !self.spec.commit_offsets {
            return;
        }
        if self.committer.is_none() {
            let mut properties = self.spec.properties.clone();
            properties.insert("group.id".into(), self.spec.group_id.clone());
            match lookup_consumer(&self.spec.brokers, &properties) {
                Ok(c) => self.committer = Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot commit Kafka offsets to the group");
                    return;
                }
            }
        }
        let mut list = TopicPartitionList::new();
        for split in &self.splits {
            let name = assign::split_name(&split.topic, split.partition);
            let Some((_, bytes)) = positions.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            if let Ok(p) = PartitionPosition::decode(&name, bytes) {
                // Kafka's convention: the committed offset is the next one to read.
                let _ = list.add_partition_offset(
                    &split.topic,
                    split.partition,
                    Offset::Offset(p.next),
                );
            }
        }
        if let Some(committer) = &self.committer
            && list.count() > 0
            && let Err(e) = committer.commit(&list, rdkafka::consumer::CommitMode::Async)
        {
            tracing::warn!(group = %self.spec.group_id, error = %e, "committing Kafka offsets");
        }
    }

    fn take_finished_splits(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.finished_since)
    }

    fn counters(&self) -> SourceCounters {
        self.counters
    }

    fn positions(&self) -> Result<Vec<(String, Bytes)>> {
        Ok(self
            .splits
            .iter()
            .map(|s| {
                (
                    assign::split_name(&s.topic, s.partition),
                    s.position.encode(),
                )
            })
            .collect())
    }

    fn restore(&mut self, positions: &HashMap<String, Bytes>) -> Result<()> {
        if self.fetcher.is_some() {
            return Err(Error::Internal(
                "a Kafka reader restored after it started".into(),
            ));
        }
        for split in &mut self.splits {
            let name = assign::split_name(&split.topic, split.partition);
            split.position = match positions.get(&name) {
                Some(bytes) => PartitionPosition::decode(&name, bytes)?,
                // Created after the checkpoint: read from its start, like a partition
                // found while running.
                None => PartitionPosition {
                    next: split.earliest,
                    end: split.position.end,
                },
            };
        }
        Ok(())
    }
}

/// The partitions `subtask` owns, each at the offset `start` names (blocking: it asks
/// the brokers).
fn owned_splits(spec: &pb::KafkaSource, subtask: SubtaskInfo) -> Result<Vec<Split>> {
    let consumer = lookup_consumer(&spec.brokers, &spec.properties)?;
    let all = partitions(&consumer, spec)?;
    let brokers = spec.brokers.as_str();
    let mut splits = Vec::new();
    let mine: Vec<(String, i32)> = all
        .into_iter()
        .filter(|(t, p)| assign::owner(t, *p, subtask.parallelism) == subtask.index)
        .collect();
    let starts = start_offsets(&consumer, spec, &mine)?;
    for ((topic, partition), start) in mine.into_iter().zip(starts) {
        let (low, high) = consumer
            .fetch_watermarks(&topic, partition, REQUEST_TIMEOUT)
            .map_err(|e| unreachable(brokers, "read a partition's offsets", &e))?;
        let next = match start {
            Start::Earliest => low,
            Start::Latest => high,
            Start::At(offset) => offset.clamp(low, high),
        };
        splits.push(Split {
            topic,
            partition,
            position: PartitionPosition {
                next,
                end: spec.bounded_latest.then_some(high),
            },
            earliest: low,
            finished: false,
        });
    }
    Ok(splits)
}

enum Start {
    Earliest,
    Latest,
    At(i64),
}

/// Where each partition starts under the source's `start`.
fn start_offsets(
    consumer: &BaseConsumer,
    spec: &pb::KafkaSource,
    partitions: &[(String, i32)],
) -> Result<Vec<Start>> {
    let brokers = spec.brokers.as_str();
    match spec.start() {
        pb::KafkaStart::Earliest => Ok(partitions.iter().map(|_| Start::Earliest).collect()),
        pb::KafkaStart::Latest => Ok(partitions.iter().map(|_| Start::Latest).collect()),
        pb::KafkaStart::Timestamp => {
            let mut list = TopicPartitionList::new();
            for (t, p) in partitions {
                list.add_partition_offset(t, *p, Offset::Offset(spec.start_timestamp_ms))
                    .map_err(|e| Error::Plan(format!("Kafka partition {t}/{p}: {e}")))?;
            }
            let found = consumer
                .offsets_for_times(list, REQUEST_TIMEOUT)
                .map_err(|e| unreachable(brokers, "look up offsets by timestamp", &e))?;
            Ok(partitions
                .iter()
                .map(
                    |(t, p)| match found.find_partition(t, *p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => Start::At(o),
                        // No record at or after the timestamp: start at the end.
                        _ => Start::Latest,
                    },
                )
                .collect())
        }
        pb::KafkaStart::GroupOffsets => {
            if spec.group_id.is_empty() {
                return Err(Error::Plan(
                    "`start: group_offsets` needs the Kafka source's `group_id`".into(),
                ));
            }
            let mut properties = spec.properties.clone();
            properties.insert("group.id".into(), spec.group_id.clone());
            let grouped = lookup_consumer(brokers, &properties)?;
            let mut list = TopicPartitionList::new();
            for (t, p) in partitions {
                list.add_partition(t, *p);
            }
            let found = grouped
                .committed_offsets(list, REQUEST_TIMEOUT)
                .map_err(|e| unreachable(brokers, "read the group's committed offsets", &e))?;
            Ok(partitions
                .iter()
                .map(
                    |(t, p)| match found.find_partition(t, *p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => Start::At(o),
                        _ => Start::Earliest,
                    },
                )
                .collect())
        }
    }
}
