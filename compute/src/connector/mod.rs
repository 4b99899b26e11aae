//! Sources and sinks: the edges of a job where records enter and leave Sluice.
//!
//! A source is split into *splits* (generator ranges, files); each source subtask reads
//! its share and tags every batch with the split it came from, so that watermarks can be
//! generated per split. Sinks write what reaches them. Neither knows about watermarks,
//! chaining or the network: the runtime wraps them in operators.
//!
//! A source that can resume reports, per split, an opaque position
//! ([`SourceReader::positions`]) under a split name that is the same at any parallelism,
//! and continues from such positions ([`SourceReader::restore`]): that is its part of a
//! checkpoint, and what lets a job restart or rescale without a gap or a duplicate.
//!
//! - [`nexmark`]: the deterministic Nexmark generator.
//! - [`file`]: CSV, JSON lines and Parquet files on local disk or `s3://`.
//! - [`stdout`], [`blackhole`]: sinks for people and benchmarks.
//! - [`store`]: resolving a path or URL to an object store.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use sluice_common::pb;

use crate::error::{Error, Result};

pub mod blackhole;
pub mod file;
pub mod nexmark;
pub mod stdout;
pub mod store;

/// A batch read from one split.
#[derive(Debug, Clone)]
pub struct SourceBatch {
    /// Index of the split within this subtask's assignment (0-based, dense).
    pub split: usize,
    /// The records.
    pub batch: RecordBatch,
}

/// Counters a source keeps about its input.
#[derive(Debug, Default, Clone, Copy)]
pub struct SourceCounters {
    /// Records emitted.
    pub records: u64,
    /// Malformed records skipped or sent to the dead-letter output.
    pub skipped: u64,
}

/// Reads the splits assigned to one source subtask.
#[async_trait]
pub trait SourceReader: Send {
    /// Schema of every batch this reader returns.
    fn schema(&self) -> SchemaRef;
    /// Number of splits this subtask reads (watermarks are tracked per split).
    fn num_splits(&self) -> usize;
    /// The next batch, or `None` once every split is exhausted.
    async fn next_batch(&mut self) -> Result<Option<SourceBatch>>;
    /// Splits that finished since the last call (so their watermark stops holding back).
    fn take_finished_splits(&mut self) -> Vec<usize> {
        Vec::new()
    }
    /// Counters so far.
    fn counters(&self) -> SourceCounters;
    /// Where each split of this reader stands, so that a restarted job resumes there:
    /// (split name, opaque position), one per split this reader owns, finished ones
    /// included. Split names are global (the same split has the same name at any
    /// parallelism).
    fn positions(&self) -> Result<Vec<(String, Bytes)>> {
        Err(cannot_resume())
    }
    /// Resumes from positions recorded by the readers of the same source at a checkpoint
    /// (possibly at another parallelism): each split this reader owns continues where its
    /// entry says; a split without an entry starts at its beginning.
    fn restore(&mut self, _positions: &HashMap<String, Bytes>) -> Result<()> {
        Err(cannot_resume())
    }
}

/// The error of a source that cannot record where it stands.
fn cannot_resume() -> Error {
    Error::Plan(
        "this source cannot record its position, so a job reading it cannot resume from a \
         checkpoint"
            .into(),
    )
}

/// Writes what reaches one sink subtask.
///
/// # Exactly once
///
/// A transactional sink (the file sink) commits in two phases, driven by checkpoints:
/// [`pre_commit`](SinkWriter::pre_commit) at every barrier, [`commit`](SinkWriter::commit)
/// once the checkpoint is committed job-wide, and [`recover`](SinkWriter::recover) when a
/// subtask restarts from a checkpoint. The defaults do nothing, which is right for sinks
/// that cannot take back what they wrote (stdout, blackhole: at least once).
#[async_trait]
pub trait SinkWriter: Send {
    /// Writes one batch.
    async fn write(&mut self, batch: &RecordBatch) -> Result<()>;

    /// The barrier of `checkpoint` arrived: makes everything written so far durable but
    /// not yet visible, and returns what waits for a commit (every pending transaction of
    /// this checkpoint and of earlier ones not committed yet; for files, their names).
    /// That list is the sink's pre-commit state for `checkpoint`.
    async fn pre_commit(&mut self, _checkpoint: u64) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Checkpoint `checkpoint` is committed: makes visible what was pre-committed for it
    /// and for every earlier checkpoint. Idempotent.
    async fn commit(&mut self, _checkpoint: u64) -> Result<()> {
        Ok(())
    }

    /// Called before the first record of a subtask restarted from checkpoint
    /// `last_committed` (0: no checkpoint was committed): commits what was pre-committed
    /// for checkpoints up to it, and discards what an earlier attempt wrote after it.
    async fn recover(&mut self, _last_committed: u64) -> Result<()> {
        Ok(())
    }

    /// Flushes and closes at the end of a bounded input; a transactional sink commits
    /// everything (the job is over, its final checkpoint implied).
    async fn finish(&mut self) -> Result<()>;
}

/// Where a subtask sits among its siblings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubtaskInfo {
    /// This subtask's index.
    pub index: usize,
    /// Number of subtasks of the node.
    pub parallelism: usize,
}

/// Default rows per source batch.
pub const DEFAULT_BATCH_SIZE: usize = 8192;

/// The schema a source produces, resolved at planning time (may read file metadata).
pub async fn source_schema(spec: &pb::SourceSpec) -> Result<SchemaRef> {
    let full = match spec.kind.as_ref() {
        Some(pb::source_spec::Kind::Nexmark(n)) => nexmark::schema(n.stream()),
        Some(pb::source_spec::Kind::File(f)) => file::source_schema(f).await?,
        None => return Err(Error::Plan("the source has no kind".into())),
    };
    match projection(&full, &spec.columns)? {
        Some(indices) => Ok(Arc::new(full.project(&indices)?)),
        None => Ok(full),
    }
}

/// Indices of `columns` in `schema` (`None` when all columns are wanted, in order).
pub fn projection(schema: &SchemaRef, columns: &[String]) -> Result<Option<Vec<usize>>> {
    if columns.is_empty() {
        return Ok(None);
    }
    let indices = columns
        .iter()
        .map(|c| {
            schema
                .index_of(c)
                .map_err(|_| crate::error::Error::Plan(format!("the source has no column `{c}`")))
        })
        .collect::<Result<Vec<_>>>()?;
    let all =
        indices.len() == schema.fields().len() && indices.iter().enumerate().all(|(i, &j)| i == j);
    Ok((!all).then_some(indices))
}

/// Projects the batches of a reader that cannot skip columns itself.
struct ProjectedReader {
    inner: Box<dyn SourceReader>,
    indices: Vec<usize>,
    schema: SchemaRef,
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
        let Some(sb) = self.inner.next_batch().await? else {
            return Ok(None);
        };
        Ok(Some(SourceBatch {
            split: sb.split,
            batch: sb.batch.project(&self.indices)?,
        }))
    }

    fn take_finished_splits(&mut self) -> Vec<usize> {
        self.inner.take_finished_splits()
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

/// Opens the reader of one source subtask.
pub async fn create_source(
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
        None => Err(crate::error::Error::Plan("the source has no kind".into())),
    }
}

/// Opens the writer of one sink subtask.
pub async fn create_sink(
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
        Some(pb::sink_spec::Kind::File(f)) => Ok(Box::new(
            file::FileWriter::create(f, schema, subtask).await?,
        )),
        None => Err(crate::error::Error::Plan("the sink has no kind".into())),
    }
}
