//! The worker's client of the remote state service (DESIGN §7): a [`KeyedStateBackend`]
//! whose state lives in `sluice state-service` shards, reached over gRPC.
//!
//! # Parts
//! - [`RemoteState`]: one per worker process and job: the gRPC channel, the job's
//!   [`ShardLayout`], lazy shard opening, and the job-level calls a checkpoint needs
//!   (commit, rollback, status).
//! - [`RemoteStore`]: the same as the job-level [`StateStore`] the runtime and the
//!   coordinator use; [`StateServiceConnector`] hands it to the coordinator.
//! - [`RemoteStateBackend`]: one per subtask, implementing [`KeyedStateBackend`]. It holds
//!   an [`EpochBuffer`] (writes stay in the worker until the epoch's barrier, then go as
//!   one batched `Write` per shard, then `Flush` makes them durable) and a bounded
//!   [`ReadCache`] that its own shipped writes keep correct.
//!
//! # Reads
//! A read looks at the epoch buffer, then at writes being shipped, then at the cache;
//! what is left goes to the service as one `MultiGet` per shard (chunked), all shards in
//! parallel. A pending append (list state) is resolved against the service's value.
//!
//! # Ordering
//! Accesses to one key are serial (the state API's contract), so a write never races
//! with a read of the same key; writes of different keys and reads proceed concurrently.
//! A ship holds its entries readable until the service acknowledges them, so no read
//! falls between the buffer and the service. A ship runs beside the reads (a barrier's
//! epoch ships in the background), so a read whose key has a pending append in a buffer
//! being shipped holds the ship lock: otherwise the service could answer with the append
//! already applied, and the read would add it twice.
//!
//! # Failure
//! A failed `Write` leaves the service with part of an epoch: the backend then refuses
//! further use, and the job must restart from its last checkpoint (the service rolls
//! the shards back). Nothing acknowledged durable is lost.
//!
//! It must not know RocksDB, foyer's disk tier or the object store: those are the
//! service's.

mod connector;
mod epoch_buffer;
mod read_cache;
mod shards;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::try_join_all;
use sluice_common::pb::state as pb;
use sluice_common::pb::state::state_service_client::StateServiceClient;
use sluice_common::state::net_writes::{lookup_newest_first, with_appended};
use sluice_common::state::{KeyedStateBackend, StateError, StateResult, StateStore, WriteOp};
use tokio::sync::OnceCell;
use tonic::transport::Channel;

pub use connector::StateServiceConnector;
pub use epoch_buffer::{Entry, EpochBuffer, Lookup};
pub use read_cache::ReadCache;
pub use shards::{KEY_GROUP_SPACE, ShardLayout};

/// Largest gRPC message either side sends or accepts.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// How a worker reaches the state service and how much it keeps locally.
#[derive(Clone, Debug)]
pub struct RemoteStateConfig {
    /// `http://host:port` of the state-service node of every shard, unless `placement`
    /// names one per shard.
    pub endpoint: String,
    /// The job whose shards are used.
    pub job_id: String,
    /// The job's key groups.
    pub max_parallelism: u32,
    /// Shards the job's key groups are cut into.
    pub shards: u32,
    /// A subtask ships its epoch buffer early when it holds more than this.
    pub write_buffer_bytes: usize,
    /// Read cache per subtask; 0 disables it.
    pub read_cache_bytes: usize,
    /// Keys per `MultiGet` and operations per `Write`.
    pub max_keys_per_rpc: usize,
    /// The checkpoint to open shards at (0: the latest committed one).
    pub restore_checkpoint: u64,
    /// This writer's fence (its deployment attempt; 0: unfenced): once a newer attempt
    /// restored the shards, writes and flushes of this one are refused.
    pub fence: u64,
    /// The endpoint of each shard's node, by shard index (the coordinator's placement);
    /// empty: every shard is at `endpoint`.
    pub placement: Vec<String>,
}

impl RemoteStateConfig {
    /// Defaults for a job: 4 MiB write buffer, 32 MiB read cache, 8192 keys per call.
    pub fn new(
        endpoint: impl Into<String>,
        job_id: impl Into<String>,
        max_parallelism: u32,
    ) -> Self {
        Self {
            endpoint: endpoint.into(),
            job_id: job_id.into(),
            max_parallelism,
            shards: 4,
            write_buffer_bytes: 4 << 20,
            read_cache_bytes: 32 << 20,
            max_keys_per_rpc: 8192,
            restore_checkpoint: 0,
            fence: 0,
            placement: Vec::new(),
        }
    }

