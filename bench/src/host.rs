//! What the benchmarks borrow from the binary that runs them.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use sluice_common::pb;
use sluice_compute::network::NetworkConfig;
use sluice_coordinator::job::master::{MasterConfig, StateConnector};
use sluice_state_service::RunningStateService;

use crate::Result;

/// What a job run did.
#[derive(Debug, Clone, Copy)]
pub struct JobSummary {
    /// Records read by the sources.
    pub records_in: u64,
    /// Records written by the sinks.
    pub records_out: u64,
    /// Wall-clock seconds from planning to the end.
    pub seconds: f64,
}

/// The `sluice` binary's wiring that benchmarks use; `cli` implements it.
#[async_trait]
pub trait Host: Send + Sync {
    /// Plans and runs `graph` to its end as `sluice run` does: in this process with
    /// `workers == 0`, else across that many worker processes under a coordinator in
    /// this process. Keyed state goes where the command line said.
    fn run_job(&self, graph: pb::JobGraph, workers: u32) -> Result<JobSummary> {
        self.run_job_exporting(graph, workers, None)
    }

    /// [`Host::run_job`] with its metrics and traces exported over OTLP as `otlp` says:
    /// `None` as the environment says, `Some(None)` not at all, `Some(Some((endpoint,
    /// interval)))` to that endpoint at that interval.
    fn run_job_exporting(
        &self,
        graph: pb::JobGraph,
        workers: u32,
        otlp: Option<Option<(String, std::time::Duration)>>,
    ) -> Result<JobSummary>;

    /// Starts a state-service node in this process whose data and objects live under
    /// `dir`, as `sluice run` does for jobs with remote state.
    async fn start_state_service(&self, dir: &Path, memory: u64) -> Result<RunningStateService>;

    /// The coordinator's access to the shards on the state-service node at `endpoint`
    /// (`http://host:port`).
    fn state_connector(&self, endpoint: String) -> Arc<dyn StateConnector>;

    /// The settings a job master of this binary starts from.
    fn master_config(
        &self,
        workers: usize,
        network: &NetworkConfig,
        metrics_interval_ms: u64,
    ) -> MasterConfig;
}
