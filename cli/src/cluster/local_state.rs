//! Where `sluice run` keeps a job's keyed state: a state-service node (one it starts in
//! this process unless `--state-service` names one) for `state: { backend: remote }`,
//! or this process's memory, which the embedded coordinator restores and commits when
//! the workers run in this process too.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use clap::Args;
use sluice_common::state::{PlacementHints, StateConnector, StateResult, StateStore};
use sluice_common::{byte_size, pb};
use sluice_compute::keyed::{InProcessState, MemoryStores};
use sluice_compute::state_client::StateServiceConnector;
use sluice_state_service::RunningStateService;

use crate::Failure;
use crate::state_service::start_embedded;

/// Where a job with `state: { backend: remote }` keeps its state.
#[derive(Args, Clone, Default)]
pub struct StateArgs {
    /// A running state service (`http://host:port`); without it, `sluice run` starts an
    /// embedded one.
    #[arg(long, env = "SLUICE_STATE_SERVICE")]
    pub state_service: Option<String>,
    /// Directory of the embedded state service (its object store and RocksDB) and of
    /// the run's checkpoint metadata, kept after the run (a later run starts afresh under
    /// a new job id; `--from-savepoint` resumes one). Default: a temporary directory
    /// removed at the end.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Memory budget of the embedded state service.
    #[arg(long, default_value = "256MiB", value_parser = byte_size::parse)]
    pub state_memory: u64,
}

/// The state a run's jobs use.
pub struct LocalState {
    /// The state service, when the job asks for it.
    remote: Option<StateServiceConnector>,
    /// Memory state, when the workers run in this process.
    memory: Option<Arc<MemoryStores>>,
    embedded: Option<RunningStateService>,
    _temp_dir: Option<tempfile::TempDir>,
}

impl LocalState {
    /// Starts what `graph` needs: a state-service node for remote state (unless `args`
    /// names one); the memory stores the in-process workers share when `in_process`.
    pub async fn start(
        graph: &pb::JobGraph,
        args: &StateArgs,
        in_process: bool,
    ) -> Result<Self, Failure> {
        let memory = in_process.then(MemoryStores::new);
        let remote = graph
            .state
            .as_ref()
            .is_some_and(|s| s.backend() == pb::StateBackend::Remote);
        if !remote {
            return Ok(Self {
                remote: None,
                memory,
                embedded: None,
                _temp_dir: None,
            });
        }
        let (endpoint, embedded, temp) = match &args.state_service {
            Some(url) => (url.clone(), None, None),
            None => {
                let (dir, temp) = match &args.state_dir {
                    Some(d) => (d.clone(), None),
                    None => {
                        let t = tempfile::Builder::new()
                            .prefix("sluice-state-")
                            .tempdir()
                            .map_err(|e| {
                                Failure::from(anyhow::anyhow!("temporary state dir: {e}"))
                            })?;
                        (t.path().to_path_buf(), Some(t))
                    }
                };
                let service = start_embedded(&dir, args.state_memory).await?;
                (
                    format!(
                        "{}://{}",
                        sluice_common::tls::scheme(),
                        service.local_addr()
                    ),
                    Some(service),
                    temp,
                )
            }
        };
        Ok(Self {
            remote: Some(StateServiceConnector {
                endpoint: Some(endpoint),
            }),
            memory,
            embedded,
            _temp_dir: temp,
        })
    }

    /// The workers' shared memory stores, when they run in this process.
    pub fn memory(&self) -> Option<Arc<MemoryStores>> {
        self.memory.clone()
    }

    /// The coordinator's way to the state.
    pub fn connector(&self) -> Arc<dyn StateConnector> {
        Arc::new(LocalConnector {
            remote: self.remote.clone(),
            memory: self.memory.clone().map(InProcessState),
        })
    }

    /// Stops the embedded node, if there is one.
    pub async fn close(self) {
        if let Some(service) = self.embedded
            && let Err(e) = service.shutdown().await
        {
            tracing::warn!("embedded state service did not shut down cleanly: {e}");
        }
    }
}

/// The state service for remote state, this process's memory for the rest.
struct LocalConnector {
    remote: Option<StateServiceConnector>,
    memory: Option<InProcessState>,
}

#[async_trait]
impl StateConnector for LocalConnector {
    async fn connect(
        &self,
        job_id: &str,
        graph: &pb::JobGraph,
        hints: &PlacementHints,
    ) -> StateResult<Option<Arc<dyn StateStore>>> {
        if let Some(r) = &self.remote
            && let Some(store) = r.connect(job_id, graph, hints).await?
        {
            return Ok(Some(store));
        }
        match &self.memory {
            Some(m) => m.connect(job_id, graph, hints).await,
            None => Ok(None),
        }
    }
}
