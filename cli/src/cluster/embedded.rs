//! `sluice run JOB.yaml`: the coordinator's code with an embedded cluster.
//!
//! The job is planned here first (a mistake in it is reported once, with exit code 2).
//! Then a coordinator starts in this process (its workers' gRPC API on 127.0.0.1, its
//! `_metadata` store in a temporary directory, under `--state-dir`, or at `--store`),
//! workers attach to it over that API, and the job is submitted and waited for: the
//! same deploy, checkpoint, commit, failover and restore paths as on a cluster.
//!
//! - Without `--workers`, one worker runs in this process ([`session::serve`] on a task
//!   of this runtime). Keyed state kept in memory is then this process's memory, which
//!   the coordinator restores and commits like the state service's, so a job with
//!   checkpoints restarts from its last one after a task fails.
//! - With `--workers N`, a [`ProcessLauncher`] starts N `sluice worker` child processes
//!   (and replacements for workers that die, when the job restarts from a checkpoint).
//!   Memory state then lives in those processes and is not restored.
//!
//! Without checkpoints a failure fails the run; with them, the coordinator restarts the
//! job from its last checkpoint.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_common::pb;
use sluice_compute::cluster::session::{self, SessionOptions};
use sluice_compute::cluster::worker::WorkerEnv;
use sluice_compute::network::NetworkConfig;
use sluice_coordinator::checkpoint::store::ObjectMetadataStore;
use sluice_coordinator::job::master::{MasterConfig, WorkerLauncher};
use sluice_coordinator::job::{JobState, RestartPolicy};
use sluice_coordinator::prometheus::CoordinatorMetrics;
use sluice_coordinator::service::{self, Coordinator, CoordinatorOptions, SubmitOptions};
use sluice_telemetry::Collect;
use tokio_util::task::AbortOnDropHandle;

use crate::Failure;
use crate::cluster::local_state::{LocalState, StateArgs};
use crate::progress::{Figures, Progress};
use crate::telemetry::TelemetryArgs;

/// Settings of an embedded run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Worker processes to start; 0 runs one worker in this process.
    pub workers: u32,
    /// Data-plane settings sent to every worker.
    pub network: NetworkConfig,
    /// Each worker process's network memory (`sluice worker --network-memory`; none:
    /// its default).
    pub network_memory: Option<u64>,
    /// Workers print per-task metrics this often (0: only at the end, and not at all
    /// for the worker in this process).
    pub metrics_interval_ms: u64,
    /// Where checkpoint metadata and job records live (a directory, `file://` or
    /// `s3://` URL); default: under `--state-dir`, or a temporary directory.
    pub store: Option<String>,
    /// A savepoint in that store to start from (as `sluice savepoint` printed it).
    pub from_savepoint: Option<String>,
    /// A live progress line on a terminal.
    pub progress: bool,
    /// Where the run's metrics go (its coordinator's and its in-process worker's; worker
    /// processes get the same endpoint).
    pub telemetry: TelemetryArgs,
    /// Cancels the job when cancelled (the SQL shell's Ctrl-C); it then ends as
    /// cancelled, an error.
    pub cancel: Option<tokio_util::sync::CancellationToken>,
}

/// What a finished job did.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Records read by the sources.
    pub records_in: u64,
    /// Records written by the sinks.
    pub records_out: u64,
    /// Late records counted by windows.
    pub late: u64,
    /// Malformed records skipped.
    pub skipped: u64,
    /// Checkpoint barriers that reached sinks.
    pub barriers: u64,
    /// Times the job restarted from a checkpoint after a failure.
    pub restarts: u32,
    /// Wall-clock seconds from planning to the end.
    pub seconds: f64,
}

/// Starts `sluice worker` processes attached to a coordinator; kills them when dropped.
pub struct ProcessLauncher {
    exe: PathBuf,
    coordinator: String,
    telemetry: TelemetryArgs,
    network_memory: Option<u64>,
    children: Mutex<Vec<std::process::Child>>,
}

