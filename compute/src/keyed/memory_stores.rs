//! The memory stores of the jobs this process runs, shared by its in-process workers
//! and the coordinator beside them.
//!
//! `sluice run` runs its workers in the coordinator's process: a job keeping its state
//! in memory then has one [`MemoryStateStore`] in that process, which the coordinator
//! restores and commits (through [`InProcessState`], a [`StateConnector`]) and every
//! attempt's subtasks write, so such a job restarts from its checkpoints like one on the
//! state service. Workers in other processes never see it: the coordinator tells them a
//! state lives "in this process" with an empty endpoint, and a worker without the
//! registry refuses such a deployment.
//!
//! A store lives as long as someone holds it (the coordinator's job, or a running
//! attempt): the registry keeps weak references.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use sluice_common::pb;
use sluice_common::state::{
    MemoryStateStore, PlacementHints, StateConnector, StateResult, StateStore,
};

/// The jobs' memory stores of this process, by job id.
#[derive(Debug, Default)]
pub struct MemoryStores {
    stores: Mutex<HashMap<String, Weak<MemoryStateStore>>>,
}

impl MemoryStores {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The store of job `job_id`, created (`versioned` when the job takes checkpoints)
    /// when nobody holds one.
    pub fn store(&self, job_id: &str, versioned: bool) -> Arc<MemoryStateStore> {
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        stores.retain(|_, s| s.strong_count() > 0);
        if let Some(s) = stores.get(job_id).and_then(Weak::upgrade) {
            return s;
        }
        let s = Arc::new(MemoryStateStore::new(versioned));
        stores.insert(job_id.to_owned(), Arc::downgrade(&s));
        s
    }
}

/// The coordinator's way to the memory state of jobs whose workers run in this process.
#[derive(Debug, Clone)]
pub struct InProcessState(pub Arc<MemoryStores>);

#[async_trait]
impl StateConnector for InProcessState {
    async fn connect(
        &self,
        job_id: &str,
        graph: &pb::JobGraph,
        _hints: &PlacementHints,
    ) -> StateResult<Option<Arc<dyn StateStore>>> {
        let remote = graph
            .state
            .as_ref()
            .is_some_and(|s| s.backend() == pb::StateBackend::Remote);
        if remote {
            return Ok(None);
        }
        let versioned = graph.checkpoint.as_ref().is_some_and(|c| c.interval_ms > 0);
        Ok(Some(self.0.store(job_id, versioned)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_lives_while_held_and_is_shared_meanwhile() {
        let stores = MemoryStores::new();
        let a = stores.store("job", true);
        let b = stores.store("job", true);
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        let c = stores.store("job", true);
        assert!(c.is_empty());
        assert_eq!(stores.stores.lock().unwrap().len(), 1);
    }
}
