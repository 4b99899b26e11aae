//! `sluice run JOB.yaml`: reads and parses a job file and runs it to its end on an
//! embedded cluster (`cluster::embedded`): a coordinator in this process with its
//! workers in this process, or with `--workers N` in N child processes.

use std::path::PathBuf;

use clap::Args;
use sluice_common::pb;
use sluice_planner::job_spec;

use crate::cluster::embedded::{self, RunOptions};
use crate::cluster::local_state::StateArgs;
use crate::progress::human;
use crate::telemetry::TelemetryArgs;
use crate::{Failure, runtime};

/// Arguments of `sluice run`.
#[derive(Args)]
pub struct RunArgs {
    /// The job file: YAML, or SQL when its name ends in `.sql`.
    job: PathBuf,
    /// No progress line and no summary.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    pub state: StateArgs,
    /// Run across this many worker processes on this machine (0: in this process).
    #[arg(long, default_value_t = 0)]
    pub workers: u32,
    /// Where checkpoint metadata and job records live: a directory, `file:///dir` or
    /// `s3://bucket/prefix`. Default: under --state-dir, else a temporary directory.
    #[arg(long)]
    pub store: Option<String>,
    /// Start from this savepoint in --store (the path `sluice savepoint` printed).
    #[arg(long)]
    pub from_savepoint: Option<String>,
    /// Bytes per network buffer (with --workers).
    #[arg(long, default_value_t = 32 << 10)]
    pub buffer_bytes: usize,
    /// Each worker's network memory (with --workers): the most its remote channels may
    /// hold; a job whose channels need more fails at deployment. Default 1GiB.
    #[arg(long, value_parser = sluice_common::byte_size::parse)]
    pub network_memory: Option<u64>,
    /// Send a partly filled buffer after this many ms; 0 sends every batch at once.
    #[arg(long, default_value_t = 100)]
    pub buffer_timeout_ms: u64,
    /// Workers print per-task metrics this often (ms; 0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub metrics_interval_ms: u64,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl RunArgs {
    /// The run settings these arguments ask for.
    pub fn run_options(&self) -> RunOptions {
        let mut network = sluice_compute::network::NetworkConfig {
            buffer_bytes: self.buffer_bytes.max(64),
            flush_every_batch: self.buffer_timeout_ms == 0,
            buffer_timeout: std::time::Duration::from_millis(self.buffer_timeout_ms.max(1)),
            ..Default::default()
        };
        network.max_frame_bytes = network.buffer_bytes + 64;
        RunOptions {
            workers: self.workers,
            network,
            network_memory: self.network_memory,
            metrics_interval_ms: self.metrics_interval_ms,
            store: self.store.clone(),
            from_savepoint: self.from_savepoint.clone(),
            progress: !self.quiet,
            telemetry: self.telemetry.clone(),
            cancel: None,
        }
    }
}

/// Reads and parses a job file; errors name file, line and column.
pub fn load_job(path: &std::path::Path) -> Result<pb::JobGraph, Failure> {
    load_job_text(path).map(|(_, graph)| graph)
}

/// [`load_job`], with the file's text.
pub fn load_job_text(path: &std::path::Path) -> Result<(String, pb::JobGraph), Failure> {
    let text = read_job_file(path)?;
    let graph = sluice_planner::parse_job_file(&path.display().to_string(), &text)
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

/// Runs `sluice run`.
pub fn run(args: RunArgs) -> Result<(), Failure> {
    let graph = load_job(&args.job)?;
    let name = graph.name.clone();
    let options = args.run_options();
    let s = runtime()?.block_on(embedded::run(graph, &options, &args.state))?;
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
