//! The file source reader: one subtask's share of the files under a path.
//!
//! Every file is a split. Subtask `i` of `p` reads the files `j` (in path order) with
//! `j % p == i`, decoded in batches of `batch_size` records; a split is reported finished
//! right after its last batch. Up to [`MAX_OPEN_TEXT_FILES`] CSV or JSON-lines files are
//! read at once, a batch from each in turn, so that files covering the same stretch of
//! event time advance together and per-split watermarks hold: read one after another,
//! every record of the second file would be behind the first file's watermark. A file
//! holds the watermark from when it is opened (`take_opened_splits`), before its first
//! batch: restored files resume at different event times, and the first batch of one
//! far ahead must not close the windows the others are still filling. Files beyond that
//! number wait for a place (like Flink's unassigned splits, they do not hold the
//! watermark back until they start); Parquet files, whose row groups are larger,
//! [`MAX_OPEN_PARQUET_FILES`] at a time.
//!
//! CSV and JSON-lines files are streamed with bounded memory: the object is fetched in
//! ranges of [`CHUNK_SIZE`] (`get_range`, the same for a local disk and S3) into a
//! buffer of the bytes not yet decoded. Records are cut from the buffer only once their
//! terminating newline (outside quotes, for CSV) is in it, or at the end of the file;
//! when fewer than `batch_size` records are complete, the consumed prefix is dropped and
//! the next range appended. Batches are decoded straight from the buffer, so it holds at
//! most a batch's records, a record cut off at the chunk's end and one chunk. Line
//! numbers count across chunks. A record may be longer than a chunk (the buffer grows
//! until it ends), but one longer than [`MAX_RECORD`] fails with
//! [`Error::BadRecord`] naming its `file:line` whatever `on_error` says, since where it
//! ends is unknown.
//!
//! Parquet files are streamed by parquet's async reader over the object store: the
//! footer first, then the column chunks of one row group at a time, only of the columns
//! the job reads.
//!
//! # Positions
//!
//! Each split's [`Position`] follows the records handled so far: after a text batch,
//! the file offset just past its last record (the records scanned beyond it stay in the
//! buffer and count as unread) and the line after it; after a Parquet batch, the row
//! group and row reached by the rows returned (the batch read ahead does not count).
//! Records skipped or dead-lettered count as read. A file is finished when its last
//! batch is returned. [`restore`](SourceReader::restore) reopens each file at its
//! position: a text file is fetched from the offset on (a CSV header is skipped only at
//! offset 0, the only position before it), a Parquet file skips the row groups read and
//! then the rows read of the next one. The assignment of files to subtasks depends only
//! on the listing and the parallelism, so every file of the listing has one reader at
//! any parallelism; a checkpointed file missing from the listing fails the restore.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use arrow::compute::cast;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use parquet::arrow::async_reader::ParquetRecordBatchStream;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use sluice_common::pb;

use super::dead_letter::DeadLetter;
use super::decode::{BadRecords, TextDecoder, TextFormat};
use super::parquet_object::ParquetObject;
use super::position::{Position, split_name};
use super::records::{RecordScanner, RecordSpan};
use super::schema;
use crate::store;
use sluice_compute::connector::{SourceBatch, SourceCounters, SourceReader, SubtaskInfo};
use sluice_compute::error::{Error, Result};

/// The files a source reads and how to name them.
struct Listing {
    store: Arc<dyn ObjectStore>,
    root: Path,
    root_display: String,
    files: Vec<ObjectMeta>,
}

impl Listing {
    async fn of(spec: &pb::FileSource) -> Result<Self> {
        let (store, root, root_display) = store::resolve(&spec.path, spec.store.as_ref())?;
        let files = store::list_files(store.as_ref(), &root).await?;
        if files.is_empty() {
            return Err(Error::Plan(format!("no files found at {root_display}")));
        }
        Ok(Listing {
            store,
            root,
            root_display,
            files,
        })
    }

    fn display(&self, file: &ObjectMeta) -> String {
        store::display_location(&self.root_display, &self.root, &file.location)
    }

