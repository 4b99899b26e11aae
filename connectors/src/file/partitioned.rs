//! The partitioned file sink: rows go to a directory per value of the partition
//! columns (`dt=2015-07-15/hm=12%3A30/`), as Flink's and Hive's file tables lay them
//! out, each directory written by a [`FileWriter`] of its own.
//!
//! The partition columns are not written inside the files: the path holds them. A value
//! is escaped as Hive escapes path names (`:` is `%3A`), and a null is
//! `__DEFAULT_PARTITION__`, Flink's default partition name.
//!
//! Two-phase commit is the plain sink's, per directory: at a barrier every directory's
//! part is made pending, and a committed checkpoint makes them all visible. The sink's
//! pre-commit state lists the directories that hold pending parts, so a restarted
//! subtask recovers each of them (and any directory it writes to later, when it first
//! opens it) to the restored checkpoint. This module knows nothing of how a directory is
//! written: [`FileWriter`] does that.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, UInt32Array};
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use sluice_common::pb;
use sluice_compute::connector::{SinkWriter, SubtaskInfo, partition_columns};
use sluice_compute::error::{Error, Result};

use super::FileWriter;

/// The directory name of a null partition value.
pub const DEFAULT_PARTITION: &str = "__DEFAULT_PARTITION__";

/// The prefix of a pre-commit state line naming a directory with pending parts.
const STATE_PREFIX: &str = "partition ";

/// How a newly opened directory's writer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No barrier yet: one part per directory, committed when the input ends.
    OnePhase,
    /// Checkpoints run: parts are numbered and committed in two phases.
    TwoPhase,
    /// Restarted from this checkpoint: a directory is recovered to it when opened.
    Recovered(u64),
}

/// Writes one sink subtask's rows into a directory per partition.
pub struct PartitionedWriter {
    spec: pb::FileSink,
    /// Indices of the partition columns, in `partition_by` order, and of the others.
    partition: Vec<usize>,
    keep: Vec<usize>,
    /// The files' schema: the input's without the partition columns.
    file_schema: SchemaRef,
    subtask: SubtaskInfo,
    /// Open directories by their path below the sink's (`dt=.../hm=...`).
    writers: BTreeMap<String, FileWriter>,
    mode: Mode,
}

impl std::fmt::Debug for PartitionedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedWriter")
            .field("path", &self.spec.path)
            .field("partition_by", &self.spec.partition_by)
            .field("open", &self.writers.len())
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl PartitionedWriter {
    /// The writer of `subtask` under `spec.path`, partitioned by `spec.partition_by`;
    /// an error names a partition column the input lacks, or one that leaves the files
    /// no column.
    pub fn create(spec: &pb::FileSink, schema: SchemaRef, subtask: SubtaskInfo) -> Result<Self> {
        let partition = partition_columns(&spec.partition_by, &schema)?;
        let keep: Vec<usize> = (0..schema.fields().len())
            .filter(|i| !partition.contains(i))
            .collect();
        let file_schema = Arc::new(schema.project(&keep)?);
        Ok(Self {
            spec: spec.clone(),
            partition,
            keep,
            file_schema,
            subtask,
            writers: BTreeMap::new(),
            mode: Mode::OnePhase,
        })
    }

    /// The writer of directory `dir` (below the sink's), opened in the current mode.
    async fn writer(&mut self, dir: &str) -> Result<&mut FileWriter> {
        if !self.writers.contains_key(dir) {
            let mut spec = self.spec.clone();
            spec.partition_by.clear();
            spec.path = format!("{}/{dir}", self.spec.path.trim_end_matches('/'));
            let mut writer =
                FileWriter::create(&spec, self.file_schema.clone(), self.subtask).await?;
            match self.mode {
                Mode::OnePhase => {}
                Mode::TwoPhase => writer.start_two_phase().await?,
                Mode::Recovered(checkpoint) => writer.recover(checkpoint, &[]).await?,
            }
            self.writers.insert(dir.to_owned(), writer);
        }
        self.writers
            .get_mut(dir)
            .ok_or_else(|| Error::Internal(format!("partition {dir} vanished")))
    }

    /// Per row of `batch`, its directory below the sink's.
    fn directories(&self, batch: &RecordBatch) -> Result<Vec<String>> {
        let values: Vec<ArrayRef> = self
            .partition
            .iter()
            .map(|&i| cast(batch.column(i), &DataType::Utf8))
            .collect::<std::result::Result<_, _>>()?;
        let names: Vec<&str> = self.spec.partition_by.iter().map(String::as_str).collect();
        Ok((0..batch.num_rows())
            .map(|row| {
                let mut dir = String::new();
                for (name, column) in names.iter().zip(&values) {
                    if !dir.is_empty() {
                        dir.push('/');
                    }
                    dir.push_str(&escape(name));
                    dir.push('=');
                    let column = column.as_string::<i32>();
                    if column.is_null(row) {
                        dir.push_str(DEFAULT_PARTITION);
                    } else {
                        dir.push_str(&escape(column.value(row)));
                    }
                }
                dir
            })
            .collect())
    }
}

