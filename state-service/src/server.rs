//! The gRPC face of the node: request validation and limits, the map of open shards,
//! and the mapping of each RPC onto a shard.
//!
//! It owns which shards are open here and the node-wide counters (`Status`); it must not
//! know how a shard stores or makes data durable. RocksDB work runs in `spawn_blocking`,
//! never on the runtime's threads. Every input error becomes a gRPC status through
//! [`Error`]; nothing here panics on input.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use opentelemetry::KeyValue;
use sluice_common::pb::state::state_service_server::StateService;
use sluice_common::pb::state::{
    CloseShardRequest, CloseShardResponse, CommitRequest, CommitResponse, FlushRequest,
    FlushResponse, MultiGetRequest, MultiGetResponse, OpenShardRequest, OpenShardResponse,
    RollbackRequest, RollbackResponse, ScanRequest, ScanResponse, ShardStatus, StatusRequest,
    StatusResponse, WriteRequest, WriteResponse, write_op,
};
use sluice_telemetry::trace;
use tonic::{Request, Response, Status};

use crate::config::StateServiceConfig;
use crate::delta::Op;
use crate::error::{Error, Result};
use crate::lock::lock;
use crate::restore::{self, NodeParts};
use crate::shard::Shard;
use crate::shard_id::ShardKey;
use crate::ttl_filter::TtlStates;

/// Entries a scan page holds when the request does not say.
const DEFAULT_SCAN_PAGE: usize = 1000;

/// What the node served since it started.
#[derive(Debug, Default)]
pub(crate) struct IoCounters {
    pub(crate) keys_read: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) ops_written: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) flushed_bytes: AtomicU64,
    pub(crate) commits: AtomicU64,
}

/// A close checks this often whether the requests that held the shard are done...
const CLOSE_WAIT_STEP: std::time::Duration = std::time::Duration::from_millis(20);
/// ... this many times at most (10 s), then closes anyway.
const CLOSE_WAIT_STEPS: u32 = 500;

/// The node: its open shards and what they share.
pub struct Node {
    config: StateServiceConfig,
    parts: NodeParts,
    shards: std::sync::Mutex<HashMap<ShardKey, Arc<Shard>>>,
    /// Serializes opening and closing shards (rare, and never on the data path).
    open_lock: tokio::sync::Mutex<()>,
    restore_bytes_total: AtomicU64,
    /// Data-path counters since start, for the node's metrics.
    pub(crate) io: IoCounters,
    /// Each shard's fence: writers of an older attempt are refused. The fence is
    /// durable (`<shard root>/fence` in the object store, written before the request
    /// that raised it is answered); this is its copy, loaded when a shard opens, so a
    /// node that restarted refuses a superseded writer as the one before it did.
    fences: std::sync::Mutex<HashMap<ShardKey, u64>>,
    /// Serializes fence raises, so that the durable fence only grows.
    fence_lock: tokio::sync::Mutex<()>,
    /// Set while memtables are being flushed to bring them under their share.
    relieving: Arc<AtomicBool>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node_id", &self.config.node_id)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// A node with no shard open.
    pub fn new(config: StateServiceConfig, parts: NodeParts) -> Self {
        Self {
            config,
            parts,
            shards: std::sync::Mutex::new(HashMap::new()),
            open_lock: tokio::sync::Mutex::new(()),
            restore_bytes_total: AtomicU64::new(0),
            io: IoCounters::default(),
            fences: std::sync::Mutex::new(HashMap::new()),
            fence_lock: tokio::sync::Mutex::new(()),
            relieving: Arc::new(AtomicBool::new(false)),
        }
    }

