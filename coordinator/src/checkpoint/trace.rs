//! The coordinator's part of a checkpoint's trace: a root span from the trigger to the
//! shards' commit, with the `_metadata` write and the commit as children; its
//! `traceparent` rides in the trigger to the workers (their task spans) and in the
//! commit calls to the state nodes (their shard spans).
//!
//! It watches the messages and actions the job actor carries out and must not change
//! what they do: the checkpoint protocol does not know traces exist.

use std::collections::BTreeMap;

use opentelemetry::{Context, KeyValue};
use sluice_common::pb::cluster as pbc;
use sluice_common::pb::cluster::coordinator_message as cm;
use sluice_telemetry::trace;

/// Checkpoints whose span is still open beyond this many are abandoned (an attempt that
/// failed never completes them), oldest first.
const MAX_OPEN: usize = 16;

/// The open checkpoint spans of one job.
#[derive(Default)]
pub(crate) struct CheckpointTraces {
    open: BTreeMap<u64, Context>,
}

impl CheckpointTraces {
    /// Sees `msg` before it goes to the workers: a trigger opens the checkpoint's span
    /// (once per id) and carries its `traceparent`; an abort ends it as failed; a
    /// completion ends it when no shards are left to commit (`stateless`).
    pub(crate) fn on_send(&mut self, job: &str, msg: &mut cm::Msg, stateless: bool) {
        match msg {
            cm::Msg::Trigger(t) => self.triggered(job, t),
            cm::Msg::Abort(a) => self.finish(a.checkpoint_id, Some("aborted".into())),
            cm::Msg::Complete(c) if stateless => self.finish(c.checkpoint_id, None),
            _ => {}
        }
    }

    fn triggered(&mut self, job: &str, t: &mut pbc::TriggerCheckpoint) {
        let cx = self.open.entry(t.checkpoint_id).or_insert_with(|| {
            trace::start(
                "checkpoint",
                &Context::new(),
                vec![
                    KeyValue::new("sluice.job_id", job.to_owned()),
                    KeyValue::new("sluice.checkpoint_id", t.checkpoint_id as i64),
                    KeyValue::new("sluice.attempt", t.attempt as i64),
                    KeyValue::new("sluice.unaligned", t.unaligned),
                    KeyValue::new("sluice.final", t.final_checkpoint),
                ],
                None,
            )
        });
        t.trace_parent = trace::traceparent(cx);
        while self.open.len() > MAX_OPEN {
            if let Some((_, cx)) = self.open.pop_first() {
                trace::end(&cx, None, Some("abandoned: it never completed".into()));
            }
        }
    }

    /// A child span `name` of checkpoint `id`'s span, when it is open.
    pub(crate) fn child(&self, id: u64, name: &'static str) -> Option<Context> {
        self.open
            .get(&id)
            .map(|cx| trace::start(name, cx, Vec::new(), None))
    }

    /// Ends checkpoint `id`'s span (failed with `error`).
    pub(crate) fn finish(&mut self, id: u64, error: Option<String>) {
        if let Some(cx) = self.open.remove(&id) {
            trace::end(&cx, None, error);
        }
    }
}
