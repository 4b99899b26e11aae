//! Runs one worker's share of a deployed job.
//!
//! [`run_deployment`]: plan the job (every worker plans the same graph alike), connect to
//! every peer, build the subtasks that the round-robin placement puts here (remote
//! channels registered with the data plane), start the connections, run the tasks,
//! then let the connections drain. Metrics are printed to stderr every
//! `metrics_interval` (and once at the end) as `metrics worker=... task=...` lines.
//! The returned [`pbc::Report`] carries the counts, the final metrics, or the error.
//!
//! Under the coordinator, an [`AttemptLink`] connects the run to it: the tasks built are
//! announced, triggers reach the source tasks, acknowledgements come back, completed
//! checkpoints reach every task.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_common::pb::cluster as pbc;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use crate::cluster::task_metrics::{self, Sampler, lock};
use crate::connector::Connectors;
use crate::element::{Barrier, BarrierKind};
use crate::error::{Error, Result};
use crate::keyed::MemoryStores;
use crate::network::NetworkConfig;
use crate::network::environment::{self, NetworkBuilder};
use crate::network::transport::DataTls;
use crate::runtime::alignment::Alignment;
use crate::runtime::build::{self, BuildOptions, Placement, RestoreFrom};
use crate::runtime::metrics::JobMetrics;
use crate::runtime::task::{CheckpointEvent, CheckpointLink, Task};
use crate::runtime::tasks::run_tasks;
use crate::state_client::{CheckpointTraces, RemoteState, RemoteStateConfig, RemoteStore};

/// What a deployment attempt tells its coordinator.
#[derive(Debug)]
pub enum AttemptEvent {
    /// The tasks were built: (chain's first node, subtask, is a source).
    Deployed(Vec<(u32, u32, bool)>),
    /// A task acknowledged or declined a checkpoint.
    Checkpoint(CheckpointEvent),
}

/// A deployment attempt's connection to the coordinator's checkpoints.
pub struct AttemptLink {
    /// Checkpoints to trigger: (id, unaligned, the job's final checkpoint).
    pub triggers: mpsc::UnboundedReceiver<(u64, bool, bool)>,
    /// The newest checkpoint committed job-wide.
    pub completed: watch::Receiver<u64>,
    /// Where the attempt's events go.
    pub events: mpsc::UnboundedSender<AttemptEvent>,
    /// The attempt's counters, for progress reports while it runs.
    pub metrics: Arc<JobMetrics>,
    /// The attempt's aligned sources (watermark alignment across workers).
    pub alignment: Arc<Alignment>,
    /// The checkpoints' traces, for the state nodes' flush spans.
    pub traces: Arc<dyn CheckpointTraces>,
}

/// What this worker process offers the jobs it runs.
#[derive(Debug, Clone)]
pub struct WorkerEnv {
    /// The sources and sinks jobs may use.
    pub connectors: Arc<dyn Connectors>,
    /// The memory stores of jobs whose coordinator runs in this process (in-process
    /// workers only): a deployment whose state lives "in this process" uses them.
    pub memory: Option<Arc<MemoryStores>>,
    /// Print the tasks' metrics lines at the end of an attempt (a worker process of its
    /// own); in-process workers of `sluice run` leave the summary to it.
    pub final_metrics: bool,
    /// The running attempts' task figures, published as this process's metrics.
    pub live: Arc<task_metrics::LiveTasks>,
    /// Bytes the remote channels of one attempt may hold (0: no limit); an attempt
    /// whose channels need more fails at deployment, naming them.
    pub network_memory: u64,
}

/// A worker's network memory unless told otherwise (Flink's upper default).
pub const DEFAULT_NETWORK_MEMORY: u64 = 1 << 30;

impl WorkerEnv {
    /// A worker process of its own: `connectors`, no shared memory state.
    pub fn standalone(connectors: Arc<dyn Connectors>) -> Self {
        Self {
            connectors,
            memory: None,
            final_metrics: true,
            live: Arc::default(),
            network_memory: DEFAULT_NETWORK_MEMORY,
        }
    }
}

/// Runs `deployment` with the data plane on `listener`; never fails, the report says.
pub async fn run_deployment(
    listener: &TcpListener,
    deployment: pbc::Deployment,
    env: WorkerEnv,
) -> pbc::Report {
    run_attempt(listener, deployment, None, env).await
}

