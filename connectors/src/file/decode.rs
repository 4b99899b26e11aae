//! Decoding chunks of CSV or JSON-lines records into Arrow, one bad record at a time.
//!
//! A chunk of records is decoded in bulk by arrow's decoder. When that fails, the chunk
//! is decoded again record by record, to find the bad ones; good records keep their
//! order and the bad ones go to the [`OnError`](pb::OnError) policy: fail naming
//! `file:line`, skip, or go to the dead-letter output. This module does not know where
//! the bytes came from or where dead letters go.

use std::sync::Arc;

use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use sluice_common::pb;

use super::dead_letter::DeadLetter;
use super::records::{RecordSpan, trim_cr};
use sluice_compute::error::{Error, Result};

/// A text format decoded record by record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFormat {
    /// CSV without its header line.
    Csv,
    /// Newline-delimited JSON objects.
    JsonLines,
}

enum Inner {
    Csv(Box<arrow::csv::reader::Decoder>),
    Json(Box<arrow::json::reader::Decoder>),
}

/// What happens to bad records, and the counts kept about them.
pub struct BadRecords<'a> {
    /// The policy.
    pub policy: pb::OnError,
    /// Where bad records go under [`pb::OnError::DeadLetter`].
    pub dead_letter: Option<&'a mut DeadLetter>,
    /// Incremented for each record skipped or sent to the dead-letter output.
    pub skipped: &'a mut u64,
}

/// Decodes chunks of records of one schema.
pub struct TextDecoder {
    format: TextFormat,
    /// The file's full schema.
    schema: SchemaRef,
    /// Indices of the columns to decode, and the schema of what is decoded.
    projection: Option<(Vec<usize>, SchemaRef)>,
    /// Upper bound of records per chunk.
    capacity: usize,
    /// A decoder in a clean state, kept between calls (dropped after an error).
    inner: Option<Inner>,
}

impl std::fmt::Debug for TextDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextDecoder")
            .field("format", &self.format)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl TextDecoder {
    /// A decoder of chunks of up to `capacity` records into `schema`.
    pub fn new(format: TextFormat, schema: SchemaRef, capacity: usize) -> Self {
        TextDecoder {
            format,
            schema,
            projection: None,
            capacity: capacity.max(1),
            inner: None,
        }
    }

    /// Decodes only the columns at `indices` (of the full schema), skipping the others.
    pub fn with_projection(mut self, indices: Vec<usize>) -> Result<Self, ArrowError> {
        let projected = Arc::new(self.schema.project(&indices)?);
        self.projection = Some((indices, projected));
        Ok(self)
    }

    /// The schema of decoded batches.
    pub fn output_schema(&self) -> SchemaRef {
        match &self.projection {
            Some((_, schema)) => schema.clone(),
            None => self.schema.clone(),
        }
    }

    /// Decodes the records `spans` of `data` into one batch, handing bad records to
    /// `bad`; `locate` names where a record came from given its span's `line` (for files
    /// `file:line`, for Kafka the partition and offset). Returns `None` when no record
    /// was good.
    pub fn decode_chunk(
        &mut self,
        data: &[u8],
        spans: &[RecordSpan],
        locate: &dyn Fn(u64) -> String,
        bad: &mut BadRecords<'_>,
    ) -> Result<Option<RecordBatch>> {
        Ok(self
            .decode_rows(data, spans, locate, bad)?
            .map(|(batch, _)| batch))
    }

    /// [`Self::decode_chunk`], also saying which records the batch holds: `None` when
    /// all of them, else the indices (into `spans`) of the good ones, in order.
    pub fn decode_rows(
        &mut self,
        data: &[u8],
        spans: &[RecordSpan],
        locate: &dyn Fn(u64) -> String,
        bad: &mut BadRecords<'_>,
    ) -> Result<Option<(RecordBatch, Option<Vec<usize>>)>> {
        let (Some(first), Some(last)) = (spans.first(), spans.last()) else {
            return Ok(None);
        };
        if let Ok(batch) = self.decode(&data[first.start..last.next])
            && batch.as_ref().map_or(0, |b| b.num_rows()) == spans.len()
        {
            return Ok(batch.map(|b| (b, None)));
        }
        // Some record is bad (or blank lines confused the count): one at a time.
        let mut good = Vec::with_capacity(spans.len());
        let mut kept = Vec::with_capacity(spans.len());
        for (i, span) in spans.iter().enumerate() {
            let raw = &data[span.start..span.end];
            match self.decode(&data[span.start..span.next]) {
                Ok(Some(batch)) if batch.num_rows() == 1 => {
                    good.push(batch);
                    kept.push(i);
                }
                Ok(other) => {
                    let rows = other.map_or(0, |b| b.num_rows());
                    let message = format!("expected one record, found {rows}");
                    handle_bad(locate(span.line), raw, message, bad)?;
                }
                Err(e) => handle_bad(locate(span.line), raw, describe(e), bad)?,
            }
        }
        if good.is_empty() {
            return Ok(None);
        }
        Ok(Some((
            concat_batches(&self.output_schema(), &good)?,
            Some(kept),
        )))
    }

    /// Decodes whole records; the decoder is dropped on error (its state is unknown).
    fn decode(&mut self, bytes: &[u8]) -> Result<Option<RecordBatch>, ArrowError> {
        let mut inner = match self.inner.take() {
            Some(inner) => inner,
            None => self.fresh()?,
        };
        let result = feed(&mut inner, bytes);
        if result.is_ok() {
            self.inner = Some(inner);
        }
        result
    }

    fn fresh(&self) -> Result<Inner, ArrowError> {
        // Room for twice the records expected, so a blank line can never stop a chunk.
        let batch_size = self.capacity * 2 + 16;
        Ok(match self.format {
            TextFormat::Csv => {
                let mut builder = arrow::csv::ReaderBuilder::new(self.schema.clone())
                    .with_header(false)
                    .with_batch_size(batch_size);
                if let Some((indices, _)) = &self.projection {
                    builder = builder.with_projection(indices.clone());
                }
                Inner::Csv(Box::new(builder.build_decoder()))
            }
            // JSON fields are matched by name; fields outside the schema are skipped.
            TextFormat::JsonLines => Inner::Json(Box::new(
                arrow::json::ReaderBuilder::new(self.output_schema())
                    .with_batch_size(batch_size)
                    .build_decoder()?,
            )),
        })
    }
}

