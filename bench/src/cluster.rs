//! `sluice bench cluster`: checkpoint duration, rescale time and recovery time of a job
//! under the coordinator, with a given amount of keyed state in the state service.
//!
//! Per state size: a state-service node starts as a child process (with a spare node,
//! both registered with the coordinator) and is loaded with
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
//!   as reported by a worker within 10 ms of reading it;
//! - recovery after the state node is SIGKILLed: the same, with the job's shards
//!   reopened on a second (spare) node from the object store at the last checkpoint.
//!
//! The coordinator is the real one (`sluice_coordinator::service::Coordinator`) with
//! the binary's master settings and state connector ([`Host`]); the workers are
//! `sluice worker --coordinator URL` processes ([`Workers`], which the coordinator also
//! asks for a replacement after the kill), logging to `worker-K.log` in the run's
//! directory. It compares state sizes with each other: a checkpoint's cost should be
//! its epoch's delta, and a rescale should move no state (`rescale_state_bytes` 0).
//!
//! With `--tls` each state size runs twice, plainly and then with every role (state
//! nodes, workers, the coordinator and this process's clients) over mutual TLS with a
//! CA made for the run, so the two lines compare in one run.
//!
//! Output: the header `state_mb checkpoints p50_ms p99_ms max_ms rescale_to rescale_ms
//! rescale_state_bytes recovery_ms node_recovery_ms tls`, then one line per state size
//! (and mode); progress on stderr.

use sluice_common::outln;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Args as ClapArgs;
use sluice_common::byte_size;
use sluice_compute::network::NetworkConfig;
use sluice_compute::state_client::ShardLayout;
use sluice_coordinator::checkpoint::store::ObjectMetadataStore;
use sluice_coordinator::job::JobState;
use sluice_coordinator::service::{self, Coordinator, CoordinatorOptions, SubmitOptions};
use sluice_planner::job_spec;

use crate::harness::process::{StateServiceNode, Workers};
use crate::harness::runtime;
use crate::harness::table::Table;
use crate::harness::timing::{percentile, wait_for};
use crate::harness::tls::TlsFiles;
use crate::state_workload::preload;
use crate::{Error, Host, Result};

const JOB_ID: &str = "bench-cluster";
const SHARDS: u32 = 4;

/// The result table.
const TABLE: Table = Table::new(
    &[
        "state_mb",
        "checkpoints",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "rescale_to",
        "rescale_ms",
        "rescale_state_bytes",
        "recovery_ms",
        "node_recovery_ms",
        "tls",
    ],
    " ",
);

