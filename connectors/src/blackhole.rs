//! A sink that drops everything, for benchmarks that measure the rest of the job.
//! With `delay_per_batch` it sleeps after each batch: a deliberately slow consumer for
//! back-pressure tests.

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use sluice_compute::connector::SinkWriter;
use sluice_compute::error::Result;

/// Drops every batch.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlackholeWriter {
    /// Sleep after each batch.
    pub delay_per_batch: std::time::Duration,
}

#[async_trait]
impl SinkWriter for BlackholeWriter {
    async fn write(&mut self, _batch: &RecordBatch) -> Result<()> {
        if !self.delay_per_batch.is_zero() {
            tokio::time::sleep(self.delay_per_batch).await;
        }
        Ok(())
    }

    async fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}
