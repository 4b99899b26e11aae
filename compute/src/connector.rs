//! The connector API: what the runtime needs of sources and sinks, and nothing of any
//! particular one.
//!
//! A source is split into *splits* (generator ranges, files, partitions); each source
//! subtask reads its share and tags every batch with the split it came from, so that
//! watermarks can be generated per split. Sinks write what reaches them. Neither knows
//! about watermarks, chaining or the network: the runtime wraps them in operators.
//!
//! A source that can resume reports, per split, an opaque position
//! ([`SourceReader::positions`]) under a split name that is the same at any parallelism,
//! and continues from such positions ([`SourceReader::restore`]): that is its part of a
//! checkpoint, and what lets a job restart or rescale without a gap or a duplicate.
//!
//! The connectors themselves (Nexmark, files, stdout, blackhole, and the clients they
//! need) live in the `sluice-connectors` crate, which implements [`Connectors`]; the
//! process that runs jobs hands that to the planner and the task builder. The runtime
//! thereby builds, tests and reads without any connector's code or client library.

use std::collections::HashMap;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use sluice_common::pb;

use crate::error::{Error, Result};

/// A batch read from one split.
#[derive(Debug, Clone)]
pub struct SourceBatch {
    /// Index of the split within this subtask's assignment (0-based, dense).
    pub split: usize,
    /// The records.
    pub batch: RecordBatch,
}

/// What a source had when asked with [`SourceReader::poll_batch`].
#[derive(Debug)]
pub enum SourceStep {
    /// A batch.
    Batch(SourceBatch),
    /// Nothing arrived within the wait; the source is still open.
    Pending,
    /// Every split is exhausted.
    End,
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
    /// The next batch if one arrives within `wait`: what the runtime calls, so that a
    /// source with nothing to read (a quiet Kafka topic) still lets its task take
    /// barriers and notice idleness. Sources that never wait for data (generators,
    /// files) keep this default.
    async fn poll_batch(&mut self, _wait: std::time::Duration) -> Result<SourceStep> {
        Ok(match self.next_batch().await? {
            Some(batch) => SourceStep::Batch(batch),
            None => SourceStep::End,
        })
    }
    /// Whether every split is read at once (Kafka partitions, the Nexmark generator's
    /// interleaved splits), so that a split that has produced nothing yet holds the
    /// watermark back until it does or is idle: after a restore the splits resume at
    /// different event times, and the first batch of one far ahead must not close the
    /// windows the others are still filling. Readers that read some splits at a time
    /// report those as they start ([`Self::take_opened_splits`]) instead.
    fn splits_read_concurrently(&self) -> bool {
        false
    }
    /// Splits that began to be read since the last call, alongside others (files opened
    /// into a reader's round-robin): each holds the watermark back from now until it
    /// produces, finishes or is idle. Splits not started yet hold nothing back.
    fn take_opened_splits(&mut self) -> Vec<usize> {
        Vec::new()
    }
    /// Splits that finished since the last call (so their watermark stops holding back).
    fn take_finished_splits(&mut self) -> Vec<usize> {
        Vec::new()
    }
    /// Counters so far.
    fn counters(&self) -> SourceCounters;
    /// Checkpoint completed job-wide with these positions (what this reader reported
    /// for it): a source may tell an outside system how far it got (Kafka: offsets
    /// committed to a consumer group for monitoring). Nothing may depend on it: a restore
    /// reads positions from the checkpoint, never from there.
    fn checkpoint_committed(&mut self, _positions: &[(String, Bytes)]) {}
    /// The name of split `split` for people (`topic/partition`), when the source has one.
    fn split_name(&self, _split: usize) -> Option<String> {
        None
    }
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
    /// `state` holds the lines every subtask of the sink returned from
    /// [`pre_commit`](Self::pre_commit) for that checkpoint (at its parallelism then).
    async fn recover(&mut self, _last_committed: u64, _state: &[String]) -> Result<()> {
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
    /// The deployment attempt's fence (growing across attempts; 0: unfenced): sinks tag
    /// what they leave behind with it, so a later attempt tells a zombie's leftovers
    /// from its own.
    pub fence: u64,
}

/// Default rows per source batch.
pub const DEFAULT_BATCH_SIZE: usize = 8192;

/// Makes the sources and sinks a job names: the seam between the runtime and the
/// connectors crate.
#[async_trait]
pub trait Connectors: Send + Sync + std::fmt::Debug {
    /// The schema `spec` produces (after its column projection), resolved at planning
    /// time; it may read file metadata.
    async fn source_schema(&self, spec: &pb::SourceSpec) -> Result<SchemaRef>;

    /// Opens the reader of one source subtask.
    async fn create_source(
        &self,
        spec: &pb::SourceSpec,
        subtask: SubtaskInfo,
    ) -> Result<Box<dyn SourceReader>>;

