//! The coordinator's view of a job's remote state, over the compute crate's client.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_common::pb;
use sluice_common::pb::cluster as pbc;
use sluice_compute::state_client::{RemoteState, RemoteStateConfig};
use sluice_coordinator::job::master::{JobStateShards, StateConnector, max_parallelism};

/// Connects jobs to the state-service node at `endpoint`.
pub struct StateServiceConnector {
    /// `http://host:port` of the node.
    pub endpoint: String,
}

struct Shards {
    state: Arc<RemoteState>,
    endpoint: String,
}

#[async_trait]
impl StateConnector for StateServiceConnector {
    async fn connect(
        &self,
        job_id: &str,
        graph: &pb::JobGraph,
    ) -> Result<Arc<dyn JobStateShards>, String> {
        let mut config =
            RemoteStateConfig::new(self.endpoint.clone(), job_id, max_parallelism(graph));
        if let Some(s) = &graph.state
            && s.shards > 0
        {
            config.shards = s.shards;
        }
        let state = RemoteState::connect(config)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(Shards {
            state,
            endpoint: self.endpoint.clone(),
        }))
    }
}

#[async_trait]
impl JobStateShards for Shards {
    async fn open(&self) -> Result<u64, String> {
        self.state.open_all().await.map_err(|e| e.to_string())
    }

    async fn rollback(&self, checkpoint: u64, fence: u64) -> Result<(), String> {
        let done = if checkpoint == 0 {
            // Nothing completed: drop every epoch (OpenShard(0) would mean "latest").
            self.state.rollback(0, fence).await.map(|_| ())
        } else {
            self.state.restore_to(checkpoint, fence).await.map(|_| ())
        };
        done.map_err(|e| e.to_string())
    }

    async fn commit(&self, checkpoint: u64, retained: &[u64]) -> Result<(), String> {
        self.state
            .commit(checkpoint, retained)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn reference(&self) -> pbc::RemoteStateRef {
        pbc::RemoteStateRef {
            endpoint: self.endpoint.clone(),
            job_id: self.state.layout().job_id().to_owned(),
            shards: self.state.layout().len() as u32,
            first_epoch: 0,
            fence: 0,
        }
    }

    async fn restore_bytes(&self) -> Result<u64, String> {
        self.state
            .status()
            .await
            .map(|s| s.restore_bytes_total)
            .map_err(|e| e.to_string())
    }
}