/// [`run_deployment`], linked to the coordinator when `link` is given.
pub async fn run_attempt(
    listener: &TcpListener,
    deployment: pbc::Deployment,
    link: Option<AttemptLink>,
    env: WorkerEnv,
) -> pbc::Report {
    let metrics = link
        .as_ref()
        .map_or_else(|| Arc::new(JobMetrics::default()), |l| l.metrics.clone());
    let me = deployment.worker_index;
    let interval = Duration::from_millis(deployment.metrics_interval_ms);
    let mut sampler_slot = None;
    let mut remote = None;
    let final_metrics = env.final_metrics;
    let result = run(
        listener,
        deployment,
        link,
        env,
        &metrics,
        &mut sampler_slot,
        &mut remote,
        interval,
    )
    .await;
    let rss = task_metrics::rss_bytes();
    let tasks = match &sampler_slot {
        Some(s) => {
            let figures = lock(s).sample();
            if final_metrics {
                for m in &figures {
                    eprintln!("{}", task_metrics::format_line(me, m, rss));
                }
            }
            figures
        }
        None => Vec::new(),
    };
    let (error, user_error, unavailable) = match &result {
        Ok(()) => (String::new(), false, false),
        Err(e) => (
            e.to_string(),
            e.is_user_error() || matches!(e, Error::Plan(_)),
            e.is_unavailable(),
        ),
    };
    pbc::Report {
        attempt: 0,
        cancelled: false,
        r#final: true,
        error,
        user_error,
        unavailable,
        records_in: metrics.records_in.load(Ordering::Relaxed),
        records_out: metrics.records_out.load(Ordering::Relaxed),
        watermark: metrics.watermark(),
        late: metrics.late_records(),
        skipped: metrics.skipped_records.load(Ordering::Relaxed),
        tasks,
        rss_bytes: rss,
        barriers: metrics.sink_barriers.load(Ordering::Relaxed),
        last_flushed_epoch: remote
            .and_then(|r: Arc<RemoteState>| r.last_flushed_epoch())
            .unwrap_or(0),
    }
}

/// Links every task to the coordinator; returns the task that hands triggers to the
/// source tasks (aborted when dropped). A source task that finished its input still
/// takes part (it waits for the final checkpoint); a trigger for one that is gone
/// altogether is declined for it, so the checkpoint is aborted at once rather than
/// timing out.
fn connect_tasks(tasks: &mut [Task], link: AttemptLink) -> AbortOnDropHandle<()> {
    let AttemptLink {
        mut triggers,
        completed,
        events,
        metrics: _,
        alignment: _,
        traces: _,
    } = link;
    let (checkpoint_tx, mut checkpoint_rx) = mpsc::unbounded_channel();
    let (final_tx, final_rx) = watch::channel(0u64);
    let mut sources = Vec::new();
    let announced = announce(tasks);
    for task in tasks.iter_mut() {
        let source = task.is_source();
        let source_triggers = source.then(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            sources.push((task.id, tx));
            rx
        });
        task.link = Some(CheckpointLink::new(
            task.id,
            source_triggers,
            final_rx.clone(),
            completed.clone(),
            checkpoint_tx.clone(),
        ));
    }
    let _ = events.send(AttemptEvent::Deployed(announced));
    let handle = tokio::spawn(async move {
        loop {
            tokio::select! {
                trigger = triggers.recv() => {
                    let Some((id, unaligned, last)) = trigger else { break };
                    if last {
                        // Every task waits at the end of its input and takes it there.
                        final_tx.send_replace(id);
                        continue;
                    }
                    let kind = if unaligned { BarrierKind::Unaligned } else { BarrierKind::Aligned };
                    for (task, tx) in &sources {
                        if tx.send(Barrier::new(id, kind)).is_err() {
                            let _ = events.send(AttemptEvent::Checkpoint(CheckpointEvent::Decline {
                                checkpoint_id: id,
                                task: *task,
                                reason: "the source task has finished".into(),
                            }));
                        }
                    }
                }
                event = checkpoint_rx.recv() => {
                    let Some(event) = event else { break };
                    let _ = events.send(AttemptEvent::Checkpoint(event));
                }
            }
        }
    });
    AbortOnDropHandle::new(handle)
}

