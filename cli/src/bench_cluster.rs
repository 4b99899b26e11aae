//! `sluice bench cluster`: checkpoint duration, rescale time and recovery time of a job
//! under the coordinator, with a given amount of keyed state in the state service.
//!
//! Per state size: a state-service node starts as a child process and is loaded with
//! that many bytes of state under the job's id (other keys of the same shards, so the
//! node's RocksDB and object store hold the full size); a coordinator starts in this
//! process with worker child processes; a windowed count per auction runs on Nexmark
//! bids at a steady `--rate` with a checkpoint every `--interval-ms`. Measured:
//! - checkpoint duration, trigger to `_metadata` committed (p50, p99, max) over
//!   `--seconds` of steady input;
//! - rescale from `--workers`-way parallelism to twice that: request to running at the
//!   new parallelism, and the state bytes the node downloaded meanwhile;
//! - recovery after one worker is SIGKILLed: kill to the first record read again by the
//!   new attempt (deployed from the last checkpoint, state restored, timers rebuilt),
//!   as reported by a worker within 10 ms of reading it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Args;
use sluice_common::job_spec;
use sluice_compute::network::NetworkConfig;
use sluice_compute::state_client::ShardLayout;
use sluice_coordinator::checkpoint::store::ObjectMetadataStore;
use sluice_coordinator::job::JobState;
use sluice_coordinator::job::master::StateConnector;
use sluice_coordinator::service::{self, Coordinator, CoordinatorOptions, SubmitOptions};

use crate::bench_checkpoint::{NodeProcess, preload};
use crate::cluster::embedded::{ProcessLauncher, master_config};
use crate::cluster::state::StateServiceConnector;
use crate::output::outln;
use crate::{Failure, byte_size, runtime};

const JOB_ID: &str = "bench-cluster";
const SHARDS: u32 = 4;

