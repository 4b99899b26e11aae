//! `sluice bench …`: the benchmarks' subcommands and this binary's side of them.
//!
//! The benchmarks themselves are the `sluice-bench` crate, which declares their flags
//! and does not import this crate. What they need that only the composition root has
//! (running a job as `sluice run` does, an embedded state-service node, the coordinator's
//! state connector, the master settings) they ask of [`Wiring`], this binary's
//! [`sluice_bench::Host`].

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use clap::{Args, Subcommand};
use sluice_bench::JobSummary;
use sluice_common::pb;
use sluice_compute::network::NetworkConfig;
use sluice_compute::state_client::StateServiceConnector;
use sluice_coordinator::job::master::{MasterConfig, StateConnector};
use sluice_state_service::RunningStateService;

use crate::cluster::embedded::{self, RunOptions, master_config};
use crate::cluster::local_state::StateArgs;
use crate::state_service::start_embedded;
use crate::telemetry::TelemetryArgs;
use crate::{Failure, runtime};

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Run a Nexmark query and print events, seconds, events/s, events/s per core, peak RSS.
    Nexmark(NexmarkArgs),
    /// State-service operations per second over gRPC on loopback.
    State(sluice_bench::state::Args),
    /// State-service checkpoint latency, memory and shard open time, nodes as child
    /// processes.
    Checkpoint(sluice_bench::checkpoint::Args),
    /// Checkpoint duration, rescale time and recovery time of a job under the
    /// coordinator, with a given amount of state.
    Cluster(sluice_bench::cluster::Args),
    /// The coordinator with hundreds of simulated workers and state nodes (real gRPC
    /// protocols, no operators): checkpoint coordination time and CPU, and the time to
    /// place a lost node's shards again.
    Scale(sluice_bench::scale::Args),
    /// Exchange throughput between two worker processes next to a raw TCP pair; with
    /// --slow-consumer, the producer's RSS under back pressure.
    Exchange(sluice_bench::exchange::Args),
    /// The Kafka source's throughput next to a plain librdkafka consumer reading the
    /// same topic in the same run.
    Kafka(sluice_bench::kafka::Args),
    /// Throughput with OTLP export off, on (to a receiver in this process) and with the
    /// collector down, interleaved in one run.
    Telemetry(sluice_bench::telemetry::Args),
}

/// Arguments of `sluice bench nexmark`: the benchmark's, and where remote state lives
/// (as for `sluice run`).
#[derive(Args)]
pub struct NexmarkArgs {
    #[command(flatten)]
    bench: sluice_bench::nexmark::Args,
    #[command(flatten)]
    state: StateArgs,
}

/// Runs `sluice bench …`.
pub fn run(command: BenchCommand) -> Result<(), Failure> {
    let result = match command {
        BenchCommand::Nexmark(args) => {
            sluice_bench::nexmark::run(args.bench, &Wiring { state: args.state })
        }
        BenchCommand::State(args) => sluice_bench::state::run(args, &Wiring::default()),
        BenchCommand::Checkpoint(args) => sluice_bench::checkpoint::run(args),
        BenchCommand::Cluster(args) => sluice_bench::cluster::run(args, &Wiring::default()),
        BenchCommand::Scale(args) => sluice_bench::scale::run(args, &Wiring::default()),
        BenchCommand::Exchange(args) => sluice_bench::exchange::run(args, &Wiring::default()),
        BenchCommand::Kafka(args) => sluice_bench::kafka::run(args, &Wiring::default()),
        BenchCommand::Telemetry(args) => sluice_bench::telemetry::run(args, &Wiring::default()),
    };
    result.map_err(Failure::from)
}

impl From<sluice_bench::Error> for Failure {
    fn from(e: sluice_bench::Error) -> Self {
        match e {
            sluice_bench::Error::Usage(message) => Failure::usage(message),
            sluice_bench::Error::Failed(e) => Failure::from(e),
        }
    }
}

impl Failure {
    /// The same failure as a benchmark's error (a usage error stays one).
    fn into_bench(self) -> sluice_bench::Error {
        if self.code == 2 {
            sluice_bench::Error::Usage(self.message)
        } else {
            sluice_bench::Error::failed(self.message)
        }
    }
}

/// This binary's wiring, as the benchmarks see it.
#[derive(Default)]
struct Wiring {
    /// Where the keyed state of jobs with remote state lives.
    state: StateArgs,
}

#[async_trait]
impl sluice_bench::Host for Wiring {
    fn run_job_exporting(
        &self,
        graph: pb::JobGraph,
        workers: u32,
        otlp: Option<Option<(String, std::time::Duration)>>,
    ) -> sluice_bench::Result<JobSummary> {
        let telemetry = match otlp {
            None => TelemetryArgs::default(),
            // An empty endpoint is "off", whatever the environment says.
            Some(None) => TelemetryArgs {
                otlp_endpoint: Some(String::new()),
                ..TelemetryArgs::default()
            },
            Some(Some((endpoint, interval))) => TelemetryArgs {
                otlp_endpoint: Some(endpoint),
                otlp_interval_ms: Some(interval.as_millis().max(1) as u64),
                ..TelemetryArgs::default()
            },
        };
        let options = RunOptions {
            workers,
            telemetry,
            ..RunOptions::default()
        };
        let summary = runtime()
            .and_then(|rt| rt.block_on(embedded::run(graph, &options, &self.state)))
            .map_err(Failure::into_bench)?;
        Ok(JobSummary {
            records_in: summary.records_in,
            records_out: summary.records_out,
            seconds: summary.seconds,
        })
    }

    async fn start_state_service(
        &self,
        dir: &Path,
        memory: u64,
    ) -> sluice_bench::Result<RunningStateService> {
        start_embedded(dir, memory)
            .await
            .map_err(Failure::into_bench)
    }

    fn state_connector(&self, endpoint: String) -> Arc<dyn StateConnector> {
        Arc::new(StateServiceConnector {
            endpoint: Some(endpoint),
        })
    }

    fn master_config(
        &self,
        workers: usize,
        network: &NetworkConfig,
        metrics_interval_ms: u64,
    ) -> MasterConfig {
        master_config(workers, network, metrics_interval_ms)
    }
}
