//! The file sink: the part files of one sink subtask, committed in two phases when the job
//! checkpoints.
//!
//! Part names and their stages are in [`part_name`](super::part_name); the directory
//! operations (atomic rename locally, copy and delete on S3) in
//! [`part_dir`](super::part_dir); what recovery does in [`recovery`](super::recovery).
//!
//! # Without checkpoints
//!
//! Subtask `i` writes one part, `part-<i>.<ext>`: locally through a buffered writer to the
//! hidden `.part-<i>.<ext>.inprogress`, renamed on [`finish`](SinkWriter::finish); on S3
//! buffered in memory and uploaded on finish (as a multipart upload when large). Readers
//! never see a half-written part.
//!
//! # Two-phase commit (exactly once)
//!
//! The first checkpoint barrier (or a [`recover`](SinkWriter::recover)) switches the
//! writer to two phases, as Flink's `FileSink`:
//!
//! 1. Records go to the in-progress part `.part-<i>-<seq>.<ext>.inprogress`, started at
//!    the first record after a barrier.
//! 2. At barrier `N` ([`pre_commit`](SinkWriter::pre_commit)) the part is finished (the
//!    encoder's footer written, flushed, fsynced) and renamed to the hidden pending name
//!    `.part-<i>-<seq>.<ext>.pending-<N>`; the directory is synced. On S3 the bytes are
//!    uploaded as a complete object under that hidden name. The pending parts are the
//!    subtask's pre-commit state for `N`.
//! 3. When checkpoint `N` completes ([`commit`](SinkWriter::commit)) every part pending
//!    for a checkpoint `<= N` is made visible as `part-<i>-<seq>.<ext>`.
//! 4. At the end of a bounded input ([`finish`](SinkWriter::finish)) the job is over:
//!    every pending part and the current part are committed. Under the coordinator a
//!    finished task still takes part in checkpoints: a barrier after finish has nothing
//!    to pre-commit.
//!
//! ## Why S3 parts are complete objects while pending
//!
//! A pending part could instead stay an open multipart upload, completed under the
//! visible key on commit (no copy). That is not safe here: an open upload is invisible
//! to listings, so recovery could only find it through the upload id and part ETags kept
//! in checkpoint state (and `object_store` cannot resume an upload by id), and bucket
//! lifecycle rules that abort incomplete uploads would silently drop a pending part
//! whose checkpoint is slow to complete. A complete object under a hidden name is
//! durable, found by a plain listing, and names its checkpoint; the price is a
//! server-side copy on commit (no bytes through the worker) and the 5 GiB limit of one
//! `CopyObject`. On S3 the in-progress part lives in memory only (a crash loses it, as
//! it should): memory per subtask is bounded by what one checkpoint interval writes.
//!
//! Timestamps are written as the file source reads them back (`2015-07-15T00:00:01.234`).

use std::fs::File;
use std::io::{BufWriter, Write};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use parquet::arrow::ArrowWriter;
use sluice_common::pb;

use super::part_dir::PartDir;
use super::part_name::{FenceMark, PartName, Stage};
use super::recovery;
use crate::store;
use sluice_compute::connector::{SinkWriter, SubtaskInfo};
use sluice_compute::error::{Error, Result};

/// The file extension of `format`.
pub fn extension(format: pb::FileFormat) -> &'static str {
    match format {
        pb::FileFormat::Jsonl => "jsonl",
        pb::FileFormat::Csv => "csv",
        pb::FileFormat::Parquet => "parquet",
    }
}

/// Bytes on their way to a local file or to memory.
enum Output {
    Local(BufWriter<File>),
    Memory(Vec<u8>),
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Output::Local(w) => w.write(buf),
            Output::Memory(v) => v.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Output::Local(w) => w.write_all(buf),
            Output::Memory(v) => v.write_all(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::Local(w) => w.flush(),
            Output::Memory(_) => Ok(()),
        }
    }
}

/// Encodes batches in one format.
enum Encoder {
    Json(arrow::json::LineDelimitedWriter<Output>),
    Csv(Box<arrow::csv::Writer<Output>>),
    Parquet(Box<ArrowWriter<Output>>),
}