    /// When the memtables of every shard together pass their share, flushes those of
    /// the shards holding most until they are at half of it, on a blocking thread, one
    /// relief at a time. RocksDB's write buffer manager, once full, flushes only the
    /// database being written to, so idle shards' memtables would stay: 32 shards at
    /// `--memory 128MiB` held 254 MiB of memtables against a 32 MiB share.
    fn relieve_memtables(&self) {
        let rocks = Arc::clone(&self.parts.rocks);
        if !rocks.memtables_over(1.0) || self.relieving.swap(true, Ordering::SeqCst) {
            return;
        }
        let shards: Vec<Arc<Shard>> = lock(&self.shards).values().cloned().collect();
        let relieving = Arc::clone(&self.relieving);
        tokio::task::spawn_blocking(move || {
            let mut by_size: Vec<(u64, Arc<Shard>)> = shards
                .into_iter()
                .map(|s| (s.rocksdb_memory().0, s))
                .collect();
            by_size.sort_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
            for (_, shard) in by_size {
                if !rocks.memtables_over(0.5) {
                    break;
                }
                if let Err(e) = shard.flush_memtables() {
                    tracing::warn!("flushing the memtables of {}: {e}", shard.id);
                }
            }
            relieving.store(false, Ordering::SeqCst);
        });
    }

    fn shard(&self, id: Option<&sluice_common::pb::state::ShardId>) -> Result<Arc<Shard>> {
        let key = ShardKey::from_pb(id)?;
        lock(&self.shards).get(&key).cloned().ok_or_else(|| {
            Error::NotFound(format!(
                "{key} is not open on node {}: call OpenShard first",
                self.config.node_id
            ))
        })
    }

    fn check_count(&self, what: &str, n: usize) -> Result<()> {
        if n > self.config.max_batch_ops {
            return Err(Error::TooLarge(format!(
                "{n} {what} in one request; at most {} are allowed: split the batch",
                self.config.max_batch_ops
            )));
        }
        Ok(())
    }

    /// Opens (or re-targets) a shard.
    pub async fn open_shard(&self, req: OpenShardRequest) -> Result<OpenShardResponse> {
        let key = ShardKey::from_pb(req.shard.as_ref())?;
        self.raise_fence(&key, req.fence).await?;
        let _open = self.open_lock.lock().await;
        let existing = lock(&self.shards).get(&key).cloned();
        if let Some(shard) = existing {
            shard.ttl.extend(&req.ttl_states);
            let c = req.checkpoint_id;
            // A rollback keeps checkpoint `c` only when this instance received its
            // flushes: after a restart (or a move) the shard here was opened at an
            // older checkpoint, and `c`'s writes are in deltas only the object store has.
            let holds = c == shard.committed()
                || (c > shard.committed() && c <= shard.flushed_epoch.load(Ordering::SeqCst));
            if c == 0 || holds {
                if c > 0 {
                    let s = Arc::clone(&shard);
                    tokio::task::spawn_blocking(move || s.rollback(c)).await??;
                }
                return Ok(OpenShardResponse {
                    checkpoint_id: shard.committed(),
                    restored_from_object_store: false,
                    restore_bytes: 0,
                });
            }
            // Older than what is committed here, or newer than what was flushed here:
            // only the object store has it.
            drop(shard);
            self.close_locked(&key).await;
        }
        let ttl = TtlStates::default();
        ttl.extend(&req.ttl_states);
        let shards = lock(&self.shards).len() + 1;
        self.parts.rocks.size_for(shards);
        let opened = restore::open(&self.parts, key.clone(), req.checkpoint_id, ttl).await?;
        self.restore_bytes_total
            .fetch_add(opened.bytes, Ordering::Relaxed);
        lock(&self.shards).insert(key, opened.shard);
        self.resize_memtables().await;
        self.relieve_memtables();
        Ok(OpenShardResponse {
            checkpoint_id: opened.checkpoint,
            restored_from_object_store: opened.restored,
            restore_bytes: opened.bytes,
        })
    }

    /// `key`'s fence, read from the object store the first time this node needs it.
    async fn load_fence(&self, key: &ShardKey) -> Result<u64> {
        if let Some(&f) = lock(&self.fences).get(key) {
            return Ok(f);
        }
        let location = fence_location(&self.parts.durable, key);
        let durable = match self.parts.durable.get(&location).await {
            Ok(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| Error::Corrupt {
                    object: location.to_string(),
                    reason: "not a fence (a decimal number)".into(),
                })?,
            Err(Error::NotFound(_)) => 0,
            Err(e) => return Err(e),
        };
        Ok(self.remember_fence(key, durable))
    }

