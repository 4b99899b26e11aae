//! `sluice state-service`: runs a state-service node until interrupted, and the embedded
//! node `sluice run` starts for jobs with remote state.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use clap::Args;
use sluice_state_service::metrics::NodeMetrics;
use sluice_state_service::registration;

use crate::telemetry::TelemetryArgs;
use sluice_common::byte_size;
use sluice_state_service::{RunningStateService, StateServiceConfig};

use sluice_common::outln;

use crate::{Failure, runtime};

/// Arguments of `sluice state-service`.
#[derive(Args)]
pub struct StateServiceArgs {
    /// Address to serve gRPC on (port 0: any free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:7071")]
    listen: SocketAddr,
    /// This node's name in status reports (default: the listen address).
    #[arg(long)]
    node_id: Option<String>,
    /// Local directory for RocksDB shards, the disk cache and spool files.
    #[arg(long, default_value = ".sluice/state-service")]
    data_dir: PathBuf,
    /// Durable tier: `s3://bucket/prefix` (AWS_* variables, AWS_ENDPOINT_URL) or
    /// `file:///dir`.
    #[arg(long, env = "SLUICE_STATE_STORE")]
    object_store: String,
    /// Memory budget for RocksDB's block cache and write buffers and the memory cache.
    #[arg(long, default_value = "1GiB", value_parser = byte_size::parse)]
    memory: u64,
    /// Size of the local-disk cache tier.
    #[arg(long, default_value = "4GiB", value_parser = byte_size::parse)]
    disk_cache: u64,
    /// Register with the coordinator at this URL (its gRPC API, `http://host:6123`) and
    /// heartbeat this node's shards to it, so `sluice cluster` lists it.
    #[arg(long)]
    coordinator: Option<String>,
    /// The URL others reach this node at (default: `http://` and the listen address).
    #[arg(long)]
    advertise: Option<String>,
    #[command(flatten)]
    telemetry: TelemetryArgs,
}

/// Runs `sluice state-service` until Ctrl-C or SIGTERM.
pub fn serve(args: StateServiceArgs) -> Result<(), Failure> {
    let node_id = args.node_id.unwrap_or_else(|| args.listen.to_string());
    let config = StateServiceConfig {
        node_id: node_id.clone(),
        memory_bytes: args.memory,
        disk_cache_bytes: args.disk_cache,
        listen: args.listen,
        data_dir: args.data_dir,
        object_store_url: object_store_url("--object-store", &args.object_store)?,
        ..StateServiceConfig::default()
    };
    let object_store = config.object_store_url.clone();
    // Before the runtime's threads exist: they share the capped arenas.
    sluice_state_service::heap::limit_arenas(sluice_state_service::heap::ARENAS);
    let rt = runtime()?;
    rt.block_on(async {
        let service = sluice_state_service::start(config)
            .await
            .map_err(|e| Failure::from(anyhow::anyhow!("state service: {e}")))?;
        // Scripts and tests read the bound address from this line.
        outln!("state-service listening on {}", service.local_addr());
        let _registration = args.coordinator.map(|coordinator| {
            let endpoint = args.advertise.clone().unwrap_or_else(|| {
                format!(
                    "{}://{}",
                    sluice_common::tls::scheme(),
                    service.local_addr()
                )
            });
            registration::start(
                registration::Registration {
                    coordinator,
                    node_id: node_id.clone(),
                    endpoint,
                    memory_bytes: args.memory,
                    disk_cache_bytes: args.disk_cache,
                    object_store,
                },
                service.node().clone(),
            )
        });
        let node = NodeMetrics(service.node().clone());
        let telemetry = args
            .telemetry
            .start("state-service", node_id, vec![Arc::new(node)])
            .await?;
        shutdown_signal().await;
        drop(telemetry);
        service
            .shutdown()
            .await
            .map_err(|e| Failure::from(anyhow::anyhow!("state service shutdown: {e}")))
    })
}

/// An embedded node for `sluice run`, storing its durable tier under `dir/objects`.
pub async fn start_embedded(dir: &Path, memory: u64) -> Result<RunningStateService, Failure> {
    std::fs::create_dir_all(dir.join("objects")).map_err(|e| {
        Failure::usage(format!(
            "cannot create state directory {}: {e}",
            dir.display()
        ))
    })?;
    let objects = dir.join("objects").canonicalize().map_err(|e| {
        Failure::usage(format!(
            "cannot resolve state directory {}: {e}",
            dir.display()
        ))
    })?;
    let config = StateServiceConfig {
        node_id: "embedded".into(),
        memory_bytes: memory,
        disk_cache_bytes: 1 << 30,
        data_dir: dir.join("node"),
        object_store_url: format!("file://{}", objects.display()),
        ..StateServiceConfig::default()
    };
    sluice_state_service::start(config)
        .await
        .map_err(|e| Failure::from(anyhow::anyhow!("embedded state service: {e}")))
}

/// Accepts `s3://...` and `file:///...` as they are and a plain path as a local directory
/// (created if missing); errors name the option `flag`.
pub(crate) fn object_store_url(flag: &str, text: &str) -> Result<String, Failure> {
    if text.starts_with("s3://") || text.starts_with("file://") {
        return Ok(text.to_owned());
    }
    if text.contains("://") {
        return Err(Failure::usage(format!(
            "{flag} `{text}`: use s3://bucket/prefix or file:///dir"
        )));
    }
    std::fs::create_dir_all(text)
        .and_then(|()| std::fs::canonicalize(text))
        .map(|p| format!("file://{}", p.display()))
        .map_err(|e| Failure::usage(format!("{flag} `{text}`: {e}")))
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