impl Encoder {
    fn new(format: pb::FileFormat, schema: SchemaRef, output: Output) -> Result<Self> {
        Ok(match format {
            pb::FileFormat::Jsonl => Encoder::Json(arrow::json::LineDelimitedWriter::new(output)),
            pb::FileFormat::Csv => Encoder::Csv(Box::new(
                arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(output),
            )),
            pb::FileFormat::Parquet => {
                Encoder::Parquet(Box::new(ArrowWriter::try_new(output, schema, None)?))
            }
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        match self {
            Encoder::Json(w) => w.write(batch)?,
            Encoder::Csv(w) => w.write(batch)?,
            Encoder::Parquet(w) => w.write(batch)?,
        }
        Ok(())
    }

    fn finish(self) -> Result<Output> {
        Ok(match self {
            Encoder::Json(mut w) => {
                w.finish()?;
                w.into_inner()
            }
            Encoder::Csv(w) => w.into_inner(),
            Encoder::Parquet(w) => w.into_inner()?,
        })
    }
}

/// The part being written.
struct OpenPart {
    /// Its sequence number (`None` for the part opened before the first barrier).
    seq: Option<u64>,
    /// Its in-progress file name.
    in_progress: String,
    encoder: Encoder,
    rows: usize,
}

/// Writes one sink subtask's part files.
pub struct FileWriter {
    format: pb::FileFormat,
    schema: SchemaRef,
    subtask: SubtaskInfo,
    dir: PartDir,
    current: Option<OpenPart>,
    /// Set by the first barrier or by recovery: parts are committed in two phases.
    two_phase: bool,
    /// The sequence number of the next part (two-phase only).
    next_seq: u64,
    /// Parts finished at a barrier and not committed yet, oldest first.
    pending: Vec<PartName>,
    finished: bool,
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("dir", &self.dir)
            .field("subtask", &self.subtask.index)
            .field("two_phase", &self.two_phase)
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl FileWriter {
    /// Starts the part of `subtask` under the directory `spec.path`.
    pub async fn create(
        spec: &pb::FileSink,
        schema: SchemaRef,
        subtask: SubtaskInfo,
    ) -> Result<Self> {
        let dir = if let Some(dir) = store::local_path(&spec.path)? {
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
            PartDir::Local(dir)
        } else {
            let (store, root, root_display) = store::resolve(&spec.path, spec.store.as_ref())?;
            PartDir::Remote {
                store,
                root,
                root_display,
            }
        };
        let mut writer = FileWriter {
            format: spec.format(),
            schema,
            subtask,
            dir,
            current: None,
            two_phase: false,
            next_seq: 0,
            pending: Vec::new(),
            finished: false,
        };
        // Without checkpoints every subtask writes its one part, even an empty one.
        writer.current = Some(writer.start_part()?);
        Ok(writer)
    }

    /// Switches to two-phase commits (the job checkpoints): parts are numbered after any
    /// number this subtask's index ever used in the directory.
    pub async fn start_two_phase(&mut self) -> Result<()> {
        if !self.two_phase {
            let names = self.dir.list().await?;
            self.next_seq = recovery::next_seq(&names, self.subtask.index);
            self.two_phase = true;
        }
        Ok(())
    }

    /// Whether nothing is open or waiting for a commit (in two phases): the writer may
    /// be dropped and the directory opened again later.
    pub fn is_idle(&self) -> bool {
        self.two_phase && self.pending.is_empty() && self.current.is_none() && !self.finished
    }

    /// Where the part of a job without checkpoints is written, for messages.
    pub fn display(&self) -> String {
        self.dir.display(&self.single_part().to_string())
    }

    /// The parts waiting for their checkpoint to complete, for messages and tests.
    pub fn pending(&self) -> Vec<String> {
        self.pending
            .iter()
            .map(|p| self.dir.display(&p.to_string()))
            .collect()
    }

    fn ext(&self) -> &'static str {
        extension(self.format)
    }

    /// `part-<i>.<ext>`, the one part of a job without checkpoints.
    fn single_part(&self) -> PartName {
        PartName::new(self.subtask.index, None, self.ext(), Stage::Committed)
    }

    /// Opens a new in-progress part.
    fn start_part(&mut self) -> Result<OpenPart> {
        let seq = self.two_phase.then(|| {
            self.next_seq += 1;
            self.next_seq - 1
        });
        let name = PartName::new(self.subtask.index, seq, self.ext(), Stage::InProgress)
            .fenced(self.subtask.fence);
        let output = match self.dir.local_path(&name.to_string()) {
            Some(path) => {
                let file =
                    File::create(&path).map_err(|e| Error::io(path.display().to_string(), e))?;
                Output::Local(BufWriter::with_capacity(1 << 20, file))
            }
            None => Output::Memory(Vec::new()),
        };
        let encoder = Encoder::new(self.format, self.schema.clone(), output)?;
        Ok(OpenPart {
            seq,
            in_progress: name.to_string(),
            encoder,
            rows: 0,
        })
    }

    /// Commits every part pending for a checkpoint `<= checkpoint`, oldest first.
    async fn commit_up_to(&mut self, checkpoint: u64) -> Result<()> {
        let due = |p: &PartName| matches!(p.stage, Stage::Pending(n) if n <= checkpoint);
        if !self.pending.iter().any(due) {
            return Ok(());
        }
        for part in self.pending.iter().filter(|p| due(p)) {
            commit_part(&self.dir, part).await?;
        }
        self.dir.sync()?;
        self.pending.retain(|p| !due(p));
        Ok(())
    }
}

// Free functions over the directory, not methods: a `&FileWriter` held across an await
// would need the encoders to be `Sync`, which Parquet's are not.

/// Finishes `part` and stores it, whole, as `target` in `dir`.
async fn seal(dir: &PartDir, part: OpenPart, target: &PartName) -> Result<()> {
    let display = dir.display(&target.to_string());
    let output = part.encoder.finish().map_err(|e| with_path(e, &display))?;
    match output {
        Output::Local(writer) => {
            let in_progress = dir.display(&part.in_progress);
            let io = |e| Error::io(in_progress.clone(), e);
            let file = writer.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
            drop(file);
            dir.promote(&part.in_progress, &target.to_string()).await?;
            dir.sync()
        }
        Output::Memory(bytes) => dir.upload(&target.to_string(), bytes).await,
    }
}

/// Throws `part` away (it holds no record).
async fn discard(dir: &PartDir, part: OpenPart) -> Result<()> {
    let name = part.in_progress.clone();
    drop(part);
    match dir.local_path(&name) {
        Some(_) => dir.delete(&name).await,
        None => Ok(()),
    }
}

/// Makes the pending `part` visible under its committed name.
async fn commit_part(dir: &PartDir, part: &PartName) -> Result<()> {
    let visible = part.with_stage(Stage::Committed);
    match dir.promote(&part.to_string(), &visible.to_string()).await {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::Internal(format!(
                "pending part {} is gone and {visible} does not exist: it was neither \
                 committed nor kept",
                dir.display(&part.to_string()),
            )))
        }
        other => other,
    }
}

