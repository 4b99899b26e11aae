//! The coordinator's way to a job's shards in the state service: a [`StateConnector`]
//! over the client in this module, so the coordinator restores and commits shards
//! without knowing gRPC or the shard layout.
//!
//! It places the job's shards over the state nodes registered with the coordinator
//! ([`placement::place`]); with none registered, every shard is on the node the
//! coordinator was started with (`--state-service`), if any.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_common::pb;
use sluice_common::state::placement;
use sluice_common::state::{PlacementHints, StateConnector, StateError, StateResult, StateStore};

use super::{RemoteState, RemoteStateConfig, RemoteStore, ShardLayout};

/// Connects jobs with `state: { backend: remote }` to the registered state nodes, or to
/// the node at `endpoint` when none is registered.
#[derive(Debug, Clone, Default)]
pub struct StateServiceConnector {
    /// `http://host:port` of the node used when no node is registered.
    pub endpoint: Option<String>,
}

/// Closes the copies of the job's shards that live nodes hold although the placement
/// put the shards elsewhere (they moved: a drain, a rebalance, a node that came back),
/// so that each shard is open on one node. The job's previous attempt has stopped by
/// the time its state is connected again, and the moved shards' checkpoint is in the
/// object store. Best effort: a copy left open is only wasted memory.
async fn close_stale_copies(remote: &RemoteState, job_id: &str, hints: &PlacementHints) {
    let layout = remote.layout();
    let placed = remote.placement();
    let index_of = |r: &std::ops::Range<u32>| (0..layout.len()).find(|&i| layout.range(i) == *r);
    let mut stale: Vec<(usize, String)> = Vec::new();
    for node in &hints.nodes {
        for s in node.shards.iter().filter(|s| s.job_id == job_id) {
            if let Some(i) = index_of(&s.key_groups)
                && placed[i] != node.endpoint
            {
                stale.push((i, node.endpoint.clone()));
            }
        }
    }
    for (range, endpoint) in &hints.previous {
        let live = hints.nodes.iter().any(|n| &n.endpoint == endpoint);
        if let Some(i) = index_of(range)
            && live
            && &placed[i] != endpoint
        {
            stale.push((i, endpoint.clone()));
        }
    }
    stale.sort();
    stale.dedup();
    for (i, endpoint) in stale {
        if let Err(e) = remote.close_stale_copy(i, &endpoint).await {
            tracing::warn!(job = job_id, shard = i, node = %endpoint, "cannot close a moved shard's old copy: {e}");
        }
    }
}

#[async_trait]
impl StateConnector for StateServiceConnector {
    async fn connect(
        &self,
        job_id: &str,
        graph: &pb::JobGraph,
        hints: &PlacementHints,
    ) -> StateResult<Option<Arc<dyn StateStore>>> {
        let Some(state) = graph
            .state
            .as_ref()
            .filter(|s| s.backend() == pb::StateBackend::Remote)
        else {
            return Ok(None);
        };
        let max_parallelism = match graph.max_parallelism {
            0 => sluice_common::DEFAULT_MAX_PARALLELISM,
            n => n,
        };
        let mut config = RemoteStateConfig::new(String::new(), job_id, max_parallelism);
        if state.shards > 0 {
            config.shards = state.shards;
        }
        if hints.nodes.is_empty() {
            config.endpoint = self.endpoint.clone().ok_or_else(|| {
                StateError::Unavailable(
                    "no state node is registered with the coordinator (start `sluice \
                     state-service --coordinator URL`), and it names none with \
                     --state-service"
                        .into(),
                )
            })?;
        } else {
            let layout = ShardLayout::new(job_id, max_parallelism, config.shards);
            let ranges: Vec<_> = (0..layout.len()).map(|i| layout.range(i)).collect();
            config.placement = placement::place(
                job_id,
                &ranges,
                &hints.nodes,
                &hints.previous,
                hints.balance,
            )
            .map_err(StateError::Unavailable)?;
            config.endpoint = config.placement[0].clone();
        }
        let remote = RemoteState::connect(config).await?;
        close_stale_copies(&remote, job_id, hints).await;
        Ok(Some(Arc::new(RemoteStore(remote))))
    }
}
