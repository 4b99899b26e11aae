//! The sink operator: hands batches to a connector's [`SinkWriter`] and drives its
//! two-phase commit.
//!
//! It checks that checkpoint barriers reach it in order (each id larger than the last)
//! and counts them, so tests see barriers end to end.
//!
//! # Checkpoints
//!
//! - [`open`](Operator::open): when the subtask restarts from a checkpoint
//!   ([`SinkOperator::restored_from`]), the writer recovers what an earlier attempt left,
//!   given the states every subtask of the sink recorded with that checkpoint.
//! - [`on_barrier`](Operator::on_barrier): the writer pre-commits; the returned list
//!   ([`SinkOperator::pre_committed`]) is the sink's state for that checkpoint, recorded
//!   with it under [`SinkOperator::state_key`] (as a source's split is).
//! - [`notify_checkpoint_complete`](Operator::notify_checkpoint_complete): the writer
//!   commits everything pre-committed up to that checkpoint.
//! - [`close`](Operator::close): the end of a bounded input; the writer commits all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use super::{Operator, OperatorContext, Output};
use crate::connector::SinkWriter;
use crate::element::{Barrier, Timestamp};
use crate::error::{Error, Result};

/// Writes every batch it receives; the end of a chain.
pub struct SinkOperator {
    writer: Box<dyn SinkWriter>,
    records: Arc<AtomicU64>,
    barriers: Arc<AtomicU64>,
    last_barrier: u64,
    restored_from: Option<u64>,
    restored_state: Vec<String>,
    state_key: Option<String>,
    pre_committed: Vec<String>,
    /// The coordinator takes a final checkpoint at the end of the input: closing leaves
    /// the writer open for it, and its completion commits and finishes the writer.
    final_checkpoint: bool,
    closed: bool,
}

impl SinkOperator {
    /// Wraps `writer`, counting written records into `records` and barriers into
    /// `barriers`.
    pub fn new(
        writer: Box<dyn SinkWriter>,
        records: Arc<AtomicU64>,
        barriers: Arc<AtomicU64>,
    ) -> Self {
        Self {
            writer,
            records,
            barriers,
            last_barrier: 0,
            restored_from: None,
            restored_state: Vec::new(),
            state_key: None,
            pre_committed: Vec::new(),
            final_checkpoint: false,
            closed: false,
        }
    }

    /// The end of the input waits for the coordinator's final checkpoint instead of
    /// committing everything at once (which a restore could not take back).
    pub fn with_final_checkpoint(mut self) -> Self {
        self.final_checkpoint = true;
        self
    }

    /// The subtask restarts from the committed checkpoint `checkpoint` (0 when the job
    /// restarts before any checkpoint was committed), where the sink's subtasks recorded
    /// `state` (their pre-commit lines, at the parallelism of then):
    /// [`open`](Operator::open) lets the writer recover, and later barriers must be
    /// numbered above it.
    pub fn restored_from(mut self, checkpoint: u64, state: Vec<String>) -> Self {
        self.restored_from = Some(checkpoint);
        self.restored_state = state;
        self.last_barrier = checkpoint;
        self
    }

    /// Records the pre-commit state with each checkpoint as subtask `subtask` of sink
    /// node `node`.
    pub fn with_state_key(mut self, node: u32, subtask: usize) -> Self {
        self.state_key = Some(Self::state_key(node, subtask));
        self
    }

    /// The name a sink subtask's state is recorded under.
    pub fn state_key(node: u32, subtask: usize) -> String {
        format!("{}{subtask}", Self::state_prefix(node))
    }

    /// The names of every subtask's state of sink node `node` start with this.
    pub fn state_prefix(node: u32) -> String {
        format!("sink/{node}/")
    }

    /// Whether a recorded split name is a sink's state key, not a source's split.
    pub fn is_state_key(name: &str) -> bool {
        name.starts_with("sink/")
    }

    /// The lines of recorded states (as [`sink_state`](Operator::sink_state) encodes
    /// them).
    pub fn decode_state(state: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(state)
            .split('\n')
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// What the writer pre-committed at the last barrier and has not committed yet: the
    /// sink's state for that checkpoint, to be recorded with it.
    pub fn pre_committed(&self) -> &[String] {
        &self.pre_committed
    }
}

#[async_trait]
impl Operator for SinkOperator {
    async fn open(&mut self, _ctx: &OperatorContext) -> Result<()> {
        match self.restored_from {
            Some(checkpoint) => {
                let state = std::mem::take(&mut self.restored_state);
                self.writer.recover(checkpoint, &state).await
            }
            None => Ok(()),
        }
    }