#[async_trait]
impl SinkWriter for FileWriter {
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.finished {
            return Err(Error::Internal(format!(
                "write to {} after finish",
                self.dir.display("")
            )));
        }
        let mut part = match self.current.take() {
            Some(part) => part,
            None => self.start_part()?,
        };
        let result = part.encoder.write(batch);
        part.rows += batch.num_rows();
        let visible = PartName::new(self.subtask.index, part.seq, self.ext(), Stage::Committed);
        let display = self.dir.display(&visible.to_string());
        self.current = Some(part);
        result.map_err(|e| with_path(e, &display))
    }

    async fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<String>> {
        if self.finished {
            // A task that finished its input still takes part in checkpoints; its sink
            // committed everything it wrote when it finished (and refuses writes since),
            // so there is nothing to pre-commit.
            tracing::debug!(checkpoint, dir = %self.dir.display(""), "barrier after finish: nothing to pre-commit");
            return Ok(self.pending());
        }
        // The job checkpoints: from now on parts are numbered and committed in two phases.
        self.start_two_phase().await?;
        if let Some(part) = self.current.take() {
            if part.rows == 0 {
                discard(&self.dir, part).await?;
            } else {
                // The part opened before the first barrier has no number yet.
                let seq = match part.seq {
                    Some(seq) => seq,
                    None => {
                        self.next_seq += 1;
                        self.next_seq - 1
                    }
                };
                let pending = PartName::new(
                    self.subtask.index,
                    Some(seq),
                    self.ext(),
                    Stage::Pending(checkpoint),
                )
                .fenced(self.subtask.fence);
                seal(&self.dir, part, &pending).await?;
                self.pending.push(pending);
            }
        }
        Ok(self.pending())
    }

    async fn commit(&mut self, checkpoint: u64) -> Result<()> {
        self.commit_up_to(checkpoint).await
    }

    async fn recover(&mut self, last_committed: u64, _state: &[String]) -> Result<()> {
        let written = self.current.as_ref().is_some_and(|p| p.rows > 0);
        if self.finished || written || !self.pending.is_empty() {
            return Err(Error::Internal(format!(
                "recovery of {} after records were written",
                self.dir.display("")
            )));
        }
        if let Some(part) = self.current.take() {
            discard(&self.dir, part).await?;
        }
        let mut names = self.dir.list().await?;
        if self.subtask.fence > 0 {
            // Before anything else: whatever an older attempt still running leaves from
            // now on is void to every later recovery.
            let mark = FenceMark {
                attempt: self.subtask.fence,
                committed: last_committed,
            }
            .to_string();
            if !names.contains(&mark) {
                self.dir.touch(&mark).await?;
                names.push(mark);
            }
        }
        let plan = recovery::plan(&names, self.subtask, last_committed);
        for part in &plan.delete {
            self.dir.delete(&part.to_string()).await?;
        }
        for part in &plan.commit {
            commit_part(&self.dir, part).await?;
        }
        self.dir.sync()?;
        tracing::info!(
            dir = %self.dir.display(""),
            subtask = self.subtask.index,
            last_committed,
            committed = plan.commit.len(),
            deleted = plan.delete.len(),
            next_seq = plan.next_seq,
            "file sink recovered"
        );
        self.next_seq = plan.next_seq;
        self.two_phase = true;
        Ok(())
    }

    async fn finish(&mut self) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        // The input ended: the job is over and its final checkpoint implied.
        self.commit_up_to(u64::MAX).await?;
        let Some(part) = self.current.take() else {
            return Ok(());
        };
        if self.two_phase && part.rows == 0 {
            return discard(&self.dir, part).await;
        }
        let target = PartName::new(self.subtask.index, part.seq, self.ext(), Stage::Committed);
        seal(&self.dir, part, &target).await
    }
}

/// Names the part file in I/O errors that come through the encoders.
fn with_path(e: Error, display: &str) -> Error {
    match e {
        Error::Io { source, .. } => Error::io(display, source),
        Error::Arrow(arrow::error::ArrowError::IoError(_, source)) => Error::io(display, source),
        other => other,
    }
}
