//! The schema of a file source: written in the job, or inferred from its first file.
//!
//! Explicit schemas use the job format's type names (`int64`, `int32`, `float64`,
//! `boolean`, `string`, `timestamp`). Inference reads a sample of the first non-empty
//! file: the CSV header and records, JSON objects (strings that all parse as timestamps
//! become timestamps), or the Parquet footer. Inferred timestamps are always
//! milliseconds without a time zone, the unit event time uses.

use std::io::Cursor;
use std::sync::Arc;

use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::util::display::FormatOptions;
use bytes::Bytes;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};
use sluice_common::pb;

use super::records::RecordScanner;
use sluice_compute::error::{Error, Result};

/// Bytes read from the start of a text file to infer its schema.
const SAMPLE_BYTES: u64 = 1 << 20;
/// Records looked at to infer a schema.
const SAMPLE_RECORDS: usize = 1000;
/// Bytes read from the end of a Parquet file in the first attempt to find its footer.
const FOOTER_GUESS: u64 = 64 * 1024;

/// Timestamps as event time uses them.
const TIMESTAMP_MS: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

/// The schema the job wrote, or an error naming the bad field.
pub fn explicit_schema(fields: &[pb::Field]) -> Result<SchemaRef> {
    let fields = fields
        .iter()
        .map(|f| {
            let data_type = parse_type(&f.data_type).ok_or_else(|| {
                Error::Plan(format!(
                    "field '{}' has unknown type '{}': use int64, int32, float64, boolean, \
                     string or timestamp",
                    f.name, f.data_type
                ))
            })?;
            Ok(Field::new(&f.name, data_type, f.nullable))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

/// The Arrow type of a job-format type name.
pub fn parse_type(name: &str) -> Option<DataType> {
    Some(match name.to_ascii_lowercase().as_str() {
        "int64" | "bigint" | "long" => DataType::Int64,
        "int32" | "int" | "integer" => DataType::Int32,
        "float64" | "double" => DataType::Float64,
        "boolean" | "bool" => DataType::Boolean,
        "string" | "utf8" | "varchar" => DataType::Utf8,
        "timestamp" => TIMESTAMP_MS,
        _ => return None,
    })
}

/// Infers the schema of `format` from `file` (shown as `display` in errors).
pub async fn infer(
    store: &dyn ObjectStore,
    file: &ObjectMeta,
    display: &str,
    format: pb::FileFormat,
) -> Result<SchemaRef> {
    let schema = match format {
        pb::FileFormat::Parquet => parquet_schema(store, file, display).await?,
        pb::FileFormat::Csv | pb::FileFormat::Jsonl => {
            let end = file.size.min(SAMPLE_BYTES);
            let mut sample = store.get_range(&file.location, 0..end).await?;
            if end < file.size {
                // Only whole lines.
                let cut = sample
                    .iter()
                    .rposition(|b| *b == b'\n')
                    .map_or(0, |i| i + 1);
                sample = sample.slice(..cut);
            }
            if format == pb::FileFormat::Csv {
                infer_csv(&sample, display)?
            } else {
                infer_json(&sample, display)?
            }
        }
    };
    Ok(Arc::new(schema))
}

/// The first records of `sample`, at most [`SAMPLE_RECORDS`] (plus a CSV header).
fn sample_records(sample: &[u8], csv: bool) -> Vec<&[u8]> {
    let mut spans = Vec::new();
    RecordScanner::new(csv).scan(sample, SAMPLE_RECORDS + 1, &mut spans);
    spans.iter().map(|s| &sample[s.start..s.next]).collect()
}

fn infer_csv(sample: &[u8], display: &str) -> Result<Schema> {
    let records = sample_records(sample, true);
    let Some((header, rows)) = records.split_first() else {
        return Err(Error::Plan(format!(
            "cannot infer a schema from {display}: it has no header"
        )));
    };
    let format = arrow::csv::reader::Format::default().with_header(true);
    let infer = |rows: &[&[u8]]| {
        let mut text = header.to_vec();
        if !text.ends_with(b"\n") {
            text.push(b'\n');
        }
        for r in rows {
            text.extend_from_slice(r);
        }
        format
            .infer_schema(Cursor::new(text), None)
            .map(|(schema, _)| schema)
    };
    // Records that the reader rejects (wrong field count) are left out of the sample.
    let schema = match infer(rows) {
        Ok(schema) => schema,
        Err(_) => {
            let good: Vec<&[u8]> = rows
                .iter()
                .copied()
                .filter(|r| infer(&[r]).is_ok())
                .collect();
            infer(&good).map_err(|e| {
                Error::Plan(format!("cannot infer a CSV schema from {display}: {e}"))
            })?
        }
    };
    Ok(normalize(schema))
}

fn infer_json(sample: &[u8], display: &str) -> Result<Schema> {
    let records = sample_records(sample, false);
    let infer = |rows: &[&[u8]]| {
        arrow::json::reader::infer_json_schema(Cursor::new(rows.concat()), None)
            .map(|(schema, _)| schema)
    };
    // Lines that are not JSON objects are left out of the sample.
    let mut good = records.clone();
    let schema = match infer(&records) {
        Ok(schema) => schema,
        Err(_) => {
            good.retain(|r| infer(&[r]).is_ok());
            infer(&good).map_err(|e| {
                Error::Plan(format!("cannot infer a JSON schema from {display}: {e}"))
            })?
        }
    };
    if schema.fields().is_empty() {
        return Err(Error::Plan(format!(
            "cannot infer a schema from {display}: no records"
        )));
    }
    let schema = in_key_order(normalize(schema), good.first().copied().unwrap_or_default());
    Ok(detect_timestamps(schema, &good.concat()))
}

/// Fields in the order their keys appear in `record` (arrow sorts inferred JSON fields by
/// name); fields whose key is not found keep their order after the others.
fn in_key_order(schema: Schema, record: &[u8]) -> Schema {
    let text = String::from_utf8_lossy(record);
    let position = |name: &str| {
        let quoted = format!("\"{name}\"");
        text.match_indices(&quoted)
            .find(|(i, _)| {
                let escaped = *i > 0 && text.as_bytes()[i - 1] == b'\\';
                let after = text[i + quoted.len()..].trim_start();
                !escaped && after.starts_with(':')
            })
            .map_or(usize::MAX, |(i, _)| i)
    };
    let mut fields: Vec<_> = schema.fields().iter().cloned().collect();
    fields.sort_by_key(|f| position(f.name()));
    Schema::new(fields)
}

/// Turns string columns whose sampled values all parse as timestamps into timestamps.
fn detect_timestamps(schema: Schema, sample: &[u8]) -> Schema {
    let schema = Arc::new(schema);
    let batch = arrow::json::ReaderBuilder::new(schema.clone())
        .with_batch_size(SAMPLE_RECORDS + 1)
        .build(Cursor::new(sample))
        .ok()
        .and_then(|mut reader| reader.next())
        .and_then(|batch| batch.ok());
    let Some(batch) = batch else {
        return Arc::unwrap_or_clone(schema);
    };
    let strict = CastOptions {
        safe: false,
        format_options: FormatOptions::default(),
    };
    let fields = schema
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(field, column)| {
            let is_time = field.data_type() == &DataType::Utf8
                && column.null_count() < column.len()
                && cast_with_options(column, &TIMESTAMP_MS, &strict).is_ok();
            if is_time {
                Arc::new(field.as_ref().clone().with_data_type(TIMESTAMP_MS))
            } else {
                field.clone()
            }
        })
        .collect::<Vec<_>>();
    Schema::new(fields)
}

/// Event-time friendly types: timestamps in milliseconds, unknown (all-null) as strings.
fn normalize(schema: Schema) -> Schema {
    let fields = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Timestamp(_, None) => f.as_ref().clone().with_data_type(TIMESTAMP_MS),
            DataType::Null => f.as_ref().clone().with_data_type(DataType::Utf8),
            _ => f.as_ref().clone(),
        })
        .collect::<Vec<_>>();
    Schema::new(fields)
}