    /// Takes the coordinator's `placement` of the job's shards (matched to this
    /// configuration's shards by key-group range; empty: every shard at `endpoint`).
    pub fn place(
        &mut self,
        placement: &[sluice_common::pb::cluster::ShardPlacement],
    ) -> StateResult<()> {
        if placement.is_empty() {
            self.placement.clear();
            return Ok(());
        }
        let layout = ShardLayout::new(&self.job_id, self.max_parallelism, self.shards);
        self.placement = (0..layout.len())
            .map(|i| {
                let range = layout.range(i);
                placement
                    .iter()
                    .find(|p| p.key_group_start == range.start && p.key_group_end == range.end)
                    .map(|p| p.endpoint.clone())
                    .ok_or_else(|| {
                        StateError::Rejected(format!(
                            "the coordinator placed no state node for shard {}-{} of job {}",
                            range.start, range.end, self.job_id
                        ))
                    })
            })
            .collect::<StateResult<_>>()?;
        Ok(())
    }
}

/// Where the state client finds the trace a checkpoint's flush belongs to: the
/// coordinator's checkpoint span, whose `traceparent` came with the trigger (epoch `N`
/// ends at checkpoint `N`'s barrier).
pub trait CheckpointTraces: Send + Sync {
    /// The `traceparent` of checkpoint `id`'s span; empty when it is not traced.
    fn traceparent(&self, id: u64) -> String;
}

/// A job's connection to the state service, shared by the subtasks of one process.
pub struct RemoteState {
    /// The client of each shard's node, by shard index.
    clients: Vec<StateServiceClient<Channel>>,
    /// Every node of the job's shards, by endpoint.
    nodes: Vec<(String, StateServiceClient<Channel>)>,
    /// The endpoint of each shard's node.
    placement: Vec<String>,
    layout: ShardLayout,
    config: RemoteStateConfig,
    opened: Vec<OnceCell<u64>>,
    ttl_states: Mutex<Vec<pb::TtlState>>,
    /// The highest epoch any subtask made durable (0: none).
    flushed: AtomicU64,
    /// Bytes the nodes read back from the object store to open shards for this
    /// connection.
    restored: AtomicU64,
    /// The checkpoints' traces, under which flushes are traced on the state nodes.
    traces: std::sync::OnceLock<Arc<dyn CheckpointTraces>>,
}

