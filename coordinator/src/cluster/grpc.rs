//! The coordinator's gRPC API for workers and state nodes: `Coordinator.Attach` and
//! `Coordinator.AttachStateNode` (see `common/proto/cluster.proto`).

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use sluice_common::pb::cluster as pbc;
use sluice_common::pb::cluster::coordinator_server::Coordinator;
use sluice_common::pb::cluster::{coordinator_message as cm, worker_message as wm};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::{Request, Response, Status, Streaming};

use super::registry::Registry;
use super::state_nodes::StateNodes;

pub use sluice_common::pb::cluster::PROTOCOL_VERSION;

/// The `Coordinator` gRPC service over a [`Registry`].
pub struct ControlService {
    registry: Arc<Registry>,
    state_nodes: Arc<StateNodes>,
    heartbeat_interval_ms: u64,
    /// One reader per attached worker's stream; aborted when the service (the server
    /// that owns it) goes.
    readers: Mutex<JoinSet<()>>,
}

impl ControlService {
    /// Workers attach to `registry`, state nodes to `state_nodes`; both heartbeat every
    /// `heartbeat_interval_ms`.
    pub fn new(
        registry: Arc<Registry>,
        state_nodes: Arc<StateNodes>,
        heartbeat_interval_ms: u64,
    ) -> Self {
        Self {
            registry,
            state_nodes,
            heartbeat_interval_ms,
            readers: Mutex::new(JoinSet::new()),
        }
    }
}

/// Refuses a `who` that speaks another control protocol.
fn same_protocol(who: &str, version: u32) -> Result<(), Status> {
    if version == PROTOCOL_VERSION {
        return Ok(());
    }
    Err(Status::failed_precondition(format!(
        "the {who} speaks control protocol {version}, this coordinator {PROTOCOL_VERSION}"
    )))
}

impl ControlService {
    /// Runs the reader of an attached stream (aborted with the service).
    fn read(&self, reader: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        // Forget the readers of streams that ended.
        while readers.try_join_next().is_some() {}
        readers.spawn(reader);
    }
}

type Outbound = Pin<Box<dyn Stream<Item = Result<pbc::CoordinatorMessage, Status>> + Send>>;
type ToStateNode = Pin<Box<dyn Stream<Item = Result<pbc::StateNodeCommand, Status>> + Send>>;

#[tonic::async_trait]
impl Coordinator for ControlService {
    type AttachStream = Outbound;
    type AttachStateNodeStream = ToStateNode;

    async fn attach_state_node(
        &self,
        request: Request<Streaming<pbc::StateNodeMessage>>,
    ) -> Result<Response<Self::AttachStateNodeStream>, Status> {
        use pbc::state_node_message::Msg;
        let mut inbound = request.into_inner();
        let first = inbound.next().await.ok_or_else(|| {
            Status::invalid_argument("the state node's stream closed before `register`")
        })??;
        let Some(Msg::Register(reg)) = first.msg else {
            return Err(Status::invalid_argument(
                "the first message of a state node's stream must be `register`",
            ));
        };
        same_protocol("state node", reg.protocol_version)?;
        if reg.node_id.is_empty() || reg.endpoint.is_empty() {
            return Err(Status::invalid_argument(
                "a state node registers with its node id and endpoint",
            ));
        }
        let generation = self
            .state_nodes
            .attach(&reg)
            .map_err(Status::failed_precondition)?;
        tracing::info!(node = %reg.node_id, endpoint = %reg.endpoint, "state node registered");
        let nodes = self.state_nodes.clone();
        let node = reg.node_id.clone();
        self.read(async move {
            let reason = loop {
                match inbound.next().await {
                    None => break "its stream closed".to_string(),
                    Some(Err(s)) => break format!("its stream broke: {}", s.message()),
                    Some(Ok(pbc::StateNodeMessage {
                        msg: Some(Msg::Heartbeat(hb)),
                    })) => nodes.heartbeat(&node, generation, &hb),
                    Some(Ok(_)) => {}
                }
            };
            nodes.lost(&node, generation, &reason);
        });
        let registered = pbc::StateNodeCommand {
            msg: Some(pbc::state_node_command::Msg::Registered(
                pbc::StateNodeRegistered {
                    heartbeat_interval_ms: self.heartbeat_interval_ms,
                },
            )),
        };
        // The stream stays open (pending) after the greeting: its end is the node's.
        let outbound = futures::stream::iter([Ok(registered)]).chain(futures::stream::pending());
        Ok(Response::new(Box::pin(outbound)))
    }

    async fn attach(
        &self,
        request: Request<Streaming<pbc::WorkerMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let mut inbound = request.into_inner();
        let first = inbound.next().await.ok_or_else(|| {
            Status::invalid_argument("the control stream closed before `register`")
        })??;
        let Some(wm::Msg::Register(reg)) = first.msg else {
            return Err(Status::invalid_argument(
                "the first message of a control stream must be `register`",
            ));
        };
        same_protocol("worker", reg.protocol_version)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let heartbeat_interval_ms = self.heartbeat_interval_ms;
        let id = self
            .registry
            .attach(&reg, tx, |id| pbc::CoordinatorMessage {
                msg: Some(cm::Msg::Registered(pbc::Registered {
                    worker_id: id.to_string(),
                    heartbeat_interval_ms,
                })),
            });
        tracing::info!(worker = %id, pid = reg.pid, host = %reg.host, slots = reg.slots, "worker attached");
        let registry = self.registry.clone();
        self.read(async move {
            let reason = loop {
                match inbound.next().await {
                    None => break "its control stream closed".to_string(),
                    Some(Err(s)) => break format!("its control stream broke: {}", s.message()),
                    Some(Ok(m)) => {
                        if let Some(msg) = m.msg {
                            registry.deliver(&id, msg);
                        }
                    }
                }
            };
            registry.lost(&id, &reason);
        });
        let outbound =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        Ok(Response::new(Box::pin(outbound)))
    }
}
