//! The coordinator's gRPC API for workers: `Coordinator.Attach` (see
//! `common/proto/cluster.proto`).

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

/// Version of the control protocol this coordinator speaks.
pub const PROTOCOL_VERSION: u32 = 2;

/// The `Coordinator` gRPC service over a [`Registry`].
pub struct ControlService {
    registry: Arc<Registry>,
    heartbeat_interval_ms: u64,
    /// One reader per attached worker's stream; aborted when the service (the server
    /// that owns it) goes.
    readers: Mutex<JoinSet<()>>,
}

impl ControlService {
    /// Workers attach to `registry` and heartbeat every `heartbeat_interval_ms`.
    pub fn new(registry: Arc<Registry>, heartbeat_interval_ms: u64) -> Self {
        Self {
            registry,
            heartbeat_interval_ms,
            readers: Mutex::new(JoinSet::new()),
        }
    }
}

type Outbound = Pin<Box<dyn Stream<Item = Result<pbc::CoordinatorMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Coordinator for ControlService {
    type AttachStream = Outbound;

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
        if reg.protocol_version != PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "the worker speaks control protocol {}, this coordinator {PROTOCOL_VERSION}",
                reg.protocol_version
            )));
        }
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
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        // Forget the readers of streams that ended.
        while readers.try_join_next().is_some() {}
        readers.spawn(async move {
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
