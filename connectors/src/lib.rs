//! # sluice-connectors
//!
//! Sluice's sources and sinks, behind the runtime's connector API
//! ([`sluice_compute::connector`]): [`Builtin`] implements
//! [`Connectors`](sluice_compute::connector::Connectors) for every connector here, and
//! the process that runs jobs (the `sluice` binary) hands it to the planner and the task
//! builder.
//!
//! - [`nexmark`]: the deterministic Nexmark generator.
//! - [`file`]: CSV, JSON lines and Parquet files on local disk or `s3://`.
//! - [`kafka`]: Kafka topics in (partitions as splits, offsets in checkpoints) and out.
//! - [`stdout`], [`blackhole`]: sinks for people and benchmarks.
//! - [`store`]: resolving a path or URL to an object store.
//!
//! This crate owns connector formats and client libraries; it must not know about
//! tasks, chaining, watermarks, the network or state: the runtime wraps sources and
//! sinks in operators.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use bytes::Bytes;
use sluice_common::pb;
use sluice_compute::connector::{
    Connectors, DEFAULT_BATCH_SIZE, SinkWriter, SourceBatch, SourceCounters, SourceReader,
    SourceStep, SubtaskInfo, projection,
};
use sluice_compute::error::{Error, Result};

pub mod blackhole;
pub mod file;
pub mod kafka;
pub mod nexmark;
pub mod stdout;
pub mod store;
#[cfg(test)]
mod watermark_tests;

/// Every connector of this crate.
#[derive(Debug, Default, Clone, Copy)]
pub struct Builtin;

impl Builtin {
    /// The connectors as the runtime takes them.
    pub fn shared() -> Arc<dyn Connectors> {
        Arc::new(Builtin)
    }
}

#[async_trait]
impl Connectors for Builtin {
    async fn source_schema(&self, spec: &pb::SourceSpec) -> Result<SchemaRef> {
        let full = match spec.kind.as_ref() {
            Some(pb::source_spec::Kind::Nexmark(n)) => nexmark::schema(n.stream()),
            Some(pb::source_spec::Kind::File(f)) => file::source_schema(f).await?,
            Some(pb::source_spec::Kind::Kafka(k)) => kafka::source_schema(k)?,
            None => return Err(Error::Plan("the source has no kind".into())),
        };
        match projection(&full, &spec.columns)? {
            Some(indices) => Ok(Arc::new(full.project(&indices)?)),
            None => Ok(full),
        }
    }

    async fn create_source(
        &self,
        spec: &pb::SourceSpec,
        subtask: SubtaskInfo,
    ) -> Result<Box<dyn SourceReader>> {
        let batch_size = match spec.batch_size {
            0 => DEFAULT_BATCH_SIZE,
            n => n as usize,
        };
        match spec.kind.as_ref() {
            Some(pb::source_spec::Kind::Nexmark(n)) => {
                let reader: Box<dyn SourceReader> =
                    Box::new(nexmark::NexmarkReader::new(n, subtask, batch_size)?);
                let full = reader.schema();
                Ok(match projection(&full, &spec.columns)? {
                    Some(indices) => {
                        let schema = Arc::new(full.project(&indices)?);
                        Box::new(ProjectedReader {
                            inner: reader,
                            indices,
                            schema,
                        })
                    }
                    None => reader,
                })
            }
            Some(pb::source_spec::Kind::File(f)) => Ok(Box::new(
                file::FileReader::open(f, &spec.columns, subtask, batch_size).await?,
            )),
            Some(pb::source_spec::Kind::Kafka(k)) => Ok(Box::new(
                kafka::KafkaReader::open(k, &spec.columns, subtask, batch_size).await?,
            )),
            None => Err(Error::Plan("the source has no kind".into())),
        }
    }

    async fn create_sink(
        &self,
        spec: &pb::SinkSpec,
        schema: SchemaRef,
        subtask: SubtaskInfo,
    ) -> Result<Box<dyn SinkWriter>> {
        match spec.kind.as_ref() {
            Some(pb::sink_spec::Kind::Stdout(s)) => {
                Ok(Box::new(stdout::StdoutWriter::new(s.format(), schema)?))
            }
            Some(pb::sink_spec::Kind::Blackhole(b)) => Ok(Box::new(blackhole::BlackholeWriter {
                delay_per_batch: std::time::Duration::from_millis(b.delay_per_batch_ms),
            })),
            Some(pb::sink_spec::Kind::File(f)) => {
                let writer: Box<dyn SinkWriter> = match f.partition_by.is_empty() {
                    true => Box::new(file::FileWriter::create(f, schema, subtask).await?),
                    false => Box::new(file::PartitionedWriter::create(f, schema, subtask)?),
                };
                Ok(match f.delay_per_batch_ms {
                    0 => writer,
                    ms => Box::new(blackhole::DelayedWriter {
                        inner: writer,
                        delay_per_batch: std::time::Duration::from_millis(ms),
                    }),
                })
            }
            Some(pb::sink_spec::Kind::Kafka(k))
                if k.delivery() == pb::KafkaDelivery::ExactlyOnce =>
            {
                Ok(Box::new(
                    kafka::txn::ExactlyOnceWriter::create(k, schema, subtask).await?,
                ))
            }
            Some(pb::sink_spec::Kind::Kafka(k)) => Ok(Box::new(
                kafka::KafkaWriter::create(k, schema, subtask).await?,
            )),
            None => Err(Error::Plan("the sink has no kind".into())),
        }
    }
}

/// Projects the batches of a reader that cannot skip columns itself.
struct ProjectedReader {
    inner: Box<dyn SourceReader>,
    indices: Vec<usize>,
    schema: SchemaRef,
}

impl ProjectedReader {
    /// The inner reader's batch with the job's columns only.
    fn project(&self, sb: SourceBatch) -> Result<SourceBatch> {
        Ok(SourceBatch {
            split: sb.split,
            batch: sb.batch.project(&self.indices)?,
        })
    }
}

#[async_trait]
impl SourceReader for ProjectedReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn num_splits(&self) -> usize {
        self.inner.num_splits()
    }

    async fn next_batch(&mut self) -> Result<Option<SourceBatch>> {
        self.inner
            .next_batch()
            .await?
            .map(|sb| self.project(sb))
            .transpose()
    }

    async fn poll_batch(&mut self, wait: std::time::Duration) -> Result<SourceStep> {
        Ok(match self.inner.poll_batch(wait).await? {
            SourceStep::Batch(sb) => SourceStep::Batch(self.project(sb)?),
            other => other,
        })
    }

    fn splits_read_concurrently(&self) -> bool {
        self.inner.splits_read_concurrently()
    }

    fn take_opened_splits(&mut self) -> Vec<usize> {
        self.inner.take_opened_splits()
    }

    fn take_finished_splits(&mut self) -> Vec<usize> {
        self.inner.take_finished_splits()
    }

    fn checkpoint_committed(&mut self, positions: &[(String, Bytes)]) {
        self.inner.checkpoint_committed(positions)
    }

    fn split_name(&self, split: usize) -> Option<String> {
        self.inner.split_name(split)
    }

    fn counters(&self) -> SourceCounters {
        self.inner.counters()
    }

    fn positions(&self) -> Result<Vec<(String, Bytes)>> {
        self.inner.positions()
    }

    fn restore(&mut self, positions: &HashMap<String, Bytes>) -> Result<()> {
        self.inner.restore(positions)
    }
}
