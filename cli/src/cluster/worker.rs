//! `sluice worker`: a compute worker process.
//!
//! Under a coordinator: `sluice worker --coordinator http://HOST:PORT [--host H]
//! [--slots N]` attaches to it and runs what it deploys, for as long as it lives
//! (re-attaching when the coordinator restarts; `--exit-with-coordinator` exits instead).
//!
//! By hand: `sluice worker --listen ADDR --job JOB.yaml --index I --peers A0,A1,...`
//! runs worker `I` of the job among the listed data addresses (its own entry is only
//! used in messages), prints `worker I listening on ADDR` on stderr and, at the end, the
//! same `finished ...` line as `sluice run`. This runs one deployment without a
//! coordinator (a tool for testing the data plane): no state service and no checkpoints.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use sluice_common::pb::cluster as pbc;
use sluice_compute::cluster::session::{self, SessionOptions};
use sluice_compute::cluster::worker::{WorkerEnv, run_deployment};
use sluice_compute::network::NetworkConfig;
use tokio::net::TcpListener;

use crate::run::load_job;
use crate::telemetry::{TelemetryArgs, instance};
use crate::{Failure, runtime};
use sluice_telemetry::Collect;

/// Arguments of `sluice worker`.
#[derive(Args)]
pub struct WorkerArgs {
    /// Address for data connections (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The coordinator's worker API (`http://host:port`).
    #[arg(long, env = "SLUICE_COORDINATOR_GRPC", conflicts_with_all = ["job", "index", "peers"])]
    coordinator: Option<String>,
    /// With --coordinator: the host to bind data ports on and advertise.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// With --coordinator: jobs this worker runs at once.
    #[arg(long, default_value_t = 1)]
    slots: u32,
    /// With --coordinator: join a TLS cluster without certificate files of its own
    /// (an auto-scaled worker): the coordinators' REST API (`https://HOST:PORT[,…]`),
    /// which signs a certificate for this worker's address with the cluster's CA.
    #[arg(long, value_name = "URL", requires_all = ["join_token_file", "join_ca", "coordinator"])]
    join: Option<String>,
    /// With --join: a file holding a join token (`sluice token new --role join`).
    #[arg(long, value_name = "FILE", requires = "join")]
    join_token_file: Option<PathBuf>,
    /// With --join: the cluster's CA certificate (PEM), which the coordinators' REST API
    /// is checked against.
    #[arg(long, value_name = "PEM", requires = "join")]
    join_ca: Option<PathBuf>,
    /// With --coordinator: exit when the coordinator goes away.
    #[arg(long)]
    exit_with_coordinator: bool,
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
    /// The most memory one job's remote channels may hold on this worker (network
    /// buffers); a job whose channels need more fails at deployment, saying why.
    #[arg(long, default_value = "1GiB", value_parser = sluice_common::byte_size::parse)]
    network_memory: u64,
    #[command(flatten)]
    telemetry: TelemetryArgs,
}