    async fn process_batch(&mut self, batch: RecordBatch, _out: &mut Output) -> Result<()> {
        self.writer.write(&batch).await?;
        self.records
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn on_watermark(&mut self, _ts: Timestamp, _out: &mut Output) -> Result<()> {
        Ok(())
    }

    fn sink_state(&self) -> Option<(String, bytes::Bytes)> {
        let key = self.state_key.as_ref()?;
        if self.pre_committed.is_empty() {
            return None;
        }
        Some((key.clone(), self.pre_committed.join("\n").into()))
    }

    async fn on_barrier(&mut self, barrier: Barrier, _out: &mut Output) -> Result<()> {
        if barrier.checkpoint_id <= self.last_barrier {
            return Err(Error::Internal(format!(
                "barrier {} reached the sink after barrier {}",
                barrier.checkpoint_id, self.last_barrier
            )));
        }
        self.last_barrier = barrier.checkpoint_id;
        self.pre_committed = self.writer.pre_commit(barrier.checkpoint_id).await?;
        self.barriers.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<()> {
        if checkpoint_id > self.last_barrier {
            return Err(Error::Internal(format!(
                "checkpoint {checkpoint_id} completed before its barrier reached the sink \
                 (last barrier {})",
                self.last_barrier
            )));
        }
        self.writer.commit(checkpoint_id).await?;
        if checkpoint_id == self.last_barrier {
            self.pre_committed.clear();
            if self.closed {
                // The final checkpoint: nothing is left to write.
                self.writer.finish().await?;
            }
        }
        Ok(())
    }

    async fn close(&mut self, _out: &mut Output) -> Result<()> {
        self.closed = true;
        if self.final_checkpoint {
            return Ok(());
        }
        self.writer.finish().await?;
        self.pre_committed.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::element::BarrierKind;

    /// Records the calls it receives.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<String>>>);

    #[async_trait]
    impl SinkWriter for Recorder {
        async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
            self.0
                .lock()
                .unwrap()
                .push(format!("write {}", batch.num_rows()));
            Ok(())
        }
        async fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<String>> {
            self.0
                .lock()
                .unwrap()
                .push(format!("pre_commit {checkpoint}"));
            Ok(vec![format!("pending-{checkpoint}")])
        }
        async fn commit(&mut self, checkpoint: u64) -> Result<()> {
            self.0.lock().unwrap().push(format!("commit {checkpoint}"));
            Ok(())
        }
        async fn recover(&mut self, last_committed: u64, _state: &[String]) -> Result<()> {
            self.0
                .lock()
                .unwrap()
                .push(format!("recover {last_committed}"));
            Ok(())
        }
        async fn finish(&mut self) -> Result<()> {
            self.0.lock().unwrap().push("finish".into());
            Ok(())
        }
    }

    fn ctx() -> OperatorContext {
        OperatorContext {
            node_id: 1,
            node_name: "sink".into(),
            subtask: 0,
            parallelism: 1,
            max_parallelism: 128,
            state: None,
        }
    }

    fn barrier(checkpoint_id: u64) -> Barrier {
        Barrier {
            checkpoint_id,
            kind: BarrierKind::Aligned,
            timeout_at_ms: 0,
        }
    }

    fn batch(rows: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(0..rows))],
        )
        .unwrap()
    }

    fn operator(rec: &Recorder) -> SinkOperator {
        SinkOperator::new(
            Box::new(rec.clone()),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        )
    }

    #[tokio::test]
    async fn barriers_pre_commit_notifications_commit_close_finishes() {
        let rec = Recorder::default();
        let mut op = operator(&rec);
        let mut out = Output::default();
        op.open(&ctx()).await.unwrap();
        op.process_batch(batch(3), &mut out).await.unwrap();
        op.on_barrier(barrier(1), &mut out).await.unwrap();
        assert_eq!(op.pre_committed(), ["pending-1"]);
        op.notify_checkpoint_complete(1).await.unwrap();
        assert!(op.pre_committed().is_empty());
        op.on_barrier(barrier(2), &mut out).await.unwrap();
        // A notification for a checkpoint whose barrier has not arrived is a bug.
        assert!(op.notify_checkpoint_complete(3).await.is_err());
        op.close(&mut out).await.unwrap();
        assert!(out.main.is_empty());
        assert_eq!(
            *rec.0.lock().unwrap(),
            [
                "write 3",
                "pre_commit 1",
                "commit 1",
                "pre_commit 2",
                "finish"
            ]
        );
    }

    #[tokio::test]
    async fn a_restored_subtask_recovers_on_open_and_numbers_barriers_after_it() {
        let rec = Recorder::default();
        let mut op = operator(&rec).restored_from(4, Vec::new());
        let mut out = Output::default();
        op.open(&ctx()).await.unwrap();
        assert!(op.on_barrier(barrier(4), &mut out).await.is_err());
        op.on_barrier(barrier(5), &mut out).await.unwrap();
        assert_eq!(*rec.0.lock().unwrap(), ["recover 4", "pre_commit 5"]);
    }
}
