//! A sink that drops everything, for benchmarks that measure the rest of the job, and
//! the delay that slows down any sink.
//! With `delay_per_batch` it sleeps after each batch: a deliberately slow consumer for
//! back-pressure tests.

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use sluice_compute::connector::SinkWriter;
use sluice_compute::error::Result;

/// Another sink slowed down by a sleep after each batch (`delay_per_batch` on sinks that
/// write somewhere): the same deliberately slow consumer, with real output.
pub struct DelayedWriter {
    /// The sink that writes.
    pub inner: Box<dyn SinkWriter>,
    /// Sleep after each batch.
    pub delay_per_batch: std::time::Duration,
}

#[async_trait]
impl SinkWriter for DelayedWriter {
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.inner.write(batch).await?;
        tokio::time::sleep(self.delay_per_batch).await;
        Ok(())
    }

    async fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<String>> {
        self.inner.pre_commit(checkpoint).await
    }

    async fn commit(&mut self, checkpoint: u64) -> Result<()> {
        self.inner.commit(checkpoint).await
    }

    async fn recover(&mut self, last_committed: u64, state: &[String]) -> Result<()> {
        self.inner.recover(last_committed, state).await
    }

    async fn finish(&mut self) -> Result<()> {
        self.inner.finish().await
    }
}

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