impl ProcessLauncher {
    /// Workers of this binary, attaching to `coordinator` (`http://host:port`) and
    /// exporting their telemetry as `telemetry` says (its `--metrics-http` excepted: each
    /// worker would need an address of its own).
    pub fn new(coordinator: String, telemetry: TelemetryArgs) -> Result<Self, Failure> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::from(anyhow::anyhow!("cannot find sluice: {e}")))?;
        Ok(Self {
            exe,
            coordinator,
            telemetry,
            network_memory: None,
            children: Mutex::new(Vec::new()),
        })
    }

    /// Workers with `bytes` of network memory (none: their default).
    pub fn with_network_memory(mut self, bytes: Option<u64>) -> Self {
        self.network_memory = bytes;
        self
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
            let mut command = std::process::Command::new(&self.exe);
            command.args([
                "worker",
                "--coordinator",
                &self.coordinator,
                "--exit-with-coordinator",
            ]);
            if let Some(endpoint) = &self.telemetry.otlp_endpoint {
                command.args(["--otlp-endpoint", endpoint]);
            }
            if let Some(ms) = self.telemetry.otlp_interval_ms {
                command.args(["--otlp-interval-ms", &ms.to_string()]);
            }
            if let Some(bytes) = self.network_memory {
                command.args(["--network-memory", &bytes.to_string()]);
            }
            let spawned = command.stdin(std::process::Stdio::null()).spawn();
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
        in_process_state: false,
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

/// Runs `graph` to its end under a coordinator in this process.
pub async fn run(
    graph: pb::JobGraph,
    options: &RunOptions,
    state: &StateArgs,
) -> Result<Summary, Failure> {
    let start = Instant::now();
    let plan = sluice_compute::plan::plan(graph.clone(), sluice_connectors::Builtin::shared())
        .await
        .map_err(Failure::from_compute)?;
    let in_process = options.workers == 0;
    let memory_keyed = !sluice_compute::runtime::build::wants_remote_state(&plan)
        && graph
            .nodes
            .iter()
            .any(|n| n.kind.as_ref().is_some_and(pb::node::Kind::keeps_state));
    if memory_keyed && options.from_savepoint.is_some() {
        return Err(Failure::usage(
            "--from-savepoint: this job keeps its keyed state in memory, which no savepoint \
             holds; resuming it needs `state: { backend: remote }`",
        ));
    }
    let local = LocalState::start(&graph, state, in_process).await?;
    let result = run_job(graph, options, state, &local, start).await;
    local.close().await;
    result
}

/// The metadata store of a run: `--store`, else under `--state-dir`, else a temporary
/// directory (held by the returned guard).
fn metadata_store(
    options: &RunOptions,
    state: &StateArgs,
) -> Result<(ObjectMetadataStore, Option<tempfile::TempDir>), Failure> {
    if let Some(url) = &options.store {
        let url = crate::state_service::object_store_url("--store", url)?;
        let store = ObjectMetadataStore::from_url(&url)
            .map_err(|e| Failure::usage(format!("--store {url}: {e}")))?;
        return Ok((store, None));
    }
    let (dir, temp) = match &state.state_dir {
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
    Ok((store, temp))
}

async fn run_job(
    graph: pb::JobGraph,
    options: &RunOptions,
    state: &StateArgs,
    local: &LocalState,
    start: Instant,
) -> Result<Summary, Failure> {
    let (store, _temp) = metadata_store(options, state)?;
    let (listener, addr) = service::bind("127.0.0.1:0", "workers")
        .await
        .map_err(|e| fail(e.to_string()))?;
    let url = format!("{}://{addr}", sluice_common::tls::scheme());
    let launcher = match options.workers {
        0 => None,
        _ => Some(Arc::new(
            ProcessLauncher::new(url.clone(), options.telemetry.clone())?
                .with_network_memory(options.network_memory),
        )),
    };
    let mut master = master_config(
        options.workers.max(1) as usize,
        &options.network,
        options.metrics_interval_ms,
    );
    master.in_process_state = launcher.is_none();
    let coordinator = Coordinator::new(CoordinatorOptions {
        store: Arc::new(store),
        state: Some(local.connector()),
        launcher: launcher.clone().map(|l| l as Arc<dyn WorkerLauncher>),
        heartbeat_interval: Duration::from_millis(500),
        heartbeat_timeout: Duration::from_secs(5),
        master,
    });
    let server = coordinator.serve_workers(listener);
    let env = WorkerEnv {
        connectors: sluice_connectors::Builtin::shared(),
        memory: local.memory(),
        final_metrics: options.metrics_interval_ms > 0,
        live: Arc::default(),
        network_memory: options
            .network_memory
            .unwrap_or(sluice_compute::cluster::worker::DEFAULT_NETWORK_MEMORY),
    };
    let mut published: Vec<Arc<dyn Collect>> =
        vec![Arc::new(CoordinatorMetrics(coordinator.clone()))];
    if launcher.is_none() {
        published.push(env.live.clone());
    }
    let telemetry = options
        .telemetry
        .start("run", crate::telemetry::instance(), published)
        .await?;
    // The worker in this process, attached like any other; aborted when dropped.
    let worker = launcher.is_none().then(|| {
        AbortOnDropHandle::new(tokio::spawn(session::serve(SessionOptions {
            coordinator: url.clone(),
            host: "127.0.0.1".into(),
            slots: 1,
            name: "in-process".into(),
            exit_with_coordinator: true,
            env,
        })))
    });
    let submitted = coordinator
        .submit(
            graph.clone(),
            SubmitOptions {
                // A fresh id (the name and a unique suffix), as the cluster gives a
                // submitted job: a run starts from empty state (or its savepoint), never
                // from what an earlier run of the same name left in a state service.
                job_id: None,
                from_savepoint: options.from_savepoint.clone(),
                ..SubmitOptions::default()
            },
        )
        .await;
    let id = match submitted {
        Ok(id) => id,
        Err(e) => {
            drop((server, worker));
            return Err(Failure::usage(e.to_string()));
        }
    };
    let progress = {
        let coordinator = coordinator.clone();
        let id = id.clone();
        Progress::start(
            move || {
                coordinator.status(&id).ok().map(|s| Figures {
                    records_in: s.records_in,
                    records_out: s.records_out,
                    watermark: s.watermark,
                })
            },
            !options.progress,
        )
    };
    let status = match &options.cancel {
        None => coordinator.wait(&id).await,
        Some(cancel) => tokio::select! {
            status = coordinator.wait(&id) => status,
            () = cancel.cancelled() => {
                let _ = coordinator.cancel(&id).await;
                coordinator.wait(&id).await
            }
        },
    };
    progress.finish();
    drop((server, worker, launcher));
    // The last export carries the job's final figures.
    drop(telemetry);
    let status = status.map_err(|e| fail(e.to_string()))?;
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
        // The job file was planned here already: what fails now is the job (a bad
        // record, an unreachable store, a worker), exit code 1.
        other => Err(fail(
            status
                .failure
                .unwrap_or_else(|| format!("the job ended {other}")),
        )),
    }
}
