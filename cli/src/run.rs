//! `sluice run JOB.yaml`: parse, plan and run a job on the embedded local runtime.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use clap::Args;
use sluice_common::{byte_size, pb};
use sluice_compute::plan::PhysicalPlan;
use sluice_compute::runtime::local::{self, LocalOptions};
use sluice_compute::runtime::metrics::JobMetrics;
use sluice_compute::state_client::{RemoteState, RemoteStateConfig};
use sluice_planner::job_spec;
use sluice_state_service::RunningStateService;

use crate::progress::{Progress, human};
use crate::state_service::start_embedded;
use crate::{Failure, runtime};

/// Arguments of `sluice run`.
#[derive(Args)]
pub struct RunArgs {
    /// The job file.
    job: PathBuf,
    /// No progress line and no summary.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    pub state: StateArgs,
    /// Run across this many worker processes on this machine (0: in this process).
    #[arg(long, default_value_t = 0)]
    pub workers: u32,
    /// Bytes per network buffer (with --workers).
    #[arg(long, default_value_t = 32 << 10)]
    pub buffer_bytes: usize,
    /// Send a partly filled buffer after this many ms; 0 sends every batch at once.
    #[arg(long, default_value_t = 100)]
    pub buffer_timeout_ms: u64,
    /// Workers print per-task metrics this often (ms; 0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub metrics_interval_ms: u64,
}

impl RunArgs {
    /// The driver settings these arguments ask for.
    pub fn driver_options(&self) -> crate::cluster::embedded::DriverOptions {
        let mut network = sluice_compute::network::NetworkConfig {
            buffer_bytes: self.buffer_bytes.max(64),
            flush_every_batch: self.buffer_timeout_ms == 0,
            buffer_timeout: std::time::Duration::from_millis(self.buffer_timeout_ms.max(1)),
            ..Default::default()
        };
        network.max_frame_bytes = network.buffer_bytes + 64;
        crate::cluster::embedded::DriverOptions {
            workers: self.workers,
            network,
            metrics_interval_ms: self.metrics_interval_ms,
        }
    }
}

/// Where a job with `state: { backend: remote }` keeps its state.
#[derive(Args, Clone, Default)]
pub struct StateArgs {
    /// A running state service (`http://host:port`); without it, `sluice run` starts an
    /// embedded one.
    #[arg(long, env = "SLUICE_STATE_SERVICE")]
    pub state_service: Option<String>,
    /// Directory of the embedded state service (its object store and RocksDB); kept
    /// after the run, so a later run with the same job name restores from it. Default:
    /// a temporary directory removed at the end.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Memory budget of the embedded state service.
    #[arg(long, default_value = "256MiB", value_parser = byte_size::parse)]
    pub state_memory: u64,
}

/// Reads and parses a job file; errors name file, line and column.
pub fn load_job(path: &std::path::Path) -> Result<pb::JobGraph, Failure> {
    load_job_text(path).map(|(_, graph)| graph)
}

/// [`load_job`], with the file's text.
pub fn load_job_text(path: &std::path::Path) -> Result<(String, pb::JobGraph), Failure> {
    let text = read_job_file(path)?;
    let graph = job_spec::parse_job(&path.display().to_string(), &text)
        .map_err(|e| Failure::usage(e.to_string()))?;
    Ok((text, graph))
}