    /// The explicit schema, or the one inferred from the first non-empty file.
    async fn schema(&self, spec: &pb::FileSource) -> Result<SchemaRef> {
        if !spec.schema.is_empty() {
            return schema::explicit_schema(&spec.schema);
        }
        let file = self.files.iter().find(|f| f.size > 0).ok_or_else(|| {
            Error::Plan(format!(
                "cannot infer a schema: every file at {} is empty; give the schema in the job",
                self.root_display
            ))
        })?;
        schema::infer(
            self.store.as_ref(),
            file,
            &self.display(file),
            spec.format(),
        )
        .await
    }
}

/// The schema of `spec`'s records: explicit, or inferred from its first file.
pub async fn source_schema(spec: &pb::FileSource) -> Result<SchemaRef> {
    Listing::of(spec).await?.schema(spec).await
}

/// Bytes fetched from a text file at a time.
pub const CHUNK_SIZE: usize = 4 << 20;

/// CSV or JSON-lines files one reader streams at the same time.
pub const MAX_OPEN_TEXT_FILES: usize = 8;

/// Parquet files one reader streams at the same time (each holds a row group's columns).
pub const MAX_OPEN_PARQUET_FILES: usize = 4;

/// The longest CSV or JSON-lines record read, in bytes (without its line terminator).
pub const MAX_RECORD: usize = 64 << 20;

/// A text file being streamed.
struct TextFile {
    location: Path,
    size: u64,
    /// Bytes of the object fetched so far: the buffer ends at this offset of the file.
    fetched: u64,
    /// The unconsumed bytes fetched (and possibly a consumed prefix not dropped yet).
    buf: Vec<u8>,
    scanner: RecordScanner,
    /// The CSV header has not been skipped yet.
    header_pending: bool,
    /// Line of a record found to be longer than the limit: fails the next read.
    too_long: Option<u64>,
}

impl TextFile {
    /// The file `meta` read from byte `offset`, where a record starting on `line` begins
    /// (0 and 1: the start of the file, with a CSV header still to skip).
    fn new(meta: &ObjectMeta, csv: bool, offset: u64, line: u64) -> Self {
        TextFile {
            location: meta.location.clone(),
            size: meta.size,
            fetched: offset,
            buf: Vec::new(),
            scanner: RecordScanner::at_line(csv, line),
            header_pending: csv && offset == 0,
            too_long: None,
        }
    }

    /// Byte offset in the file of offset `at` of the buffer.
    fn file_offset(&self, at: usize) -> u64 {
        self.fetched - (self.buf.len() - at) as u64
    }

    /// True when the buffer reaches the end of the file.
    fn eof(&self) -> bool {
        self.fetched >= self.size
    }

    /// Drops the first `keep_from` bytes of the buffer and appends up to `chunk` more
    /// bytes of the file.
    async fn fetch(
        &mut self,
        store: &dyn ObjectStore,
        keep_from: usize,
        chunk: usize,
        display: &str,
    ) -> Result<()> {
        let end = self.size.min(self.fetched.saturating_add(chunk as u64));
        let bytes = store.get_range(&self.location, self.fetched..end).await?;
        if bytes.is_empty() {
            return Err(Error::BadRecord {
                location: display.to_string(),
                message: format!(
                    "the file ended at byte {} of the {} listed (changed while read?)",
                    self.fetched, self.size
                ),
            });
        }
        self.fetched += bytes.len() as u64;
        self.buf.drain(..keep_from);
        self.scanner.discard(keep_from);
        self.buf.extend_from_slice(&bytes);
        // After a long record, give back what a chunk-sized buffer does not need.
        if self.buf.capacity() > 4 * chunk && self.buf.len() <= chunk {
            self.buf.shrink_to(2 * chunk);
        }
        Ok(())
    }
}

/// The message of a record longer than `limit` bytes.
pub(super) fn too_long_message(limit: usize) -> String {
    if limit.is_multiple_of(1 << 20) {
        format!("record longer than {} MiB", limit >> 20)
    } else {
        format!("record longer than {limit} bytes")
    }
}

/// The file being read.
enum Open {
    Text(TextFile),
    Parquet {
        reader: ParquetRecordBatchStream<ParquetObject>,
        pending: Option<RecordBatch>,
        /// Rows of each row group of the file (to follow the position).
        group_rows: Vec<u64>,
    },
}

