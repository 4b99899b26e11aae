//! `sluice run JOB.yaml --workers N`: the coordinator's code with an embedded cluster.
//!
//! The job is planned here first (a mistake in it is reported once, with exit code 2);
//! then a coordinator starts in this process (its workers' gRPC API on 127.0.0.1, its
//! `_metadata` store in a temporary directory, or under `--state-dir`), a
//! [`ProcessLauncher`] starts N `sluice worker` child processes attached to it (and
//! replacements for workers that die, when the job restarts from a checkpoint), and the
//! job is submitted and waited for. Without checkpoints a dead worker fails the run; with
//! them, the coordinator restarts the job from its last checkpoint.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_common::pb;
use sluice_compute::network::NetworkConfig;
use sluice_coordinator::checkpoint::store::ObjectMetadataStore;
use sluice_coordinator::job::master::{MasterConfig, StateConnector, WorkerLauncher};
use sluice_coordinator::job::{JobState, RestartPolicy};
use sluice_coordinator::service::{self, Coordinator, CoordinatorOptions, SubmitOptions};

use crate::Failure;
use crate::cluster::state::StateServiceConnector;
use crate::run::{StateArgs, Summary, connect_state};

/// Settings of a multi-process run.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// Number of worker processes.
    pub workers: u32,
    /// Data-plane settings sent to every worker.
    pub network: NetworkConfig,
    /// Workers print per-task metrics this often (0: only at the end).
    pub metrics_interval_ms: u64,
}

/// Starts `sluice worker` processes attached to a coordinator; kills them when dropped.
pub struct ProcessLauncher {
    exe: PathBuf,
    coordinator: String,
    children: Mutex<Vec<std::process::Child>>,
}

impl ProcessLauncher {
    /// Workers of this binary, attaching to `coordinator` (`http://host:port`).
    pub fn new(coordinator: String) -> Result<Self, Failure> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::from(anyhow::anyhow!("cannot find sluice: {e}")))?;
        Ok(Self {
            exe,
            coordinator,
            children: Mutex::new(Vec::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<std::process::Child>> {
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl WorkerLauncher for ProcessLauncher {
    fn ensure(&self, n: usize) {
        let mut children = self.lock();
        children.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        while children.len() < n {
            let spawned = std::process::Command::new(&self.exe)
                .args([
                    "worker",
                    "--coordinator",
                    &self.coordinator,
                    "--exit-with-coordinator",
                ])
                .stdin(std::process::Stdio::null())
                .spawn();
            match spawned {
                Ok(c) => children.push(c),
                Err(e) => {
                    tracing::error!("cannot start a worker: {e}");
                    return;
                }
            }
        }
    }
}

impl Drop for ProcessLauncher {
    fn drop(&mut self) {
        let mut children = self.lock();
        for c in children.iter_mut() {
            let _ = c.kill();
        }
        for c in children.iter_mut() {
            let _ = c.wait();
        }
    }
}

/// The settings every job master of a `sluice` process starts from.
pub fn master_config(
    workers: usize,
    network: &NetworkConfig,
    metrics_interval_ms: u64,
) -> MasterConfig {
    MasterConfig {
        workers,
        restart: RestartPolicy {
            max_restarts: 10,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        },
        deploy_timeout: Duration::from_secs(30),
        network: network.to_proto(),
        metrics_interval_ms,
        coordinator_id: format!("c{}-{}", std::process::id(), now_ms()),
        state_id: None,
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

fn fail(message: impl Into<String>) -> Failure {
    Failure::from(anyhow::anyhow!("{}", message.into()))
}

/// Runs `graph` on `options.workers` worker processes under an embedded coordinator.
pub async fn run(
    graph: pb::JobGraph,
    options: &DriverOptions,
    state: &StateArgs,
) -> Result<Summary, Failure> {
    let start = Instant::now();
    let plan = sluice_compute::plan::plan(graph.clone(), sluice_connectors::Builtin::shared())
        .await
        .map_err(Failure::from_compute)?;
    let remote = connect_state(&plan, state).await?;
    let connector: Option<Arc<dyn StateConnector>> = remote.as_ref().map(|r| {
        Arc::new(StateServiceConnector {
            endpoint: r.endpoint.clone(),
        }) as Arc<dyn StateConnector>
    });
    let result = run_job(graph, options, state, connector, start).await;
    if let Some(r) = remote {
        r.close().await;
    }
    result
}

async fn run_job(
    graph: pb::JobGraph,
    options: &DriverOptions,
    state: &StateArgs,
    connector: Option<Arc<dyn StateConnector>>,
    start: Instant,
) -> Result<Summary, Failure> {
    // Checkpoint metadata: next to the state when it is kept, else for this run only.
    let (dir, _temp) = match &state.state_dir {
        Some(d) => (d.join("coordinator"), None),
        None => {
            let t = tempfile::Builder::new()
                .prefix("sluice-coordinator-")
                .tempdir()
                .map_err(|e| fail(format!("temporary directory: {e}")))?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    let store = ObjectMetadataStore::from_url(&format!("file://{}", dir.display()))
        .map_err(|e| fail(format!("checkpoint store: {e}")))?;
    let (listener, addr) = service::bind("127.0.0.1:0", "workers")
        .await
        .map_err(|e| fail(e.to_string()))?;
    let launcher = Arc::new(ProcessLauncher::new(format!("http://{addr}"))?);
    let n = options.workers.max(1) as usize;
    let coordinator = Coordinator::new(CoordinatorOptions {
        store: Arc::new(store),
        state: connector,
        launcher: Some(launcher.clone()),
        heartbeat_interval: Duration::from_millis(500),
        heartbeat_timeout: Duration::from_secs(5),
        master: master_config(n, &options.network, options.metrics_interval_ms),
    });
    let server = coordinator.serve_workers(listener);
    let id = coordinator
        .submit(graph, SubmitOptions::default())
        .await
        .map_err(|e| Failure::usage(e.to_string()))?;
    let status = coordinator
        .wait(&id)
        .await
        .map_err(|e| fail(e.to_string()))?;
    server.abort();
    drop(launcher);
    match status.state {
        JobState::Finished => Ok(Summary {
            records_in: status.records_in,
            records_out: status.records_out,
            late: status.late,
            skipped: status.skipped,
            barriers: status.barriers,
            restarts: status.restarts,
            seconds: start.elapsed().as_secs_f64(),
        }),
        other => {
            let message = status
                .failure
                .unwrap_or_else(|| format!("the job ended {other}"));
            Err(if status.user_error {
                Failure::usage(message)
            } else {
                fail(message)
            })
        }
    }
}
