//! The Sluice state service (DESIGN §7-8): keyed state of jobs' shards, served over gRPC
//! (`common/proto/state_service.proto`), on RocksDB behind a foyer cache, durable in an
//! object store.
//!
//! # Parts
//! - [`server`]: the gRPC service, request limits and the map of open shards.
//! - [`registration`]: registering with a coordinator and heartbeating the open shards.
//! - [`shard`]: one key-group range of one job in one RocksDB instance; writes held in
//!   memory per uncommitted epoch ([`pending`]) until their checkpoint commits, reads
//!   through them and the cache ([`cache`]), flush and commit.
//! - [`delta`]: the checksummed record format of uploaded deltas and the local spool.
//! - [`manifest`]: what a restore of a committed checkpoint needs.
//! - [`snapshot`]: background, incremental upload of RocksDB checkpoints.
//! - [`restore`]: opening a shard empty or from the object store; [`gc`]: deleting
//!   objects no retained checkpoint needs.
//! - [`durability`]: what of a shard is in the object store, and the traits through
//!   which [`snapshot`] and [`gc`] see a shard without importing [`shard`];
//!   [`local_dir`]: removing a shard's local directories; [`lock`]: poison-tolerant
//!   locking.
//! - [`rocks`]: RocksDB options shared by all shards (one block cache, one write buffer
//!   manager, the merge operator, the TTL compaction filter of [`ttl_filter`]).
//! - [`store`]: the object store from its URL (`sluice-storage`) and the shard's objects
//!   in it; [`config`], [`error`].
//!
//! # Module order
//! Imports go one way: [`server`] -> [`restore`] -> [`shard`] -> [`snapshot`], [`gc`] ->
//! [`durability`], [`manifest`], [`store`] and the leaves. [`snapshot`] and [`gc`] work
//! on the traits of [`durability`] and [`snapshot`], which [`shard`] implements.
//!
//! # Durability in one paragraph
//! A write is appended to the shard's spool file and held in its epoch's layer in memory.
//! `Flush` cuts the spool into delta `n` and uploads it; only then does it answer, so an
//! answered flush is durable. `Commit(C)` writes manifest C (the last complete snapshot
//! plus every delta since) and applies the layers of epochs `<= C` to RocksDB (without
//! WAL). A node that dies loses nothing that was acknowledged: another one restores the
//! shard from manifest C. Uncommitted epochs are dropped with their layers.
//!
//! This crate must not know about operators, the compute side or the coordinator.

pub mod cache;
pub mod config;
pub mod delta;
pub mod durability;
pub mod error;
pub mod gc;
pub mod heap;
pub mod local_dir;
pub mod lock;
pub mod manifest;
pub mod metrics;
pub mod pending;
pub mod registration;
pub mod restore;
pub mod rocks;
pub mod server;
pub mod shard;
pub mod shard_id;
pub mod snapshot;
pub mod spill;
pub mod store;
pub mod ttl_filter;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use sluice_common::pb::state::state_service_server::StateServiceServer;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::server::TcpIncoming;

pub use crate::config::{ObjectStoreClientConfig, StateServiceConfig};
pub use crate::error::{Error, Result};
use crate::restore::NodeParts;
use crate::server::{Node, StateServer};

/// A running state service (embedded mode and tests).
#[derive(Debug)]
pub struct RunningStateService {
    local_addr: SocketAddr,
    node: Arc<Node>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The server; on drop it is told to stop and finishes closing the shards itself.
    task: Option<tokio::task::JoinHandle<Result<()>>>,
    /// The periodic memory report, when enabled.
    _memory_log: Option<AbortOnDropHandle<()>>,
}

impl RunningStateService {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The node behind the service (status, forced compaction in tests).
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Stops serving, closes every shard and waits for it.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningStateService {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn build_node(config: StateServiceConfig) -> Result<Node> {
    if config.max_batch_ops == 0 || config.max_message_bytes < (1 << 20) {
        return Err(Error::Config(
            "max_batch_ops must be positive and max_message_bytes at least 1 MiB".into(),
        ));
    }
    let client = &config.object_store_client;
    if client.connect_timeout.is_zero() || client.request_timeout.is_zero() {
        return Err(Error::Config(
            "object store connect and request timeouts must be positive".into(),
        ));
    }
    let data_dir = config.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|e| Error::io(&data_dir, e))?;
    let split = config.memory_split();
    let durable =
        store::Durable::from_url_with(&config.object_store_url, &config.object_store_client)?
            .with_upload_memory(split.uploads);
    let rocks = Arc::new(rocks::Rocks::new(split));
    let cache = Arc::new(
        cache::StateCache::build(
            split.foyer_memory,
            config.disk_cache_bytes,
            split.foyer_buffer_pool,
            &data_dir.join("foyer"),
        )
        .await?,
    );
    let parts = NodeParts {
        data_dir,
        rocks,
        cache,
        durable,
        pending: Arc::new(spill::PendingBudget::new(split.pending)),
    };
    Ok(Node::new(config, parts))
}

/// The log target of the periodic memory report (every 2 s when enabled at debug level,
/// e.g. `SLUICE_LOG=warn,sluice_state_service::memory=debug`).
pub const MEMORY_LOG: &str = "sluice_state_service::memory";

/// Binds `config.listen` and serves in the background.
pub async fn start(config: StateServiceConfig) -> Result<RunningStateService> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", config.listen)))?;
    let local_addr = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("listening socket: {e}")))?;
    let max_message = config.max_message_bytes;
    let node = Arc::new(build_node(config).await?);
    let svc = StateServiceServer::new(StateServer(Arc::clone(&node)))
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let memory_log = tracing::enabled!(target: MEMORY_LOG, tracing::Level::DEBUG).then(|| {
        let weak = Arc::downgrade(&node);
        AbortOnDropHandle::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
            loop {
                tick.tick().await;
                let Some(node) = weak.upgrade() else { break };
                let report = tokio::task::spawn_blocking(move || node.memory_report()).await;
                if let Ok(report) = report {
                    tracing::debug!(target: MEMORY_LOG, "{report}");
                }
            }
        }))
    });
    let serving = Arc::clone(&node);
    let task = tokio::spawn(async move {
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut builder = match sluice_common::tls::grpc_server() {
            Ok(builder) => builder,
            Err(e) => {
                serving.close_all().await;
                return Err(Error::Internal(e));
            }
        };
        let result = builder
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await
            .map_err(|e| Error::Internal(format!("gRPC server: {e}")));
        serving.close_all().await;
        result
    });
    tracing::info!("state service listening on {local_addr}");
    Ok(RunningStateService {
        local_addr,
        node,
        stop: Some(stop),
        task: Some(task),
        _memory_log: memory_log,
    })
}

/// Serves until `shutdown` completes.
pub async fn serve(config: StateServiceConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    let running = start(config).await?;
    shutdown.await;
    running.shutdown().await
}
