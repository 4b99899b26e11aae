//! The control messages of a deployment attempt, in and out of the driver's terms.
//!
//! Builders for what the driver sends to workers (`Prepare`, `Deploy` with where to
//! resume from, checkpoint triggers and notifications, `Cancel`) and conversions of what
//! they answer (an acknowledgement into the checkpoint protocol's [`TaskAck`]). Plain
//! functions over `common/proto/cluster.proto`'s types: no I/O, no decisions.

use std::time::Duration;

use sluice_common::pb;
use sluice_common::pb::cluster as pbc;
use sluice_common::pb::cluster::coordinator_message as cm;

use crate::checkpoint::metadata::CheckpointMetadata;
use crate::checkpoint::{SourcePosition, TaskAck, TaskFigures, TaskId};

/// What every worker of one attempt is sent, besides its index and the graph.
#[derive(Debug, Clone)]
pub struct DeploySettings {
    /// The job's id.
    pub job_id: String,
    /// The attempt.
    pub attempt: u64,
    /// Data-plane settings.
    pub network: pbc::NetworkConfig,
    /// Workers print task metrics this often (0: at the end only).
    pub metrics_interval_ms: u64,
    /// Where the job's keyed state lives (remote state only), with the attempt's first
    /// epoch and fence.
    pub remote_state: Option<pbc::RemoteStateRef>,
    /// Where the attempt resumes from.
    pub restore: Option<pbc::Restore>,
    /// Whether the coordinator triggers checkpoints.
    pub coordinated: bool,
    /// The attempt's fence.
    pub fence: u64,
}

/// `Prepare`: bind a data port for `attempt`.
pub fn prepare(job_id: &str, attempt: u64) -> cm::Msg {
    cm::Msg::Prepare(pbc::Prepare {
        job_id: job_id.to_string(),
        attempt,
    })
}

/// `Deploy` for worker `index` of `peers`.
pub fn deploy(s: &DeploySettings, graph: &pb::JobGraph, index: usize, peers: &[String]) -> cm::Msg {
    cm::Msg::Deploy(pbc::Deploy {
        attempt: s.attempt,
        deployment: Some(pbc::Deployment {
            job: Some(graph.clone()),
            worker_index: index as u32,
            peers: peers.to_vec(),
            network: Some(s.network),
            metrics_interval_ms: s.metrics_interval_ms,
            remote_state: s.remote_state.clone(),
            restore: s.restore.clone(),
            coordinated_checkpoints: s.coordinated,
            job_id: s.job_id.clone(),
            fence: s.fence,
        }),
    })
}

/// Where an attempt resumes from: checkpoint `m` and its sources' positions.
pub fn restore(m: &CheckpointMetadata) -> pbc::Restore {
    pbc::Restore {
        checkpoint_id: m.checkpoint_id,
        source_positions: m
            .tasks
            .iter()
            .flat_map(|t| t.source_positions.iter())
            .map(|p| pbc::SourcePosition {
                split: p.split.clone(),
                position: p.position.clone(),
            })
            .collect(),
        channel_state: m
            .tasks
            .iter()
            .filter_map(|t| t.channel_state.clone())
            .collect(),
    }
}

/// `TriggerCheckpoint`.
pub fn trigger(attempt: u64, id: u64, unaligned: bool, final_checkpoint: bool) -> cm::Msg {
    cm::Msg::Trigger(pbc::TriggerCheckpoint {
        attempt,
        checkpoint_id: id,
        unaligned,
        final_checkpoint,
        trace_parent: String::new(),
    })
}

/// `CheckpointComplete`.
pub fn complete(attempt: u64, id: u64) -> cm::Msg {
    cm::Msg::Complete(pbc::CheckpointComplete {
        attempt,
        checkpoint_id: id,
    })
}

/// `AbortCheckpoint`.
pub fn abort(attempt: u64, id: u64) -> cm::Msg {
    cm::Msg::Abort(pbc::AbortCheckpoint {
        attempt,
        checkpoint_id: id,
    })
}

/// `Cancel`.
pub fn cancel(attempt: u64) -> cm::Msg {
    cm::Msg::Cancel(pbc::Cancel { attempt })
}

/// The task a message names.
pub fn task_id(t: &pbc::TaskRef) -> TaskId {
    TaskId::new(t.node, t.subtask)
}

/// A worker's acknowledgement as the checkpoint protocol takes it.
pub fn task_ack(a: pbc::CheckpointAck, task: TaskId) -> TaskAck {
    TaskAck {
        checkpoint_id: a.checkpoint_id,
        task,
        shard_handles: Vec::new(),
        source_positions: a
            .source_positions
            .into_iter()
            .map(|s| SourcePosition {
                split: s.split,
                position: s.position,
            })
            .collect(),
        channel_state_handles: Vec::new(),
        channel_state: (!a.channel_state.is_empty()).then_some(a.channel_state),
        figures: TaskFigures {
            sync: Duration::from_micros(a.sync_micros),
            alignment: Duration::from_micros(a.alignment_micros),
            records: a.source_records,
            ..TaskFigures::default()
        },
    }
}
