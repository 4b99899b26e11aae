//! Operators: the units of work inside a task.
//!
//! An [`Operator`] receives the elements of one input stream and writes what it produces
//! into an [`Output`]. Every lifecycle hook but `process_batch` has a default, so an
//! operator overrides only what it needs: a filter only `process_batch`; a window also
//! `on_watermark` and `close`. Operators never see channels, threads or the network:
//! chained operators are called one after the other by [`crate::runtime::chain`], and
//! whatever an operator emits goes to the next one or to the task's output router.
//!
//! One file per operator, each with its builder from the job graph (`build`).
//!
//! # Keyed state
//! A keyed operator finds its state in its [`OperatorContext`] at `open`, asks it for
//! the tables it keeps ([`crate::keyed::OperatorState::table`]) and reads and writes
//! them. It does what its semantics need at a barrier (finish in-flight work, persist
//! its timers) in `on_barrier`; the runtime then seals the epoch. It never sees which
//! store holds its state, when an epoch becomes durable, or how a restore happened.

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use crate::element::{Barrier, StreamElement, Timestamp};
use crate::error::Result;
use crate::keyed::OperatorState;

pub mod aggregate;
pub mod dedup;
pub mod filter;
pub mod join;
pub mod lookup_join;
pub mod over;
pub mod select;
pub mod sink;
pub mod top_n;
pub mod union;
pub mod window;

/// Where an operator runs: its node, subtask, and the job-wide settings it may need.
#[derive(Debug, Clone)]
pub struct OperatorContext {
    /// The job-graph node this operator instance runs.
    pub node_id: u32,
    /// Node name for messages and metrics.
    pub node_name: String,
    /// This subtask's index.
    pub subtask: usize,
    /// The node's parallelism.
    pub parallelism: usize,
    /// Number of key groups of the job.
    pub max_parallelism: u32,
    /// The operator's keyed state, when its node keeps state (windows, dedup).
    pub state: Option<OperatorState>,
}

impl OperatorContext {
    /// The operator's keyed state; an error for a node the runtime gave none (a bug:
    /// the task builder gives state to every node kind that keeps it).
    pub fn keyed_state(&self) -> Result<&OperatorState> {
        self.state.as_ref().ok_or_else(|| {
            crate::error::Error::Internal(format!(
                "operator `{}` keeps keyed state but was built without any",
                self.node_name
            ))
        })
    }

    /// `name[subtask]`, the way tasks are named in messages.
    pub fn task_name(&self) -> String {
        format!("{}[{}]", self.node_name, self.subtask)
    }
}

/// What an operator emits while handling one element.
#[derive(Debug, Default)]
pub struct Output {
    /// Elements for the next operator (or the output router).
    pub main: Vec<StreamElement>,
    /// Batches for named side outputs (e.g. `late`).
    pub side: Vec<(&'static str, RecordBatch)>,
}

impl Output {
    /// Emits a batch on the main output; empty batches are dropped.
    pub fn batch(&mut self, batch: RecordBatch) {
        if batch.num_rows() > 0 {
            self.main.push(StreamElement::Batch(batch));
        }
    }

    /// Emits a watermark.
    pub fn watermark(&mut self, ts: Timestamp) {
        self.main.push(StreamElement::Watermark(ts));
    }

    /// Forwards a barrier.
    pub fn barrier(&mut self, barrier: Barrier) {
        self.main.push(StreamElement::Barrier(barrier));
    }

    /// Emits a batch on the side output `tag`.
    pub fn side(&mut self, tag: &'static str, batch: RecordBatch) {
        if batch.num_rows() > 0 {
            self.side.push((tag, batch));
        }
    }
}

/// One operator instance (one subtask of one job-graph node).
#[async_trait]
pub trait Operator: Send {
    /// Called once before the first element.
    async fn open(&mut self, _ctx: &OperatorContext) -> Result<()> {
        Ok(())
    }

    /// Handles a batch of records.
    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()>;

    /// Handles a batch of records from input `input` of a two-input operator (a join);
    /// one-input operators only see input 0, which the default hands to `process_batch`.
    async fn process_input(
        &mut self,
        _input: usize,
        batch: RecordBatch,
        out: &mut Output,
    ) -> Result<()> {
        self.process_batch(batch, out).await
    }

    /// Handles a watermark (the minimum across the task's inputs). The default forwards it.
    async fn on_watermark(&mut self, ts: Timestamp, out: &mut Output) -> Result<()> {
        out.watermark(ts);
        Ok(())
    }

    /// The snapshot point of checkpoint `barrier.checkpoint_id`; the default forwards it.
    async fn on_barrier(&mut self, barrier: Barrier, out: &mut Output) -> Result<()> {
        out.barrier(barrier);
        Ok(())
    }

    /// Checkpoint `checkpoint_id` is committed job-wide.
    async fn notify_checkpoint_complete(&mut self, _checkpoint_id: u64) -> Result<()> {
        Ok(())
    }

    /// A sink's pre-commit state at the last barrier, under its state key (other
    /// operators: none); recorded with the checkpoint.
    fn sink_state(&self) -> Option<(String, bytes::Bytes)> {
        None
    }

    /// Whether the task should call [`Operator::on_processing_time`] periodically.
    fn wants_processing_time(&self) -> bool {
        false
    }

    /// A processing-time tick: `now` is wall-clock milliseconds since the epoch.
    async fn on_processing_time(&mut self, _now: Timestamp, _out: &mut Output) -> Result<()> {
        Ok(())
    }

    /// Called once after the last element (end of a bounded input); may emit final results.
    async fn close(&mut self, _out: &mut Output) -> Result<()> {
        Ok(())
    }

    /// Whether the output of the call just made is not complete: the operator emits a
    /// large result (a watermark closing many windows) in parts, so that the chain passes
    /// each part on before the next is built. The chain then calls
    /// [`Operator::resume`] until this is false, before anything else.
    fn has_more(&self) -> bool {
        false
    }

    /// Emits the next part of the output [`Operator::has_more`] announced.
    async fn resume(&mut self, _out: &mut Output) -> Result<()> {
        Ok(())
    }
}