/// Arguments of `sluice bench cluster`.
#[derive(Args)]
pub struct ClusterBenchArgs {
    /// State sizes, one run each (e.g. 100MB,1GB,4GB).
    #[arg(long, value_delimiter = ',', default_value = "100MB", value_parser = byte_size::parse)]
    state_bytes: Vec<u64>,
    /// Events per second of the steady input.
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Seconds of steady input over which checkpoints are measured.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Checkpoint interval.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Worker processes (and the job's starting parallelism; the rescale doubles it).
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// The state-service node's memory budget.
    #[arg(long, default_value = "512MiB", value_parser = byte_size::parse)]
    memory: u64,
    /// Directory for the node's data and objects (default: a temporary one per run).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

/// Runs `sluice bench cluster`.
pub fn bench(args: ClusterBenchArgs) -> Result<(), Failure> {
    if args.state_bytes.is_empty() || args.rate == 0 || args.workers == 0 {
        return Err(Failure::usage(
            "--state-bytes, --rate and --workers must be positive",
        ));
    }
    let exe = std::env::current_exe()
        .map_err(|e| Failure::from(anyhow!("cannot find the sluice binary: {e}")))?;
    let rt = runtime()?;
    outln!(
        "state_mb checkpoints p50_ms p99_ms max_ms rescale_to rescale_ms rescale_state_bytes recovery_ms"
    );
    for &size in &args.state_bytes {
        let line = rt
            .block_on(run_one(&args, &exe, size))
            .with_context(|| format!("cluster benchmark with {size} bytes of state"))?;
        outln!("{line}");
    }
    Ok(())
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

async fn run_one(
    args: &ClusterBenchArgs,
    exe: &std::path::Path,
    size: u64,
) -> anyhow::Result<String> {
    let temp = tempfile::Builder::new()
        .prefix("sluice-bench-cluster-")
        .tempdir()?;
    let dir = args
        .work_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(dir.join("objects"))?;
    let objects = format!("file://{}", dir.join("objects").display());
    let node = NodeProcess::start(exe, &dir, "node", &objects, args.memory)?;
    let layout = ShardLayout::new(JOB_ID, sluice_common::DEFAULT_MAX_PARALLELISM, SHARDS);
    let loaded = Instant::now();
    let epoch = preload(
        &node.addr,
        &layout,
        size,
        1000,
        256 << 20,
        Instant::now() + Duration::from_secs(7200),
    )
    .await?;
    eprintln!(
        "[{} MB] loaded in {:.1} s (checkpoint {epoch})",
        size / 1_000_000,
        loaded.elapsed().as_secs_f64()
    );

    std::fs::create_dir_all(dir.join("coordinator"))?;
    let store =
        ObjectMetadataStore::from_url(&format!("file://{}", dir.join("coordinator").display()))?;
    let (listener, addr) = service::bind("127.0.0.1:0", "workers")
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let launcher = Arc::new(
        ProcessLauncher::new(format!("http://{addr}"))
            .map_err(|_| anyhow!("cannot start workers"))?,
    );
    let connector: Arc<dyn StateConnector> = Arc::new(StateServiceConnector {
        endpoint: format!("http://{}", node.addr),
    });
    let workers = args.workers as usize;
    let coordinator = Coordinator::new(CoordinatorOptions {
        store: Arc::new(store),
        state: Some(connector),
        launcher: Some(launcher.clone()),
        heartbeat_interval: Duration::from_millis(500),
        heartbeat_timeout: Duration::from_secs(5),
        master: master_config(workers, &NetworkConfig::default(), 0),
    });
    let server = coordinator.serve_workers(listener);
    let yaml = format!(
        "name: bench-cluster\nparallelism: {p}\ncheckpoint: {{ interval: {i}ms }}\n\
         state: {{ backend: remote, shards: {SHARDS} }}\n\
         source:\n  nexmark: {{ stream: bid, events: 0, seed: 3, splits: 8, max_events_per_second: {r} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 2s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 1s }}\n    aggregate: [\"count(*) AS bids\"]\n\
         sink:\n  blackhole: {{}}\n",
        p = args.workers,
        i = args.interval_ms,
        r = args.rate
    );
    let graph = job_spec::parse_job("bench-cluster.yaml", &yaml)?;
    let id = coordinator
        .submit(
            graph,
            SubmitOptions {
                job_id: Some(JOB_ID.into()),
                ..SubmitOptions::default()
            },
        )
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let result = measure(args, &coordinator, &launcher, &id, size).await;
    let _ = coordinator.cancel(&id).await;
    server.abort();
    drop(launcher);
    drop(node);
    result
}

async fn wait_for(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            bail!("{what} did not happen within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(start.elapsed())
}

async fn measure(
    args: &ClusterBenchArgs,
    c: &Arc<Coordinator>,
    launcher: &ProcessLauncher,
    id: &str,
    size: u64,
) -> anyhow::Result<String> {
    let status = || c.status(id).map_err(|e| anyhow!("{e}"));
    let limit = Duration::from_secs(120);
    wait_for("the first checkpoint", limit, || {
        c.status(id)
            .is_ok_and(|s| s.last_checkpoint.is_some() || s.state == JobState::Failed)
    })
    .await?;
    if let Some(f) = status()?.failure {
        bail!("the job failed: {f}");
    }
    let first = status()?.checkpoints.len();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let st = status()?;
    let mut durations: Vec<u64> = st.checkpoints[first..]
        .iter()
        .map(|c| c.commit_ms)
        .collect();
    durations.sort_unstable();

    let to = args.workers * 2;
    let rescale = c
        .rescale(id, to)
        .await
        .map_err(|e| anyhow!("rescale: {e}"))?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let before = status()?.attempt;
    let victim = *launcher
        .pids()
        .first()
        .ok_or_else(|| anyhow!("no worker to kill"))?;
    let killed = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status();
    wait_for("recovery", limit, || {
        c.status(id).is_ok_and(|s| {
            (s.attempt > before && s.state == JobState::Running && s.records_in > 0)
                || s.state == JobState::Failed
        })
    })
    .await?;
    let recovery = killed.elapsed();
    let st = status()?;
    if st.state == JobState::Failed {
        bail!(
            "the job failed after the kill: {}",
            st.failure.unwrap_or_default()
        );
    }
    Ok(format!(
        "{} {} {} {} {} {to} {} {} {}",
        size / 1_000_000,
        durations.len(),
        percentile(&durations, 0.5),
        percentile(&durations, 0.99),
        durations.last().copied().unwrap_or(0),
        rescale.millis,
        rescale.state_bytes_restored,
        recovery.as_millis()
    ))
}
