//! The transactional requests of a Kafka producer, over [`wire`](super::wire): find a
//! transaction coordinator, take over or bump a transactional id (InitProducerId), add
//! partitions to a transaction, produce a record batch, and end a transaction, each by
//! producer id and epoch given by the caller.
//!
//! Unlike librdkafka, nothing here hides the producer id and epoch: the sink records them
//! with a checkpoint, and a restarted subtask ends a transaction a dead process left
//! pre-committed by sending EndTxn with them (what Flink does through reflection on the
//! Java client). Retriable errors (a coordinator moving or loading, a leader changing,
//! a transaction still ending) are retried with backoff until [`Cluster::deadline`];
//! every InitProducerId, AddPartitionsToTxn and EndTxn can be journaled, so tests see what
//! was asked in which order.
//!
//! It knows nothing of rows, checkpoints or subtasks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, EndTxnRequest, FindCoordinatorRequest, InitProducerIdRequest,
    MetadataRequest, ProduceRequest, ProducerId, TopicName, TransactionalId,
    add_partitions_to_txn_request::AddPartitionsToTxnTopic,
    metadata_request::MetadataRequestTopic,
    produce_request::{PartitionProduceData, TopicProduceData},
};
use kafka_protocol::protocol::{Request, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use sluice_compute::error::{Error, Result};

use super::wire::{CLOSED_IN_ANSWER, Connection};

/// Request versions, chosen as the oldest that Kafka 2.8 to 4.x and tansu all accept.
const METADATA_V: i16 = 9;
const FIND_COORDINATOR_V: i16 = 3;
const INIT_PRODUCER_ID_V: i16 = 3;
const ADD_PARTITIONS_V: i16 = 3;
const PRODUCE_V: i16 = 8;
const END_TXN_V: i16 = 3;

/// A producer's identity in the transaction coordinator: id and epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerEpoch {
    /// The producer id.
    pub id: i64,
    /// Its epoch; a newer one fences every older one.
    pub epoch: i16,
}

/// How ending a transaction went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The coordinator ended it as asked (or had, when asked again).
    Done,
    /// The producer epoch was superseded or the transaction was no longer open: its
    /// outcome was decided before (by an earlier commit, or by a takeover that aborted
    /// it). Named by the broker's error.
    Superseded(String),
}

/// A record to produce: key and value.
pub type KeyValue = (Option<Bytes>, Bytes);

/// Requests to one Kafka cluster.
#[derive(Debug)]
pub struct Cluster {
    bootstrap: Vec<String>,
    client_id: String,
    timeout: Duration,
    /// How long a request is retried on retriable errors.
    pub deadline: Duration,
    brokers: HashMap<i32, String>,
    conns: HashMap<String, Connection>,
    leaders: HashMap<String, Vec<i32>>,
    coordinators: HashMap<String, String>,
    journal: Option<Arc<Mutex<Vec<String>>>>,
    /// The brokers bump an epoch given the current one (KIP-360); tansu 0.6 does not.
    bumps: bool,
}

impl Cluster {
    /// A client of the brokers `bootstrap` (comma-separated `host:port`); connects lazily.
    pub fn new(bootstrap: &str, client_id: &str, timeout: Duration) -> Self {
        Self {
            bootstrap: bootstrap
                .split(',')
                .map(|b| b.trim().to_string())
                .filter(|b| !b.is_empty())
                .collect(),
            client_id: client_id.to_string(),
            timeout,
            deadline: Duration::from_secs(60),
            brokers: HashMap::new(),
            conns: HashMap::new(),
            leaders: HashMap::new(),
            coordinators: HashMap::new(),
            journal: None,
            bumps: true,
        }
    }

    /// Records every InitProducerId, AddPartitionsToTxn and EndTxn and its outcome as a
    /// line in `journal` (Produce requests are not: they are many).
    pub fn with_journal(mut self, journal: Arc<Mutex<Vec<String>>>) -> Self {
        self.journal = Some(journal);
        self
    }

    fn note(&self, line: String) {
        if let Some(j) = &self.journal
            && let Ok(mut j) = j.lock()
        {
            j.push(line);
        }
    }

    /// Whether the brokers bump a producer's epoch given the current one (KIP-360), so
    /// that a zombie cannot begin a transaction; learnt at the first bump.
    pub fn bumps_epochs(&self) -> bool {
        self.bumps
    }

