//! `sluice coordinator`: the coordinator as its own process.
//!
//! It serves the REST API for users (`--http`) and the gRPC API workers attach to
//! (`--grpc`), keeps job records and checkpoint `_metadata` in `--store` (a directory or
//! `s3://bucket/prefix`), reaches keyed state through `--state-service`, and on start
//! resumes every job the store records as not ended, from its newest valid checkpoint.
//! It prints `coordinator listening: http=ADDR grpc=ADDR` once both are bound.
//!
//! With `--ha etcd://host:port[,…]` several coordinators (one `--store`) elect a leader
//! through etcd: the leader serves and resumes the jobs, standbys refuse with the
//! leader's address until they are elected; a leader that loses its lease exits (exit
//! code 3), so that only one coordinator ever acts. Workers, state nodes and the CLI
//! take every coordinator's address (`--coordinator URL1,URL2`).

use crate::telemetry::TelemetryArgs;
use sluice_coordinator::prometheus::CoordinatorMetrics;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use sluice_compute::network::NetworkConfig;
use sluice_compute::state_client::StateServiceConnector;
use sluice_coordinator::checkpoint::store::ObjectMetadataStore;
use sluice_coordinator::ha::{Elector, HaOptions, Member, parse_etcd_url};
use sluice_coordinator::job::master::StateConnector;
use sluice_coordinator::rest;
use sluice_coordinator::service::{self, Coordinator, CoordinatorOptions};

use crate::cluster::embedded::master_config;
use crate::state_service::{object_store_url, shutdown_signal};
use crate::{Failure, runtime};

/// Arguments of `sluice coordinator`.
#[derive(Args)]
pub struct CoordinatorArgs {
    /// Address of the REST API.
    #[arg(long, default_value = "127.0.0.1:8081")]
    http: String,
    /// Address of the workers' gRPC API.
    #[arg(long, default_value = "127.0.0.1:6123")]
    grpc: String,
    /// Where job records and checkpoint metadata live: a directory, `file:///dir` or
    /// `s3://bucket/prefix` (AWS_* variables; AWS_ENDPOINT_URL for a compatible server).
    #[arg(long, default_value = "sluice-coordinator")]
    store: String,
    /// The state-service node jobs with `state: { backend: remote }` use while no state
    /// node is registered (`http://host:port`); registered nodes take every new
    /// placement.
    #[arg(long, env = "SLUICE_STATE_SERVICE")]
    state_service: Option<String>,
    /// Restarts after failures of a job's own making before the job fails (an
    /// unreachable state node or object store is waited for and not counted).
    #[arg(long, default_value_t = 10)]
    max_restarts: u32,
    /// Worker processes a job runs on unless its submission says.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// A worker silent this long (ms) is lost and its jobs restart.
    #[arg(long, default_value_t = 5000)]
    heartbeat_timeout_ms: u64,
    /// Workers heartbeat this often (ms).
    #[arg(long, default_value_t = 1000)]
    heartbeat_interval_ms: u64,
    /// Workers print per-task metrics this often (ms; 0: only at the end).
    #[arg(long, default_value_t = 0)]
    metrics_interval_ms: u64,
    /// Workers that hold a job's slots must bind their data ports within this long
    /// (ms), and then deploy their tasks within as long again, or the attempt fails.
    /// Waiting for free slots has no limit.
    #[arg(long, default_value_t = 30_000)]
    deploy_timeout_ms: u64,
    /// After a state node joins (and no other joined for this long, ms), every job's
    /// shards are spread over the nodes again, as `sluice cluster rebalance` does (0:
    /// only that command does).
    #[arg(long, default_value_t = 10_000)]
    rebalance_after_join_ms: u64,
    /// Elect a leader among coordinators through etcd: `etcd://host:port[,host:port]`
    /// (`etcds://`: over mutual TLS with the SLUICE_TLS_* identity).
    #[arg(long, value_name = "etcd://HOST:PORT")]
    ha: Option<String>,
    /// This coordinator's name in the election (default: its gRPC address).
    #[arg(long)]
    ha_id: Option<String>,
    /// The key prefix of this cluster in etcd.
    #[arg(long, default_value = "sluice")]
    ha_prefix: String,
    /// The leader's etcd lease (ms, whole seconds, at least 2000): a dead leader is
    /// replaced after about this long.
    #[arg(long, default_value_t = 5000)]
    ha_lease_ttl_ms: u64,
    /// Require a bearer token on the REST API: a file of `read|operate|join sha256:HEX [name]`
    /// lines (`sluice token new` makes one).
    #[arg(long, env = "SLUICE_AUTH_TOKENS", value_name = "FILE")]
    auth_tokens: Option<std::path::PathBuf>,
    /// Serve the REST API over TLS with this certificate (PEM, the chain leaf first).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Require REST clients to present a certificate this CA signed (mutual TLS).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_client_ca: Option<std::path::PathBuf>,
    /// Let workers it was not given join with a join token (`sluice worker --join`):
    /// the cluster CA's key (PEM), whose certificate is SLUICE_TLS_CA. The coordinator
    /// signs each joining worker a certificate for the address it calls from.
    #[arg(long, env = "SLUICE_JOIN_CA_KEY", value_name = "PEM")]
    join_ca_key: Option<std::path::PathBuf>,
    #[command(flatten)]
    telemetry: TelemetryArgs,
}

