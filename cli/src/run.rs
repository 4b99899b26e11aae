//! `sluice run JOB.yaml`: parse, plan and run a job on the embedded local runtime.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use clap::Args;
use sluice_common::{job_spec, pb};
use sluice_compute::runtime::local::{self, LocalOptions};
use sluice_compute::runtime::metrics::JobMetrics;

use crate::progress::{Progress, human};
use crate::{Failure, runtime};

/// Arguments of `sluice run`.
#[derive(Args)]
pub struct RunArgs {
    /// The job file.
    job: PathBuf,
    /// No progress line and no summary.
    #[arg(long, short)]
    quiet: bool,
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
    pub fn driver_options(&self) -> crate::cluster::local_driver::DriverOptions {
        let mut network = sluice_compute::network::NetworkConfig {
            buffer_bytes: self.buffer_bytes.max(64),
            flush_every_batch: self.buffer_timeout_ms == 0,
            buffer_timeout: std::time::Duration::from_millis(self.buffer_timeout_ms.max(1)),
            ..Default::default()
        };
        network.max_frame_bytes = network.buffer_bytes + 64;
        crate::cluster::local_driver::DriverOptions {
            workers: self.workers,
            network,
            metrics_interval_ms: self.metrics_interval_ms,
        }
    }
}

/// Reads and parses a job file; errors name file, line and column.
pub fn load_job(path: &std::path::Path) -> Result<pb::JobGraph, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read job file {}: {e}", path.display())))?;
    job_spec::parse_job(&path.display().to_string(), &text)
        .map_err(|e| Failure::usage(e.to_string()))
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
    /// Wall-clock seconds from planning to the end.
    pub seconds: f64,
}

/// Plans and runs `graph` to the end on a fresh runtime.
pub fn execute(graph: pb::JobGraph, quiet: bool) -> Result<Summary, Failure> {
    let rt = runtime()?;
    let metrics = Arc::new(JobMetrics::default());
    let start = Instant::now();
    rt.block_on(async {
        let plan = sluice_compute::plan::plan(graph)
            .await
            .map_err(Failure::from_compute)?;
        let progress = Progress::start(metrics.clone(), quiet);
        let result = local::run(&plan, metrics.clone(), &LocalOptions::default()).await;
        progress.finish();
        result.map_err(Failure::from_compute)
    })?;
    Ok(Summary {
        records_in: metrics.records_in.load(Ordering::Relaxed),
        records_out: metrics.records_out.load(Ordering::Relaxed),
        late: metrics.late_records(),
        skipped: metrics.skipped_records.load(Ordering::Relaxed),
        barriers: metrics.sink_barriers.load(Ordering::Relaxed),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Runs `sluice run`.
pub fn run(args: RunArgs) -> Result<(), Failure> {
    let graph = load_job(&args.job)?;
    let name = graph.name.clone();
    let s = if args.workers > 0 {
        let options = args.driver_options();
        runtime()?.block_on(crate::cluster::local_driver::run(graph, &options))?
    } else {
        execute(graph, args.quiet)?
    };
    if !args.quiet {
        let barriers = if s.barriers > 0 {
            format!(", {} barriers at sinks", s.barriers)
        } else {
            String::new()
        };
        eprintln!(
            "finished {name}: {} records in, {} out, {:.2} s, {} events/s, {} late, {} skipped{barriers}",
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