    /// Raises this node's copy of `key`'s fence to `fence`; returns the copy.
    fn remember_fence(&self, key: &ShardKey, fence: u64) -> u64 {
        let mut fences = lock(&self.fences);
        let f = fences.entry(key.clone()).or_default();
        *f = (*f).max(fence);
        *f
    }

    /// Raises `key`'s fence to `fence` (0: leaves it, but loads it), durably before it
    /// returns.
    async fn raise_fence(&self, key: &ShardKey, fence: u64) -> Result<()> {
        if fence == 0 {
            return self.load_fence(key).await.map(|_| ());
        }
        let _raising = self.fence_lock.lock().await;
        if fence > self.load_fence(key).await? {
            let location = fence_location(&self.parts.durable, key);
            self.parts
                .durable
                .put(&location, bytes::Bytes::from(fence.to_string()))
                .await?;
            self.remember_fence(key, fence);
        }
        Ok(())
    }

    /// Refuses a writer whose fence a newer attempt superseded.
    fn check_fence(&self, key: &ShardKey, fence: u64) -> Result<()> {
        if fence == 0 {
            return Ok(());
        }
        let current = lock(&self.fences).get(key).copied().unwrap_or(0);
        if fence < current {
            return Err(Error::FailedPrecondition(format!(
                "{key} is fenced at {current}: a writer of an earlier attempt ({fence}) may not change it"
            )));
        }
        Ok(())
    }

    async fn close_locked(&self, key: &ShardKey) {
        let removed = lock(&self.shards).remove(key);
        if let Some(shard) = removed {
            if let Some(task) = lock(&shard.snapshot_task).take() {
                task.abort();
            }
            // Requests under way (and an aborted snapshot, until it unwinds) still hold
            // the shard: its RocksDB closes with the last of them, and a reopen of the
            // shard before that would meet its lock on the directory.
            for _ in 0..CLOSE_WAIT_STEPS {
                if Arc::strong_count(&shard) == 1 {
                    break;
                }
                tokio::time::sleep(CLOSE_WAIT_STEP).await;
            }
            if Arc::strong_count(&shard) > 1 {
                tracing::warn!(
                    "{key}: closed while {} holders still have it",
                    Arc::strong_count(&shard) - 1
                );
            }
            let dir = shard.dir.clone();
            drop(shard);
            let _ = tokio::task::spawn_blocking(move || crate::local_dir::remove(&dir)).await;
            self.resize_memtables().await;
        }
    }

    /// Sizes every open shard's memtables for how many are open now.
    async fn resize_memtables(&self) {
        let shards: Vec<Arc<Shard>> = lock(&self.shards).values().cloned().collect();
        let size = self.parts.rocks.size_for(shards.len());
        let _ = tokio::task::spawn_blocking(move || {
            for s in shards {
                if let Err(e) = s.resize_memtables(size) {
                    tracing::warn!("sizing the memtables of {}: {e}", s.id);
                }
            }
        })
        .await;
    }

    /// Compacts a shard's live state now (tests use it to run the TTL filter).
    pub async fn compact(&self, id: &sluice_common::pb::state::ShardId) -> Result<()> {
        let shard = self.shard(Some(id))?;
        tokio::task::spawn_blocking(move || shard.compact()).await?
    }

    async fn multi_get(&self, req: MultiGetRequest) -> Result<MultiGetResponse> {
        let shard = self.shard(req.shard.as_ref())?;
        self.check_count("keys", req.keys.len())?;
        let values = shard.multi_get(req.keys).await?;
        let bytes: usize = values
            .iter()
            .map(|v| v.as_ref().map_or(0, Bytes::len))
            .sum();
        if bytes > self.config.max_message_bytes.saturating_sub(1 << 20) {
            return Err(Error::TooLarge(format!(
                "the {} values asked for hold {bytes} bytes, more than a response may \
                 ({} bytes): ask for fewer keys at a time",
                values.len(),
                self.config.max_message_bytes
            )));
        }
        let io = &self.io;
        io.keys_read
            .fetch_add(values.len() as u64, Ordering::Relaxed);
        io.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
        let found = values.iter().map(Option::is_some).collect();
        let values = values.into_iter().map(Option::unwrap_or_default).collect();
        Ok(MultiGetResponse { values, found })
    }

