//! The sink operator: hands batches to a connector's [`SinkWriter`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use super::{Operator, Output};
use crate::connector::SinkWriter;
use crate::element::Timestamp;
use crate::error::Result;

/// Writes every batch it receives; the end of a chain.
pub struct SinkOperator {
    writer: Box<dyn SinkWriter>,
    records: Arc<AtomicU64>,
}

impl SinkOperator {
    /// Wraps `writer`, counting written records into `records`.
    pub fn new(writer: Box<dyn SinkWriter>, records: Arc<AtomicU64>) -> Self {
        Self { writer, records }
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

    async fn close(&mut self, _out: &mut Output) -> Result<()> {
        self.writer.finish().await
    }
}
