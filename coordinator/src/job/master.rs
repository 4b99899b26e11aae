//! A job's master: what it is given and how it is started.
//!
//! The master of a job is an actor (`super::actor`) around a pure driver
//! ([`super::driver`]). This module is their face to the rest of the coordinator: the
//! settings ([`MasterConfig`]), the ports through which the master reaches what it
//! does not own (re-exported from [`super::ports`]: the state service,
//! [`StateConnector`] and [`StateStore`]; worker processes, [`WorkerLauncher`]),
//! and [`JobMaster::spawn`], which starts the actor and returns the [`JobHandle`] the
//! service keeps: a command channel, the published status, and the task to wait for.
//!
//! It knows nothing of how a job is driven.

use std::sync::Arc;
use std::time::Duration;

use sluice_common::pb;
use sluice_common::pb::cluster as pbc;
use tokio::sync::{mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use super::actor::{JobActor, Ports, now_ms};
use super::command::Command;
use super::driver::{Driver, DriverConfig, JobHistory, Setup};
use super::lifecycle::JobState;
use super::restart::RestartPolicy;
use super::status::{CHECKPOINT_HISTORY, JobStatus};
use crate::checkpoint::metadata::CheckpointMetadata;
use crate::checkpoint::store::{self, MetadataStore};
use crate::cluster::registry::Registry;
use crate::cluster::state_nodes::StateNodes;

pub use super::graph::{graph_parallelism, max_parallelism, set_parallelism};
pub use super::ports::{StateConnector, StateStore, WorkerLauncher};

/// How long workers may take to confirm that an attempt is cancelled.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stop waits for the tasks to commit its savepoint's output.
const STOP_COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of a job's master.
#[derive(Clone)]
pub struct MasterConfig {
    /// Worker processes to run the job on.
    pub workers: usize,
    /// Restarts after failures.
    pub restart: RestartPolicy,
    /// How long to wait for workers, ports and deployments.
    pub deploy_timeout: Duration,
    /// Data-plane settings for the workers.
    pub network: pbc::NetworkConfig,
    /// Workers print task metrics this often (0: at the end only).
    pub metrics_interval_ms: u64,
    /// This coordinator incarnation.
    pub coordinator_id: String,
    /// Whose shards in the state service the job uses: its own id (`None`), or the
    /// job it took a savepoint from.
    pub state_id: Option<String>,
    /// The workers run in this process, whose memory holds the keyed state of jobs
    /// with `state: { backend: memory }`: the coordinator restores and commits it as it
    /// does the state service's, so such jobs restart from their checkpoints.
    pub in_process_state: bool,
}

/// A running job's master, as the service holds it.
#[derive(Debug)]
pub struct JobHandle {
    /// Where user commands go.
    pub commands: mpsc::UnboundedSender<Command>,
    /// The job's status, as its driver last published it.
    pub status: watch::Receiver<JobStatus>,
    /// The actor's task: its terminal state. Dropping it aborts the actor.
    pub done: AbortOnDropHandle<JobState>,
}

/// Starts job masters.
pub struct JobMaster;

impl JobMaster {
    /// Starts the master of job `id` (graph `graph`), resuming from `resume` when given.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        id: String,
        graph: pb::JobGraph,
        config: MasterConfig,
        registry: Arc<Registry>,
        store: Arc<dyn MetadataStore>,
        state_connector: Option<Arc<dyn StateConnector>>,
        state_nodes: Arc<StateNodes>,
        launcher: Option<Arc<dyn WorkerLauncher>>,
        resume: Option<CheckpointMetadata>,
    ) -> JobHandle {
        let (commands_tx, commands) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::unbounded_channel();
        registry.add_job(&id, events_tx);
        let driver_config = DriverConfig {
            job_id: id.clone(),
            coordinator_id: config.coordinator_id.clone(),
            workers: config.workers,
            restart: config.restart,
            deploy_timeout: config.deploy_timeout,
            cancel_timeout: CANCEL_TIMEOUT,
            stop_commit_timeout: STOP_COMMIT_TIMEOUT,
            network: config.network,
            metrics_interval_ms: config.metrics_interval_ms,
            in_process_state: config.in_process_state,
        };
        let now = now_ms();
        let initial = JobStatus::new(&id, &graph.name, graph_parallelism(&graph), now);
        let (status_tx, status) = watch::channel(initial);
        let ports = Ports {
            registry,
            store,
            state_connector,
            state_nodes,
            launcher,
            state_id: config.state_id.clone().unwrap_or_else(|| id.clone()),
        };
        let done = AbortOnDropHandle::new(tokio::spawn(async move {
            // Checkpoint ids continue after the newest one in the store.
            let existing = store::checkpoint_ids(ports.store.as_ref(), &id)
                .await
                .unwrap_or_default();
            let driver = Driver::new(Setup {
                config: driver_config,
                graph,
                resume,
                first_checkpoint_id: existing.last().map_or(1, |l| l + 1),
                now,
                history: history(ports.store.as_ref(), &id, &existing).await,
            });
            status_tx.send_replace(driver.status().clone());
            JobActor::new(id, driver, ports, commands, events, status_tx)
                .run()
                .await
        }));
        JobHandle {
            commands: commands_tx,
            status,
            done,
        }
    }
}

/// What the store holds of job `id`'s past (its checkpoints `existing`): the newest
/// checkpoints' metadata and the recorded failures. What cannot be read is left out
/// with a warning: history never stops a job from resuming.
async fn history(store: &dyn MetadataStore, id: &str, existing: &[u64]) -> JobHistory {
    let mut checkpoints = Vec::new();
    let newest = existing.len().saturating_sub(CHECKPOINT_HISTORY);
    for &c in &existing[newest..] {
        let read = match store::checkpoint_path(id, c) {
            Ok(path) => store::read_metadata(store, &path).await,
            Err(e) => Err(e),
        };
        match read {
            Ok(m) => checkpoints.push(m),
            Err(e) => tracing::warn!(
                job = id,
                checkpoint = c,
                "checkpoint left out of the job's history: {e}"
            ),
        }
    }
    let failures = store::failure_history(store, id).await.unwrap_or_else(|e| {
        tracing::warn!(job = id, "cannot read the job's failures: {e}");
        Vec::new()
    });
    JobHistory {
        checkpoints,
        failures,
    }
}
