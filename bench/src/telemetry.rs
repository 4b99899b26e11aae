//! `sluice bench telemetry`: what exporting metrics and checkpoint traces costs.
//!
//! What it measures: events per second of Nexmark queries (q0 pass-through and the
//! tumbling count + sum per auction, with checkpoints so that traces flow) run three
//! ways, interleaved run by run so that the machine's drift hits all three alike:
//! `off` (no export), `on` (OTLP export every `--interval-ms` to a receiver in this
//! process, as a co-located collector would be) and `down` (export to a port where
//! nothing listens: the collector is down). Reported: each run, then per query the
//! median of each way and the ratios `on/off` and `down/off` (the goal: at least 0.97),
//! with the exports the receiver got and this process's RSS after the runs (nothing may
//! grow with the collector down).
//!
//! Output: `query=.. way=.. run=.. events=.. seconds=.. events_per_s=..` per run, then
//! `query=.. off_eps=.. on_eps=.. down_eps=.. on_ratio=.. down_ratio=.. metric_exports=..
//! span_exports=.. rss_mb=..`.

use std::time::Duration;

use clap::Args as ClapArgs;
use sluice_common::outln;
use sluice_planner::job_spec;
use sluice_telemetry::receiver::OtlpReceiver;

use crate::harness::table::Line;
use crate::harness::timing::percentile;
use crate::nexmark::{JobOptions, Query, StateChoice, job_text};
use crate::{Error, Host, Result};

/// Arguments of `sluice bench telemetry`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Bids per run: enough for several export intervals, so that what is measured is
    /// the steady cost, not an exporter's start and last flush.
    #[arg(long, default_value_t = 100_000_000)]
    events: u64,
    /// Parallelism of the jobs.
    #[arg(long, default_value_t = 2)]
    parallelism: u32,
    /// Runs of each way per query.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Export interval (ms); short, to exaggerate the cost.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Checkpoint interval of the jobs (ms).
    #[arg(long, default_value_t = 1000)]
    checkpoint_ms: u64,
}

/// How a run exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Off,
    On,
    Down,
}

/// Runs `sluice bench telemetry`.
pub fn run(args: Args, host: &dyn Host) -> Result<()> {
    if args.runs == 0 || args.parallelism == 0 || args.interval_ms == 0 {
        return Err(Error::usage(
            "--runs, --parallelism and --interval-ms must be at least 1",
        ));
    }
    let receiver = OtlpReceiver::start();
    let down = {
        // A port that was free a moment ago: nothing listens there.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| Error::failed(format!("a free port: {e}")))?;
        format!("http://{addr}")
    };
    let interval = Duration::from_millis(args.interval_ms);
    for query in [Query::Q0, Query::Tumbling] {
        let text = job_text(
            query,
            &JobOptions {
                events: args.events,
                parallelism: args.parallelism,
                input: None,
                auctions: None,
                persons: None,
                state: StateChoice::Memory,
                checkpoint_ms: args.checkpoint_ms,
                cache: None,
                max_drift_ms: 0,
                out: None,
            },
        )?;
        let graph =
            job_spec::parse_job("<bench>", &text).map_err(|e| Error::usage(e.to_string()))?;
        let before = receiver.exports();
        let mut eps: [Vec<f64>; 3] = Default::default();
        for run in 1..=args.runs {
            for (i, way) in [Way::Off, Way::On, Way::Down].into_iter().enumerate() {
                let otlp = match way {
                    Way::Off => None,
                    Way::On => Some((receiver.endpoint(), interval)),
                    Way::Down => Some((down.clone(), interval)),
                };
                let s = host.run_job_exporting(graph.clone(), 0, Some(otlp))?;
                let rate = s.records_in as f64 / s.seconds.max(1e-9);
                eps[i].push(rate);
                let line = Line::new()
                    .field("query", format!("{query:?}"))
                    .field("way", format!("{way:?}").to_lowercase())
                    .field("run", run)
                    .field("events", s.records_in)
                    .field("seconds", format!("{:.3}", s.seconds))
                    .field("events_per_s", format!("{rate:.0}"));
                outln!("{line}");
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            percentile(v, 0.5)
        };
        let [off, on, down_eps] = eps.each_mut().map(median);
        let after = receiver.exports();
        let rss_mb = sluice_common::process::self_rss_bytes().unwrap_or(0) as f64 / 1048576.0;
        let line = Line::new()
            .field("query", format!("{query:?}"))
            .field("off_eps", format!("{off:.0}"))
            .field("on_eps", format!("{on:.0}"))
            .field("down_eps", format!("{down_eps:.0}"))
            .field("on_ratio", format!("{:.3}", on / off.max(1e-9)))
            .field("down_ratio", format!("{:.3}", down_eps / off.max(1e-9)))
            .field("metric_exports", after.0 - before.0)
            .field("span_exports", after.1 - before.1)
            .field("rss_mb", format!("{rss_mb:.1}"));
        outln!("{line}");
    }
    Ok(())
}
