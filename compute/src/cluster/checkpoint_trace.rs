//! A worker's part of a checkpoint's trace: for each task's acknowledgement, a span
//! under the coordinator's checkpoint span (whose `traceparent` came with the trigger),
//! split into the task's barrier alignment and its snapshot, timed as the task measured
//! them; the state client's flushes of the checkpoint's epoch are traced under the same
//! span on the state nodes. Without a `traceparent` (tracing off at the coordinator)
//! nothing is recorded.
//!
//! It watches the control messages of one attempt and must not change them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use opentelemetry::{Context, KeyValue};
use sluice_common::pb::cluster as pbc;
use sluice_telemetry::trace;

/// Checkpoints whose parent is kept at most: older ones are forgotten (their acks, if
/// any still come, are not traced).
const MAX_OPEN: usize = 32;

/// The coordinator's checkpoint spans an attempt was triggered under.
#[derive(Default)]
pub(crate) struct TaskTraces {
    parents: Mutex<BTreeMap<u64, Context>>,
}

impl TaskTraces {
    fn parents(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Context>> {
        self.parents.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checkpoint `id` was triggered under `traceparent`.
    pub(crate) fn triggered(&self, id: u64, traceparent: &str) {
        if traceparent.is_empty() {
            return;
        }
        let parent = trace::remote_parent(traceparent);
        let mut parents = self.parents();
        parents.insert(id, parent);
        while parents.len() > MAX_OPEN {
            parents.pop_first();
        }
    }

    /// Checkpoints up to `id` are complete: their acks have all been sent.
    pub(crate) fn completed(&self, id: u64) {
        self.parents().retain(|c, _| *c > id);
    }

    /// Records the spans of a task's acknowledgement (nothing for other acks).
    pub(crate) fn acked(&self, ack: &pbc::CheckpointAck) {
        if ack.committed || ack.finished {
            return;
        }
        let Some(parent) = self.parents().get(&ack.checkpoint_id).cloned() else {
            return;
        };
        let task = ack.task.unwrap_or_default();
        let now = SystemTime::now();
        let snapshot = Duration::from_micros(ack.sync_micros);
        let alignment = Duration::from_micros(ack.alignment_micros);
        let aligned_at = now.checked_sub(snapshot).unwrap_or(now);
        let start = aligned_at.checked_sub(alignment).unwrap_or(aligned_at);
        let cx = trace::start(
            "task checkpoint",
            &parent,
            vec![
                KeyValue::new("sluice.node", i64::from(task.node)),
                KeyValue::new("sluice.subtask", i64::from(task.subtask)),
                KeyValue::new("sluice.source", task.source),
                KeyValue::new("sluice.checkpoint_id", ack.checkpoint_id as i64),
            ],
            Some(start),
        );
        trace::record("barrier alignment", &cx, Vec::new(), start, aligned_at);
        trace::record("snapshot", &cx, Vec::new(), aligned_at, now);
        trace::end(&cx, Some(now), None);
    }
}

impl crate::state_client::CheckpointTraces for TaskTraces {
    fn traceparent(&self, id: u64) -> String {
        self.parents()
            .get(&id)
            .map(trace::traceparent)
            .unwrap_or_default()
    }
}
