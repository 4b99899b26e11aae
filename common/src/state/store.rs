//! A job's keyed state as a whole: the seam between the runtime (or the coordinator)
//! and whichever store holds the state.
//!
//! A [`StateStore`] hands each subtask its [`KeyedStateBackend`] over the key groups the
//! subtask owns, and moves the whole job's state between checkpoints: [`open`] says which
//! checkpoint it holds, [`restore`] goes back to a completed checkpoint (dropping every
//! later write, at any parallelism: subtasks of the next attempt may own other key-group
//! ranges), [`commit`] lets versions that no retained checkpoint needs go. Two stores
//! implement it: the in-memory one ([`MemoryStateStore`](super::MemoryStateStore)) and
//! the client of the remote state service (in the runtime crate). Both pass the epoch
//! cases of [`conformance`](super::conformance).
//!
//! [`open`]: StateStore::open
//! [`restore`]: StateStore::restore
//! [`commit`]: StateStore::commit

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;

use super::backend::KeyedStateBackend;
use super::error::StateResult;
use super::placement::LiveStateNode;
use crate::pb;

/// One job's keyed state, as one process reaches it.
#[async_trait]
pub trait StateStore: Send + Sync + std::fmt::Debug {
    /// Opens the job's state; returns the newest checkpoint it holds (0: none).
    async fn open(&self) -> StateResult<u64>;

    /// The backend of the subtask owning `key_groups`, whose writes start in epoch
    /// `first_epoch` (the checkpoint after the one restored).
    fn subtask(&self, key_groups: Range<u32>, first_epoch: u64) -> Arc<dyn KeyedStateBackend>;

    /// [`StateStore::subtask`] for an operator that keeps what it reads and writes in a
    /// cache of its own: the backend need not cache values for it (a second copy would
    /// only cost memory and time). By default the same backend.
    fn subtask_for_cached_operator(
        &self,
        key_groups: Range<u32>,
        first_epoch: u64,
    ) -> Arc<dyn KeyedStateBackend> {
        self.subtask(key_groups, first_epoch)
    }

    /// Brings the job's state back to completed checkpoint `checkpoint` (0: empty),
    /// dropping every later write, and refuses writers of attempts older than `fence`
    /// from then on (0: leaves the fence). Returns the bytes read back from durable
    /// storage to do it.
    async fn restore(&self, checkpoint: u64, fence: u64) -> StateResult<u64>;

    /// Checkpoint `checkpoint` completed job-wide; `retained` are the checkpoints a
    /// restore may still ask for.
    async fn commit(&self, checkpoint: u64, retained: &[u64]) -> StateResult<()>;

    /// The newest epoch a subtask of this process sealed (0: none).
    fn last_sealed(&self) -> u64;

    /// Bytes read back from durable storage to open or restore this store's state so
    /// far (a rescale must add none; moving shards to other nodes adds what they read).
    async fn restored_bytes(&self) -> StateResult<u64> {
        Ok(0)
    }

    /// How workers reach this state (without `first_epoch` and `fence`): a
    /// state-service endpoint, or an empty one for memory of this process, which only
    /// workers running in it share.
    fn reference(&self) -> pb::cluster::RemoteStateRef {
        pb::cluster::RemoteStateRef::default()
    }
}

/// What the coordinator knows of the state nodes when it connects a job to its state.
#[derive(Clone, Debug, Default)]
pub struct PlacementHints {
    /// The registered, live state nodes (empty: none registered).
    pub nodes: Vec<LiveStateNode>,
    /// Where the job's shards were: the last attempt's placement, or that of the
    /// checkpoint it restores.
    pub previous: Vec<(Range<u32>, String)>,
    /// Spread the shards evenly over the nodes, moving some off nodes holding more than
    /// their share (a rebalance), rather than keeping every shard where it is.
    pub balance: bool,
}

/// Finds the state of jobs.
#[async_trait]
pub trait StateConnector: Send + Sync {
    /// The state of job `job_id`, whose graph is `graph`, its shards placed by `hints`
    /// where the connector places shards; `None` when this connector does not hold the
    /// backend the graph asks for.
    async fn connect(
        &self,
        job_id: &str,
        graph: &pb::JobGraph,
        hints: &PlacementHints,
    ) -> StateResult<Option<Arc<dyn StateStore>>>;
}
