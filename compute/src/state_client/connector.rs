//! The coordinator's way to a job's shards in the state service: a [`StateConnector`]
//! over the client in this module, so the coordinator restores and commits shards
//! without knowing gRPC or the shard layout.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_common::pb;
use sluice_common::state::{StateConnector, StateResult, StateStore};

use super::{RemoteState, RemoteStateConfig, RemoteStore};

/// Connects jobs with `state: { backend: remote }` to the state-service node at
/// `endpoint`.
#[derive(Debug, Clone)]
pub struct StateServiceConnector {
    /// `http://host:port` of the node.
    pub endpoint: String,
}

#[async_trait]
impl StateConnector for StateServiceConnector {
    async fn connect(
        &self,
        job_id: &str,
        graph: &pb::JobGraph,
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
        let mut config = RemoteStateConfig::new(self.endpoint.clone(), job_id, max_parallelism);
        if state.shards > 0 {
            config.shards = state.shards;
        }
        let remote = RemoteState::connect(config).await?;
        Ok(Some(Arc::new(RemoteStore(remote))))
    }
}
