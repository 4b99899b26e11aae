//! A sink that prints records to standard output, as JSON lines or CSV.
//!
//! Each batch is encoded into a reused buffer and written under one lock of stdout, so
//! the lines of concurrent subtasks never interleave within a batch. CSV prints its
//! header before the first batch of each subtask.

use std::io::Write;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use sluice_common::pb;

use sluice_compute::connector::SinkWriter;
use sluice_compute::error::{Error, Result};

/// Prints batches to stdout.
#[derive(Debug)]
pub struct StdoutWriter {
    format: pb::FileFormat,
    /// Whether the CSV header is still to be printed.
    header_due: bool,
    buffer: Vec<u8>,
}

impl StdoutWriter {
    /// A writer in `format` (JSON lines or CSV; Parquet is not for terminals).
    pub fn new(format: pb::FileFormat, _schema: SchemaRef) -> Result<Self> {
        if format == pb::FileFormat::Parquet {
            return Err(Error::Plan(
                "the stdout sink prints jsonl or csv, not parquet: use a file sink".into(),
            ));
        }
        Ok(StdoutWriter {
            format,
            header_due: true,
            buffer: Vec::with_capacity(64 * 1024),
        })
    }

    /// Encodes `batch` into the buffer.
    fn encode(&mut self, batch: &RecordBatch) -> Result<()> {
        self.buffer.clear();
        match self.format {
            pb::FileFormat::Csv => {
                let mut w = arrow::csv::WriterBuilder::new()
                    .with_header(self.header_due)
                    .build(&mut self.buffer);
                w.write(batch)?;
                self.header_due = false;
            }
            _ => {
                let mut w = arrow::json::LineDelimitedWriter::new(&mut self.buffer);
                w.write(batch)?;
                w.finish()?;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl SinkWriter for StdoutWriter {
    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.encode(batch)?;
        let mut out = std::io::stdout().lock();
        out.write_all(&self.buffer)
            .map_err(|e| Error::io("stdout", e))
    }

    async fn finish(&mut self) -> Result<()> {
        std::io::stdout()
            .lock()
            .flush()
            .map_err(|e| Error::io("stdout", e))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Utf8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["x", "y"])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn csv_prints_the_header_once_and_json_one_object_per_line() {
        let b = batch();
        let mut csv = StdoutWriter::new(pb::FileFormat::Csv, b.schema()).unwrap();
        csv.encode(&b).unwrap();
        assert_eq!(String::from_utf8_lossy(&csv.buffer), "a,b\n1,x\n2,y\n");
        csv.encode(&b).unwrap();
        assert_eq!(String::from_utf8_lossy(&csv.buffer), "1,x\n2,y\n");
        let mut json = StdoutWriter::new(pb::FileFormat::Jsonl, b.schema()).unwrap();
        json.encode(&b).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&json.buffer),
            "{\"a\":1,\"b\":\"x\"}\n{\"a\":2,\"b\":\"y\"}\n"
        );
        assert!(StdoutWriter::new(pb::FileFormat::Parquet, b.schema()).is_err());
    }
}
