//! Runs one worker's share of a deployed job.
//!
//! [`run_deployment`]: plan the job (every worker plans the same graph alike), connect to
//! every peer, build the subtasks that the round-robin placement puts here (remote
//! channels registered with the data plane), start the connections, run the tasks,
//! then let the connections drain. Metrics are printed to stderr every
//! `metrics_interval` (and once at the end) as `metrics worker=... task=...` lines.
//! The returned [`pbc::Report`] carries the counts, the final metrics, or the error.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_common::pb::cluster as pbc;
use tokio::net::TcpListener;

use crate::cluster::task_metrics::{self, Sampler};
use crate::error::{Error, Result};
use crate::network::NetworkConfig;
use crate::network::environment::{self, NetworkBuilder};
use crate::runtime::build::{self, BuildOptions, Placement};
use crate::runtime::local;
use crate::runtime::metrics::JobMetrics;
use crate::state_client::{RemoteState, RemoteStateConfig};

/// Runs `deployment` with the data plane on `listener`; never fails, the report says.
pub async fn run_deployment(listener: &TcpListener, deployment: pbc::Deployment) -> pbc::Report {
    let metrics = Arc::new(JobMetrics::default());
    let me = deployment.worker_index;
    let interval = Duration::from_millis(deployment.metrics_interval_ms);
    let mut sampler_slot = None;
    let mut remote = None;
    let result = run(
        listener,
        deployment,
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
            for m in &figures {
                eprintln!("{}", task_metrics::format_line(me, m, rss));
            }
            figures
        }
        None => Vec::new(),
    };
    let (error, user_error) = match &result {
        Ok(()) => (String::new(), false),
        Err(e) => (
            e.to_string(),
            e.is_user_error() || matches!(e, Error::Plan(_)),
        ),
    };
    pbc::Report {
        r#final: true,
        error,
        user_error,
        records_in: metrics.records_in.load(Ordering::Relaxed),
        records_out: metrics.records_out.load(Ordering::Relaxed),
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

fn lock(s: &Arc<Mutex<Sampler>>) -> std::sync::MutexGuard<'_, Sampler> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

async fn run(
    listener: &TcpListener,
    deployment: pbc::Deployment,
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
    let plan = crate::plan::plan(graph).await?;
    let mut options = BuildOptions::default();
    if let Some(r) = &deployment.remote_state {
        let mut config = RemoteStateConfig::new(&r.endpoint, &r.job_id, plan.max_parallelism);
        config.shards = r.shards.max(1);
        let remote = RemoteState::connect(config).await?;
        *remote_slot = Some(remote.clone());
        options.remote_state = Some(remote);
        options.first_epoch = r.first_epoch.max(1);
    }
    let config = NetworkConfig::from_proto(deployment.network.as_ref());
    let placement = Placement::round_robin(&plan, peers.len() as u32);
    let streams = environment::connect_peers(listener, me, &peers, &config).await?;
    let mut net = NetworkBuilder::new(config, peers);
    let tasks =
        build::build_tasks(&plan, metrics, &options, &placement, me, Some(&mut net)).await?;
    let sampler = Arc::new(Mutex::new(Sampler::new(
        tasks.iter().map(|t| t.metrics.clone()).collect(),
        net.probes(),
    )));
    *sampler_slot = Some(sampler.clone());
    let _otel = task_metrics::register_otel(sampler.clone());
    let running = net.start(streams)?;
    let printer = (!interval.is_zero()).then(|| {
        let sampler = sampler.clone();
        tokio::spawn(async move {
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
        })
    });
    let result = local::run_tasks(tasks).await;
    let result = match result {
        Ok(()) => running.finish().await,
        Err(e) => Err(e),
    };
    if let Some(p) = printer {
        p.abort();
    }
    result
}
