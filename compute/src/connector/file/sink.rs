//! The file sink: subtask `i` writes `<path>/part-<i>.<jsonl|csv|parquet>`.
//!
//! Locally the part is written through a buffered writer to a hidden
//! `.part-<i>.<ext>.inprogress` file (which listings skip) and renamed on
//! [`finish`](SinkWriter::finish), so readers never see a half-written part. On S3 it is
//! buffered in memory and uploaded on finish (as a multipart upload when large).
//! Timestamps are written as the file source reads them back
//! (`2015-07-15T00:00:01.234`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use parquet::arrow::ArrowWriter;
use sluice_common::pb;

use crate::connector::{SinkWriter, SubtaskInfo, store};
use crate::error::{Error, Result};

/// Parts larger than this are uploaded in several requests.
const MULTIPART_THRESHOLD: usize = 32 * 1024 * 1024;

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

/// Where the finished part goes.
enum Target {
    Local {
        in_progress: PathBuf,
        path: PathBuf,
    },
    Remote {
        store: Arc<dyn ObjectStore>,
        location: Path,
    },
}

/// Writes one sink subtask's part file.
pub struct FileWriter {
    encoder: Option<Encoder>,
    target: Target,
    display: String,
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("display", &self.display)
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
        let format = spec.format();
        let name = format!("part-{}.{}", subtask.index, extension(format));
        if let Some(dir) = store::local_path(&spec.path)? {
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
            let path = dir.join(&name);
            let in_progress = dir.join(format!(".{name}.inprogress"));
            let file = File::create(&in_progress)
                .map_err(|e| Error::io(in_progress.display().to_string(), e))?;
            let output = Output::Local(BufWriter::with_capacity(1 << 20, file));
            let display = path.display().to_string();
            let encoder = Encoder::new(format, schema, output)?;
            return Ok(FileWriter {
                encoder: Some(encoder),
                target: Target::Local { in_progress, path },
                display,
            });
        }
        let (store, root, root_display) = store::resolve(&spec.path, spec.store.as_ref())?;
        let location = root.clone().join(name.as_str());
        let display = store::display_location(&root_display, &root, &location);
        let encoder = Encoder::new(format, schema, Output::Memory(Vec::new()))?;
        Ok(FileWriter {
            encoder: Some(encoder),
            target: Target::Remote { store, location },
            display,
        })
    }

    /// Where the part is written, for messages.
    pub fn display(&self) -> &str {
        &self.display
    }
}

#[async_trait]
impl SinkWriter for FileWriter {
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let encoder = self
            .encoder
            .as_mut()
            .ok_or_else(|| Error::Internal(format!("write to {} after finish", self.display)))?;
        encoder
            .write(batch)
            .map_err(|e| with_path(e, &self.display))
    }

    async fn finish(&mut self) -> Result<()> {
        let Some(encoder) = self.encoder.take() else {
            return Ok(());
        };
        let output = encoder.finish().map_err(|e| with_path(e, &self.display))?;
        match (output, &self.target) {
            (Output::Local(writer), Target::Local { in_progress, path }) => {
                let io = |e| Error::io(in_progress.display().to_string(), e);
                let file = writer.into_inner().map_err(|e| io(e.into_error()))?;
                file.sync_all().map_err(io)?;
                std::fs::rename(in_progress, path)
                    .map_err(|e| Error::io(path.display().to_string(), e))?;
            }
            (Output::Memory(bytes), Target::Remote { store, location }) => {
                if bytes.len() <= MULTIPART_THRESHOLD {
                    store.put(location, PutPayload::from(bytes)).await?;
                } else {
                    let mut upload = WriteMultipart::new(store.put_multipart(location).await?);
                    upload.put(Bytes::from(bytes));
                    upload.finish().await?;
                }
            }
            _ => {
                return Err(Error::Internal(
                    "file sink output and target disagree".into(),
                ));
            }
        }
        Ok(())
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
