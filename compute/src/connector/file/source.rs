//! The file source reader: one subtask's share of the files under a path.
//!
//! Every file is a split. Subtask `i` of `p` reads the files `j` (in path order) with
//! `j % p == i`, one after the other. A file is fetched whole (`get().bytes()`, bounded
//! by its size) and decoded in chunks of `batch_size` records; a split is reported
//! finished right after its last batch.

use std::sync::Arc;

use arrow::compute::cast;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use sluice_common::pb;

use super::dead_letter::DeadLetter;
use super::decode::{BadRecords, TextDecoder, TextFormat};
use super::records::{RecordScanner, RecordSpan};
use super::schema;
use crate::connector::{SourceBatch, SourceCounters, SourceReader, SubtaskInfo, store};
use crate::error::{Error, Result};

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

/// The file being read.
enum Open {
    Text {
        data: Bytes,
        scanner: RecordScanner,
    },
    Parquet {
        reader: ParquetRecordBatchReader,
        pending: Option<RecordBatch>,
    },
}

/// Reads the files assigned to one source subtask.
pub struct FileReader {
    store: Arc<dyn ObjectStore>,
    schema: SchemaRef,
    format: pb::FileFormat,
    policy: pb::OnError,
    batch_size: usize,
    /// The assigned files (local split `k` is `files[k]`) and their display names.
    files: Vec<(ObjectMeta, String)>,
    /// Local split being read.
    current: usize,
    open: Option<Open>,
    decoder: Option<TextDecoder>,
    spans: Vec<RecordSpan>,
    dead_letter: Option<DeadLetter>,
    finished: Vec<usize>,
    counters: SourceCounters,
}

impl std::fmt::Debug for FileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReader")
            .field(
                "files",
                &self.files.iter().map(|(_, d)| d).collect::<Vec<_>>(),
            )
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl FileReader {
    /// Lists the files of `spec` and opens the share of `subtask`.
    pub async fn open(
        spec: &pb::FileSource,
        subtask: SubtaskInfo,
        batch_size: usize,
    ) -> Result<Self> {
        if subtask.parallelism == 0 || subtask.index >= subtask.parallelism {
            return Err(Error::Internal(format!("invalid subtask {subtask:?}")));
        }
        let listing = Listing::of(spec).await?;
        let schema = listing.schema(spec).await?;
        let files = listing
            .files
            .iter()
            .enumerate()
            .filter(|(j, _)| j % subtask.parallelism == subtask.index)
            .map(|(_, f)| (f.clone(), listing.display(f)))
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
        let decoder = match format {
            pb::FileFormat::Csv => Some(TextDecoder::new(
                TextFormat::Csv,
                schema.clone(),
                batch_size,
            )),
            pb::FileFormat::Jsonl => Some(TextDecoder::new(
                TextFormat::JsonLines,
                schema.clone(),
                batch_size,
            )),
            pb::FileFormat::Parquet => None,
        };
        Ok(FileReader {
            store: listing.store,
            schema,
            format,
            policy,
            batch_size,
            files,
            current: 0,
            open: None,
            decoder,
            spans: Vec::new(),
            dead_letter,
            finished: Vec::new(),
            counters: SourceCounters::default(),
        })
    }

    async fn open_current(&mut self) -> Result<Open> {
        let (meta, display) = &self.files[self.current];
        let data = self.store.get(&meta.location).await?.bytes().await?;
        Ok(match self.format {
            pb::FileFormat::Csv => {
                let mut scanner = RecordScanner::new(true);
                let mut header = Vec::new();
                scanner.scan(&data, 1, &mut header);
                Open::Text { data, scanner }
            }
            pb::FileFormat::Jsonl => Open::Text {
                data,
                scanner: RecordScanner::new(false),
            },
            pb::FileFormat::Parquet => {
                let bad = |e| Error::BadRecord {
                    location: display.clone(),
                    message: format!("{e}"),
                };
                let reader = ParquetRecordBatchReaderBuilder::try_new(data)
                    .map_err(bad)?
                    .with_batch_size(self.batch_size)
                    .build()
                    .map_err(bad)?;
                Open::Parquet {
                    reader,
                    pending: None,
                }
            }
        })
    }

    /// The next batch of the current file, and whether the file is exhausted after it.
    fn read_open(&mut self) -> Result<(Option<RecordBatch>, bool)> {
        let display = &self.files[self.current].1;
        match self.open.as_mut().expect("a file is open") {
            Open::Text { data, scanner } => {
                self.spans.clear();
                scanner.scan(data, self.batch_size, &mut self.spans);
                let decoder = self.decoder.as_mut().expect("text formats have a decoder");
                let mut bad = BadRecords {
                    policy: self.policy,
                    dead_letter: self.dead_letter.as_mut(),
                    skipped: &mut self.counters.skipped,
                };
                let batch = decoder.decode_chunk(data, &self.spans, display, &mut bad)?;
                Ok((batch, scanner.at_end(data)))
            }
            Open::Parquet { reader, pending } => {
                let bad = |e| Error::BadRecord {
                    location: display.clone(),
                    message: format!("{e}"),
                };
                let batch = match pending.take() {
                    Some(b) => Some(b),
                    None => reader.next().transpose().map_err(bad)?,
                };
                *pending = reader.next().transpose().map_err(bad)?;
                let batch = batch
                    .map(|b| conform(b, &self.schema, display))
                    .transpose()?;
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
        while self.current < self.files.len() {
            if self.open.is_none() {
                self.open = Some(self.open_current().await?);
            }
            let split = self.current;
            let (batch, at_end) = self.read_open()?;
            if at_end {
                self.open = None;
                self.finished.push(split);
                self.current += 1;
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

    fn take_finished_splits(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.finished)
    }

    fn counters(&self) -> SourceCounters {
        self.counters
    }
}