/// One assigned file.
struct SplitFile {
    meta: ObjectMeta,
    /// Its path or URL in messages.
    display: String,
    /// Its split name (see [`position`](super::position)).
    name: String,
}

/// Reads the files assigned to one source subtask.
pub struct FileReader {
    store: Arc<dyn ObjectStore>,
    schema: SchemaRef,
    format: pb::FileFormat,
    policy: pb::OnError,
    batch_size: usize,
    /// The assigned files: local split `k` is `files[k]`.
    files: Vec<SplitFile>,
    /// Where each local split stands: the records before it have been returned.
    positions: Vec<Position>,
    /// The split names of every file of the source (of every subtask).
    listed: HashSet<String>,
    /// The source's root in messages.
    root_display: String,
    /// Local split being read.
    current: usize,
    open: Option<Open>,
    /// Open files waiting for their next turn, with their local split.
    waiting: VecDeque<(usize, Open)>,
    /// The first assigned file not opened yet.
    next_file: usize,
    /// Files opened into the round-robin not yet taken by
    /// [`SourceReader::take_opened_splits`].
    opened: Vec<usize>,
    decoder: Option<TextDecoder>,
    spans: Vec<RecordSpan>,
    dead_letter: Option<DeadLetter>,
    /// Finished splits not yet taken by [`SourceReader::take_finished_splits`].
    finished: Vec<usize>,
    /// Local splits already reported finished (each is reported once).
    reported: Vec<bool>,
    counters: SourceCounters,
    /// Bytes fetched from a text file at a time.
    chunk_size: usize,
    /// The longest text record accepted.
    max_record: usize,
    /// The most bytes a text file's buffer has held (to test that memory is bounded).
    #[cfg(test)]
    peak_buffered: usize,
}