/// Runs `sluice worker`.
pub fn worker(args: WorkerArgs) -> Result<(), Failure> {
    let rt = runtime()?;
    let mut env = WorkerEnv::standalone(sluice_connectors::Builtin::shared());
    env.network_memory = args.network_memory;
    let live: Arc<dyn Collect> = env.live.clone();
    if let Some(url) = &args.coordinator {
        if let Some(rest) = &args.join {
            rt.block_on(join(&args, rest))?;
        }
        let options = SessionOptions {
            coordinator: url.clone(),
            host: args.host.clone(),
            slots: args.slots,
            name: String::new(),
            exit_with_coordinator: args.exit_with_coordinator,
            env,
        };
        return rt.block_on(async {
            let _telemetry = args
                .telemetry
                .start("worker", instance(), vec![live])
                .await?;
            session::serve(options).await.map_err(Failure::from_compute)
        });
    }
    let Some(job) = &args.job else {
        return Err(Failure::usage(
            "`sluice worker` needs --coordinator URL, or --job, --index and --peers",
        ));
    };
    let graph = load_job(job)?;
    if graph.checkpoint.as_ref().is_some_and(|c| c.interval_ms > 0) {
        return Err(Failure::usage(format!(
            "{}: checkpoints need a coordinator: run the job with `sluice run` or submit it \
             to `sluice coordinator`",
            job.display()
        )));
    }
    rt.block_on(async move {
        let _telemetry = args
            .telemetry
            .start("worker", instance(), vec![live])
            .await?;
        let listener = TcpListener::bind(&args.listen)
            .await
            .map_err(|e| Failure::usage(format!("cannot listen on {}: {e}", args.listen)))?;
        let data_address = listener
            .local_addr()
            .map_err(|e| Failure::from(anyhow::anyhow!("listener address: {e}")))?
            .to_string();
        let index = args.index.unwrap_or_default();
        eprintln!("worker {index} listening on {data_address}");
        let name = graph.name.clone();
        let deployment = pbc::Deployment {
            job: Some(graph),
            worker_index: index,
            peers: args.peers.clone(),
            network: Some(NetworkConfig::default().to_proto()),
            metrics_interval_ms: args.metrics_interval_ms,
            // Remote state needs the coordinator to open and commit the job's shards.
            remote_state: None,
            ..Default::default()
        };
        let report = run_deployment(&listener, deployment, env).await;
        finish(&name, &report)
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

/// Gets this worker's certificate from a coordinator with a join token, and makes it
/// the process's cluster identity; the key never leaves the process (a restart joins
/// again).
async fn join(args: &WorkerArgs, rest: &str) -> Result<(), Failure> {
    if sluice_common::tls::cluster_tls().is_some() {
        return Err(Failure::usage(
            "--join fetches this worker's certificate: do not also set SLUICE_TLS_CA, \
             SLUICE_TLS_CERT and SLUICE_TLS_KEY",
        ));
    }
    let token_file = args.join_token_file.clone().unwrap_or_default();
    let token = std::fs::read_to_string(&token_file)
        .map_err(|e| Failure::usage(format!("--join-token-file {}: {e}", token_file.display())))?
        .trim()
        .to_owned();
    if token.is_empty() {
        return Err(Failure::usage(format!(
            "--join-token-file {}: the file is empty",
            token_file.display()
        )));
    }
    let (key, request) =
        sluice_common::tls::certificate_request(&format!("sluice worker {}", args.host))
            .map_err(|e| Failure::from(anyhow::anyhow!("making this worker's key: {e}")))?;
    let credentials = crate::cluster::client::Credentials {
        token: Some(token),
        ca: args.join_ca.clone(),
        // The certificate names the address the request comes from: this worker's.
        local_address: args.host.parse().ok(),
        ..Default::default()
    };
    let answer = crate::cluster::client::call_any(
        "POST",
        rest,
        "/v1/workers/join",
        Some(serde_json::json!({ "host": args.host, "csr": request })),
        &credentials,
    )
    .await
    .map_err(|f| {
        Failure::from(anyhow::anyhow!(
            "joining the cluster at {rest}: {}",
            f.message()
        ))
    })?;
    let field = |name: &str| {
        answer[name].as_str().map(str::to_owned).ok_or_else(|| {
            Failure::from(anyhow::anyhow!(
                "joining the cluster at {rest}: the answer has no `{name}`"
            ))
        })
    };
    let (certificate, ca) = (field("certificate")?, field("ca")?);
    let identity = sluice_common::tls::ClusterTls::from_pem(
        ca.into_bytes(),
        certificate.into_bytes(),
        key.into_bytes(),
    )
    .map_err(|e| Failure::from(anyhow::anyhow!("the certificate {rest} signed: {e}")))?;
    sluice_common::tls::set_cluster_tls(Some(Box::leak(Box::new(identity))));
    eprintln!(
        "joined the cluster at {rest}: a certificate for {}",
        args.host
    );
    Ok(())
}