impl std::fmt::Debug for RemoteState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteState")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RemoteState {
    /// Connects to the nodes of the job's shards (`config.placement`, or
    /// `config.endpoint` for all of them).
    pub async fn connect(config: RemoteStateConfig) -> StateResult<Arc<Self>> {
        let layout = ShardLayout::new(&config.job_id, config.max_parallelism, config.shards);
        let placement = if config.placement.is_empty() {
            vec![config.endpoint.clone(); layout.len()]
        } else if config.placement.len() == layout.len() {
            config.placement.clone()
        } else {
            return Err(StateError::Rejected(format!(
                "the job's state has {} shards and its placement names {} nodes",
                layout.len(),
                config.placement.len()
            )));
        };
        let mut endpoints: Vec<String> = placement.clone();
        endpoints.sort();
        endpoints.dedup();
        let nodes = try_join_all(endpoints.iter().map(|e| connect_node(e))).await?;
        let nodes: Vec<(String, StateServiceClient<Channel>)> =
            endpoints.into_iter().zip(nodes).collect();
        let clients = placement
            .iter()
            .map(|e| {
                let i = nodes.partition_point(|(n, _)| n < e);
                nodes[i].1.clone()
            })
            .collect();
        let opened = (0..layout.len()).map(|_| OnceCell::new()).collect();
        Ok(Arc::new(Self {
            clients,
            nodes,
            placement,
            layout,
            config,
            opened,
            ttl_states: Mutex::new(Vec::new()),
            flushed: AtomicU64::new(0),
            restored: AtomicU64::new(0),
            traces: std::sync::OnceLock::new(),
        }))
    }

    /// The client of shard `index`'s node.
    fn client(&self, index: usize) -> StateServiceClient<Channel> {
        self.clients[index].clone()
    }

    /// The endpoint of the node holding each shard, by shard index.
    pub fn placement(&self) -> &[String] {
        &self.placement
    }

    /// Traces each shard's flush of epoch `N` under checkpoint `N`'s span from `traces`
    /// (set once; later calls change nothing).
    pub fn trace_flushes(&self, traces: Arc<dyn CheckpointTraces>) {
        let _ = self.traces.set(traces);
    }

    /// The highest epoch a subtask of this process made durable, if any.
    pub fn last_flushed_epoch(&self) -> Option<u64> {
        Some(self.flushed.load(Ordering::Acquire)).filter(|&e| e > 0)
    }

    /// The job's shards.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// A backend for the subtask owning `key_groups`, writing epochs from `first_epoch`.
    pub fn backend(
        self: &Arc<Self>,
        key_groups: Range<u32>,
        first_epoch: u64,
    ) -> RemoteStateBackend {
        self.backend_with_cache(key_groups, first_epoch, self.config.read_cache_bytes)
    }

    /// The same without a read cache, for an operator that caches its own state.
    pub fn backend_without_cache(
        self: &Arc<Self>,
        key_groups: Range<u32>,
        first_epoch: u64,
    ) -> RemoteStateBackend {
        self.backend_with_cache(key_groups, first_epoch, 0)
    }

    fn backend_with_cache(
        self: &Arc<Self>,
        key_groups: Range<u32>,
        first_epoch: u64,
        read_cache_bytes: usize,
    ) -> RemoteStateBackend {
        let owned = self.layout.shards_for_key_groups(key_groups);
        RemoteStateBackend {
            remote: Arc::clone(self),
            buffer: Mutex::new(Buffers::default()),
            ship_lock: tokio::sync::Mutex::new(()),
            cache: ReadCache::new(read_cache_bytes),
            epoch: AtomicU64::new(first_epoch.max(1)),
            owned_shards: owned,
            written: Mutex::new(BTreeSet::new()),
            failure: std::sync::OnceLock::new(),
        }
    }

    /// Declares a state whose values carry a TTL header, so the service's compaction
    /// drops them once expired. Takes effect for shards opened afterwards.
    pub fn declare_ttl_state(&self, operator_id: u32, name: &str, list: bool) {
        let kind = if list {
            pb::ttl_state::Kind::List
        } else {
            pb::ttl_state::Kind::Value
        };
        let mut states = self.ttl_states.lock().unwrap_or_else(|p| p.into_inner());
        states.push(pb::TtlState {
            operator_id,
            state_name: Bytes::copy_from_slice(name.as_bytes()),
            kind: kind as i32,
        });
    }

    /// The request opening shard `index` at `checkpoint` with the declared TTL states,
    /// raising its fence to `fence`.
    fn open_request(&self, index: usize, checkpoint: u64, fence: u64) -> pb::OpenShardRequest {
        let ttl_states = self
            .ttl_states
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        pb::OpenShardRequest {
            shard: Some(self.layout.id(index)),
            checkpoint_id: checkpoint,
            ttl_states,
            fence,
        }
    }

    /// Opens shard `index` once per process; returns the checkpoint it holds.
    async fn open(&self, index: usize) -> StateResult<u64> {
        self.opened[index]
            .get_or_try_init(|| async {
                let req = self.open_request(index, self.config.restore_checkpoint, 0);
                let resp = self
                    .client(index)
                    .open_shard(req)
                    .await
                    .map_err(|s| status_error("open shard", &s))?
                    .into_inner();
                self.restored
                    .fetch_add(resp.restore_bytes, Ordering::Relaxed);
                Ok(resp.checkpoint_id)
            })
            .await
            .copied()
    }

    /// Opens every shard; returns the checkpoint they hold (the oldest, should they
    /// differ).
    pub async fn open_all(&self) -> StateResult<u64> {
        let held = try_join_all((0..self.layout.len()).map(|i| self.open(i))).await?;
        Ok(held.into_iter().min().unwrap_or(0))
    }

    /// Tells every shard that `checkpoint` is complete, keeping `retained`.
    pub async fn commit(&self, checkpoint: u64, retained: &[u64]) -> StateResult<Vec<String>> {
        let calls = (0..self.layout.len()).map(|i| async move {
            self.open(i).await?;
            let req = traced(pb::CommitRequest {
                shard: Some(self.layout.id(i)),
                checkpoint_id: checkpoint,
                retained: retained.to_vec(),
            });
            let resp = self
                .client(i)
                .commit(req)
                .await
                .map_err(|s| status_error("commit", &s))?;
            Ok::<_, StateError>(resp.into_inner().manifest)
        });
        try_join_all(calls).await
    }

    /// Returns every shard to `checkpoint`, dropping later writes, and raises its fence
    /// to `fence` (0: leaves it); returns writes undone.
    pub async fn rollback(&self, checkpoint: u64, fence: u64) -> StateResult<u64> {
        let calls = (0..self.layout.len()).map(|i| async move {
            self.open(i).await?;
            let req = pb::RollbackRequest {
                shard: Some(self.layout.id(i)),
                checkpoint_id: checkpoint,
                fence,
            };
            let resp = self
                .client(i)
                .rollback(req)
                .await
                .map_err(|s| status_error("rollback", &s))?;
            Ok::<_, StateError>(resp.into_inner().undone)
        });
        Ok(try_join_all(calls).await?.into_iter().sum())
    }

    /// Brings every shard to committed checkpoint `checkpoint`: rolled back where it is
    /// open at that checkpoint or later and only uncommitted epochs are newer, restored
    /// from the object store where a newer checkpoint was committed since (a restore
    /// that skips a checkpoint whose metadata is unusable). Returns the bytes restored.
    /// Raises the shards' fence to `fence` first, so writers of older attempts are
    /// refused from then on.
    pub async fn restore_to(&self, checkpoint: u64, fence: u64) -> StateResult<u64> {
        let calls = (0..self.layout.len()).map(|i| async move {
            let req = self.open_request(i, checkpoint, fence);
            let resp = self
                .client(i)
                .open_shard(req)
                .await
                .map_err(|s| status_error("open shard", &s))?
                .into_inner();
            // Lower is fine: the node had the shard open with `checkpoint`'s epochs
            // flushed to it but its commit not yet received, and rolling back kept
            // exactly them (a node that did not receive them restores from the store).
            if resp.checkpoint_id > checkpoint {
                return Err(StateError::Internal(format!(
                    "shard {i} opened at checkpoint {} instead of {checkpoint}",
                    resp.checkpoint_id
                )));
            }
            self.restored
                .fetch_add(resp.restore_bytes, Ordering::Relaxed);
            Ok::<_, StateError>(resp.restore_bytes)
        });
        Ok(try_join_all(calls).await?.into_iter().sum())
    }

    /// Closes the copy of shard `index` that the node at `endpoint` still has open
    /// although the shard is placed elsewhere now (it moved): the node frees its memory
    /// and disk, and no one can read or write the stale copy. A copy already gone is
    /// fine.
    pub async fn close_stale_copy(&self, index: usize, endpoint: &str) -> StateResult<()> {
        // The old copy is often on a node this connection uses for other shards.
        let mut client = match self.nodes.iter().find(|(e, _)| e == endpoint) {
            Some((_, client)) => client.clone(),
            None => connect_node(endpoint).await?,
        };
        let req = pb::CloseShardRequest {
            shard: Some(self.layout.id(index)),
        };
        match client.close_shard(req).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(status_error("close shard", &s)),
        }
    }

    /// Bytes the nodes read back from the object store to open this connection's
    /// shards.
    pub fn restored_bytes(&self) -> u64 {
        self.restored.load(Ordering::Relaxed)
    }

    /// The status of each node of the job's shards.
    pub async fn status(&self) -> StateResult<Vec<pb::StatusResponse>> {
        try_join_all(self.nodes.iter().map(|(_, client)| async move {
            let resp = client
                .clone()
                .status(pb::StatusRequest {})
                .await
                .map_err(|s| status_error("status", &s))?;
            Ok::<_, StateError>(resp.into_inner())
        }))
        .await
    }

    async fn multi_get(&self, shard: usize, keys: Vec<Bytes>) -> StateResult<Vec<Option<Bytes>>> {
        self.open(shard).await?;
        let n = keys.len();
        let req = pb::MultiGetRequest {
            shard: Some(self.layout.id(shard)),
            keys,
        };
        let resp = self
            .client(shard)
            .multi_get(req)
            .await
            .map_err(|s| status_error("multi-get", &s))?
            .into_inner();
        if resp.values.len() != n || resp.found.len() != n {
            return Err(StateError::Internal(format!(
                "state service answered {} values for {n} keys",
                resp.values.len()
            )));
        }
        Ok(resp
            .values
            .into_iter()
            .zip(resp.found)
            .map(|(v, found)| found.then_some(v))
            .collect())
    }

    async fn write(&self, shard: usize, epoch: u64, ops: Vec<pb::WriteOp>) -> StateResult<()> {
        self.open(shard).await?;
        let req = pb::WriteRequest {
            shard: Some(self.layout.id(shard)),
            epoch,
            ops,
            fence: self.config.fence,
        };
        self.client(shard)
            .write(req)
            .await
            .map_err(|s| status_error("write", &s))?;
        Ok(())
    }

    async fn flush(&self, shard: usize, epoch: u64) -> StateResult<String> {
        self.open(shard).await?;
        let parent = self
            .traces
            .get()
            .map(|t| t.traceparent(epoch))
            .unwrap_or_default();
        let req = with_traceparent(
            pb::FlushRequest {
                shard: Some(self.layout.id(shard)),
                epoch,
                fence: self.config.fence,
            },
            &parent,
        );
        let resp = self
            .client(shard)
            .flush(req)
            .await
            .map_err(|s| status_error("flush", &s))?;
        Ok(resp.into_inner().handle)
    }

    async fn scan_shard(
        &self,
        shard: usize,
        start: Bytes,
        end: Bytes,
        limit: Option<usize>,
        out: &mut Vec<(Bytes, Bytes)>,
    ) -> StateResult<()> {
        self.open(shard).await?;
        let mut from = start;
        loop {
            let want = limit.map(|l| l - out.len());
            if want == Some(0) {
                return Ok(());
            }
            let page = want.map_or(0, |w| w.min(self.config.max_keys_per_rpc));
            let req = pb::ScanRequest {
                shard: Some(self.layout.id(shard)),
                start: from.clone(),
                end: end.clone(),
                limit: u32::try_from(page).unwrap_or(u32::MAX),
            };
            let resp = self
                .client(shard)
                .scan(req)
                .await
                .map_err(|s| status_error("scan", &s))?
                .into_inner();
            if resp.keys.len() != resp.values.len() {
                return Err(StateError::Internal(
                    "state service answered a scan with unpaired keys and values".into(),
                ));
            }
            out.extend(resp.keys.into_iter().zip(resp.values));
            if !resp.more {
                return Ok(());
            }
            if resp.resume_key <= from {
                return Err(StateError::Internal(
                    "state service scan did not advance".into(),
                ));
            }
            from = resp.resume_key;
        }
    }
}