/// `text` as a path segment, escaped as Hive escapes partition names and values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let special = c.is_control()
            || matches!(
                c,
                '"' | '#' | '%' | '\'' | '*' | '/' | ':' | '=' | '?' | '\\' | '{' | '[' | ']' | '^'
            );
        if special && (c as u32) < 0x80 {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

#[async_trait]
impl SinkWriter for PartitionedWriter {
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let dirs = self.directories(batch)?;
        let mut rows: HashMap<&str, Vec<u32>> = HashMap::new();
        let mut order: Vec<&str> = Vec::new();
        for (row, dir) in dirs.iter().enumerate() {
            let entry = rows.entry(dir.as_str()).or_insert_with(|| {
                order.push(dir.as_str());
                Vec::new()
            });
            entry.push(row as u32);
        }
        for dir in order {
            let indices = UInt32Array::from(rows.remove(dir).unwrap_or_default());
            let columns = self
                .keep
                .iter()
                .map(|&i| take(batch.column(i), &indices, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let part = RecordBatch::try_new(self.file_schema.clone(), columns)?;
            self.writer(dir).await?.write(&part).await?;
        }
        Ok(())
    }

    async fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<String>> {
        if self.mode == Mode::OnePhase {
            self.mode = Mode::TwoPhase;
        }
        let mut state = Vec::new();
        for (dir, writer) in &mut self.writers {
            if !writer.pre_commit(checkpoint).await?.is_empty() {
                state.push(format!("{STATE_PREFIX}{dir}"));
            }
        }
        Ok(state)
    }

    async fn commit(&mut self, checkpoint: u64) -> Result<()> {
        for writer in self.writers.values_mut() {
            writer.commit(checkpoint).await?;
        }
        // A directory with nothing open or pending is opened again when rows come.
        self.writers.retain(|_, w| !w.is_idle());
        Ok(())
    }

    async fn recover(&mut self, last_committed: u64, state: &[String]) -> Result<()> {
        self.mode = Mode::Recovered(last_committed);
        let mut dirs: Vec<&str> = state
            .iter()
            .filter_map(|line| line.strip_prefix(STATE_PREFIX))
            .collect();
        dirs.sort_unstable();
        dirs.dedup();
        for dir in dirs {
            self.writer(dir).await?;
        }
        Ok(())
    }

    async fn finish(&mut self) -> Result<()> {
        for writer in self.writers.values_mut() {
            writer.finish().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("dt", DataType::Utf8, true),
            Field::new("hm", DataType::Utf8, false),
        ]))
    }

    fn batch(rows: &[(i64, Option<&str>, &str)]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap()
    }

    fn writer(dir: &Path, index: usize) -> PartitionedWriter {
        let spec = pb::FileSink {
            path: dir.to_str().unwrap().into(),
            format: pb::FileFormat::Jsonl as i32,
            store: None,
            delay_per_batch_ms: 0,
            partition_by: vec!["dt".into(), "hm".into()],
        };
        let info = SubtaskInfo {
            index,
            parallelism: 2,
            fence: 0,
        };
        PartitionedWriter::create(&spec, schema(), info).unwrap()
    }

    /// Every visible file below `dir` with its lines, by path below `dir`.
    fn visible(dir: &Path) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap().flatten() {
                let path = entry.path();
                let name = entry.file_name().into_string().unwrap();
                if path.is_dir() {
                    stack.push(path);
                } else if !name.starts_with('.') {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let rel = path.strip_prefix(dir).unwrap().to_str().unwrap().to_owned();
                    out.push((rel, text.lines().map(str::to_owned).collect()));
                }
            }
        }
        out.sort();
        out
    }

    #[tokio::test]
    async fn rows_go_to_a_directory_per_value_without_the_partition_columns() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), 0);
        w.write(&batch(&[
            (1, Some("2015-07-15"), "00:01"),
            (2, None, "00:01"),
            (3, Some("2015-07-15"), "00:01"),
        ]))
        .await
        .unwrap();
        w.finish().await.unwrap();
        assert_eq!(
            visible(dir.path()),
            vec![
                (
                    "dt=2015-07-15/hm=00%3A01/part-0.jsonl".to_owned(),
                    vec![r#"{"id":1}"#.to_owned(), r#"{"id":3}"#.to_owned()]
                ),
                (
                    "dt=__DEFAULT_PARTITION__/hm=00%3A01/part-0.jsonl".to_owned(),
                    vec![r#"{"id":2}"#.to_owned()]
                ),
            ]
        );
    }

    #[tokio::test]
    async fn pending_parts_of_every_directory_commit_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), 0);
        w.write(&batch(&[(1, Some("d1"), "a")])).await.unwrap();
        assert_eq!(w.pre_commit(1).await.unwrap(), ["partition dt=d1/hm=a"]);
        w.commit(1).await.unwrap();
        assert_eq!(visible(dir.path()).len(), 1);
        // Checkpoint 2 covers rows in two directories, one of them new; the crash
        // comes before its commit reaches this subtask.
        w.write(&batch(&[(2, Some("d1"), "a"), (3, Some("d2"), "b")]))
            .await
            .unwrap();
        let state = w.pre_commit(2).await.unwrap();
        assert_eq!(state, ["partition dt=d1/hm=a", "partition dt=d2/hm=b"]);
        // Written after checkpoint 2 and lost with the crash.
        w.write(&batch(&[(4, Some("d3"), "c")])).await.unwrap();
        drop(w);
        assert_eq!(
            visible(dir.path()).len(),
            1,
            "nothing of checkpoint 2 visible yet"
        );

        let mut again = writer(dir.path(), 0);
        again.recover(2, &state).await.unwrap();
        let rows: Vec<String> = visible(dir.path())
            .into_iter()
            .flat_map(|(_, lines)| lines)
            .collect();
        assert_eq!(
            rows.len(),
            3,
            "checkpoint 2's rows committed once: {rows:?}"
        );
        // The directory written after the checkpoint is cleaned when next opened.
        again.write(&batch(&[(5, Some("d3"), "c")])).await.unwrap();
        again.finish().await.unwrap();
        let d3: Vec<(String, Vec<String>)> = visible(dir.path())
            .into_iter()
            .filter(|(p, _)| p.starts_with("dt=d3"))
            .collect();
        assert_eq!(d3.len(), 1, "{d3:?}");
        assert_eq!(d3[0].1, [r#"{"id":5}"#]);
        let hidden = std::fs::read_dir(dir.path().join("dt=d3/hm=c"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .count();
        assert_eq!(hidden, 0, "the lost in-progress part was deleted");
    }

    #[test]
    fn mistakes_are_named_and_values_escaped() {
        let spec = pb::FileSink {
            path: "/tmp/x".into(),
            partition_by: vec!["nope".into()],
            ..Default::default()
        };
        let info = SubtaskInfo {
            index: 0,
            parallelism: 1,
            fence: 0,
        };
        let err = PartitionedWriter::create(&spec, schema(), info)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("`nope`"), "{err}");
        assert_eq!(escape("a/b:c=d%"), "a%2Fb%3Ac%3Dd%25");
        assert_eq!(escape("été"), "été");
    }
}
