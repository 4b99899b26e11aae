//! The thread that polls one source subtask's consumer.
//!
//! librdkafka's consumer is polled by a blocking call, so each reader owns a thread that
//! polls it and hands the task chunks of raw records, one partition per chunk, through a
//! bounded channel (when the task falls behind, the thread waits and librdkafka's
//! prefetch queue fills up to its limit: back pressure reaches the brokers). A chunk is
//! sent when it holds a batch's worth of records, or as soon as the consumer has nothing
//! more buffered, so a quiet topic's records are not held back.
//!
//! The thread also finds partitions created while the job runs (bounded reads do not
//! look) and ends bounded partitions at their end offset. It never decodes records and
//! never decides positions: the reader records a partition's position only for records
//! it returned.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use sluice_common::pb;
use sluice_compute::error::{Error, Result};
use tokio::sync::mpsc;

use super::position::PartitionPosition;
use super::{assign, client_config, partitions};
use crate::file::records::RecordSpan;

/// How often new partitions are looked for when the source does not say.
pub const DEFAULT_DISCOVERY_INTERVAL: Duration = Duration::from_secs(10);
/// How long one poll waits when nothing is buffered.
const POLL: Duration = Duration::from_millis(100);
/// Chunks in flight between the thread and the task.
const CHANNEL_CHUNKS: usize = 4;

/// A partition the thread reads, as the reader numbered it.
#[derive(Debug, Clone)]
pub struct Assigned {
    /// The reader's split index.
    pub index: usize,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Where reading starts and (bounded) stops.
    pub position: PartitionPosition,
}

/// Raw records of one partition, in offset order.
#[derive(Debug, Default)]
pub struct Chunk {
    /// The reader's split index.
    pub index: usize,
    /// The values, each followed by a newline.
    pub data: Vec<u8>,
    /// Each value's bytes in `data`; `line` holds the record's offset.
    pub spans: Vec<RecordSpan>,
    /// The keys' bytes, when the reader asked for keys.
    pub key_data: Vec<u8>,
    /// Each key's range in `key_data` (`None`: the record had no key).
    pub keys: Vec<Option<(usize, usize)>>,
    /// The records' Kafka timestamps in milliseconds (empty unless asked for).
    pub timestamps: Vec<Option<i64>>,
    /// The offset after the last record.
    pub next: i64,
}

/// What the thread hands the reader.
#[derive(Debug)]
pub enum Fetched {
    /// Records of one partition.
    Chunk(Chunk),
    /// A partition created while the job ran, owned by this subtask; it is read from its
    /// earliest offset.
    Added {
        /// The split index the thread gave it (the next after the reader's last).
        index: usize,
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Its earliest offset.
        next: i64,
    },
    /// A bounded partition has nothing more.
    Finished {
        /// The split index.
        index: usize,
    },
}

/// What the thread needs to know.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The source.
    pub spec: pb::KafkaSource,
    /// This subtask and its siblings' count (for discovered partitions).
    pub subtask: usize,
    /// Number of source subtasks.
    pub parallelism: usize,
    /// Records per chunk.
    pub batch_size: usize,
    /// Whether to copy record keys.
    pub with_keys: bool,
    /// Whether to keep record timestamps.
    pub with_timestamps: bool,
}

