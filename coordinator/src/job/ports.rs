//! The ports through which a job reaches what the coordinator does not own: the state
//! service ([`StateConnector`], [`JobStateShards`]) and worker processes
//! ([`WorkerLauncher`]). The CLI implements them; the job's actor calls them. Traits
//! only: nothing here knows how a job is driven or how the state service stores
//! anything.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_common::pb;
use sluice_common::pb::cluster as pbc;

/// A job's keyed state in the state service, as the coordinator needs it.
#[async_trait]
pub trait JobStateShards: Send + Sync {
    /// Opens every shard; returns the checkpoint they hold.
    async fn open(&self) -> Result<u64, String>;
    /// Brings every shard to `checkpoint`: drops later writes, or restores it from the
    /// object store when a later checkpoint was committed since; and raises the shards'
    /// fence to `fence`, so writers of earlier attempts are refused from then on.
    async fn rollback(&self, checkpoint: u64, fence: u64) -> Result<(), String>;
    /// Commits `checkpoint`, keeping `retained`.
    async fn commit(&self, checkpoint: u64, retained: &[u64]) -> Result<(), String>;
    /// What workers need to reach the shards (without `first_epoch`).
    fn reference(&self) -> pbc::RemoteStateRef;
    /// Bytes the node(s) downloaded to restore shards so far (rescaling must add none).
    async fn restore_bytes(&self) -> Result<u64, String>;
}

/// Connects jobs to the state service.
#[async_trait]
pub trait StateConnector: Send + Sync {
    /// The shards of job `job_id` with graph `graph` (which asked for remote state).
    async fn connect(
        &self,
        job_id: &str,
        graph: &pb::JobGraph,
    ) -> Result<Arc<dyn JobStateShards>, String>;
}

/// Starts worker processes when a job needs more than are attached (embedded clusters).
pub trait WorkerLauncher: Send + Sync {
    /// Makes sure `n` launched workers are alive (starting replacements for dead ones).
    fn ensure(&self, n: usize);
}