    async fn write(&self, req: WriteRequest) -> Result<WriteResponse> {
        let shard = self.shard(req.shard.as_ref())?;
        self.check_fence(&shard.id, req.fence)?;
        self.check_count("ops", req.ops.len())?;
        let mut ops = Vec::with_capacity(req.ops.len());
        let bytes: usize = req.ops.iter().map(|o| o.key.len() + o.value.len()).sum();
        self.io
            .ops_written
            .fetch_add(req.ops.len() as u64, Ordering::Relaxed);
        self.io
            .bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
        for op in req.ops {
            let kind = write_op::Kind::try_from(op.kind)
                .map_err(|_| Error::InvalidArgument(format!("unknown write kind {}", op.kind)))?;
            ops.push(match kind {
                write_op::Kind::Put => Op::Put(op.key, op.value),
                write_op::Kind::Delete => Op::Delete(op.key),
                write_op::Kind::Merge => Op::Merge(op.key, op.value),
                write_op::Kind::DeleteRange => Op::DeleteRange(op.key, op.end),
            });
        }
        let epoch = req.epoch;
        tokio::task::spawn_blocking(move || shard.write(epoch, ops)).await??;
        self.relieve_memtables();
        Ok(WriteResponse {})
    }

    async fn scan(&self, req: ScanRequest) -> Result<ScanResponse> {
        let shard = self.shard(req.shard.as_ref())?;
        let limit = match req.limit as usize {
            0 => DEFAULT_SCAN_PAGE,
            n => n.min(self.config.max_batch_ops),
        };
        let max_bytes = self.config.max_message_bytes / 2;
        let (entries, resume) =
            tokio::task::spawn_blocking(move || shard.scan(&req.start, &req.end, limit, max_bytes))
                .await??;
        let (keys, values) = entries.into_iter().unzip();
        Ok(ScanResponse {
            keys,
            values,
            more: resume.is_some(),
            resume_key: resume.unwrap_or_default(),
        })
    }

    /// Span `name` of a call on `shard` for checkpoint (or epoch) `id`, under the
    /// caller's span.
    fn shard_span(
        &self,
        name: &'static str,
        parent: &opentelemetry::Context,
        shard: Option<&sluice_common::pb::state::ShardId>,
        id: u64,
    ) -> opentelemetry::Context {
        let shard = shard.cloned().unwrap_or_default();
        trace::start(
            name,
            parent,
            vec![
                KeyValue::new("sluice.node_id", self.config.node_id.clone()),
                KeyValue::new("sluice.job_id", shard.job_id),
                KeyValue::new(
                    "sluice.key_groups",
                    format!("{}-{}", shard.key_group_start, shard.key_group_end),
                ),
                KeyValue::new("sluice.checkpoint_id", id as i64),
            ],
            None,
        )
    }

    async fn flush(&self, req: FlushRequest) -> Result<FlushResponse> {
        let shard = self.shard(req.shard.as_ref())?;
        self.check_fence(&shard.id, req.fence)?;
        let (handle, durable_bytes) = shard.flush().await?;
        shard.flushed_epoch.fetch_max(req.epoch, Ordering::SeqCst);
        self.io.flushes.fetch_add(1, Ordering::Relaxed);
        self.io
            .flushed_bytes
            .fetch_add(durable_bytes, Ordering::Relaxed);
        Ok(FlushResponse {
            handle,
            durable_bytes,
        })
    }