/// Arguments of `sluice bench cluster`.
#[derive(ClapArgs, Debug)]
pub struct Args {
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
    /// Also run each state size with every role over mutual TLS (a CA and certificate
    /// made for the run), right after its plain run (`tls` column `yes`).
    #[arg(long)]
    tls: bool,
    /// Directory under which each run (one per state size) gets a fresh directory for the
    /// node's data and objects, removed after it (default: the system's temporary one).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

/// Runs `sluice bench cluster`.
pub fn run(args: Args, host: &dyn Host) -> Result<()> {
    if args.state_bytes.is_empty() || args.rate == 0 || args.workers == 0 {
        return Err(Error::usage(
            "--state-bytes, --rate and --workers must be positive",
        ));
    }
    let rt = runtime()?;
    outln!("{}", TABLE.header());
    let modes: &[bool] = if args.tls { &[false, true] } else { &[false] };
    for &size in &args.state_bytes {
        for &tls in modes {
            let line = rt
                .block_on(run_one(&args, host, size, tls))
                .with_context(|| {
                    format!("cluster benchmark with {size} bytes of state (TLS: {tls})")
                })?;
            outln!("{line}");
        }
    }
    Ok(())
}

async fn run_one(args: &Args, host: &dyn Host, size: u64, tls: bool) -> anyhow::Result<String> {
    // Dropped last: every role of this run talks TLS with it.
    let tls = tls.then(TlsFiles::new).transpose()?;
    let env = tls.as_ref().map(TlsFiles::env).unwrap_or_default();
    let scheme = sluice_common::tls::scheme();
    // A fresh directory per size, under --work-dir when given: a second size's job
    // must not find the first one's shards in the object store.
    let base = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base)?;
    let temp = tempfile::Builder::new()
        .prefix("sluice-bench-cluster-")
        .tempdir_in(&base)?;
    let dir = temp.path().to_path_buf();
    std::fs::create_dir_all(dir.join("objects"))?;
    let objects = format!("file://{}", dir.join("objects").display());
    // The coordinator's gRPC address comes first: the state nodes register there.
    let (listener, addr) = service::bind("127.0.0.1:0", "workers")
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let grpc = format!("{scheme}://{addr}");
    let node =
        StateServiceNode::start_registered(&dir, "node", &objects, args.memory, &grpc, &env)?;
    // The spare takes the node's shards when it is killed.
    let spare =
        StateServiceNode::start_registered(&dir, "spare", &objects, args.memory, &grpc, &env)?;
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
    let launcher = Arc::new(Workers::new(grpc, &dir)?.with_env(env));
    let workers = args.workers as usize;
    let coordinator = Coordinator::new(CoordinatorOptions {
        store: Arc::new(store),
        state: Some(host.state_connector(format!("{scheme}://{}", node.addr))),
        launcher: Some(launcher.clone()),
        heartbeat_interval: Duration::from_millis(500),
        heartbeat_timeout: Duration::from_secs(5),
        master: host.master_config(workers, &NetworkConfig::default(), 0),
    });
    let server = coordinator.serve_workers(listener);
    // The preloaded shards stay where they are open: wait until the node says so.
    wait_for(
        "the state nodes' registration",
        Duration::from_secs(60),
        || {
            let nodes = coordinator.state_nodes();
            nodes.len() == 2 && nodes.iter().any(|n| n.shards.len() == SHARDS as usize)
        },
    )
    .await?;
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
    let result = measure(
        args,
        &coordinator,
        &launcher,
        &id,
        size,
        node,
        tls.is_some(),
    )
    .await;
    let _ = coordinator.cancel(&id).await;
    server.abort();
    drop(launcher);
    drop(spare);
    result
}

async fn measure(
    args: &Args,
    c: &Arc<Coordinator>,
    launcher: &Workers,
    id: &str,
    size: u64,
    node: StateServiceNode,
    tls: bool,
) -> anyhow::Result<String> {
    let status = || c.status(id).map_err(|e| anyhow!("{e}"));
    let limit = RECOVERY_LIMIT;
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

    let victim = *launcher
        .pids()
        .first()
        .ok_or_else(|| anyhow!("no worker to kill"))?;
    let recovery = recovery_after(c, id, "a worker", || {
        launcher
            .kill(victim)
            .then_some(())
            .ok_or_else(|| anyhow!("worker {victim} could not be killed"))
    })
    .await?;

    // The state node goes: its shards reopen on the spare from the object store.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let node_recovery = recovery_after(c, id, "the state node", || {
        node.kill();
        Ok(())
    })
    .await?;
    Ok(TABLE.row(&[
        (size / 1_000_000).to_string(),
        durations.len().to_string(),
        percentile(&durations, 0.5).to_string(),
        percentile(&durations, 0.99).to_string(),
        durations.last().copied().unwrap_or(0).to_string(),
        to.to_string(),
        rescale.millis.to_string(),
        rescale.state_bytes_restored.to_string(),
        recovery.as_millis().to_string(),
        node_recovery.as_millis().to_string(),
        if tls { "yes" } else { "no" }.to_string(),
    ]))
}

/// How long the job may take to get going again.
const RECOVERY_LIMIT: Duration = Duration::from_secs(120);

/// The time from `kill` (the loss of `what`) to the first record read by a new attempt.
async fn recovery_after(
    c: &Arc<Coordinator>,
    id: &str,
    what: &str,
    kill: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Duration> {
    let before = c.status(id).map_err(|e| anyhow!("{e}"))?.attempt;
    let killed = Instant::now();
    kill()?;
    wait_for(
        &format!("recovery from the loss of {what}"),
        RECOVERY_LIMIT,
        || {
            c.status(id).is_ok_and(|s| {
                (s.attempt > before && s.state == JobState::Running && s.records_in > 0)
                    || s.state == JobState::Failed
            })
        },
    )
    .await?;
    let took = killed.elapsed();
    let st = c.status(id).map_err(|e| anyhow!("{e}"))?;
    if st.state == JobState::Failed {
        bail!(
            "the job failed after the loss of {what}: {}",
            st.failure.unwrap_or_default()
        );
    }
    Ok(took)
}