/// Reads a job file, refusing one larger than `job_spec::MAX_JOB_FILE_BYTES` before
/// reading it (and reading no more than that of anything that does not say its size).
fn read_job_file(path: &std::path::Path) -> Result<String, Failure> {
    use std::io::Read;
    let name = path.display().to_string();
    let cannot = |e: std::io::Error| Failure::usage(format!("cannot read job file {name}: {e}"));
    let too_large = |bytes: u64| job_spec::job_file_too_large(&name, bytes).map(Failure::usage);
    let file = std::fs::File::open(path).map_err(cannot)?;
    if let Some(f) = too_large(file.metadata().map_err(cannot)?.len()) {
        return Err(f);
    }
    let mut text = String::new();
    file.take(job_spec::MAX_JOB_FILE_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    match too_large(text.len() as u64) {
        Some(f) => Err(f),
        None => Ok(text),
    }
}

/// What a finished job did.
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

/// Plans and runs `graph` to the end on a fresh runtime.
pub fn execute(graph: pb::JobGraph, quiet: bool, state: &StateArgs) -> Result<Summary, Failure> {
    let rt = runtime()?;
    let metrics = Arc::new(JobMetrics::default());
    let start = Instant::now();
    rt.block_on(async {
        let plan = sluice_compute::plan::plan(graph, sluice_connectors::Builtin::shared())
            .await
            .map_err(Failure::from_compute)?;
        let remote = connect_state(&plan, state).await?;
        let options = LocalOptions {
            state: remote.as_ref().map(|r| {
                Arc::new(sluice_compute::state_client::RemoteStore(r.state.clone()))
                    as Arc<dyn sluice_common::state::StateStore>
            }),
            ..LocalOptions::default()
        };
        let progress = Progress::start(metrics.clone(), quiet);
        let result = local::run(&plan, metrics.clone(), &options).await;
        progress.finish();
        if let Some(r) = remote {
            r.close().await;
        }
        result.map_err(Failure::from_compute)
    })?;
    Ok(Summary {
        records_in: metrics.records_in.load(Ordering::Relaxed),
        records_out: metrics.records_out.load(Ordering::Relaxed),
        late: metrics.late_records(),
        skipped: metrics.skipped_records.load(Ordering::Relaxed),
        barriers: metrics.sink_barriers.load(Ordering::Relaxed),
        restarts: 0,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The state service a run uses, and the embedded one it started, if any.
pub(crate) struct RunState {
    /// The job's connection to it.
    pub(crate) state: Arc<RemoteState>,
    /// Its address.
    pub(crate) endpoint: String,
    embedded: Option<RunningStateService>,
    _temp_dir: Option<tempfile::TempDir>,
}

impl RunState {
    /// Stops the embedded node, if there is one.
    pub(crate) async fn close(self) {
        if let Some(service) = self.embedded
            && let Err(e) = service.shutdown().await
        {
            tracing::warn!("embedded state service did not shut down cleanly: {e}");
        }
    }
}

/// Connects to (or starts) the state service when the job keeps its state remotely.
pub(crate) async fn connect_state(
    plan: &PhysicalPlan,
    args: &StateArgs,
) -> Result<Option<RunState>, Failure> {
    let Some(config) = plan.graph.state.as_ref() else {
        return Ok(None);
    };
    if config.backend() != pb::StateBackend::Remote {
        return Ok(None);
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
                        .map_err(|e| Failure::from(anyhow::anyhow!("temporary state dir: {e}")))?;
                    (t.path().to_path_buf(), Some(t))
                }
            };
            let service = start_embedded(&dir, args.state_memory).await?;
            (
                format!("http://{}", service.local_addr()),
                Some(service),
                temp,
            )
        }
    };
    let mut remote = RemoteStateConfig::new(
        endpoint.clone(),
        job_id(&plan.graph.name),
        plan.max_parallelism,
    );
    if config.shards > 0 {
        remote.shards = config.shards;
    }
    let state = RemoteState::connect(remote)
        .await
        .map_err(|e| Failure::from_compute(e.into()))?;
    Ok(Some(RunState {
        state,
        endpoint,
        embedded,
        _temp_dir: temp,
    }))
}

/// The state-service job id of a job name: letters, digits, `-` and `_` kept.
fn job_id(name: &str) -> String {
    let id: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if id.is_empty() { "job".into() } else { id }
}

/// Runs `sluice run`.
pub fn run(args: RunArgs) -> Result<(), Failure> {
    let graph = load_job(&args.job)?;
    let name = graph.name.clone();
    let s = if args.workers > 0 {
        let options = args.driver_options();
        runtime()?.block_on(crate::cluster::embedded::run(graph, &options, &args.state))?
    } else {
        execute(graph, args.quiet, &args.state)?
    };
    if !args.quiet {
        let barriers = if s.barriers > 0 {
            format!(", {} barriers at sinks", s.barriers)
        } else {
            String::new()
        };
        let restarts = match s.restarts {
            0 => String::new(),
            n => format!(", {n} restarts"),
        };
        eprintln!(
            "finished {name}: {} records in, {} out, {:.2} s, {} events/s, {} late, {} skipped{barriers}{restarts}",
            s.records_in,
            s.records_out,
            s.seconds,
            human(s.records_in as f64 / s.seconds.max(1e-9)),
            s.late,
            s.skipped
        );
    }
    Ok(())
}
