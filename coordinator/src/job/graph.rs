//! What the coordinator reads from a job graph, and the one change it makes to it.
//!
//! The coordinator does not plan jobs (workers do): it needs a graph's parallelism, its
//! number of key groups, whether it keeps state in the state service, its checkpoint
//! settings, and to set every node's parallelism for a rescale. Plain functions over
//! `pb::JobGraph`; nothing here knows operators beyond their kind.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_common::pb;

use crate::checkpoint::{BarrierMode, CheckpointConfig};

/// How long a checkpoint may collect acknowledgements before it is aborted.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(120);

/// The job's number of key groups (0 in a graph means the default).
pub fn max_parallelism(graph: &pb::JobGraph) -> u32 {
    match graph.max_parallelism {
        0 => sluice_common::DEFAULT_MAX_PARALLELISM,
        n => n,
    }
}

/// The largest parallelism of the graph's nodes.
pub fn graph_parallelism(graph: &pb::JobGraph) -> u32 {
    graph
        .nodes
        .iter()
        .map(|n| n.parallelism)
        .max()
        .unwrap_or(1)
        .max(1)
}

/// Every node's parallelism, by node id.
pub fn node_parallelism(graph: &pb::JobGraph) -> BTreeMap<u32, u32> {
    graph.nodes.iter().map(|n| (n.id, n.parallelism)).collect()
}

/// Runs every node of `graph` (and a sink that names its own) at parallelism `p`.
pub fn set_parallelism(graph: &mut pb::JobGraph, p: u32) {
    for n in &mut graph.nodes {
        if n.parallelism > 0 {
            n.parallelism = p;
        }
        if let Some(pb::node::Kind::Sink(s)) = &mut n.kind
            && s.parallelism > 0
        {
            s.parallelism = p;
        }
    }
}

/// Whether the job keeps its keyed state in the state service.
pub fn uses_remote_state(graph: &pb::JobGraph) -> bool {
    graph
        .state
        .as_ref()
        .is_some_and(|s| s.backend() == pb::StateBackend::Remote)
}

/// Whether some operator of the job keeps keyed state.
pub fn keeps_keyed_state(graph: &pb::JobGraph) -> bool {
    graph
        .nodes
        .iter()
        .any(|n| n.kind.as_ref().is_some_and(pb::node::Kind::keeps_state))
}

/// Why a checkpoint of this job cannot be restored, if it cannot: keyed state kept in
/// the memory of worker processes is not part of a checkpoint (it is when the workers
/// run `in_process` with the coordinator, which then holds that memory).
pub fn not_restorable(graph: &pb::JobGraph, in_process: bool) -> Option<String> {
    let keyed = keeps_keyed_state(graph);
    (keyed && !in_process && !uses_remote_state(graph)).then(|| {
        "the job's keyed state (windows, dedup) lives in worker memory, which checkpoints \
         do not capture; with `state: { backend: remote }` it restarts from its last \
         checkpoint"
            .to_string()
    })
}

/// The job's checkpoint settings; `None` when it takes no checkpoints.
pub fn checkpoint_config(graph: &pb::JobGraph) -> Option<CheckpointConfig> {
    let c = graph.checkpoint.as_ref().filter(|c| c.interval_ms > 0)?;
    Some(CheckpointConfig {
        interval: Duration::from_millis(c.interval_ms),
        mode: match c.mode() {
            pb::CheckpointMode::Aligned => BarrierMode::Aligned,
            pb::CheckpointMode::Unaligned => BarrierMode::Unaligned,
        },
        timeout: match c.timeout_ms {
            0 => CHECKPOINT_TIMEOUT,
            ms => Duration::from_millis(ms),
        },
        ..CheckpointConfig::default()
    })
}
