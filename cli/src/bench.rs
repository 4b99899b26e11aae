//! `sluice bench nexmark`: a whole-job benchmark that prints one line of figures.
//!
//! The query runs on the embedded local runtime exactly as `sluice run` would run it
//! (with `--workers N`, across N worker processes as `sluice run --workers N` would),
//! reading either the built-in generator or CSV files of bids (`--input`, as written by
//! `sluice nexmark gen --format csv`), and writing to a blackhole sink.

use clap::{Args, ValueEnum};
use sluice_common::job_spec;

use sluice_compute::network::NetworkConfig;

use crate::cluster::embedded::{self as local_driver, DriverOptions};
use crate::output::outln;
use crate::run::{StateArgs, execute};
use crate::{Failure, rss, runtime};

/// Benchmark queries.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Query {
    /// Pass-through.
    Q0,
    /// Currency conversion (projection).
    Q1,
    /// Filter by auction id.
    Q2,
    /// Bids per auction in 10 s windows sliding by 2 s.
    Q5,
    /// Highest bid per 10 s tumbling window.
    Q7,
    /// Bids per bidder session (10 s gap).
    Q11,
    /// COUNT and SUM of bids per auction in 10 s tumbling windows.
    Tumbling,
}

/// Arguments of `sluice bench nexmark`.
#[derive(Args)]
pub struct BenchArgs {
    /// The query.
    #[arg(long, value_enum)]
    query: Query,
    /// Number of bids (ignored with --input, which reads every file).
    #[arg(long, default_value_t = 10_000_000)]
    events: u64,
    /// Parallelism of the job.
    #[arg(long, default_value_t = 2)]
    parallelism: u32,
    /// Read bids from CSV files in this directory instead of the generator.
    #[arg(long)]
    input: Option<String>,
    /// Where window state lives: `memory`, or `remote` (an embedded state service unless
    /// --state-service names one).
    #[arg(long, value_enum, default_value_t = StateChoice::Memory)]
    state: StateChoice,
    #[command(flatten)]
    state_args: StateArgs,
    /// Run across this many worker processes through the local driver (0: in this
    /// process). With workers the seconds include starting them, and peak_rss_mb (this
    /// process only) is NaN: the workers print theirs in their `metrics` lines.
    #[arg(long, default_value_t = 0)]
    workers: u32,
}

/// The state backend of a benchmark run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StateChoice {
    /// In the worker's memory.
    Memory,
    /// In the state service.
    Remote,
}

fn pipeline(query: Query) -> &'static str {
    match query {
        Query::Q0 => "",
        Query::Q1 => {
            "pipeline:\n  - select: [\"auction\", \"bidder\", \"price * 0.908 AS price\", \"date_time\"]\n"
        }
        Query::Q2 => {
            "pipeline:\n  - filter: \"auction % 123 = 0\"\n  - select: [\"auction\", \"price\"]\n"
        }
        Query::Q5 => {
            "pipeline:\n  - key_by: [auction]\n  - window: { sliding: 10s, slide: 2s }\n    aggregate: [\"count(*) AS bids\"]\n"
        }
        Query::Q7 => {
            "pipeline:\n  - window: { tumbling: 10s }\n    aggregate: [\"max(price) AS top_price\", \"count(*) AS bids\"]\n"
        }
        Query::Q11 => {
            "pipeline:\n  - key_by: [bidder]\n  - window: { session: 10s }\n    aggregate: [\"count(*) AS bids\"]\n"
        }
        Query::Tumbling => {
            "pipeline:\n  - key_by: [auction]\n  - window: { tumbling: 10s }\n    aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n"
        }
    }
}

/// The job file text of a benchmark run.
pub fn job_text(
    query: Query,
    events: u64,
    parallelism: u32,
    input: Option<&str>,
    state: StateChoice,
) -> String {
    let source = match input {
        None => format!(
            "  nexmark: {{ stream: bid, events: {events}, seed: 42, max_out_of_orderness: 2s }}\n"
        ),
        Some(dir) => format!(
            "  file:\n    path: \"{dir}\"\n    format: csv\n    schema: {{ auction: int64, bidder: int64, price: int64, channel: string, url: string, date_time: timestamp, extra: string }}\n"
        ),
    };
    let state = match state {
        StateChoice::Memory => "memory",
        StateChoice::Remote => "remote",
    };
    format!(
        "name: bench-{q:?}\nparallelism: {parallelism}\nstate: {{ backend: {state} }}\nsource:\n{source}watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n{p}sink:\n  blackhole: {{}}\n",
        q = query,
        p = pipeline(query)
    )
}

/// Runs `sluice bench nexmark`.
pub fn nexmark(args: BenchArgs) -> Result<(), Failure> {
    if args.parallelism == 0 {
        return Err(Failure::usage("--parallelism must be at least 1"));
    }
    let text = job_text(
        args.query,
        args.events,
        args.parallelism,
        args.input.as_deref(),
        args.state,
    );
    let graph = job_spec::parse_job("<bench>", &text).map_err(|e| Failure::usage(e.to_string()))?;
    let s = if args.workers > 0 {
        let options = DriverOptions {
            workers: args.workers,
            network: NetworkConfig::default(),
            metrics_interval_ms: 0,
        };
        runtime()?.block_on(local_driver::run(graph, &options, &args.state_args))?
    } else {
        execute(graph, true, &args.state_args)?
    };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let eps = s.records_in as f64 / s.seconds.max(1e-9);
    let rss_mb = match args.workers {
        0 => rss::peak_rss_bytes()
            .map(|b| b as f64 / (1 << 20) as f64)
            .unwrap_or(f64::NAN),
        _ => f64::NAN,
    };
    outln!(
        "query={:?} state={:?} source={} parallelism={} workers={} events={} seconds={:.3} events_per_s={:.0} events_per_s_per_core={:.0} peak_rss_mb={:.1} out={}",
        args.query,
        args.state,
        if args.input.is_some() {
            "csv"
        } else {
            "generator"
        },
        args.parallelism,
        args.workers,
        s.records_in,
        s.seconds,
        eps,
        eps / cores as f64,
        rss_mb,
        s.records_out
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_is_a_valid_job() {
        for q in Query::value_variants() {
            for input in [None, Some("/tmp/bids")] {
                let text = job_text(*q, 10, 2, input, StateChoice::Remote);
                job_spec::parse_job("<bench>", &text)
                    .unwrap_or_else(|e| panic!("{q:?}: {e}\n{text}"));
            }
        }
    }
}
