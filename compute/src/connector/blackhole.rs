//! A sink that drops everything, for benchmarks that measure the rest of the job.

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use crate::connector::SinkWriter;
use crate::error::Result;

/// Drops every batch.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlackholeWriter;

#[async_trait]
impl SinkWriter for BlackholeWriter {
    async fn write(&mut self, _batch: &RecordBatch) -> Result<()> {
        Ok(())
    }

    async fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}