/// The polling thread of one reader; dropping it stops the thread.
#[derive(Debug)]
pub struct Fetcher {
    /// What the thread sent (an `Err` is its last message).
    pub rx: mpsc::Receiver<Result<Fetched>>,
    stop: Arc<AtomicBool>,
    _thread: JoinHandle<()>,
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        // The thread sees this within one poll; it is not joined, so a task never waits
        // on a broker to be cancelled.
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Fetcher {
    /// Starts polling `assigned` (partitions already at their end are reported finished
    /// at once).
    pub fn start(options: FetchOptions, assigned: Vec<Assigned>) -> Result<Self> {
        let bounded = options.spec.bounded_latest;
        // librdkafka wants a group even for assigned partitions; the consumer never joins
        // it (no subscribe) and never commits to it.
        let group = match options.spec.group_id.as_str() {
            "" => "sluice",
            id => id,
        };
        let consumer: BaseConsumer = client_config(
            &options.spec.brokers,
            &[
                ("group.id", group),
                ("enable.auto.commit", "false"),
                ("auto.offset.reset", "earliest"),
                (
                    "enable.partition.eof",
                    if bounded { "true" } else { "false" },
                ),
                // librdkafka prefetches up to 64 MiB per consumer by default.
                ("queued.max.messages.kbytes", "16384"),
            ],
            &options.spec.properties,
        )
        .create()
        .map_err(|e| {
            Error::Plan(format!(
                "cannot configure a Kafka consumer for `{}`: {e}",
                options.spec.brokers
            ))
        })?;
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("kafka-fetch-{}", options.subtask))
                .spawn(move || {
                    let mut poller = Poller::new(consumer, options, tx.clone(), stop);
                    if let Err(e) = poller.run(assigned) {
                        let _ = tx.blocking_send(Err(e));
                    }
                })
                .map_err(|e| Error::io("a Kafka fetch thread", e))?
        };
        Ok(Fetcher {
            rx,
            stop,
            _thread: thread,
        })
    }
}

struct Poller {
    consumer: BaseConsumer,
    options: FetchOptions,
    tx: mpsc::Sender<Result<Fetched>>,
    stop: Arc<AtomicBool>,
    /// Split index by topic and partition.
    index: HashMap<String, HashMap<i32, usize>>,
    /// For a source of one named topic, split index by partition number: a lookup per
    /// record without reading the record's topic name.
    single_topic: Option<Vec<Option<usize>>>,
    /// Bytes per record seen so far, to size the next chunk at once.
    record_bytes: usize,
    /// Per split index: its topic, partition and end (bounded), and whether it finished.
    splits: Vec<PolledSplit>,
    open: HashMap<usize, Chunk>,
}

struct PolledSplit {
    topic: String,
    partition: i32,
    end: Option<i64>,
    finished: bool,
}

/// The receiver is gone: the reader was dropped.
struct Closed;

impl Poller {
    fn new(
        consumer: BaseConsumer,
        options: FetchOptions,
        tx: mpsc::Sender<Result<Fetched>>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        Poller {
            consumer,
            options,
            tx,
            stop,
            index: HashMap::new(),
            single_topic: None,
            record_bytes: 64,
            splits: Vec::new(),
            open: HashMap::new(),
        }
    }

    /// Files `partition` of `topic` under split `index`.
    fn register(&mut self, topic: &str, partition: i32, index: usize) {
        self.index
            .entry(topic.to_owned())
            .or_default()
            .insert(partition, index);
        if let Some(by_partition) = self.single_topic.as_mut() {
            let p = partition.max(0) as usize;
            if by_partition.len() <= p {
                by_partition.resize(p + 1, None);
            }
            by_partition[p] = Some(index);
        }
    }

    /// The split a record belongs to.
    fn lookup(&self, msg: &rdkafka::message::BorrowedMessage<'_>) -> Option<usize> {
        match &self.single_topic {
            Some(by_partition) => by_partition
                .get(usize::try_from(msg.partition()).ok()?)
                .copied()
                .flatten(),
            None => self
                .index
                .get(msg.topic())
                .and_then(|t| t.get(&msg.partition()))
                .copied(),
        }
    }

    fn run(&mut self, assigned: Vec<Assigned>) -> Result<()> {
        let mut list = TopicPartitionList::new();
        let mut done = Vec::new();
        let spec = &self.options.spec;
        if spec.topic_pattern.is_empty() && spec.topics.len() == 1 {
            self.single_topic = Some(Vec::new());
        }
        for a in &assigned {
            if a.index != self.splits.len() {
                return Err(Error::Internal(
                    "Kafka splits are not numbered densely".into(),
                ));
            }
            self.register(&a.topic, a.partition, a.index);
            self.splits.push(PolledSplit {
                topic: a.topic.clone(),
                partition: a.partition,
                end: a.position.end,
                finished: false,
            });
            if a.position.is_done() {
                done.push(a.index);
            } else {
                list.add_partition_offset(&a.topic, a.partition, Offset::Offset(a.position.next))
                    .map_err(|e| self.failed("assign partitions", &e))?;
            }
        }
        self.consumer
            .assign(&list)
            .map_err(|e| self.failed("assign partitions", &e))?;
        for index in done {
            if self.finish(index).is_err() {
                return Ok(());
            }
        }
        let _ = self.poll_loop();
        Ok(())
    }