/// The tasks as `Deployed` names them: (chain's first node, subtask, is a source).
fn announce(tasks: &[Task]) -> Vec<(u32, u32, bool)> {
    tasks
        .iter()
        .map(|t| (t.id.0, t.id.1, t.is_source()))
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn run(
    listener: &TcpListener,
    deployment: pbc::Deployment,
    link: Option<AttemptLink>,
    env: WorkerEnv,
    metrics: &Arc<JobMetrics>,
    sampler_slot: &mut Option<Arc<Mutex<Sampler>>>,
    remote_slot: &mut Option<Arc<RemoteState>>,
    interval: Duration,
) -> Result<()> {
    let me = deployment.worker_index;
    let peers = deployment.peers.clone();
    if me as usize >= peers.len() {
        return Err(Error::Internal(format!(
            "worker index {me} out of range for {} workers",
            peers.len()
        )));
    }
    let graph = deployment
        .job
        .ok_or_else(|| Error::Internal("the deployment has no job".into()))?;
    // Metrics name the job by its id under a coordinator, by its name when run by hand.
    let job_label = if deployment.job_id.is_empty() {
        graph.name.clone()
    } else {
        deployment.job_id.clone()
    };
    let network_memory = env.network_memory;
    let plan = crate::plan::plan(graph, env.connectors).await?;
    let mut options = BuildOptions::default();
    match &deployment.remote_state {
        Some(r) if r.endpoint.is_empty() => {
            // The coordinator holds the job's memory state in its own process.
            let stores = env.memory.as_ref().ok_or_else(|| {
                Error::Internal(
                    "the job's state is in the memory of the coordinator's process, which \
                     this worker is not"
                        .into(),
                )
            })?;
            let versioned = build::takes_checkpoints(&plan);
            options.state = Some(stores.store(&deployment.job_id, versioned));
            options.first_epoch = r.first_epoch.max(1);
        }
        Some(r) => {
            let mut config = RemoteStateConfig::new(&r.endpoint, &r.job_id, plan.max_parallelism);
            config.shards = r.shards.max(1);
            config.fence = r.fence;
            config.place(&r.placement)?;
            let remote = RemoteState::connect(config).await?;
            if let Some(l) = &link {
                remote.trace_flushes(l.traces.clone());
            }
            *remote_slot = Some(remote.clone());
            options.state = Some(Arc::new(RemoteStore(remote)));
            options.first_epoch = r.first_epoch.max(1);
        }
        None => {}
    }
    options.coordinated_checkpoints = deployment.coordinated_checkpoints;
    options.fence = deployment.fence;
    options.alignment = link.as_ref().map(|l| l.alignment.clone());
    options.restore = match deployment.restore.as_ref() {
        Some(r) => Some(
            RestoreFrom::new(
                r.checkpoint_id,
                r.source_positions
                    .iter()
                    .map(|p| (p.split.clone(), p.position.clone())),
            )
            .with_channel_state(&r.channel_state)?,
        ),
        None => None,
    };
    let config = NetworkConfig::from_proto(deployment.network.as_ref());
    let placement = Placement::round_robin(&plan, peers.len() as u32);
    let tls = DataTls::of_process().map_err(|message| Error::Network {
        peer: "this worker".into(),
        message: format!("its TLS identity: {message}"),
    })?;
    let streams = environment::connect_peers(listener, me, &peers, &config, tls.as_deref()).await?;
    let mut net = NetworkBuilder::new(config, peers);
    let mut tasks =
        build::build_tasks(&plan, metrics, &options, &placement, me, Some(&mut net)).await?;
    let need = net.check_memory(network_memory)?;
    tracing::debug!(
        bytes = need.bytes,
        budget = network_memory,
        "network memory"
    );
    let _fan_out = match link {
        Some(link) if options.coordinated_checkpoints => Some(connect_tasks(&mut tasks, link)),
        Some(link) => {
            // Without checkpoints the tasks answer to no one: they end with their input.
            let _ = link.events.send(AttemptEvent::Deployed(announce(&tasks)));
            None
        }
        None => None,
    };
    let sampler = Arc::new(Mutex::new(Sampler::new(
        tasks.iter().map(|t| t.metrics.clone()).collect(),
        net.probes(),
    )));
    *sampler_slot = Some(sampler.clone());
    *lock(&metrics.tasks) = tasks.iter().map(|t| t.metrics.clone()).collect();
    let _published = env.live.register(job_label, &sampler);
    let running = net.start(streams)?;
    let printer = (!interval.is_zero()).then(|| {
        let sampler = sampler.clone();
        AbortOnDropHandle::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.tick().await;
            loop {
                tick.tick().await;
                let rss = task_metrics::rss_bytes();
                let figures = lock(&sampler).sample();
                for m in &figures {
                    eprintln!("{}", task_metrics::format_line(me, m, rss));
                }
            }
        }))
    });
    let result = run_tasks(tasks).await;
    let result = match result {
        Ok(()) => running.finish().await,
        Err(e) => Err(e),
    };
    if let Some(p) = printer {
        p.abort();
    }
    result
}
