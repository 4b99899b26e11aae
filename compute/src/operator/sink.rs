//! The sink operator: hands batches to a connector's [`SinkWriter`].
//!
//! It also checks that checkpoint barriers reach it in order (each id larger than the
//! last) and counts them, so tests see barriers end to end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use super::{Operator, Output};
use crate::connector::SinkWriter;
use crate::element::{Barrier, Timestamp};
use crate::error::{Error, Result};

/// Writes every batch it receives; the end of a chain.
pub struct SinkOperator {
    writer: Box<dyn SinkWriter>,
    records: Arc<AtomicU64>,
    barriers: Arc<AtomicU64>,
    last_barrier: u64,
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
        }
    }
}

#[async_trait]
impl Operator for SinkOperator {
    async fn process_batch(&mut self, batch: RecordBatch, _out: &mut Output) -> Result<()> {
        self.writer.write(&batch).await?;
        self.records
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn on_watermark(&mut self, _ts: Timestamp, _out: &mut Output) -> Result<()> {
        Ok(())
    }

    async fn on_barrier(&mut self, barrier: Barrier, _out: &mut Output) -> Result<()> {
        if barrier.checkpoint_id <= self.last_barrier {
            return Err(Error::Internal(format!(
                "barrier {} reached the sink after barrier {}",
                barrier.checkpoint_id, self.last_barrier
            )));
        }
        self.last_barrier = barrier.checkpoint_id;
        self.barriers.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn close(&mut self, _out: &mut Output) -> Result<()> {
        self.writer.finish().await
    }
}