    fn poll_loop(&mut self) -> std::result::Result<(), Closed> {
        let bounded = self.options.spec.bounded_latest;
        let discovery = match self.options.spec.discovery_interval_ms {
            0 => DEFAULT_DISCOVERY_INTERVAL,
            ms => Duration::from_millis(ms),
        };
        let mut next_discovery = Instant::now() + discovery;
        // Not `now - 60 s`: that panics on a machine up for less than a minute.
        let mut warned: Option<Instant> = None;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if bounded && self.splits.iter().all(|s| s.finished) {
                // Dropping the sender ends the reader's input.
                return Ok(());
            }
            if !bounded && Instant::now() >= next_discovery {
                self.discover()?;
                next_discovery = Instant::now() + discovery;
            }
            let wait = if self.open.is_empty() {
                POLL
            } else {
                Duration::ZERO
            };
            match self.consumer.poll(wait) {
                None => self.flush_all()?,
                Some(Ok(msg)) => {
                    let Some(index) = self.lookup(&msg) else {
                        continue;
                    };
                    let split = &self.splits[index];
                    if split.finished {
                        continue;
                    }
                    let end = split.end;
                    let offset = msg.offset();
                    if end.is_some_and(|end| offset >= end) {
                        self.finish(index)?;
                        continue;
                    }
                    let full = append(
                        &mut self.open,
                        index,
                        &msg,
                        &self.options,
                        self.record_bytes,
                    );
                    if full {
                        self.flush(index)?;
                    }
                    if end.is_some_and(|end| offset + 1 >= end) {
                        self.finish(index)?;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    // The fetch position reached the high watermark, which is at or past
                    // the end a bounded read fixed at its start. The event names no
                    // topic: only an unambiguous partition number can be ended by it
                    // (others end when a record at or past their end arrives).
                    let candidates: Vec<usize> = (0..self.splits.len())
                        .filter(|&i| {
                            let s = &self.splits[i];
                            !s.finished && s.partition == partition
                        })
                        .collect();
                    if let [index] = candidates.as_slice() {
                        self.finish(*index)?;
                    }
                }
                Some(Err(e)) => {
                    if is_fatal(&e) {
                        let err = self.failed("read", &e);
                        self.send(Err(err))?;
                        return Ok(());
                    }
                    // librdkafka retries transient failures (a broker restarting, say)
                    // itself; say so once a minute rather than on every poll.
                    if warned.is_none_or(|w| w.elapsed() >= Duration::from_secs(60)) {
                        tracing::warn!(brokers = %self.options.spec.brokers, error = %e, "Kafka consumer");
                        warned = Some(Instant::now());
                    }
                }
            }
        }
    }

    fn flush(&mut self, index: usize) -> std::result::Result<(), Closed> {
        match self.open.remove(&index) {
            Some(chunk) if !chunk.spans.is_empty() => {
                self.record_bytes = chunk.data.len().div_ceil(chunk.spans.len());
                self.send(Ok(Fetched::Chunk(chunk)))
            }
            _ => Ok(()),
        }
    }

    fn flush_all(&mut self) -> std::result::Result<(), Closed> {
        let mut indices: Vec<usize> = self.open.keys().copied().collect();
        indices.sort_unstable();
        for index in indices {
            self.flush(index)?;
        }
        Ok(())
    }