/// The Arrow schema in a Parquet file's footer, read without fetching the whole file.
async fn parquet_schema(
    store: &dyn ObjectStore,
    file: &ObjectMeta,
    display: &str,
) -> Result<Schema> {
    let size = file.size;
    let mut fetch = size.min(FOOTER_GUESS);
    let bad = |e: parquet::errors::ParquetError| {
        Error::Plan(format!("cannot read the Parquet footer of {display}: {e}"))
    };
    let metadata = loop {
        let tail: Bytes = store.get_range(&file.location, size - fetch..size).await?;
        let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Skip);
        match reader.try_parse_sized(&tail, size) {
            Ok(()) => break reader.finish().map_err(bad)?,
            Err(parquet::errors::ParquetError::NeedMoreData(needed)) if (needed as u64) > fetch => {
                fetch = (needed as u64).min(size);
            }
            Err(e) => return Err(bad(e)),
        }
    };
    let file_metadata = metadata.file_metadata();
    let schema = parquet::arrow::parquet_to_arrow_schema(
        file_metadata.schema_descr(),
        file_metadata.key_value_metadata(),
    )
    .map_err(bad)?;
    Ok(Schema::new(schema.fields().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_types_map_to_arrow_and_unknown_ones_are_named() {
        let fields = vec![
            pb::Field {
                name: "a".into(),
                data_type: "int64".into(),
                nullable: false,
            },
            pb::Field {
                name: "t".into(),
                data_type: "TIMESTAMP".into(),
                nullable: true,
            },
        ];
        let schema = explicit_schema(&fields).unwrap();
        assert_eq!(schema.field(0).data_type(), &DataType::Int64);
        assert!(!schema.field(0).is_nullable());
        assert_eq!(schema.field(1).data_type(), &TIMESTAMP_MS);
        let bad = vec![pb::Field {
            name: "x".into(),
            data_type: "decimal".into(),
            nullable: true,
        }];
        let err = explicit_schema(&bad).unwrap_err().to_string();
        assert!(err.contains("'x'") && err.contains("decimal"), "{err}");
    }

    #[test]
    fn csv_inference_uses_millisecond_timestamps_and_ignores_ragged_records() {
        let text = b"id,name,at\n1,a,2015-07-15T00:00:01\n2,b,2015-07-15T00:00:01.5\n3\n4,d,2015-07-15T00:00:02.25\n";
        let schema = infer_csv(text, "x.csv").unwrap();
        assert_eq!(schema.field(0).data_type(), &DataType::Int64);
        assert_eq!(schema.field(1).data_type(), &DataType::Utf8);
        assert_eq!(schema.field(2).data_type(), &TIMESTAMP_MS);
    }

    #[test]
    fn json_inference_detects_timestamp_strings_and_ignores_bad_lines() {
        let text = b"{\"id\":1,\"s\":\"x\",\"at\":\"2015-07-15T00:00:01.234\"}\nnot json\n{\"id\":2,\"s\":\"2015\",\"at\":\"2015-07-15T00:00:02\"}\n";
        let schema = infer_json(text, "x.jsonl").unwrap();
        assert_eq!(
            schema.field_with_name("id").unwrap().data_type(),
            &DataType::Int64
        );
        assert_eq!(
            schema.field_with_name("s").unwrap().data_type(),
            &DataType::Utf8
        );
        assert_eq!(
            schema.field_with_name("at").unwrap().data_type(),
            &TIMESTAMP_MS
        );
        let names: Vec<&String> = schema.fields().iter().map(|f| f.name()).collect();
        assert_eq!(names, ["id", "s", "at"]);
    }
}