impl std::fmt::Debug for FileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReader")
            .field(
                "files",
                &self.files.iter().map(|f| &f.display).collect::<Vec<_>>(),
            )
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl FileReader {
    /// Lists the files of `spec` and opens the share of `subtask`, producing only
    /// `columns` (all when empty).
    pub async fn open(
        spec: &pb::FileSource,
        columns: &[String],
        subtask: SubtaskInfo,
        batch_size: usize,
    ) -> Result<Self> {
        if subtask.parallelism == 0 || subtask.index >= subtask.parallelism {
            return Err(Error::Internal(format!("invalid subtask {subtask:?}")));
        }
        let listing = Listing::of(spec).await?;
        let full = listing.schema(spec).await?;
        let indices = sluice_compute::connector::projection(&full, columns)?;
        let schema = match &indices {
            Some(i) => Arc::new(full.project(i)?),
            None => full.clone(),
        };
        let files: Vec<SplitFile> = listing
            .files
            .iter()
            .enumerate()
            .filter(|(j, _)| j % subtask.parallelism == subtask.index)
            .map(|(_, f)| SplitFile {
                meta: f.clone(),
                display: listing.display(f),
                name: split_name(&listing.root, &f.location),
            })
            .collect();
        let listed = listing
            .files
            .iter()
            .map(|f| split_name(&listing.root, &f.location))
            .collect();
        let policy = spec.on_error();
        let dead_letter = match policy {
            pb::OnError::DeadLetter => Some(DeadLetter::new(
                &spec.dead_letter_path,
                spec.store.as_ref(),
                subtask.index,
            )?),
            _ => None,
        };
        let format = spec.format();
        let batch_size = batch_size.max(1);
        let text = match format {
            pb::FileFormat::Csv => Some(TextFormat::Csv),
            pb::FileFormat::Jsonl => Some(TextFormat::JsonLines),
            pb::FileFormat::Parquet => None,
        };
        let decoder = match (text, indices) {
            (Some(text), Some(indices)) => {
                Some(TextDecoder::new(text, full.clone(), batch_size).with_projection(indices)?)
            }
            (Some(text), None) => Some(TextDecoder::new(text, full.clone(), batch_size)),
            (None, _) => None,
        };
        let parquet = format == pb::FileFormat::Parquet;
        Ok(FileReader {
            store: listing.store,
            schema,
            format,
            policy,
            batch_size,
            positions: vec![Position::start(parquet); files.len()],
            reported: vec![false; files.len()],
            files,
            listed,
            root_display: listing.root_display,
            current: 0,
            open: None,
            waiting: VecDeque::new(),
            opened: Vec::new(),
            next_file: 0,
            decoder,
            spans: Vec::new(),
            dead_letter,
            finished: Vec::new(),
            counters: SourceCounters::default(),
            chunk_size: CHUNK_SIZE,
            max_record: MAX_RECORD,
            #[cfg(test)]
            peak_buffered: 0,
        })
    }

    /// Fetches text files `chunk_size` bytes at a time and accepts records of up to
    /// `max_record` bytes.
    #[cfg(test)]
    pub(crate) fn with_limits(mut self, chunk_size: usize, max_record: usize) -> Self {
        self.chunk_size = chunk_size.max(1);
        self.max_record = max_record;
        self
    }

    /// The most bytes a text file's buffer has held.
    #[cfg(test)]
    pub(crate) fn peak_buffered(&self) -> usize {
        self.peak_buffered
    }

    /// Opens the current split at its position (which is not [`Position::Finished`]).
    async fn open_current(&mut self) -> Result<Open> {
        let SplitFile {
            meta,
            display,
            name,
        } = &self.files[self.current];
        let position = self.positions[self.current];
        let changed = |what: String| {
            Error::Plan(format!(
                "the source's files changed since the checkpoint: {what}; a job can only \
                 resume over the files it was reading (restart it without the checkpoint to \
                 read the new ones from the start)"
            ))
        };
        Ok(match self.format {
            pb::FileFormat::Csv | pb::FileFormat::Jsonl => {
                let Position::Text { offset, line } = position else {
                    return Err(Error::Internal(format!(
                        "text split `{name}` at {position:?}"
                    )));
                };
                if offset > meta.size {
                    return Err(changed(format!(
                        "{display} has {} bytes, but was read up to byte {offset}",
                        meta.size
                    )));
                }
                let csv = self.format == pb::FileFormat::Csv;
                Open::Text(TextFile::new(meta, csv, offset, line))
            }
            pb::FileFormat::Parquet => {
                let Position::Parquet { row_group, row } = position else {
                    return Err(Error::Internal(format!(
                        "Parquet split `{name}` at {position:?}"
                    )));
                };
                let bad = |e| Error::BadRecord {
                    location: display.clone(),
                    message: format!("{e}"),
                };
                let object =
                    ParquetObject::new(self.store.clone(), meta.location.clone(), meta.size);
                let builder = ParquetRecordBatchStreamBuilder::new(object)
                    .await
                    .map_err(bad)?;
                // Only the columns the job reads (by name; `conform` orders and casts them).
                let wanted: Vec<usize> = builder
                    .schema()
                    .fields()
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| self.schema.field_with_name(f.name()).is_ok())
                    .map(|(i, _)| i)
                    .collect();
                let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
                let group_rows: Vec<u64> = builder
                    .metadata()
                    .row_groups()
                    .iter()
                    .map(|g| g.num_rows().max(0) as u64)
                    .collect();
                // Resume: skip the row groups read, then the rows read of the next one.
                let groups = group_rows.len() as u64;
                let valid = match group_rows.get(row_group as usize) {
                    Some(&rows) => row < rows.max(1),
                    None => row_group == groups && row == 0,
                };
                if !valid {
                    return Err(changed(format!(
                        "{display} has {groups} row groups, but was read up to row {row} of \
                         row group {row_group}"
                    )));
                }
                let skip = usize::try_from(row).map_err(|_| {
                    Error::Internal(format!("row offset {row} of `{name}` overflows"))
                })?;
                let reader = builder
                    .with_projection(mask)
                    .with_batch_size(self.batch_size)
                    .with_row_groups((row_group as usize..group_rows.len()).collect())
                    .with_offset(skip)
                    .build()
                    .map_err(bad)?;
                Open::Parquet {
                    reader,
                    pending: None,
                    group_rows,
                }
            }
        })
    }

    /// The next batch of the current file, and whether the file is exhausted after it.
    ///
    /// The split's position moves past the records handled (returned, skipped or
    /// dead-lettered); [`next_batch`](SourceReader::next_batch) marks it finished.
    async fn read_open(&mut self) -> Result<(Option<RecordBatch>, bool)> {
        let display = &self.files[self.current].display;
        match self.open.as_mut().expect("a file is open") {
            Open::Text(file) => {
                if let Some(line) = file.too_long.take() {
                    return Err(Error::BadRecord {
                        location: format!("{display}:{line}"),
                        message: too_long_message(self.max_record),
                    });
                }
                let spans = &mut self.spans;
                spans.clear();
                loop {
                    let eof = file.eof();
                    let want = if file.header_pending {
                        1
                    } else {
                        self.batch_size - spans.len()
                    };
                    let before = spans.len();
                    file.scanner.scan_window(&file.buf, want, eof, spans);
                    if let Some(i) = spans[before..]
                        .iter()
                        .position(|s| s.end - s.start > self.max_record)
                    {
                        // Decode the records before it; the next read fails.
                        file.too_long = Some(spans[before + i].line);
                        spans.truncate(before + i);
                        break;
                    }
                    if file.header_pending {
                        if spans.len() > before || eof {
                            spans.clear();
                            file.header_pending = false;
                            continue;
                        }
                    } else if spans.len() == self.batch_size || eof {
                        break;
                    }
                    // The records complete in the buffer do not fill the batch.
                    if file.buf.len() - file.scanner.pos() > self.max_record {
                        file.too_long = Some(file.scanner.line());
                        break;
                    }
                    let keep_from = spans.first().map_or(file.scanner.pos(), |s| s.start);
                    file.fetch(self.store.as_ref(), keep_from, self.chunk_size, display)
                        .await?;
                    for span in spans.iter_mut() {
                        span.start -= keep_from;
                        span.end -= keep_from;
                        span.next -= keep_from;
                    }
                    #[cfg(test)]
                    {
                        self.peak_buffered = self.peak_buffered.max(file.buf.len());
                    }
                }
                let decoder = self.decoder.as_mut().expect("text formats have a decoder");
                let mut bad = BadRecords {
                    policy: self.policy,
                    dead_letter: self.dead_letter.as_mut(),
                    skipped: &mut self.counters.skipped,
                };
                let batch = decoder.decode_chunk(
                    &file.buf,
                    spans,
                    &|line| format!("{display}:{line}"),
                    &mut bad,
                )?;
                // The next record starts just past the last one decoded; none before it
                // is left in the buffer (later ones, already scanned, are read again).
                if let Some(last) = spans.last() {
                    self.positions[self.current] = Position::Text {
                        offset: file.file_offset(last.next),
                        line: last.next_line(&file.buf),
                    };
                }
                if batch.is_none()
                    && let Some(line) = file.too_long.take()
                {
                    return Err(Error::BadRecord {
                        location: format!("{display}:{line}"),
                        message: too_long_message(self.max_record),
                    });
                }
                let at_end =
                    file.eof() && file.scanner.at_end(&file.buf) && file.too_long.is_none();
                Ok((batch, at_end))
            }
            Open::Parquet {
                reader,
                pending,
                group_rows,
            } => {
                let bad = |e| Error::BadRecord {
                    location: display.clone(),
                    message: format!("{e}"),
                };
                let batch = match pending.take() {
                    Some(b) => Some(b),
                    None => reader.next().await.transpose().map_err(bad)?,
                };
                *pending = reader.next().await.transpose().map_err(bad)?;
                let batch = batch
                    .map(|b| conform(b, &self.schema, display))
                    .transpose()?;
                // Only the rows returned count, not the batch read ahead.
                if let Some(b) = &batch {
                    let position = &mut self.positions[self.current];
                    *position = position.after_rows(b.num_rows() as u64, group_rows);
                }
                Ok((batch, pending.is_none()))
            }
        }
    }
}