    /// Opens the writer of one sink subtask over batches of `schema`.
    async fn create_sink(
        &self,
        spec: &pb::SinkSpec,
        schema: SchemaRef,
        subtask: SubtaskInfo,
    ) -> Result<Box<dyn SinkWriter>>;
}

/// Indices of a partitioned file sink's `partition_by` columns in its input `schema`;
/// an error names a column the input lacks or names twice, or partitioning by every
/// column (the files would hold none). Planning and the sink both ask.
pub fn partition_columns(partition_by: &[String], schema: &SchemaRef) -> Result<Vec<usize>> {
    let mut indices = Vec::with_capacity(partition_by.len());
    for column in partition_by {
        let index = schema.index_of(column).map_err(|_| {
            let have: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Error::Plan(format!(
                "the file sink is partitioned by `{column}`, which its input does not have \
                 (it has {})",
                have.join(", ")
            ))
        })?;
        if indices.contains(&index) {
            return Err(Error::Plan(format!(
                "the file sink is partitioned by `{column}` twice"
            )));
        }
        indices.push(index);
    }
    if indices.len() == schema.fields().len() {
        return Err(Error::Plan(
            "the file sink is partitioned by every column of its input: the files would \
             hold none"
                .into(),
        ));
    }
    Ok(indices)
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

/// Connectors for the runtime's own unit tests: sources of given batches, sinks that
/// collect what reaches them.
#[cfg(test)]
pub mod testing {
    use std::sync::{Arc, Mutex};

    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;

    /// A bid-like schema (`auction`, `bidder`, `price`, `channel`, `date_time`), the
    /// columns the plan tests read.
    pub fn bid_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("auction", DataType::Int64, false),
            Field::new("bidder", DataType::Int64, false),
            Field::new("price", DataType::Int64, false),
            Field::new("channel", DataType::Utf8, false),
            Field::new(
                "date_time",
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            ),
        ]))
    }

    /// Every source produces `batches` (split 0 of each subtask 0); every sink appends
    /// to `collected`.
    #[derive(Debug, Clone)]
    pub struct Fixed {
        /// The source schema.
        pub schema: SchemaRef,
        /// What subtask 0 of every source reads.
        pub batches: Vec<RecordBatch>,
        /// What the sinks received.
        pub collected: Arc<Mutex<Vec<RecordBatch>>>,
    }

    /// Sources of bid-like records with no data.
    pub fn bids() -> Arc<dyn Connectors> {
        Arc::new(Fixed {
            schema: bid_schema(),
            batches: Vec::new(),
            collected: Arc::default(),
        })
    }

    struct VecReader {
        schema: SchemaRef,
        batches: std::vec::IntoIter<RecordBatch>,
        records: u64,
    }

    #[async_trait]
    impl SourceReader for VecReader {
        fn schema(&self) -> SchemaRef {
            self.schema.clone()
        }
        fn num_splits(&self) -> usize {
            1
        }
        async fn next_batch(&mut self) -> Result<Option<SourceBatch>> {
            Ok(self.batches.next().map(|batch| {
                self.records += batch.num_rows() as u64;
                SourceBatch { split: 0, batch }
            }))
        }
        fn counters(&self) -> SourceCounters {
            SourceCounters {
                records: self.records,
                skipped: 0,
            }
        }
    }

    struct Collect(Arc<Mutex<Vec<RecordBatch>>>);

    #[async_trait]
    impl SinkWriter for Collect {
        async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
            self.0.lock().unwrap().push(batch.clone());
            Ok(())
        }
        async fn finish(&mut self) -> Result<()> {
            Ok(())
        }
    }

    #[async_trait]
    impl Connectors for Fixed {
        async fn source_schema(&self, spec: &pb::SourceSpec) -> Result<SchemaRef> {
            match projection(&self.schema, &spec.columns)? {
                Some(indices) => Ok(Arc::new(self.schema.project(&indices)?)),
                None => Ok(self.schema.clone()),
            }
        }
        async fn create_source(
            &self,
            spec: &pb::SourceSpec,
            subtask: SubtaskInfo,
        ) -> Result<Box<dyn SourceReader>> {
            let indices = projection(&self.schema, &spec.columns)?;
            let batches = if subtask.index == 0 {
                self.batches
                    .iter()
                    .map(|b| match &indices {
                        Some(i) => Ok(b.project(i)?),
                        None => Ok(b.clone()),
                    })
                    .collect::<Result<Vec<_>>>()?
            } else {
                Vec::new()
            };
            Ok(Box::new(VecReader {
                schema: self.source_schema(spec).await?,
                batches: batches.into_iter(),
                records: 0,
            }))
        }
        async fn create_sink(
            &self,
            _spec: &pb::SinkSpec,
            _schema: SchemaRef,
            _subtask: SubtaskInfo,
        ) -> Result<Box<dyn SinkWriter>> {
            Ok(Box::new(Collect(self.collected.clone())))
        }
    }
}