/// Runs `sluice coordinator` until interrupted.
pub fn serve(args: CoordinatorArgs) -> Result<(), Failure> {
    if args.heartbeat_timeout_ms <= args.heartbeat_interval_ms {
        return Err(Failure::usage(format!(
            "--heartbeat-timeout-ms ({}) must be longer than --heartbeat-interval-ms ({})",
            args.heartbeat_timeout_ms, args.heartbeat_interval_ms
        )));
    }
    let tokens = match &args.auth_tokens {
        Some(path) => {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::usage(format!("--auth-tokens {name}: {e}")))?;
            let tokens = sluice_coordinator::auth::Tokens::parse(&name, &text)
                .map_err(|e| Failure::usage(format!("--auth-tokens: {e}")))?;
            Some(Arc::new(tokens))
        }
        None => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            sluice_common::tls::server_config(cert, key, args.tls_client_ca.as_deref())
                .map_err(|e| Failure::usage(format!("--tls-cert: {e}")))?,
        ),
        _ => None,
    };
    let join_authority = match &args.join_ca_key {
        Some(key) => {
            let ca = std::env::var_os("SLUICE_TLS_CA").ok_or_else(|| {
                Failure::usage(
                    "--join-ca-key needs the cluster's TLS identity (SLUICE_TLS_CA, \
                     SLUICE_TLS_CERT, SLUICE_TLS_KEY): joining workers get certificates of that CA",
                )
            })?;
            let read = |path: &std::path::Path| {
                std::fs::read_to_string(path)
                    .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))
            };
            let authority = sluice_common::tls::CertificateAuthority::from_pem(
                &read(std::path::Path::new(&ca))?,
                &read(key)?,
            )
            .map_err(|e| Failure::usage(format!("--join-ca-key {}: {e}", key.display())))?;
            Some(Arc::new(authority))
        }
        None => None,
    };
    let ha = args
        .ha
        .as_deref()
        .map(parse_etcd_url)
        .transpose()
        .map_err(|e| Failure::usage(format!("--ha: {e}")))?;
    if ha.is_some() && args.ha_lease_ttl_ms < 2000 {
        return Err(Failure::usage(format!(
            "--ha-lease-ttl-ms {} is too short: at least 2000",
            args.ha_lease_ttl_ms
        )));
    }
    let url = object_store_url("--store", &args.store)?;
    let store = ObjectMetadataStore::from_url(&url)
        .map_err(|e| Failure::usage(format!("--store {}: {e}", args.store)))?;
    runtime()?.block_on(async move {
        // Jobs with remote state go to the registered state nodes, or to
        // --state-service while none is registered.
        let connector: Option<Arc<dyn StateConnector>> = Some(Arc::new(StateServiceConnector {
            endpoint: args.state_service.clone(),
        }));
        let mut master = master_config(
            args.workers.max(1),
            &NetworkConfig::default(),
            args.metrics_interval_ms,
        );
        master.deploy_timeout = Duration::from_millis(args.deploy_timeout_ms.max(1));
        master.restart.max_restarts = args.max_restarts;
        let coordinator = Coordinator::new(CoordinatorOptions {
            store: Arc::new(store),
            state: connector,
            launcher: None,
            heartbeat_interval: Duration::from_millis(args.heartbeat_interval_ms),
            heartbeat_timeout: Duration::from_millis(args.heartbeat_timeout_ms),
            master,
        });
        if let Some(authority) = join_authority {
            coordinator.set_join_authority(authority);
        }
        coordinator.set_rebalance_after_join(Duration::from_millis(args.rebalance_after_join_ms));
        let (grpc, grpc_addr) = service::bind(&args.grpc, "workers")
            .await
            .map_err(|e| Failure::usage(e.to_string()))?;
        let (http, http_addr) = service::bind(&args.http, "the REST API")
            .await
            .map_err(|e| Failure::usage(e.to_string()))?;
        // Joined before anything serves: an etcd that does not answer stops the start.
        let elector = match &ha {
            Some(endpoints) => {
                let me = Member {
                    id: args.ha_id.clone().unwrap_or_else(|| grpc_addr.to_string()),
                    http: format!("http://{http_addr}"),
                    grpc: format!("{}://{grpc_addr}", sluice_common::tls::scheme()),
                };
                let elector = Elector::join(HaOptions {
                    endpoints: endpoints.clone(),
                    prefix: args.ha_prefix.trim_end_matches('/').to_string(),
                    lease_ttl: Duration::from_secs(args.ha_lease_ttl_ms.div_ceil(1000)),
                    me,
                })
                .await
                .map_err(|e| {
                    Failure::usage(format!("--ha {}: {e}", args.ha.as_deref().unwrap_or("")))
                })?;
                coordinator.set_elector(Arc::clone(&elector));
                Some(elector)
            }
            None => None,
        };
        // Both servers run until these handles go at the end of this function.
        let _workers = coordinator.serve_workers(grpc);
        let _rest = rest::serve(coordinator.clone(), http, tokens.clone(), tls.clone());
        eprintln!("coordinator listening: http={http_addr} grpc={grpc_addr}");
        let metrics = CoordinatorMetrics(coordinator.clone());
        let _telemetry = args
            .telemetry
            .start(
                "coordinator",
                http_addr.to_string(),
                vec![Arc::new(metrics)],
            )
            .await?;
        let Some(elector) = elector else {
            resume(&coordinator).await;
            shutdown_signal().await;
            return Ok(());
        };
        eprintln!(
            "coordinator standing by: campaigning through etcd as {}",
            elector.me().id
        );
        tokio::select! {
            () = elector.elected() => {}
            () = shutdown_signal() => {
                elector.resign().await;
                return Ok(());
            }
        }
        eprintln!(
            "coordinator leading: {} (lease {} ms)",
            elector.me().id,
            args.ha_lease_ttl_ms
        );
        resume(&coordinator).await;
        tokio::select! {
            reason = elector.deposed() => Err(Failure::deposed(format!(
                "{reason}; this coordinator exits so that only one acts (a standby leads \
                 once etcd answers; start this one again to stand by)"
            ))),
            () = shutdown_signal() => {
                elector.resign().await;
                Ok(())
            }
        }
    })
}

/// Resumes every job the store records as not ended.
async fn resume(coordinator: &Arc<Coordinator>) {
    match coordinator.resume_jobs().await {
        Ok(ids) if !ids.is_empty() => eprintln!("resumed jobs: {}", ids.join(", ")),
        Ok(_) => {}
        Err(e) => eprintln!("warning: could not resume jobs: {e}"),
    }
}