/// A channel to the state-service node at `endpoint`.
async fn connect_node(endpoint: &str) -> StateResult<StateServiceClient<Channel>> {
    let channel = sluice_common::tls::endpoint(endpoint)
        .map_err(|e| StateError::Rejected(format!("state service address: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_adaptive_window(true)
        .connect()
        .await
        .map_err(|e| {
            let why = format!(
                "cannot connect to the state service at {endpoint}: {}",
                sluice_common::tls::with_causes(&e)
            );
            // A certificate the other side refuses stays refused: not worth waiting for.
            if sluice_common::tls::is_certificate_error(&why) {
                StateError::Rejected(why)
            } else {
                StateError::Unavailable(why)
            }
        })?;
    Ok(StateServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// A job's state in the service, as the runtime and the coordinator use it.
#[derive(Debug, Clone)]
pub struct RemoteStore(pub Arc<RemoteState>);

#[async_trait]
impl StateStore for RemoteStore {
    async fn open(&self) -> StateResult<u64> {
        self.0.open_all().await
    }

    fn subtask(&self, key_groups: Range<u32>, first_epoch: u64) -> Arc<dyn KeyedStateBackend> {
        Arc::new(self.0.backend(key_groups, first_epoch))
    }

    fn subtask_for_cached_operator(
        &self,
        key_groups: Range<u32>,
        first_epoch: u64,
    ) -> Arc<dyn KeyedStateBackend> {
        Arc::new(self.0.backend_without_cache(key_groups, first_epoch))
    }

    async fn restore(&self, checkpoint: u64, fence: u64) -> StateResult<u64> {
        if checkpoint == 0 {
            // Nothing completed: drop every epoch (opening at 0 would mean "latest").
            self.0.rollback(0, fence).await.map(|_| 0)
        } else {
            self.0.restore_to(checkpoint, fence).await
        }
    }

    async fn commit(&self, checkpoint: u64, retained: &[u64]) -> StateResult<()> {
        self.0.commit(checkpoint, retained).await.map(|_| ())
    }

    fn last_sealed(&self) -> u64 {
        self.0.last_flushed_epoch().unwrap_or(0)
    }

    async fn restored_bytes(&self) -> StateResult<u64> {
        Ok(self.0.restored_bytes())
    }

    fn reference(&self) -> sluice_common::pb::cluster::RemoteStateRef {
        sluice_common::pb::cluster::RemoteStateRef {
            endpoint: self.0.config.endpoint.clone(),
            job_id: self.0.layout.job_id().to_owned(),
            shards: self.0.layout.len() as u32,
            first_epoch: 0,
            fence: 0,
            placement: (0..self.0.layout.len())
                .map(|i| {
                    let range = self.0.layout.range(i);
                    sluice_common::pb::cluster::ShardPlacement {
                        key_group_start: range.start,
                        key_group_end: range.end,
                        endpoint: self.0.placement[i].clone(),
                    }
                })
                .collect(),
        }
    }
}

/// The epoch buffer and the writes being shipped.
#[derive(Default)]
struct Buffers {
    /// Writes of the open epoch.
    active: EpochBuffer,
    /// Writes cut from `active` and not yet acknowledged by the service, oldest first,
    /// with their epochs: readable until they are.
    queued: VecDeque<(u64, Arc<EpochBuffer>)>,
}

impl Buffers {
    /// What the open epoch and the writes being shipped say of `key`, newest first.
    fn lookup(&self, key: &[u8]) -> Lookup {
        let queued = self.queued.iter().rev().map(|(_, writes)| &**writes);
        lookup_newest_first(std::iter::once(&self.active).chain(queued), key)
    }
}

/// One subtask's keyed state in the remote service.
pub struct RemoteStateBackend {
    remote: Arc<RemoteState>,
    buffer: Mutex<Buffers>,
    ship_lock: tokio::sync::Mutex<()>,
    cache: ReadCache,
    epoch: AtomicU64,
    owned_shards: Range<usize>,
    written: Mutex<BTreeSet<usize>>,
    /// Why the first failed write failed: the backend refuses everything after it.
    failure: std::sync::OnceLock<String>,
}

impl std::fmt::Debug for RemoteStateBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStateBackend")
            .field("epoch", &self.epoch)
            .field("owned_shards", &self.owned_shards)
            .finish_non_exhaustive()
    }
}

impl RemoteStateBackend {
    /// The epoch writes now belong to.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Barrier `epoch` passed: ships the buffer and makes every write of this subtask
    /// durable; later writes belong to `epoch + 1`. Returns the shards' durable handles.
    pub async fn flush_epoch(&self, epoch: u64) -> StateResult<Vec<String>> {
        self.cut(epoch);
        self.make_durable(epoch).await
    }

    /// Ends epoch `epoch` in this process: what was written so far is queued as its
    /// writes, later writes belong to `epoch + 1`.
    fn cut(&self, epoch: u64) {
        let mut buffers = self.lock_buffer();
        self.queue(&mut buffers);
        self.epoch.fetch_max(epoch + 1, Ordering::AcqRel);
    }

    /// Ships everything queued and flushes the shards written: epoch `epoch` (cut
    /// before) is durable when this returns.
    async fn make_durable(&self, epoch: u64) -> StateResult<Vec<String>> {
        self.usable()?;
        let guard = self.ship_lock.lock().await;
        let drained = self.drain_queue(&guard).await;
        self.check(drained)?;
        let mut shards: BTreeSet<usize> = self.owned_shards.clone().collect();
        shards.extend(std::mem::take(&mut *self.lock_written()));
        let handles = try_join_all(shards.into_iter().map(|s| self.remote.flush(s, epoch))).await;
        let handles = self.check(handles)?;
        self.remote.flushed.fetch_max(epoch, Ordering::AcqRel);
        Ok(handles)
    }

    fn lock_buffer(&self) -> std::sync::MutexGuard<'_, Buffers> {
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_written(&self) -> std::sync::MutexGuard<'_, BTreeSet<usize>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn usable(&self) -> StateResult<()> {
        if let Some(cause) = self.failure.get() {
            return Err(StateError::Unavailable(format!(
                "an earlier write to the state service failed ({cause}); the job must restart from its last checkpoint"
            )));
        }
        Ok(())
    }

    fn check<T>(&self, r: StateResult<T>) -> StateResult<T> {
        if let Err(e) = &r {
            let _ = self.failure.set(e.to_string());
        }
        r
    }

    /// Sends the epoch buffer, and whatever was queued before it, to the service.
    async fn ship(&self) -> StateResult<()> {
        self.usable()?;
        let guard = self.ship_lock.lock().await;
        self.queue_active();
        self.drain_queue(&guard).await
    }

    /// Queues the open epoch's writes so far for shipping.
    fn queue_active(&self) {
        self.queue(&mut self.lock_buffer());
    }

    /// Moves the open epoch's writes so far to the shipping queue, as the current epoch's.
    fn queue(&self, buffers: &mut Buffers) {
        if !buffers.active.is_empty() {
            let writes = Arc::new(std::mem::take(&mut buffers.active));
            buffers.queued.push_back((self.epoch(), writes));
        }
    }

    /// Ships the queued buffers oldest first, each one dropped from the queue (and put in
    /// the cache) once the service acknowledged it. Needs the ship lock, so that buffers
    /// reach the service, and the cache, in the order they were written.
    async fn drain_queue(&self, _ship_lock: &tokio::sync::MutexGuard<'_, ()>) -> StateResult<()> {
        loop {
            let Some((epoch, entries)) = self.lock_buffer().queued.front().cloned() else {
                return Ok(());
            };
            let shipped = self.ship_writes(epoch, &entries).await;
            self.check(shipped)?;
            self.lock_buffer().queued.pop_front();
        }
    }

    /// Sends one buffer's writes of `epoch`: its deleted ranges first (one `Write` per
    /// shard, all acknowledged before any entry goes, since entries in a range were
    /// written after it), then its entries, one `Write` per shard and chunk; once
    /// acknowledged applies them to the cache.
    async fn ship_writes(&self, epoch: u64, writes: &EpochBuffer) -> StateResult<()> {
        let layout = self.remote.layout();
        if writes.ranges().next().is_some() {
            let mut per_shard: BTreeMap<usize, Vec<pb::WriteOp>> = BTreeMap::new();
            for (start, end) in writes.ranges() {
                for (shard, lo, hi) in layout.split_range(start, end.map_or(&[][..], |e| e)) {
                    per_shard
                        .entry(shard)
                        .or_default()
                        .push(epoch_buffer::range_to_wire(lo, hi));
                }
            }
            self.lock_written().extend(per_shard.keys().copied());
            let calls = per_shard
                .into_iter()
                .map(|(shard, ops)| self.remote.write(shard, epoch, ops));
            try_join_all(calls).await?;
            self.cache.clear();
        }
        let mut per_shard: BTreeMap<usize, Vec<pb::WriteOp>> = BTreeMap::new();
        for (key, entry) in writes.entries() {
            per_shard
                .entry(layout.shard_of(key))
                .or_default()
                .push(epoch_buffer::to_wire(key.clone(), entry.clone()));
        }
        self.lock_written().extend(per_shard.keys().copied());
        let chunk = self.remote.config.max_keys_per_rpc.max(1);
        let mut calls = Vec::new();
        for (shard, ops) in per_shard {
            let mut ops = ops.into_iter().peekable();
            while ops.peek().is_some() {
                let part: Vec<_> = ops.by_ref().take(chunk).collect();
                calls.push(self.remote.write(shard, epoch, part));
            }
        }
        try_join_all(calls).await?;
        for (key, entry) in writes.entries() {
            match entry {
                Entry::Put(v) => self.cache.set(key.clone(), Some(v.clone())),
                Entry::Delete => self.cache.set(key.clone(), None),
                Entry::Merge(_) => self.cache.remove(key),
            }
        }
        Ok(())
    }
}

#[async_trait]
impl KeyedStateBackend for RemoteStateBackend {
    async fn get_many(&self, keys: &[Bytes]) -> StateResult<Vec<Option<Bytes>>> {
        self.usable()?;
        let mut out: Vec<Option<Bytes>> = vec![None; keys.len()];
        // (index, pending append) of keys the buffers do not decide.
        let mut open: Vec<(usize, Option<Bytes>)> = Vec::new();
        // A pending append may sit in a buffer being shipped: read against the service
        // (or the cache) while that ship lands, it would be appended to a value that
        // already holds it. Such a read holds the ship lock, so that no ship is under way
        // between what the buffers say and what the service answers.
        let mut ship_guard = None;
        loop {
            let racing = {
                let buffers = self.lock_buffer();
                for (i, key) in keys.iter().enumerate() {
                    match buffers.lookup(key) {
                        Lookup::Value(v) => out[i] = v,
                        Lookup::Older(tail) => open.push((i, tail)),
                    }
                }
                ship_guard.is_none()
                    && !buffers.queued.is_empty()
                    && open.iter().any(|(_, tail)| tail.is_some())
            };
            if !racing {
                break;
            }
            open.clear();
            ship_guard = Some(self.ship_lock.lock().await);
        }
        let generation = self.cache.generation();
        let layout = self.remote.layout();
        let mut remote: BTreeMap<usize, Vec<(usize, Option<Bytes>)>> = BTreeMap::new();
        for (i, tail) in open {
            match self.cache.get(&keys[i]) {
                Some(base) => out[i] = with_appended(base, tail),
                None => remote
                    .entry(layout.shard_of(&keys[i]))
                    .or_default()
                    .push((i, tail)),
            }
        }
        if remote.is_empty() {
            return Ok(out);
        }
        let chunk = self.remote.config.max_keys_per_rpc.max(1);
        let mut calls = Vec::new();
        for (shard, wanted) in remote {
            for part in wanted.chunks(chunk) {
                let part = part.to_vec();
                let req_keys: Vec<Bytes> = part.iter().map(|(i, _)| keys[*i].clone()).collect();
                calls.push(async move {
                    let values = self.remote.multi_get(shard, req_keys).await?;
                    Ok::<_, StateError>((part, values))
                });
            }
        }
        for (part, values) in try_join_all(calls).await? {
            for ((i, tail), value) in part.into_iter().zip(values) {
                self.cache.fill(generation, keys[i].clone(), value.clone());
                out[i] = with_appended(value, tail);
            }
        }
        Ok(out)
    }

    async fn write(&self, ops: Vec<WriteOp>) -> StateResult<()> {
        self.usable()?;
        let mut buffered = 0;
        for op in ops {
            let mut buffers = self.lock_buffer();
            buffers.active.apply(op);
            buffered = buffers.active.bytes();
        }
        if buffered > self.remote.config.write_buffer_bytes {
            self.ship().await?;
        }
        Ok(())
    }

    async fn seal_epoch(&self, epoch: u64) -> StateResult<()> {
        self.flush_epoch(epoch).await.map(|_| ())
    }

    async fn cut_epoch(&self, epoch: u64) -> StateResult<()> {
        self.usable()?;
        self.cut(epoch);
        Ok(())
    }

    async fn await_durable(&self, epoch: u64) -> StateResult<()> {
        self.make_durable(epoch).await.map(|_| ())
    }

    fn open_epoch(&self) -> u64 {
        self.epoch()
    }

    fn pipelined_reads(&self) -> usize {
        // A read is a round trip to the service: overlap it with the next batches'.
        4
    }

    async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: Option<usize>,
    ) -> StateResult<Vec<(Bytes, Bytes)>> {
        // Scans are rare (restoring timers, iterating a map): ship the buffer so the
        // service's answer includes this subtask's writes.
        self.ship().await?;
        let mut out = Vec::new();
        for (shard, lo, hi) in self.remote.layout().split_range(start, end) {
            if limit.is_some_and(|l| out.len() >= l) {
                break;
            }
            self.remote
                .scan_shard(shard, lo, hi, limit, &mut out)
                .await?;
        }
        Ok(out)
    }
}

/// The state error for a failed call, keeping the service's message.
fn status_error(call: &str, status: &tonic::Status) -> StateError {
    use tonic::Code;
    let msg = format!("state service {call}: {}", status.message());
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Cancelled => {
            StateError::Unavailable(msg)
        }
        Code::InvalidArgument
        | Code::OutOfRange
        | Code::FailedPrecondition
        | Code::NotFound
        | Code::ResourceExhausted
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::AlreadyExists => StateError::Rejected(msg),
        _ => StateError::Internal(msg),
    }
}

/// `req` with the current span's `traceparent` in its metadata, so that the state node's
/// spans join the caller's trace (nothing is added when no span is current).
fn traced<T>(req: T) -> tonic::Request<T> {
    with_traceparent(req, &sluice_telemetry::trace::current_traceparent())
}

/// `req` with `parent` (a `traceparent`; nothing when empty) in its metadata.
fn with_traceparent<T>(req: T, parent: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(req);
    if !parent.is_empty()
        && let Ok(value) = parent.parse()
    {
        request
            .metadata_mut()
            .insert(sluice_telemetry::trace::TRACEPARENT, value);
    }
    request
}