    /// Ends a bounded partition: its last records, then the word that it finished.
    fn finish(&mut self, index: usize) -> std::result::Result<(), Closed> {
        self.flush(index)?;
        let split = &mut self.splits[index];
        split.finished = true;
        let mut list = TopicPartitionList::new();
        list.add_partition(&split.topic, split.partition);
        // Stop fetching it; a failure only costs fetches whose records are dropped.
        let _ = self.consumer.incremental_unassign(&list);
        self.send(Ok(Fetched::Finished { index }))
    }

    /// Looks for partitions created since the last look and starts reading those this
    /// subtask owns.
    fn discover(&mut self) -> std::result::Result<(), Closed> {
        let found = match partitions(&self.consumer, &self.options.spec) {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "looking for new Kafka partitions");
                return Ok(());
            }
        };
        for (topic, partition) in found {
            let known = self
                .index
                .get(&topic)
                .is_some_and(|t| t.contains_key(&partition));
            if known
                || assign::owner(&topic, partition, self.options.parallelism)
                    != self.options.subtask
            {
                continue;
            }
            let next = match self.consumer.fetch_watermarks(
                &topic,
                partition,
                super::REQUEST_TIMEOUT,
            ) {
                Ok((low, _)) => low,
                Err(e) => {
                    tracing::warn!(topic, partition, error = %e, "reading a new partition's first offset");
                    continue;
                }
            };
            let mut list = TopicPartitionList::new();
            if list
                .add_partition_offset(&topic, partition, Offset::Offset(next))
                .is_err()
                || self.consumer.incremental_assign(&list).is_err()
            {
                tracing::warn!(topic, partition, "could not start reading a new partition");
                continue;
            }
            let index = self.splits.len();
            self.register(&topic, partition, index);
            self.splits.push(PolledSplit {
                topic: topic.clone(),
                partition,
                end: None,
                finished: false,
            });
            tracing::info!(topic, partition, "reading a new Kafka partition");
            self.send(Ok(Fetched::Added {
                index,
                topic,
                partition,
                next,
            }))?;
        }
        Ok(())
    }

    fn send(&self, item: Result<Fetched>) -> std::result::Result<(), Closed> {
        self.tx.blocking_send(item).map_err(|_| Closed)
    }

    fn failed(&self, what: &str, e: &KafkaError) -> Error {
        Error::External(format!(
            "Kafka source on brokers `{}` could not {what}: {e}",
            self.options.spec.brokers
        ))
    }
}

/// Adds a record to its partition's chunk; true when the chunk is full.
fn append(
    open: &mut HashMap<usize, Chunk>,
    index: usize,
    msg: &rdkafka::message::BorrowedMessage<'_>,
    options: &FetchOptions,
    record_bytes: usize,
) -> bool {
    let batch_size = options.batch_size;
    // Sized for a batch at once: growing a megabyte buffer by doubling copies it a
    // dozen times.
    let chunk = open.entry(index).or_insert_with(|| Chunk {
        index,
        data: Vec::with_capacity(batch_size * (record_bytes + 1)),
        spans: Vec::with_capacity(batch_size),
        timestamps: Vec::with_capacity(if options.with_timestamps {
            batch_size
        } else {
            0
        }),
        ..Chunk::default()
    });
    let payload = trim_newline(msg.payload().unwrap_or_default());
    let start = chunk.data.len();
    chunk.data.extend_from_slice(payload);
    let end = chunk.data.len();
    chunk.data.push(b'\n');
    let offset = msg.offset();
    chunk.spans.push(RecordSpan {
        start,
        end,
        next: end + 1,
        line: offset.max(0) as u64,
    });
    if options.with_keys {
        chunk.keys.push(msg.key().map(|k| {
            let s = chunk.key_data.len();
            chunk.key_data.extend_from_slice(k);
            (s, chunk.key_data.len())
        }));
    }
    if options.with_timestamps {
        chunk.timestamps.push(msg.timestamp().to_millis());
    }
    chunk.next = offset + 1;
    chunk.spans.len() >= batch_size
}

/// Failures librdkafka will not get past by retrying.
fn is_fatal(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::Fatal
        )
    )
}

/// A value without its trailing line terminator (records are joined by newlines).
fn trim_newline(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes.strip_suffix(b"\r").unwrap_or(bytes)
}