    /// The partitions of `topic` (asking the brokers when not known or `refresh`).
    pub async fn partitions(&mut self, topic: &str, refresh: bool) -> Result<usize> {
        if refresh || !self.leaders.contains_key(topic) {
            self.refresh(topic).await?;
        }
        Ok(self.leaders.get(topic).map_or(0, Vec::len))
    }

    async fn refresh(&mut self, topic: &str) -> Result<()> {
        let mut request = MetadataRequest::default();
        let mut t = MetadataRequestTopic::default();
        t.name = Some(TopicName(StrBytes::from_string(topic.to_string())));
        request.topics = Some(vec![t]);
        request.allow_auto_topic_creation = false;
        let addr = self.any_broker().await?;
        let response = self.call(&addr, &request, METADATA_V).await?;
        for b in &response.brokers {
            self.brokers
                .insert(b.node_id.0, format!("{}:{}", b.host.as_str(), b.port));
        }
        let Some(meta) = response
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        else {
            return Err(no_topic(topic, &self.bootstrap));
        };
        if let Some(e) = meta.error_code.err() {
            return Err(match e {
                ResponseError::UnknownTopicOrPartition => no_topic(topic, &self.bootstrap),
                e => Error::External(format!(
                    "Kafka brokers `{}` cannot describe topic `{topic}`: {e}",
                    self.bootstrap.join(",")
                )),
            });
        }
        let mut leaders = vec![-1; meta.partitions.len()];
        for p in &meta.partitions {
            if let Some(slot) = leaders.get_mut(p.partition_index.max(0) as usize) {
                *slot = p.leader_id.0;
            }
        }
        if leaders.is_empty() {
            return Err(no_topic(topic, &self.bootstrap));
        }
        self.leaders.insert(topic.to_string(), leaders);
        Ok(())
    }

    /// A bootstrap broker that accepts a connection.
    async fn any_broker(&mut self) -> Result<String> {
        if let Some(addr) = self.conns.keys().next() {
            return Ok(addr.clone());
        }
        let mut last = None;
        for addr in self.bootstrap.clone() {
            match self.connection(&addr).await {
                Ok(_) => return Ok(addr),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Plan("no Kafka brokers are named".into())))
    }

    async fn connection(&mut self, addr: &str) -> Result<&mut Connection> {
        if !self.conns.contains_key(addr) {
            let c = Connection::connect(addr, &self.client_id, self.timeout).await?;
            self.conns.insert(addr.to_string(), c);
        }
        Ok(self.conns.get_mut(addr).expect("inserted above"))
    }

