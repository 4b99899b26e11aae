//! `sluice worker`: a compute worker process.
//!
//! Under a coordinator: `sluice worker --coordinator http://HOST:PORT [--host H]
//! [--slots N]` attaches to it and runs what it deploys, for as long as it lives
//! (re-attaching when the coordinator restarts; `--exit-with-coordinator` exits instead).
//!
//! Under the exchange benchmark's driver: `sluice worker --listen 127.0.0.1:0 --control HOST:PORT` binds its
//! data port, connects to the driver, says hello (data address, pid), receives its
//! deployment, runs it and sends its report. If the driver goes away, the worker exits.
//!
//! By hand: `sluice worker --listen ADDR --job JOB.yaml --index I --peers A0,A1,...`
//! runs worker `I` of the job among the listed data addresses (its own entry is only
//! used in messages), prints `worker I listening on ADDR` on stderr and, at the end, the
//! same `finished ...` line as `sluice run`.

use std::path::PathBuf;

use clap::Args;
use sluice_common::pb::cluster as pbc;
use sluice_compute::cluster::control::{self, CONTROL_VERSION};
use sluice_compute::cluster::session::{self, SessionOptions};
use sluice_compute::cluster::worker::run_deployment;
use sluice_compute::network::NetworkConfig;
use tokio::net::{TcpListener, TcpStream};

use crate::run::load_job;
use crate::{Failure, runtime};

/// Arguments of `sluice worker`.
#[derive(Args)]
pub struct WorkerArgs {
    /// Address for data connections (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The coordinator's worker API (`http://host:port`).
    #[arg(long, env = "SLUICE_COORDINATOR_GRPC", conflicts_with_all = ["job", "index", "peers", "control"])]
    coordinator: Option<String>,
    /// With --coordinator: the host to bind data ports on and advertise.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// With --coordinator: jobs this worker runs at once.
    #[arg(long, default_value_t = 1)]
    slots: u32,
    /// With --coordinator: exit when the coordinator goes away.
    #[arg(long)]
    exit_with_coordinator: bool,
    /// The benchmark driver's control address; the deployment comes from there.
    #[arg(long, conflicts_with_all = ["job", "index", "peers"])]
    control: Option<String>,
    /// By hand: the job file.
    #[arg(long, requires_all = ["index", "peers"])]
    job: Option<PathBuf>,
    /// By hand: this worker's index among `--peers`.
    #[arg(long)]
    index: Option<u32>,
    /// By hand: every worker's data address, by index, comma-separated.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Print per-task metrics every this many milliseconds (0: only at the end).
    #[arg(long, default_value_t = 0)]
    metrics_interval_ms: u64,
}

/// Runs `sluice worker`.
pub fn worker(args: WorkerArgs) -> Result<(), Failure> {
    let rt = runtime()?;
    if let Some(url) = &args.coordinator {
        let options = SessionOptions {
            coordinator: url.clone(),
            host: args.host.clone(),
            slots: args.slots,
            name: String::new(),
            exit_with_coordinator: args.exit_with_coordinator,
            connectors: sluice_connectors::Builtin::shared(),
        };
        return rt
            .block_on(session::serve(options))
            .map_err(Failure::from_compute);
    }
    rt.block_on(async move {
        let listener = TcpListener::bind(&args.listen)
            .await
            .map_err(|e| Failure::usage(format!("cannot listen on {}: {e}", args.listen)))?;
        let data_address = listener
            .local_addr()
            .map_err(|e| Failure::from(anyhow::anyhow!("listener address: {e}")))?
            .to_string();
        match (&args.control, &args.job) {
            (Some(control), _) => under_driver(&listener, data_address, control).await,
            (None, Some(job)) => {
                let graph = load_job(job)?;
                let index = args.index.unwrap_or_default();
                eprintln!("worker {index} listening on {data_address}");
                let name = graph.name.clone();
                let deployment = pbc::Deployment {
                    job: Some(graph),
                    worker_index: index,
                    peers: args.peers.clone(),
                    network: Some(NetworkConfig::default().to_proto()),
                    metrics_interval_ms: args.metrics_interval_ms,
                    // Remote state needs a driver (or the coordinator) to open and
                    // commit the job's shards.
                    remote_state: None,
                    ..Default::default()
                };
                let report = run_deployment(&listener, deployment, sluice_connectors::Builtin::shared()).await;
                finish(&name, &report)
            }
            (None, None) => Err(Failure::usage(
                "`sluice worker` needs --coordinator URL, --control ADDR (a benchmark driver) or --job, --index and --peers",
            )),
        }
    })
}

fn finish(name: &str, r: &pbc::Report) -> Result<(), Failure> {
    if !r.error.is_empty() {
        return Err(Failure::from(anyhow::anyhow!("{}", r.error)));
    }
    eprintln!(
        "finished {name}: {} records in, {} out, {} late, {} skipped",
        r.records_in, r.records_out, r.late, r.skipped
    );
    Ok(())
}

async fn under_driver(
    listener: &TcpListener,
    data_address: String,
    control_addr: &str,
) -> Result<(), Failure> {
    let io = |what: &str, e: std::io::Error| Failure::from(anyhow::anyhow!("{what}: {e}"));
    let stream = TcpStream::connect(control_addr)
        .await
        .map_err(|e| io(&format!("cannot reach the driver at {control_addr}"), e))?;
    let (mut rd, mut wr) = stream.into_split();
    let hello = pbc::Hello {
        protocol_version: CONTROL_VERSION,
        data_address,
        pid: std::process::id(),
    };
    control::write_message(&mut wr, &hello)
        .await
        .map_err(|e| io("sending hello", e))?;
    let deployment: pbc::Deployment = control::read_message(&mut rd)
        .await
        .map_err(|e| io("reading the deployment", e))?
        .ok_or_else(|| Failure::from(anyhow::anyhow!("the driver closed before deploying")))?;
    // The driver going away ends this worker (no orphan processes).
    let watchdog = tokio::spawn(async move {
        let mut byte = [0u8; 1];
        let _ = tokio::io::AsyncReadExt::read(&mut rd, &mut byte).await;
        eprintln!("error: the driver closed the control connection; stopping");
        std::process::exit(1);
    });
    let report = run_deployment(listener, deployment, sluice_connectors::Builtin::shared()).await;
    let failed = !report.error.is_empty();
    let sent = control::write_message(&mut wr, &report).await;
    watchdog.abort();
    sent.map_err(|e| io("sending the report", e))?;
    if failed {
        // The driver prints the error; exit non-zero without repeating it.
        return Err(Failure::quiet(1));
    }
    Ok(())
}