    async fn commit(&self, req: CommitRequest) -> Result<CommitResponse> {
        let shard = self.shard(req.shard.as_ref())?;
        if req.checkpoint_id == 0 {
            return Err(Error::InvalidArgument(
                "checkpoint 0 cannot be committed (the first checkpoint is 1)".into(),
            ));
        }
        let manifest = shard.commit(req.checkpoint_id, &req.retained).await?;
        self.io.commits.fetch_add(1, Ordering::Relaxed);
        self.relieve_memtables();
        Ok(CommitResponse { manifest })
    }

    async fn rollback(&self, req: RollbackRequest) -> Result<RollbackResponse> {
        let shard = self.shard(req.shard.as_ref())?;
        self.raise_fence(&shard.id, req.fence).await?;
        let c = req.checkpoint_id;
        let undone = tokio::task::spawn_blocking(move || shard.rollback(c)).await??;
        Ok(RollbackResponse { undone })
    }

    async fn close_shard(&self, req: CloseShardRequest) -> Result<CloseShardResponse> {
        let key = ShardKey::from_pb(req.shard.as_ref())?;
        let _open = self.open_lock.lock().await;
        if !lock(&self.shards).contains_key(&key) {
            return Err(Error::NotFound(format!("{key} is not open on this node")));
        }
        self.close_locked(&key).await;
        Ok(CloseShardResponse {})
    }

    /// The node's status.
    pub fn status(&self) -> StatusResponse {
        let shards: Vec<Arc<Shard>> = lock(&self.shards).values().cloned().collect();
        let (cache_hits, cache_misses) = self.parts.cache.stats();
        StatusResponse {
            node_id: self.config.node_id.clone(),
            shards: shards
                .iter()
                .map(|s| ShardStatus {
                    shard: Some(s.id.to_pb()),
                    committed_checkpoint: s.committed(),
                    last_durable_epoch: s.last_durable_epoch.load(Ordering::SeqCst),
                    approximate_bytes: s.approximate_bytes(),
                })
                .collect(),
            restore_bytes_total: self.restore_bytes_total.load(Ordering::Relaxed),
            cache_hits,
            cache_misses,
            memory_limit_bytes: self.config.memory_bytes,
            pending_bytes: self.parts.pending.used() as u64,
            spilled_bytes_total: self.parts.pending.spilled_bytes(),
        }
    }

    /// One line on where the node's memory goes: RocksDB's block cache (memtables
    /// charged to it included), memtables and table readers of every shard, their
    /// uncommitted writes, foyer's memory tier, and the process's resident set and
    /// threads (Linux).
    pub fn memory_report(&self) -> String {
        let shards: Vec<Arc<Shard>> = lock(&self.shards).values().cloned().collect();
        let (mut memtables, mut readers, mut pending) = (0u64, 0u64, 0u64);
        for s in &shards {
            let (m, r) = s.rocksdb_memory();
            memtables += m;
            readers += r;
            pending += s.pending_bytes() as u64;
        }
        let mib = |b: u64| b >> 20;
        let or_unknown = |v: Option<u64>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
        format!(
            "memory: budget {} MiB; block cache {} MiB (pinned {} MiB); memtables {} MiB; \
             table readers {} MiB; uncommitted writes {} MiB (spilled {} MiB so far); \
             foyer memory {} MiB; {} shards; rss {} MiB; threads {}; heap {}",
            mib(self.config.memory_bytes),
            mib(self.parts.rocks.cache_usage() as u64),
            mib(self.parts.rocks.cache_pinned_usage() as u64),
            mib(memtables),
            mib(readers),
            mib(pending),
            mib(self.parts.pending.spilled_bytes()),
            mib(self.parts.cache.memory_usage() as u64),
            shards.len(),
            or_unknown(sluice_common::process::self_rss_bytes().map(mib)),
            or_unknown(sluice_common::process::self_threads()),
            crate::heap::stats().map_or_else(
                || "?".to_string(),
                |(used, free, mapped)| format!(
                    "{} MiB in use ({} MiB mapped alone), {} MiB free but kept",
                    mib(used as u64),
                    mib(mapped as u64),
                    mib(free as u64)
                )
            ),
        )
    }

