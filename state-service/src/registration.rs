//! A state node's registration with a coordinator (`sluice state-service --coordinator
//! URL`): it says who it is (name, endpoint, budget), then heartbeats its resident
//! memory and open shards with their sizes; a broken stream is re-established every
//! second until the node stops.
//!
//! It knows the coordinator only through the control protocol (`common/proto/
//! cluster.proto`), not its crate: the node serves its shards whether or not a
//! coordinator listens.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sluice_common::pb::cluster as pbc;
use sluice_common::pb::cluster::coordinator_client::CoordinatorClient;
use sluice_common::pb::cluster::{state_node_command, state_node_message};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use crate::server::Node;

/// Who a node says it is.
#[derive(Debug, Clone)]
pub struct Registration {
    /// `http://host:port` of the coordinator's gRPC API; several, comma-separated, for
    /// coordinators electing a leader.
    pub coordinator: String,
    /// The node's name.
    pub node_id: String,
    /// `http://host:port` others reach its state service at.
    pub endpoint: String,
    /// Its memory budget and disk cache.
    pub memory_bytes: u64,
    /// See above.
    pub disk_cache_bytes: u64,
    /// Its object store's URL.
    pub object_store: String,
}

/// Keeps `node` registered with the coordinator until the handle is dropped.
pub fn start(registration: Registration, node: Arc<Node>) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(async move {
        // The same failure once a second (a coordinator that is down) is said once.
        let mut last = String::new();
        // Several coordinators (a leader and standbys) are tried in turn.
        let urls = sluice_common::url_list::url_list(&registration.coordinator);
        if urls.is_empty() {
            tracing::error!(
                "no coordinator address in `{}`: this node does not register",
                registration.coordinator
            );
            return;
        }
        loop {
            for url in &urls {
                let why = match attach(&registration, url, &node).await {
                    Ok(()) => format!(
                        "the coordinator at {url} closed this node's stream; registering again"
                    ),
                    Err(e) => format!("cannot stay registered with the coordinator: {e}"),
                };
                if why != last && !why.contains("is a standby") {
                    tracing::warn!("{why}");
                } else {
                    tracing::debug!("{why}");
                }
                last = why;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }))
}

/// One registration: returns when its stream ends.
async fn attach(r: &Registration, url: &str, node: &Node) -> Result<(), String> {
    let channel = sluice_common::tls::endpoint(url)
        .map_err(|e| format!("coordinator address: {e}"))?
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| {
            format!(
                "cannot reach {url}: {}",
                sluice_common::tls::with_causes(&e)
            )
        })?;
    let (tx, rx) = mpsc::unbounded_channel();
    let send = |msg| {
        let _ = tx.send(pbc::StateNodeMessage { msg: Some(msg) });
    };
    send(state_node_message::Msg::Register(pbc::StateNodeRegister {
        protocol_version: pbc::PROTOCOL_VERSION,
        node_id: r.node_id.clone(),
        endpoint: r.endpoint.clone(),
        pid: std::process::id(),
        memory_bytes: r.memory_bytes,
        disk_cache_bytes: r.disk_cache_bytes,
        object_store: r.object_store.clone(),
    }));
    let outbound =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut inbound = CoordinatorClient::new(channel)
        .attach_state_node(outbound)
        .await
        .map_err(|s| format!("{url} refused the registration: {}", s.message()))?
        .into_inner();
    let every = match inbound.next().await {
        Some(Ok(pbc::StateNodeCommand {
            msg: Some(state_node_command::Msg::Registered(reg)),
        })) => Duration::from_millis(reg.heartbeat_interval_ms.clamp(50, 10_000)),
        Some(Err(s)) => return Err(format!("registration failed: {}", s.message())),
        _ => return Err("the coordinator's first message was not `registered`".into()),
    };
    tracing::info!(node = %r.node_id, "registered with {url}");
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => send(state_node_message::Msg::Heartbeat(heartbeat(node))),
            m = inbound.next() => match m {
                None => return Ok(()),
                Some(Err(s)) => return Err(format!("the stream broke: {}", s.message())),
                Some(Ok(_)) => {}
            },
        }
    }
}

/// The node's resident memory and open shards.
fn heartbeat(node: &Node) -> pbc::StateNodeHeartbeat {
    let status = node.status();
    pbc::StateNodeHeartbeat {
        rss_bytes: sluice_common::process::self_rss_bytes().unwrap_or(0),
        shards: status
            .shards
            .iter()
            .filter_map(|s| {
                let id = s.shard.as_ref()?;
                Some(pbc::ShardLoad {
                    job_id: id.job_id.clone(),
                    key_group_start: id.key_group_start,
                    key_group_end: id.key_group_end,
                    bytes: s.approximate_bytes,
                    committed_checkpoint: s.committed_checkpoint,
                })
            })
            .collect(),
    }
}