    /// One request to `addr`; a failed connection is dropped so the next call reconnects.
    async fn call<R: Request>(
        &mut self,
        addr: &str,
        request: &R,
        version: i16,
    ) -> Result<R::Response> {
        let conn = self.connection(addr).await?;
        match conn.call(request, version).await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.conns.remove(addr);
                Err(e)
            }
        }
    }

    /// The address of `txn_id`'s transaction coordinator.
    async fn coordinator(&mut self, txn_id: &str) -> Result<String, Fail> {
        if let Some(addr) = self.coordinators.get(txn_id) {
            return Ok(addr.clone());
        }
        let mut request = FindCoordinatorRequest::default();
        request.key = StrBytes::from_string(txn_id.to_string());
        request.key_type = 1;
        let addr = self.any_broker().await?;
        let response = self.call(&addr, &request, FIND_COORDINATOR_V).await?;
        if let Some(e) = response.error_code.err() {
            return Err(Fail::broker(e, "FindCoordinator", txn_id));
        }
        let found = format!("{}:{}", response.host.as_str(), response.port);
        self.coordinators.insert(txn_id.to_string(), found.clone());
        Ok(found)
    }

    /// After a failed attempt of `what`: the error when it is final (not retriable, or
    /// retried until the deadline), otherwise a wait with growing backoff.
    async fn after(
        &mut self,
        backoff: &mut Backoff,
        fail: Fail,
        what: &str,
        txn_id: &str,
    ) -> Result<()> {
        let (moved, err) = match fail {
            Fail::Fatal(e) => return Err(e),
            Fail::NoBump => {
                return Err(Error::Internal(format!("{what} cannot fall back here")));
            }
            Fail::Retry { moved, err } => (moved, err),
        };
        if backoff.start.elapsed() + backoff.delay > self.deadline {
            return Err(Error::External(format!(
                "{what} for transactional id `{txn_id}` kept failing for {:?}: {err}",
                backoff.start.elapsed()
            )));
        }
        if moved {
            self.coordinators.remove(txn_id);
            self.leaders.clear();
        }
        tokio::time::sleep(backoff.delay).await;
        backoff.delay = (backoff.delay * 2).min(Duration::from_millis(500));
        Ok(())
    }

    /// InitProducerId for `txn_id`: with `current` (its own id and epoch) it bumps the
    /// epoch of a producer whose last transaction ended, failing if another took over;
    /// without, it takes the id over from whoever held it, aborting its open
    /// transaction. Either way the returned epoch fences every older one.
    pub async fn init(
        &mut self,
        txn_id: &str,
        current: Option<ProducerEpoch>,
        transaction_timeout: Duration,
    ) -> Result<ProducerEpoch> {
        let timeout_ms = transaction_timeout.as_millis().min(i32::MAX as u128) as i32;
        let mut current = current.filter(|_| self.bumps);
        let result = {
            let mut backoff = Backoff::new();
            loop {
                match self.try_init(txn_id, current, timeout_ms).await {
                    Ok(v) => break Ok(v),
                    Err(Fail::NoBump) => {
                        tracing::warn!(
                            brokers = %self.bootstrap.join(","),
                            "the Kafka brokers do not bump a producer's epoch (KIP-360, Kafka \
                             2.5); the exactly-once sink takes its transactional ids over \
                             for each transaction instead, so a zombie attempt is fenced \
                             only when the next attempt starts"
                        );
                        self.bumps = false;
                        current = None;
                    }
                    Err(f) => {
                        if let Err(e) = self.after(&mut backoff, f, "InitProducerId", txn_id).await
                        {
                            break Err(e);
                        }
                    }
                }
            }
        };
        let how = if current.is_some() {
            "bump"
        } else {
            "takeover"
        };
        match &result {
            Ok(p) => self.note(format!(
                "init {txn_id} {how} -> producer {} epoch {}",
                p.id, p.epoch
            )),
            Err(e) => self.note(format!("init {txn_id} {how} -> {e}")),
        }
        result
    }

    /// Adds partitions of `topic` to the open transaction of `txn_id`.
    pub async fn add_partitions(
        &mut self,
        txn_id: &str,
        producer: ProducerEpoch,
        topic: &str,
        partitions: &[i32],
    ) -> Result<()> {
        let result = {
            let mut backoff = Backoff::new();
            loop {
                match self
                    .try_add_partitions(txn_id, producer, topic, partitions)
                    .await
                {
                    Ok(v) => break Ok(v),
                    Err(f) => {
                        if let Err(e) = self
                            .after(&mut backoff, f, "AddPartitionsToTxn", txn_id)
                            .await
                        {
                            break Err(e);
                        }
                    }
                }
            }
        };
        self.note(format!(
            "add {txn_id} producer {} epoch {} {topic} {partitions:?}{}",
            producer.id,
            producer.epoch,
            result
                .as_ref()
                .err()
                .map(|e| format!(" -> {e}"))
                .unwrap_or_default()
        ));
        result
    }

    /// Produces `records` to `partition` of `topic` inside the open transaction of
    /// `txn_id`, the first with sequence `sequence`; waits for all in-sync replicas.
    pub async fn produce(
        &mut self,
        txn_id: &str,
        producer: ProducerEpoch,
        topic: &str,
        partition: i32,
        sequence: i32,
        records: &[KeyValue],
    ) -> Result<()> {
        let batch = encode_batch(producer, sequence, records)?;
        {
            let mut backoff = Backoff::new();
            loop {
                match self
                    .try_produce(txn_id, topic, partition, batch.clone())
                    .await
                {
                    Ok(v) => break Ok(v),
                    Err(f) => {
                        if let Err(e) = self.after(&mut backoff, f, "Produce", txn_id).await {
                            break Err(e);
                        }
                    }
                }
            }
        }
    }

    /// Commits (or aborts) the transaction `producer` holds on `txn_id`.
    pub async fn end(
        &mut self,
        txn_id: &str,
        producer: ProducerEpoch,
        commit: bool,
    ) -> Result<Ended> {
        let result = {
            let mut backoff = Backoff::new();
            let mut closed = 0;
            loop {
                match self.try_end(txn_id, producer, commit).await {
                    Ok(v) => break Ok(v),
                    Err(f) => {
                        // tansu 0.6 closes the connection where Kafka answers
                        // PRODUCER_FENCED: a broker that takes new connections but closes
                        // each on this one request has refused it for good.
                        if matches!(&f, Fail::Retry { err: Error::External(m), .. } if m.contains(CLOSED_IN_ANSWER))
                        {
                            closed += 1;
                            if closed == 3 {
                                break Ok(Ended::Superseded(format!(
                                    "the broker closed the connection in answer, {closed} times"
                                )));
                            }
                        }
                        if let Err(e) = self.after(&mut backoff, f, "EndTxn", txn_id).await {
                            break Err(e);
                        }
                    }
                }
            }
        };
        let verb = if commit { "commit" } else { "abort" };
        self.note(format!(
            "end {txn_id} producer {} epoch {} {verb} -> {}",
            producer.id,
            producer.epoch,
            match &result {
                Ok(Ended::Done) => "done".to_string(),
                Ok(Ended::Superseded(why)) => format!("superseded ({why})"),
                Err(e) => e.to_string(),
            }
        ));
        result
    }

    async fn try_init(
        &mut self,
        txn_id: &str,
        current: Option<ProducerEpoch>,
        timeout_ms: i32,
    ) -> Result<ProducerEpoch, Fail> {
        let addr = self.coordinator(txn_id).await?;
        let mut request = InitProducerIdRequest::default();
        request.transactional_id = Some(TransactionalId(StrBytes::from_string(txn_id.to_string())));
        request.transaction_timeout_ms = timeout_ms;
        let (id, epoch) = current.map_or((-1, -1), |p| (p.id, p.epoch));
        request.producer_id = ProducerId(id);
        request.producer_epoch = epoch;
        let response = self.call(&addr, &request, INIT_PRODUCER_ID_V).await?;
        match response.error_code.err() {
            None => Ok(ProducerEpoch {
                id: response.producer_id.0,
                epoch: response.producer_epoch,
            }),
            Some(ResponseError::UnknownServerError) if current.is_some() => Err(Fail::NoBump),
            Some(e) => Err(Fail::broker(e, "InitProducerId", txn_id)),
        }
    }

    async fn try_add_partitions(
        &mut self,
        txn_id: &str,
        producer: ProducerEpoch,
        topic: &str,
        partitions: &[i32],
    ) -> Result<(), Fail> {
        let addr = self.coordinator(txn_id).await?;
        let mut request = AddPartitionsToTxnRequest::default();
        request.v3_and_below_transactional_id =
            TransactionalId(StrBytes::from_string(txn_id.to_string()));
        request.v3_and_below_producer_id = ProducerId(producer.id);
        request.v3_and_below_producer_epoch = producer.epoch;
        let mut t = AddPartitionsToTxnTopic::default();
        t.name = TopicName(StrBytes::from_string(topic.to_string()));
        t.partitions = partitions.to_vec();
        request.v3_and_below_topics = vec![t];
        let response = self.call(&addr, &request, ADD_PARTITIONS_V).await?;
        let mut first = None;
        for t in &response.results_by_topic_v3_and_below {
            for p in &t.results_by_partition {
                // OPERATION_NOT_ATTEMPTED only says another partition failed.
                match p.partition_error_code.err() {
                    None | Some(ResponseError::OperationNotAttempted) => {}
                    Some(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
        }
        match first.or(response.error_code.err()) {
            None => Ok(()),
            Some(e) => Err(Fail::broker(e, "AddPartitionsToTxn", txn_id)),
        }
    }

    async fn try_produce(
        &mut self,
        txn_id: &str,
        topic: &str,
        partition: i32,
        batch: Bytes,
    ) -> Result<(), Fail> {
        let ack_timeout = self.timeout.as_millis().min(i32::MAX as u128) as i32;
        let leader = {
            self.partitions(topic, false).await?;
            let id = self.leaders[topic]
                .get(partition as usize)
                .copied()
                .unwrap_or(-1);
            match self.brokers.get(&id) {
                Some(addr) => addr.clone(),
                None => {
                    self.leaders.remove(topic);
                    return Err(Fail::broker(
                        ResponseError::LeaderNotAvailable,
                        "Produce",
                        txn_id,
                    ));
                }
            }
        };
        let mut request = ProduceRequest::default();
        request.transactional_id = Some(TransactionalId(StrBytes::from_string(txn_id.to_string())));
        request.acks = -1;
        request.timeout_ms = ack_timeout;
        let mut data = PartitionProduceData::default();
        data.index = partition;
        data.records = Some(batch);
        let mut t = TopicProduceData::default();
        t.name = TopicName(StrBytes::from_string(topic.to_string()));
        t.partition_data = vec![data];
        request.topic_data = vec![t];
        let response = self.call(&leader, &request, PRODUCE_V).await?;
        let code = response
            .responses
            .iter()
            .flat_map(|t| t.partition_responses.iter())
            .find(|p| p.index == partition)
            .map(|p| p.error_code)
            .ok_or_else(|| {
                Error::External(format!(
                    "Kafka broker `{leader}` did not answer for partition {partition} of \
                             `{topic}`"
                ))
            })?;
        match code.err() {
            // The batch was written before (a retry after a lost answer).
            None | Some(ResponseError::DuplicateSequenceNumber) => Ok(()),
            Some(e) => Err(Fail::broker(e, "Produce", txn_id)),
        }
    }

    async fn try_end(
        &mut self,
        txn_id: &str,
        producer: ProducerEpoch,
        commit: bool,
    ) -> Result<Ended, Fail> {
        let addr = self.coordinator(txn_id).await?;
        let mut request = EndTxnRequest::default();
        request.transactional_id = TransactionalId(StrBytes::from_string(txn_id.to_string()));
        request.producer_id = ProducerId(producer.id);
        request.producer_epoch = producer.epoch;
        request.committed = commit;
        let response = self.call(&addr, &request, END_TXN_V).await?;
        match response.error_code.err() {
            None => Ok(Ended::Done),
            Some(
                e @ (ResponseError::ProducerFenced
                | ResponseError::InvalidProducerEpoch
                | ResponseError::InvalidTxnState
                | ResponseError::InvalidProducerIdMapping),
            ) => Ok(Ended::Superseded(format!("{e:?}"))),
            Some(e) => Err(Fail::broker(e, "EndTxn", txn_id)),
        }
    }
}

fn no_topic(topic: &str, bootstrap: &[String]) -> Error {
    crate::kafka::missing_output_topic(&bootstrap.join(","), topic)
}

/// When a request was first tried, and how long to wait before the next try.
struct Backoff {
    start: Instant,
    delay: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            delay: Duration::from_millis(20),
        }
    }
}

