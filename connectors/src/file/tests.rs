//! File source and sink tests on real files in temporary directories.

use arrow::array::{Array, AsArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Int64Type, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_common::pb;

use super::source::{MAX_RECORD, too_long_message};
use super::*;
use crate::nexmark::{generate_all, schema as nexmark_schema};
use sluice_compute::connector::{SinkWriter, SourceBatch, SourceReader, SubtaskInfo};
use sluice_compute::error::Error;

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

pub(super) fn subtask(index: usize, parallelism: usize) -> SubtaskInfo {
    SubtaskInfo {
        index,
        parallelism,
        fence: 0,
    }
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

pub(super) fn source(path: &str, format: pb::FileFormat) -> pb::FileSource {
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
    let mut reader = FileReader::open(spec, &[], sub, batch_size).await.unwrap();
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
        delay_per_batch_ms: 0,
        partition_by: Vec::new(),
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
            let (mut batches, reader) = read_all(&given, subtask(0, 1), 700).await;
            assert_eq!(reader.num_splits(), 2);
            // Files are read in turns; within a split, batches keep the file's order.
            batches.sort_by_key(|b| b.split);
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
            let (mut batches, _) = read_all(&inferred, subtask(0, 1), 1_000).await;
            batches.sort_by_key(|b| b.split);
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
        let mut reader = FileReader::open(&spec, &[], subtask(index, 2), 2)
            .await
            .unwrap();
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
        finished.sort_unstable();
        assert_eq!(finished, (0..splits).collect::<Vec<_>>());
        // Files are read in turns, so rows of different files interleave.
        got.sort_unstable();
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

pub(super) fn small_schema() -> Vec<pb::Field> {
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
            let mut reader = FileReader::open(&spec, &[], subtask(0, 1), batch_size)
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
    let err = FileReader::open(&spec, &[], subtask(0, 1), 10)
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

/// Opens `spec`'s reader fetching `chunk` bytes at a time.
async fn open_chunked(
    spec: &pb::FileSource,
    batch_size: usize,
    chunk: usize,
    max_record: usize,
) -> FileReader {
    FileReader::open(spec, &[], subtask(0, 1), batch_size)
        .await
        .unwrap()
        .with_limits(chunk, max_record)
}

/// Every batch of `reader` until the end or the first error.
async fn drain(reader: &mut FileReader) -> (Vec<SourceBatch>, Option<Error>) {
    let mut out = Vec::new();
    loop {
        match reader.next_batch().await {
            Ok(Some(b)) => out.push(b),
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
}

pub(super) fn ids_of(batches: &[SourceBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// Chunk sizes small enough to cut records, headers and CRLFs anywhere.
pub(super) const SMALL_CHUNKS: [usize; 6] = [1, 2, 3, 7, 16, 61];
pub(super) const HUGE_CHUNK: usize = 1 << 30;

/// CSV with a CRLF header, quoted fields holding newlines (and a CRLF), mixed line
/// endings, blank lines and no newline after the last record.
pub(super) fn awkward_csv(records: usize) -> String {
    let mut text = String::from("id,name,at\r\n");
    for i in 0..records {
        let name = match i % 7 {
            0 => format!("\"multi\nline, \"\"q\"\" {i}\""),
            3 => "\"crlf\r\ninside\"".to_string(),
            _ => format!("n{i}").repeat(i % 5 + 1),
        };
        text.push_str(&format!("{i},{name},2015-07-15T00:00:{:02}", i % 60));
        if i + 1 < records {
            text.push_str(if i % 3 == 0 { "\r\n" } else { "\n" });
        }
        if i % 11 == 5 {
            text.push_str("\n \r\n");
        }
    }
    text
}

/// JSON lines with escaped newlines, CRLFs, blank lines and no final newline.
pub(super) fn awkward_jsonl(records: usize) -> String {
    let mut text = String::new();
    for i in 0..records {
        let name = match i % 7 {
            0 => format!("multi\\nline \\\"q\\\" {i}"),
            _ => format!("n{i}").repeat(i % 5 + 1),
        };
        text.push_str(&format!(
            "{{\"id\":{i},\"name\":\"{name}\",\"at\":\"2015-07-15T00:00:{:02}\"}}",
            i % 60
        ));
        if i + 1 < records {
            text.push_str(if i % 3 == 0 { "\r\n" } else { "\n" });
        }
        if i % 11 == 5 {
            text.push_str("\n  \n");
        }
    }
    text
}

#[tokio::test]
async fn records_straddling_chunks_decode_as_with_one_chunk() {
    let records = 60;
    for (format, name, text) in [
        (pb::FileFormat::Csv, "in.csv", awkward_csv(records)),
        (pb::FileFormat::Jsonl, "in.jsonl", awkward_jsonl(records)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        std::fs::write(&file, &text).unwrap();
        let mut spec = source(file.to_str().unwrap(), format);
        spec.schema = small_schema();
        for batch_size in [1, 4, 1000] {
            let mut reader = open_chunked(&spec, batch_size, HUGE_CHUNK, MAX_RECORD).await;
            let (expected, err) = drain(&mut reader).await;
            assert!(err.is_none(), "{err:?}");
            assert_eq!(ids_of(&expected), (0..records as i64).collect::<Vec<_>>());
            let names = expected[0].batch.column(1).as_string::<i32>();
            assert!(names.value(0).starts_with("multi\nline"), "{format:?}");
            if format == pb::FileFormat::Csv {
                assert_eq!(names.value(0), "multi\nline, \"q\" 0");
                assert_eq!(expected.len(), records.div_ceil(batch_size));
            }
            for chunk in SMALL_CHUNKS {
                let mut reader = open_chunked(&spec, batch_size, chunk, MAX_RECORD).await;
                let (got, err) = drain(&mut reader).await;
                assert!(err.is_none(), "{format:?} chunk {chunk}: {err:?}");
                assert_eq!(got.len(), expected.len(), "{format:?} chunk {chunk}");
                for (g, e) in got.iter().zip(&expected) {
                    assert_eq!(g.split, e.split);
                    assert_eq!(g.batch, e.batch, "{format:?} chunk {chunk}");
                }
                assert_eq!(reader.counters().records, records as u64);
                assert_eq!(reader.take_finished_splits(), [0]);
            }
        }
    }
}

#[tokio::test]
async fn written_files_read_the_same_in_small_chunks() {
    let spec = pb::NexmarkSource {
        stream: pb::NexmarkStream::Bid as i32,
        events: 4_000,
        seed: 5,
        ..Default::default()
    };
    let generated: Vec<RecordBatch> = generate_all(&spec, 500).collect();
    let schema = nexmark_schema(pb::NexmarkStream::Bid);
    let expected = concat(&schema, generated.clone());
    for format in [pb::FileFormat::Csv, pb::FileFormat::Jsonl] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        write_part(path, format, schema.clone(), 0, &generated[..1]).await;
        write_part(path, format, schema.clone(), 1, &generated[1..]).await;
        let mut spec = source(path, format);
        spec.schema = fields_of(&schema);
        for chunk in [1_000, 4_096] {
            let mut reader = open_chunked(&spec, 64, chunk, MAX_RECORD).await;
            let (mut got, err) = drain(&mut reader).await;
            assert!(err.is_none(), "{err:?}");
            assert!(got.iter().all(|b| b.batch.num_rows() <= 64));
            got.sort_by_key(|b| b.split);
            let got = concat(&schema, got.into_iter().map(|b| b.batch));
            assert_eq!(got, expected, "{format:?} chunk {chunk}");
            // The buffer holds a chunk and less than a batch's records, not the file.
            let part = std::fs::read(
                dir.path()
                    .join(format!("part-1.{}", sink::extension(format))),
            )
            .unwrap();
            let longest = part.split(|b| *b == b'\n').map(<[u8]>::len).max().unwrap();
            let peak = reader.peak_buffered();
            assert!(
                peak <= chunk + 64 * (longest + 1),
                "{format:?} chunk {chunk}: peak {peak}, longest line {longest}"
            );
            assert!(
                peak * 4 < part.len(),
                "{format:?}: peak {peak} of {}",
                part.len()
            );
        }
    }
}

/// A file with bad records after quoted multi-line fields and blank lines: its text,
/// the ids of the good records, and the line and raw text of each bad one.
pub(super) fn bad_records_far_in(format: pb::FileFormat) -> (String, Vec<i64>, Vec<(u64, String)>) {
    let csv = format == pb::FileFormat::Csv;
    let mut text = String::new();
    let mut line = 1;
    if csv {
        text.push_str("id,name,at\n");
        line += 1;
    }
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for i in 0..40_i64 {
        let at = format!("2015-07-15T00:00:{:02}", i % 60);
        let (record, is_bad) = match (i % 9, csv) {
            (3, true) => (format!("x{i},c,{at}"), true),
            (6, true) => (format!("{i},d"), true),
            (3, false) => (format!(r#"{{"id":"x{i}","name":"c","at":"{at}"}}"#), true),
            (6, false) => (format!(r#"{{"id":{i},"name":"#), true),
            (_, true) if i % 4 == 1 => (format!("{i},\"two\nlines\",{at}"), false),
            (_, true) => (format!("{i},n{i},{at}"), false),
            (_, false) => (format!(r#"{{"id":{i},"name":"n{i}","at":"{at}"}}"#), false),
        };
        if is_bad {
            bad.push((line, record.clone()));
        } else {
            good.push(i);
        }
        line += 1 + record.matches('\n').count() as u64;
        text.push_str(&record);
        text.push_str(if i % 2 == 0 { "\r\n" } else { "\n" });
        if i % 5 == 2 {
            text.push('\n');
            line += 1;
        }
    }
    (text, good, bad)
}

#[tokio::test]
async fn bad_record_lines_are_exact_across_chunks() {
    for (format, name) in [
        (pb::FileFormat::Csv, "in.csv"),
        (pb::FileFormat::Jsonl, "in.jsonl"),
    ] {
        let (text, good, bad) = bad_records_far_in(format);
        assert!(bad.len() >= 8 && bad[0].0 > 4, "{bad:?}");
        for chunk in SMALL_CHUNKS.into_iter().chain([HUGE_CHUNK]) {
            for batch_size in [1, 3, 100] {
                let context = format!("{format:?} chunk {chunk} batch {batch_size}");
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join(name);
                std::fs::write(&file, &text).unwrap();
                let mut spec = source(file.to_str().unwrap(), format);
                spec.schema = small_schema();

                // fail: the first bad record, by file and line.
                let mut reader = open_chunked(&spec, batch_size, chunk, MAX_RECORD).await;
                let (batches, err) = drain(&mut reader).await;
                match err {
                    Some(Error::BadRecord { location, .. }) => {
                        assert_eq!(location, format!("{}:{}", file.display(), bad[0].0));
                    }
                    other => panic!("{context}: {other:?}"),
                }
                let before = ids_of(&batches);
                assert!(good.starts_with(&before), "{context}: {before:?}");

                // skip: the good records, the bad ones counted.
                spec.on_error = pb::OnError::Skip as i32;
                let mut reader = open_chunked(&spec, batch_size, chunk, MAX_RECORD).await;
                let (batches, err) = drain(&mut reader).await;
                assert!(err.is_none(), "{context}: {err:?}");
                assert_eq!(ids_of(&batches), good, "{context}");
                assert_eq!(reader.counters().skipped, bad.len() as u64);

                // dead_letter: every bad record with its line and raw text.
                let dead = dir.path().join("dead");
                spec.on_error = pb::OnError::DeadLetter as i32;
                spec.dead_letter_path = dead.to_str().unwrap().into();
                let mut reader = open_chunked(&spec, batch_size, chunk, MAX_RECORD).await;
                let (batches, err) = drain(&mut reader).await;
                assert!(err.is_none(), "{context}: {err:?}");
                assert_eq!(ids_of(&batches), good, "{context}");
                let written = std::fs::read_to_string(dead.join("bad-0.txt")).unwrap();
                let lines: Vec<&str> = written.lines().collect();
                assert_eq!(lines.len(), bad.len(), "{context}: {written}");
                for (got, (line, raw)) in lines.iter().zip(&bad) {
                    let prefix = format!("{}:{line}: ", file.display());
                    assert!(got.starts_with(&prefix), "{context}: {got}");
                    assert!(got.ends_with(&format!(": {raw}")), "{context}: {got}");
                }
            }
        }
    }
}

#[tokio::test]
async fn an_over_long_record_fails_with_file_and_line() {
    assert_eq!(too_long_message(MAX_RECORD), "record longer than 64 MiB");
    let long_name = "y".repeat(300);
    let csv = format!(
        "id,name,at\n1,a,2015-07-15T00:00:01\n2,\"b\nb\",2015-07-15T00:00:02\n\n\
         3,c,2015-07-15T00:00:03\n4,{long_name},2015-07-15T00:00:04\n5,e,2015-07-15T00:00:05\n"
    );
    let jsonl = format!(
        "{{\"id\":1,\"name\":\"a\",\"at\":\"2015-07-15T00:00:01\"}}\n\n\
         {{\"id\":2,\"name\":\"b\",\"at\":\"2015-07-15T00:00:02\"}}\n\
         {{\"id\":3,\"name\":\"c\",\"at\":\"2015-07-15T00:00:03\"}}\n\
         {{\"id\":4,\"name\":\"{long_name}\",\"at\":\"2015-07-15T00:00:04\"}}\n\
         {{\"id\":5,\"name\":\"e\",\"at\":\"2015-07-15T00:00:05\"}}"
    );
    // An unterminated quote makes the rest of the file one record.
    let unterminated = format!(
        "id,name,at\n1,a,2015-07-15T00:00:01\n2,\"b,x\n{}",
        "9,z,2015-07-15T00:00:09\n".repeat(20)
    );
    for (format, name, text, line, ids_before) in [
        (pb::FileFormat::Csv, "in.csv", csv, 7, vec![1, 2, 3]),
        (pb::FileFormat::Jsonl, "in.jsonl", jsonl, 5, vec![1, 2, 3]),
        (pb::FileFormat::Csv, "u.csv", unterminated, 3, vec![1]),
    ] {
        for chunk in [1, 16, 64, HUGE_CHUNK] {
            for batch_size in [1, 2, 100] {
                for policy in [pb::OnError::Fail, pb::OnError::Skip] {
                    let context = format!("{name} chunk {chunk} batch {batch_size} {policy:?}");
                    let dir = tempfile::tempdir().unwrap();
                    let file = dir.path().join(name);
                    std::fs::write(&file, &text).unwrap();
                    let mut spec = source(file.to_str().unwrap(), format);
                    spec.schema = small_schema();
                    spec.on_error = policy as i32;
                    let mut reader = open_chunked(&spec, batch_size, chunk, 200).await;
                    let (batches, err) = drain(&mut reader).await;
                    assert_eq!(ids_of(&batches), ids_before, "{context}");
                    match err {
                        Some(Error::BadRecord { location, message }) => {
                            assert_eq!(location, format!("{}:{line}", file.display()), "{context}");
                            assert_eq!(message, "record longer than 200 bytes", "{context}");
                        }
                        other => panic!("{context}: {other:?}"),
                    }
                }
            }
        }
    }
}