    /// Closes every shard (at shutdown).
    pub async fn close_all(&self) {
        let keys: Vec<ShardKey> = lock(&self.shards).keys().cloned().collect();
        let _open = self.open_lock.lock().await;
        for k in keys {
            self.close_locked(&k).await;
        }
        self.parts.cache.close().await;
    }
}

/// The tonic service over a [`Node`].
#[derive(Clone, Debug)]
pub struct StateServer(pub Arc<Node>);

#[tonic::async_trait]
impl StateService for StateServer {
    async fn open_shard(
        &self,
        r: Request<OpenShardRequest>,
    ) -> Result<Response<OpenShardResponse>, Status> {
        // Run to the end even when the caller goes away (a writer whose other shard
        // refused it drops its calls): an open cut short in the middle of a restore
        // would leave a RocksDB instance being built, holding the shard directory's
        // lock, that the next open of the shard then fails on.
        let node = Arc::clone(&self.0);
        let req = r.into_inner();
        let opened = tokio::spawn(async move { node.open_shard(req).await })
            .await
            .map_err(|e| Status::internal(format!("opening the shard stopped: {e}")))?;
        Ok(Response::new(opened?))
    }

    async fn multi_get(
        &self,
        r: Request<MultiGetRequest>,
    ) -> Result<Response<MultiGetResponse>, Status> {
        Ok(Response::new(self.0.multi_get(r.into_inner()).await?))
    }

    async fn write(&self, r: Request<WriteRequest>) -> Result<Response<WriteResponse>, Status> {
        Ok(Response::new(self.0.write(r.into_inner()).await?))
    }

    async fn scan(&self, r: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        Ok(Response::new(self.0.scan(r.into_inner()).await?))
    }

    async fn flush(&self, r: Request<FlushRequest>) -> Result<Response<FlushResponse>, Status> {
        let parent = caller_span(&r);
        let req = r.into_inner();
        let span = parent.map(|p| {
            self.0
                .shard_span("shard flush", &p, req.shard.as_ref(), req.epoch)
        });
        let result = self.0.flush(req).await;
        if let Some(cx) = span {
            if let Ok(f) = &result {
                trace::set_attribute(
                    &cx,
                    KeyValue::new("sluice.durable_bytes", f.durable_bytes as i64),
                );
            }
            trace::end(&cx, None, result.as_ref().err().map(ToString::to_string));
        }
        Ok(Response::new(result?))
    }

    async fn commit(&self, r: Request<CommitRequest>) -> Result<Response<CommitResponse>, Status> {
        let parent = caller_span(&r);
        let req = r.into_inner();
        let span = parent.map(|p| {
            self.0
                .shard_span("shard commit", &p, req.shard.as_ref(), req.checkpoint_id)
        });
        let result = self.0.commit(req).await;
        if let Some(cx) = span {
            trace::end(&cx, None, result.as_ref().err().map(ToString::to_string));
        }
        Ok(Response::new(result?))
    }

    async fn rollback(
        &self,
        r: Request<RollbackRequest>,
    ) -> Result<Response<RollbackResponse>, Status> {
        Ok(Response::new(self.0.rollback(r.into_inner()).await?))
    }

    async fn close_shard(
        &self,
        r: Request<CloseShardRequest>,
    ) -> Result<Response<CloseShardResponse>, Status> {
        Ok(Response::new(self.0.close_shard(r.into_inner()).await?))
    }

    async fn status(&self, _r: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(self.0.status()))
    }
}

/// The caller's span, when its request carries a `traceparent` (a checkpoint's trace).
fn caller_span<T>(r: &Request<T>) -> Option<opentelemetry::Context> {
    r.metadata()
        .get(trace::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .map(trace::remote_parent)
}

/// Where a shard's fence is kept: `<shard root>/fence`, a decimal number.
fn fence_location(durable: &crate::store::Durable, key: &ShardKey) -> object_store::path::Path {
    crate::store::child(&durable.shard_root(key), "fence")
}
