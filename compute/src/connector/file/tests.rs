//! File source and sink tests on real files in temporary directories.

use arrow::array::{Array, AsArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Int64Type, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_common::pb;

use super::*;
use crate::connector::nexmark::{generate_all, schema as nexmark_schema};
use crate::connector::{SinkWriter, SourceBatch, SourceReader, SubtaskInfo};
use crate::error::Error;

const FORMATS: [pb::FileFormat; 3] = [
    pb::FileFormat::Jsonl,
    pb::FileFormat::Csv,
    pb::FileFormat::Parquet,
];
const STREAMS: [pb::NexmarkStream; 3] = [
    pb::NexmarkStream::Bid,
    pb::NexmarkStream::Auction,
    pb::NexmarkStream::Person,
];

fn subtask(index: usize, parallelism: usize) -> SubtaskInfo {
    SubtaskInfo { index, parallelism }
}

fn fields_of(schema: &SchemaRef) -> Vec<pb::Field> {
    schema
        .fields()
        .iter()
        .map(|f| pb::Field {
            name: f.name().clone(),
            data_type: match f.data_type() {
                DataType::Int64 => "int64",
                DataType::Utf8 => "string",
                DataType::Timestamp(..) => "timestamp",
                other => panic!("no job type for {other}"),
            }
            .into(),
            nullable: f.is_nullable(),
        })
        .collect()
}

fn source(path: &str, format: pb::FileFormat) -> pb::FileSource {
    pb::FileSource {
        path: path.into(),
        format: format as i32,
        ..Default::default()
    }
}

async fn read_all(
    spec: &pb::FileSource,
    sub: SubtaskInfo,
    batch_size: usize,
) -> (Vec<SourceBatch>, FileReader) {
    let mut reader = FileReader::open(spec, sub, batch_size).await.unwrap();
    let mut out = Vec::new();
    while let Some(b) = reader.next_batch().await.unwrap() {
        assert!(b.batch.num_rows() <= batch_size);
        assert_eq!(b.batch.schema(), reader.schema());
        out.push(b);
    }
    (out, reader)
}

fn concat(schema: &SchemaRef, batches: impl IntoIterator<Item = RecordBatch>) -> RecordBatch {
    concat_batches(schema, &batches.into_iter().collect::<Vec<_>>()).unwrap()
}

/// Writes `batches` as subtask `index` of a file sink into `dir`.
async fn write_part(
    dir: &str,
    format: pb::FileFormat,
    schema: SchemaRef,
    index: usize,
    batches: &[RecordBatch],
) {
    let spec = pb::FileSink {
        path: dir.into(),
        format: format as i32,
        store: None,
    };
    let mut writer = FileWriter::create(&spec, schema, subtask(index, 2))
        .await
        .unwrap();
    for b in batches {
        writer.write(b).await.unwrap();
    }
    writer.finish().await.unwrap();
}

#[tokio::test]
async fn nexmark_round_trips_through_every_format() {
    for stream in STREAMS {
        let spec = pb::NexmarkSource {
            stream: stream as i32,
            events: 2_500,
            seed: 3,
            max_out_of_orderness_ms: 100,
            ..Default::default()
        };
        let generated: Vec<RecordBatch> = generate_all(&spec, 1_000).collect();
        let schema = nexmark_schema(stream);
        let expected = concat(&schema, generated.clone());
        for format in FORMATS {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().to_str().unwrap();
            // Two parts: the first two batches and the rest.
            write_part(path, format, schema.clone(), 0, &generated[..2]).await;
            write_part(path, format, schema.clone(), 1, &generated[2..]).await;
            let ext = sink::extension(format);
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            assert_eq!(names, [format!("part-0.{ext}"), format!("part-1.{ext}")]);

            // With the schema given: identical batches.
            let mut given = source(path, format);
            given.schema = fields_of(&schema);
            let (batches, reader) = read_all(&given, subtask(0, 1), 700).await;
            assert_eq!(reader.num_splits(), 2);
            let got = concat(&schema, batches.into_iter().map(|b| b.batch));
            assert_eq!(got, expected, "{stream:?} {format:?}");
            assert_eq!(reader.counters().records, 2_500);
            assert_eq!(reader.counters().skipped, 0);

            // Inferred: the same types and values (text formats infer nullable fields).
            let inferred = source(path, format);
            let inferred_schema = source_schema(&inferred).await.unwrap();
            for (a, b) in inferred_schema.fields().iter().zip(schema.fields()) {
                assert_eq!(
                    (a.name(), a.data_type()),
                    (b.name(), b.data_type()),
                    "{format:?}"
                );
            }
            let (batches, _) = read_all(&inferred, subtask(0, 1), 1_000).await;
            let got = concat(&inferred_schema, batches.into_iter().map(|b| b.batch));
            assert_eq!(
                got.columns(),
                expected.columns(),
                "{stream:?} {format:?} inferred"
            );
        }
    }
}

#[tokio::test]
async fn files_are_split_between_subtasks_one_split_per_file() {
    let dir = tempfile::tempdir().unwrap();
    for (i, name) in ["a.csv", "b.csv", "c.csv"].iter().enumerate() {
        let text = format!("id\n{}\n{}\n{}\n", i * 10, i * 10 + 1, i * 10 + 2);
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    std::fs::write(dir.path().join("_SUCCESS"), "").unwrap();
    let spec = source(dir.path().to_str().unwrap(), pb::FileFormat::Csv);
    let mut all = Vec::new();
    for (index, splits, ids) in [(0, 2, vec![0, 1, 2, 20, 21, 22]), (1, 1, vec![10, 11, 12])] {
        let mut reader = FileReader::open(&spec, subtask(index, 2), 2).await.unwrap();
        assert_eq!(reader.num_splits(), splits);
        let mut got = Vec::new();
        let mut finished = Vec::new();
        while let Some(b) = reader.next_batch().await.unwrap() {
            assert!(!finished.contains(&b.split));
            got.extend(
                b.batch
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .iter()
                    .copied(),
            );
            let newly = reader.take_finished_splits();
            // A split is reported finished with its last batch.
            if b.batch.num_rows() == 1 {
                assert_eq!(newly, vec![b.split]);
            }
            finished.extend(newly);
        }
        assert_eq!(finished, (0..splits).collect::<Vec<_>>());
        assert_eq!(got, ids);
        all.extend(got);
    }
    assert_eq!(all.len(), 9);
}

#[tokio::test]
async fn a_path_with_no_files_is_a_plan_error() {
    let dir = tempfile::tempdir().unwrap();
    let spec = source(
        dir.path().join("missing").to_str().unwrap(),
        pb::FileFormat::Csv,
    );
    let err = source_schema(&spec).await.unwrap_err();
    assert!(
        matches!(err, Error::Plan(ref m) if m.contains("missing")),
        "{err}"
    );
}

const CSV_WITH_BAD_LINES: &str = "\
id,name,at
1,a,2015-07-15T00:00:01.234
2,b,2015-07-15T00:00:02
x,c,2015-07-15T00:00:03
4,d
5,e,2015-07-15T00:00:05
";

const JSONL_WITH_BAD_LINES: &str = r#"{"id":1,"name":"a","at":"2015-07-15T00:00:01.234"}
{"id":2,"name":"b","at":"2015-07-15T00:00:02"}
{"id":"x","name":"c","at":"2015-07-15T00:00:03"}
{"id":4,"name":
{"id":5,"name":"e","at":"2015-07-15T00:00:05"}
"#;

fn small_schema() -> Vec<pb::Field> {
    let field = |name: &str, data_type: &str| pb::Field {
        name: name.into(),
        data_type: data_type.into(),
        nullable: false,
    };
    vec![
        field("id", "int64"),
        field("name", "string"),
        field("at", "timestamp"),
    ]
}

/// `(format, file name, contents, first bad line, second bad line)`.
fn bad_inputs() -> [(pb::FileFormat, &'static str, &'static str, u64, u64); 2] {
    [
        (pb::FileFormat::Csv, "in.csv", CSV_WITH_BAD_LINES, 4, 5),
        (
            pb::FileFormat::Jsonl,
            "in.jsonl",
            JSONL_WITH_BAD_LINES,
            3,
            4,
        ),
    ]
}

#[tokio::test]
async fn on_error_fail_names_file_and_line() {
    for (format, name, text, first_bad, _) in bad_inputs() {
        for batch_size in [1, 2, 100] {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join(name);
            std::fs::write(&file, text).unwrap();
            let mut spec = source(file.to_str().unwrap(), format);
            spec.schema = small_schema();
            let mut reader = FileReader::open(&spec, subtask(0, 1), batch_size)
                .await
                .unwrap();
            let mut rows = 0;
            let err = loop {
                match reader.next_batch().await {
                    Ok(Some(b)) => rows += b.batch.num_rows(),
                    Ok(None) => panic!("{format:?}: no error"),
                    Err(e) => break e,
                }
            };
            let location = format!("{}:{first_bad}", file.display());
            match &err {
                Error::BadRecord {
                    location: l,
                    message,
                } => {
                    assert_eq!(l, &location, "{format:?}");
                    assert!(!message.contains("line 0"), "{message}");
                }
                other => panic!("{format:?}: {other}"),
            }
            assert!(err.is_user_error());
            assert!(rows < 3, "{format:?}: {rows} rows before the error");
        }
    }
}

#[tokio::test]
async fn on_error_skip_drops_bad_records_and_counts_them() {
    for (format, name, text, _, _) in bad_inputs() {
        for batch_size in [1, 2, 100] {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join(name);
            std::fs::write(&file, text).unwrap();
            let mut spec = source(file.to_str().unwrap(), format);
            spec.schema = small_schema();
            spec.on_error = pb::OnError::Skip as i32;
            let (batches, reader) = read_all(&spec, subtask(0, 1), batch_size).await;
            let ids: Vec<i64> = batches
                .iter()
                .flat_map(|b| {
                    b.batch
                        .column(0)
                        .as_primitive::<Int64Type>()
                        .values()
                        .to_vec()
                })
                .collect();
            assert_eq!(ids, [1, 2, 5], "{format:?} batch size {batch_size}");
            assert_eq!(reader.counters().skipped, 2);
            assert_eq!(reader.counters().records, 3);
            let times = batches[0].batch.column(2);
            assert_eq!(
                times
                    .as_primitive::<arrow::datatypes::TimestampMillisecondType>()
                    .value(0),
                1_436_918_401_234
            );
        }
    }
}

#[tokio::test]
async fn on_error_dead_letter_writes_the_raw_bad_lines() {
    for (format, name, text, first_bad, second_bad) in bad_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let dead = dir.path().join("dead");
        let mut spec = source(file.to_str().unwrap(), format);
        spec.schema = small_schema();
        spec.on_error = pb::OnError::DeadLetter as i32;
        spec.dead_letter_path = dead.to_str().unwrap().into();
        let (batches, reader) = read_all(&spec, subtask(0, 1), 100).await;
        assert_eq!(batches.iter().map(|b| b.batch.num_rows()).sum::<usize>(), 3);
        assert_eq!(reader.counters().skipped, 2);
        let written = std::fs::read_to_string(dead.join("bad-0.txt")).unwrap();
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), 2, "{written}");
        let source_lines: Vec<&str> = text.lines().collect();
        for (line, bad) in lines.iter().zip([first_bad, second_bad]) {
            let prefix = format!("{}:{bad}: ", file.display());
            assert!(line.starts_with(&prefix), "{line}");
            assert!(
                line.ends_with(&format!(": {}", source_lines[bad as usize - 1])),
                "{line}"
            );
        }
    }
}

#[tokio::test]
async fn dead_letter_without_a_path_is_a_plan_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.csv");
    std::fs::write(&file, CSV_WITH_BAD_LINES).unwrap();
    let mut spec = source(file.to_str().unwrap(), pb::FileFormat::Csv);
    spec.on_error = pb::OnError::DeadLetter as i32;
    let err = FileReader::open(&spec, subtask(0, 1), 10)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Plan(ref m) if m.contains("dead_letter_path")),
        "{err}"
    );
}

#[tokio::test]
async fn inferred_csv_schema_survives_a_ragged_record() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.csv");
    std::fs::write(&file, CSV_WITH_BAD_LINES.replace("x,c", "3,c")).unwrap();
    let mut spec = source(file.to_str().unwrap(), pb::FileFormat::Csv);
    spec.on_error = pb::OnError::Skip as i32;
    let schema = source_schema(&spec).await.unwrap();
    assert_eq!(schema.field(0).data_type(), &DataType::Int64);
    let (batches, reader) = read_all(&spec, subtask(0, 1), 100).await;
    assert_eq!(batches[0].batch.num_rows(), 4);
    assert_eq!(reader.counters().skipped, 1);
    assert_eq!(batches[0].batch.column(2).null_count(), 0);
}