/// `batch` with exactly `schema`'s fields: columns by name, cast where types differ.
fn conform(batch: RecordBatch, schema: &SchemaRef, file: &str) -> Result<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(RecordBatch::try_new(
            schema.clone(),
            batch.columns().to_vec(),
        )?);
    }
    let columns = schema
        .fields()
        .iter()
        .map(|field| {
            let column = batch
                .column_by_name(field.name())
                .ok_or_else(|| Error::Plan(format!("{file} has no column '{}'", field.name())))?;
            if column.data_type() == field.data_type() {
                Ok(column.clone())
            } else {
                cast(column, field.data_type()).map_err(|e| Error::BadRecord {
                    location: file.to_string(),
                    message: format!("column '{}': {e}", field.name()),
                })
            }
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| Error::BadRecord {
        location: file.to_string(),
        message: e.to_string(),
    })
}

#[async_trait]
impl SourceReader for FileReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn num_splits(&self) -> usize {
        self.files.len()
    }

    async fn next_batch(&mut self) -> Result<Option<SourceBatch>> {
        let max_open = match self.format {
            pb::FileFormat::Parquet => MAX_OPEN_PARQUET_FILES,
            _ => MAX_OPEN_TEXT_FILES,
        };
        loop {
            while self.waiting.len() < max_open && self.next_file < self.files.len() {
                let split = self.next_file;
                self.next_file += 1;
                if self.positions[split] == Position::Finished {
                    continue;
                }
                self.current = split;
                let open = self.open_current().await?;
                self.waiting.push_back((split, open));
                self.opened.push(split);
            }
            let Some((split, open)) = self.waiting.pop_front() else {
                break;
            };
            self.current = split;
            self.open = Some(open);
            let read = self.read_open().await;
            let open = self.open.take();
            let (batch, at_end) = read?;
            match open {
                Some(open) if !at_end => self.waiting.push_back((split, open)),
                _ => {
                    self.positions[split] = Position::Finished;
                    self.finished.push(split);
                }
            }
            if let Some(batch) = batch.filter(|b| b.num_rows() > 0) {
                self.counters.records += batch.num_rows() as u64;
                return Ok(Some(SourceBatch { split, batch }));
            }
        }
        if let Some(dead_letter) = self.dead_letter.as_mut() {
            dead_letter.finish().await?;
        }
        Ok(None)
    }

    fn take_opened_splits(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.opened)
    }

    fn take_finished_splits(&mut self) -> Vec<usize> {
        for &split in &self.finished {
            self.reported[split] = true;
        }
        std::mem::take(&mut self.finished)
    }

    fn counters(&self) -> SourceCounters {
        self.counters
    }

    fn positions(&self) -> Result<Vec<(String, Bytes)>> {
        Ok(self
            .files
            .iter()
            .zip(&self.positions)
            .map(|(file, position)| (file.name.clone(), position.encode()))
            .collect())
    }

    /// Meant before the first batch: the files opened so far are closed and every split
    /// is reopened at its restored position. Counters keep counting what this reader
    /// produced.
    fn restore(&mut self, positions: &HashMap<String, Bytes>) -> Result<()> {
        let mut gone: Vec<&String> = positions
            .keys()
            .filter(|name| !self.listed.contains(*name))
            .collect();
        if !gone.is_empty() {
            gone.sort();
            let more = match gone.len() {
                1 => String::new(),
                n => format!(" (and {} more files)", n - 1),
            };
            return Err(Error::Plan(format!(
                "the source's files changed since the checkpoint: `{}` is gone from {}{more}; \
                 a job can only resume over the files it was reading (restore them, or restart \
                 the job without the checkpoint)",
                gone[0], self.root_display
            )));
        }
        let parquet = self.format == pb::FileFormat::Parquet;
        let restored = self
            .files
            .iter()
            .map(|file| match positions.get(&file.name) {
                Some(bytes) => Position::decode(&file.name, bytes, parquet),
                None => Ok(Position::start(parquet)),
            })
            .collect::<Result<Vec<_>>>()?;
        self.positions = restored;
        self.open = None;
        self.waiting.clear();
        self.opened.clear();
        self.next_file = 0;
        self.current = 0;
        self.finished = (0..self.files.len())
            .filter(|&k| self.positions[k] == Position::Finished && !self.reported[k])
            .collect();
        Ok(())
    }
}