/// Why an attempt failed: worth retrying (after finding the coordinator or leader again
/// when it `moved`), or not.
enum Fail {
    Retry {
        moved: bool,
        err: Error,
    },
    Fatal(Error),
    /// The broker failed an InitProducerId that named the current epoch: it does not
    /// implement KIP-360's bump.
    NoBump,
}

impl From<Error> for Fail {
    /// Errors of the connection (refused, broken, timed out) are retried: a broker may be
    /// restarting.
    fn from(err: Error) -> Self {
        match err {
            Error::External(_) => Fail::Retry { moved: true, err },
            err => Fail::Fatal(err),
        }
    }
}

impl Fail {
    /// The broker answered `api` for `txn_id` with `e`.
    fn broker(e: ResponseError, api: &str, txn_id: &str) -> Self {
        use ResponseError::*;
        let moved = matches!(
            e,
            NotCoordinator | CoordinatorNotAvailable | NotLeaderOrFollower | LeaderNotAvailable
        );
        let retriable = moved
            || e.is_retriable()
            || matches!(e, ConcurrentTransactions | CoordinatorLoadInProgress);
        let hint = match e {
            ProducerFenced | InvalidProducerEpoch => {
                "; a newer attempt of this job took the transactional id over (this process \
                 is a zombie), or another job uses the same transactional_id_prefix"
            }
            TransactionalIdAuthorizationFailed => "; the principal may not use transactional ids",
            InvalidTransactionTimeout => {
                "; the broker's transaction.max.timeout.ms is below the sink's \
                 transaction_timeout"
            }
            _ => "",
        };
        let err = Error::External(format!("Kafka {api} for `{txn_id}`: {e:?}{hint}"));
        if retriable {
            Fail::Retry { moved, err }
        } else {
            Fail::Fatal(err)
        }
    }
}

/// One transactional record batch of `records`, the first with sequence `sequence`.
pub fn encode_batch(producer: ProducerEpoch, sequence: i32, records: &[KeyValue]) -> Result<Bytes> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let records: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, (key, value))| Record {
            transactional: true,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: producer.id,
            producer_epoch: producer.epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: sequence.wrapping_add(i as i32),
            timestamp: now,
            key: key.clone(),
            value: Some(value.clone()),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| Error::Internal(format!("cannot encode a Kafka record batch: {e}")))?;
    Ok(buf.freeze())
}