fn feed(inner: &mut Inner, bytes: &[u8]) -> Result<Option<RecordBatch>, ArrowError> {
    let mut offset = 0;
    match inner {
        Inner::Csv(d) => {
            while offset < bytes.len() {
                let n = d.decode(&bytes[offset..])?;
                if n == 0 {
                    break;
                }
                offset += n;
            }
            // Ends a last record that has no line terminator.
            d.decode(&[])?;
        }
        Inner::Json(d) => {
            while offset < bytes.len() {
                let n = d.decode(&bytes[offset..])?;
                if n == 0 {
                    break;
                }
                offset += n;
            }
        }
    }
    if offset < bytes.len() {
        return Err(ArrowError::ParseError(
            "decoder stopped before the end of the chunk".into(),
        ));
    }
    match inner {
        Inner::Csv(d) => d.flush(),
        Inner::Json(d) => d.flush(),
    }
}

/// Applies the policy of `bad` to the record `raw` found at `location`.
pub fn handle_bad(
    location: String,
    raw: &[u8],
    message: String,
    bad: &mut BadRecords<'_>,
) -> Result<()> {
    match bad.policy {
        pb::OnError::Fail => Err(Error::BadRecord { location, message }),
        pb::OnError::Skip => {
            *bad.skipped += 1;
            Ok(())
        }
        pb::OnError::DeadLetter => {
            let raw = trim_cr(raw);
            let dead_letter = bad
                .dead_letter
                .as_deref_mut()
                .ok_or_else(|| Error::Internal("dead_letter policy without an output".into()))?;
            dead_letter.write(&location, &message, raw)?;
            *bad.skipped += 1;
            Ok(())
        }
    }
}

/// The decoder's message, without its line numbers (they count from the chunk, not the
/// file; the caller names the file's line).
fn describe(e: ArrowError) -> String {
    let text = match e {
        ArrowError::CsvError(s)
        | ArrowError::JsonError(s)
        | ArrowError::ParseError(s)
        | ArrowError::CastError(s)
        | ArrowError::InvalidArgumentError(s) => s,
        other => other.to_string(),
    };
    strip_line_numbers(&text)
}

/// Removes `for line N, ` and ` at line N` fragments from arrow's messages.
fn strip_line_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("line ") {
        let digits = rest[i + 5..].bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            out.push_str(&rest[..i + 5]);
            rest = &rest[i + 5..];
            continue;
        }
        let mut head = &rest[..i];
        let mut tail = &rest[i + 5 + digits..];
        if let Some(h) = head.strip_suffix(" at ") {
            head = h;
        } else if let Some(h) = head.strip_suffix(" for ") {
            out.push_str(h);
            out.push_str(": ");
            head = "";
            tail = tail.strip_prefix(", ").unwrap_or(tail);
        }
        out.push_str(head);
        rest = tail;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_numbers_of_the_decoder_are_removed() {
        assert_eq!(
            strip_line_numbers("incorrect number of fields for line 1, expected 3 got 2"),
            "incorrect number of fields: expected 3 got 2"
        );
        assert_eq!(
            strip_line_numbers(
                "Error while parsing value 'x' as type 'Int64' for column 0 at line 0. Row data: '[x]'"
            ),
            "Error while parsing value 'x' as type 'Int64' for column 0. Row data: '[x]'"
        );
        assert_eq!(
            strip_line_numbers("no line here: line x"),
            "no line here: line x"
        );
    }
}
