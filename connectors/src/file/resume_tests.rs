//! Checkpoint positions of the file source: read part of the input, take every
//! subtask's positions, resume at another parallelism, and compare with one straight run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use arrow::util::display::array_value_to_string;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use sluice_common::pb;

use super::position::{FINISHED, Position};
use super::source::MAX_RECORD;
use super::tests::{
    HUGE_CHUNK, awkward_csv, awkward_jsonl, bad_records_far_in, small_schema, source, subtask,
};
use super::*;
use sluice_compute::connector::SourceReader;
use sluice_compute::error::Error;

/// The rows read of each split, by split name, in the order read.
type Rows = BTreeMap<String, Vec<String>>;

/// Records of the five files, sorted by name: with two subtasks, subtask 0 reads `a`,
/// `c` and `e`, subtask 1 the short `b` (finished early) and `d`.
const FILES: [(&str, usize); 5] = [("a", 23), ("b", 4), ("c", 40), ("d", 31), ("e", 15)];

/// Rows per Parquet row group: batches of 3 rows end inside row groups.
const ROW_GROUP: usize = 7;

async fn open(
    spec: &pb::FileSource,
    index: usize,
    parallelism: usize,
    batch_size: usize,
    chunk: usize,
) -> FileReader {
    FileReader::open(spec, &[], subtask(index, parallelism), batch_size)
        .await
        .unwrap()
        .with_limits(chunk, MAX_RECORD)
}

fn names(reader: &FileReader) -> Vec<String> {
    reader
        .positions()
        .unwrap()
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// Reads up to `limit` batches, adding their rows to `rows`; returns whether the end was
/// reached. Checks that a split is reported finished once, after its last batch, and
/// (at the end) that every split was.
async fn read_batches(reader: &mut FileReader, limit: usize, rows: &mut Rows) -> bool {
    let names = names(reader);
    let mut finished = reader.take_finished_splits();
    for _ in 0..limit {
        let Some(b) = reader.next_batch().await.unwrap() else {
            finished.sort_unstable();
            assert_eq!(finished, (0..reader.num_splits()).collect::<Vec<_>>());
            return true;
        };
        assert!(
            !finished.contains(&b.split),
            "a batch after its split finished"
        );
        let out = rows.entry(names[b.split].clone()).or_default();
        for row in 0..b.batch.num_rows() {
            let cells: Vec<String> = b
                .batch
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, row).unwrap())
                .collect();
            out.push(cells.join("|"));
        }
        finished.extend(reader.take_finished_splits());
    }
    false
}

/// Writes the [`FILES`] of `format` into a new directory.
fn write_files(format: pb::FileFormat) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, records) in FILES {
        let path = dir
            .path()
            .join(format!("{name}.{}", sink::extension(format)));
        match format {
            pb::FileFormat::Csv => std::fs::write(path, awkward_csv(records)).unwrap(),
            pb::FileFormat::Jsonl => std::fs::write(path, awkward_jsonl(records)).unwrap(),
            pb::FileFormat::Parquet => {
                let schema = Arc::new(Schema::new(vec![
                    Field::new("id", DataType::Int64, false),
                    Field::new("name", DataType::Utf8, false),
                ]));
                let ids: Vec<i64> = (0..records as i64).collect();
                let names: Vec<String> = ids.iter().map(|i| format!("{name}{i}")).collect();
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(Int64Array::from(ids)),
                        Arc::new(StringArray::from(names)),
                    ],
                )
                .unwrap();
                let props = WriterProperties::builder()
                    .set_max_row_group_row_count(Some(ROW_GROUP))
                    .build();
                let file = std::fs::File::create(path).unwrap();
                let mut writer = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
                writer.write(&batch).unwrap();
                writer.close().unwrap();
            }
        }
    }
    dir
}

fn spec_of(dir: &tempfile::TempDir, format: pb::FileFormat) -> pb::FileSource {
    let mut spec = source(dir.path().to_str().unwrap(), format);
    if format != pb::FileFormat::Parquet {
        spec.schema = small_schema();
    }
    spec
}

#[tokio::test]
async fn positions_resume_at_another_parallelism_without_gap_or_duplicate() {
    let formats = [
        pb::FileFormat::Csv,
        pb::FileFormat::Jsonl,
        pb::FileFormat::Parquet,
    ];
    for format in formats {
        let dir = write_files(format);
        let spec = spec_of(&dir, format);
        let mut expected = Rows::new();
        assert!(
            read_batches(
                &mut open(&spec, 0, 1, 5, HUGE_CHUNK).await,
                usize::MAX,
                &mut expected
            )
            .await
        );
        let total: usize = expected.values().map(Vec::len).sum();
        assert_eq!(total, FILES.iter().map(|(_, n)| n).sum::<usize>());
        let chunks: &[usize] = match format {
            pb::FileFormat::Parquet => &[HUGE_CHUNK],
            _ => &[7, 61, HUGE_CHUNK],
        };
        for &chunk in chunks {
            for (batch_size, first) in [(3, [4, 3]), (1, [9, 5]), (3, [0, 1])] {
                let context = format!("{format:?} chunk {chunk} batch {batch_size} {first:?}");
                // Parallelism 2: each subtask reads a few batches.
                let mut before = Rows::new();
                let mut positions = HashMap::new();
                for (index, limit) in first.into_iter().enumerate() {
                    let mut reader = open(&spec, index, 2, batch_size, chunk).await;
                    assert!(!read_batches(&mut reader, limit, &mut before).await);
                    let own = reader.positions().unwrap();
                    assert_eq!(own.len(), reader.num_splits(), "{context}");
                    positions.extend(own);
                }
                assert_eq!(positions.len(), FILES.len(), "{context}");
                let decoded: Vec<Position> = positions
                    .iter()
                    .map(|(name, p)| {
                        Position::decode(name, p, format == pb::FileFormat::Parquet).unwrap()
                    })
                    .collect();
                let start = Position::start(format == pb::FileFormat::Parquet);
                // A subtask that read nothing leaves its files at their start.
                assert_eq!(first.contains(&0), decoded.contains(&start), "{context}");
                if first == [4, 3] {
                    // `b` is read to its end, others stop within a file.
                    let b = format!("b.{}", sink::extension(format));
                    assert_eq!(positions[&b], Bytes::from_static(FINISHED), "{context}");
                    assert!(
                        decoded
                            .iter()
                            .any(|p| *p != start && *p != Position::Finished),
                        "{context}"
                    );
                }
                for parallelism in [1, 2, 3] {
                    let mut got = before.clone();
                    let mut splits = 0;
                    for index in 0..parallelism {
                        let mut reader = open(&spec, index, parallelism, batch_size, chunk).await;
                        reader.restore(&positions).unwrap();
                        assert!(read_batches(&mut reader, usize::MAX, &mut got).await);
                        splits += reader.num_splits();
                        assert!(
                            reader
                                .positions()
                                .unwrap()
                                .iter()
                                .all(|(_, p)| p == FINISHED),
                            "{context}"
                        );
                        assert!(reader.take_finished_splits().is_empty());
                    }
                    assert_eq!(splits, FILES.len());
                    // Per file, the rows before and after the checkpoint are the file's rows
                    // in order: no gap, no duplicate.
                    assert_eq!(
                        got, expected,
                        "{context} resumed at parallelism {parallelism}"
                    );
                }
            }
        }
    }
}

#[tokio::test]
async fn a_bad_record_after_a_resume_names_its_true_line() {
    for (format, name) in [
        (pb::FileFormat::Csv, "in.csv"),
        (pb::FileFormat::Jsonl, "in.jsonl"),
    ] {
        let (text, good, bad) = bad_records_far_in(format);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        std::fs::write(&file, &text).unwrap();
        for chunk in [1, 7, HUGE_CHUNK] {
            for (batch_size, batches) in [(1, 4), (3, 4), (2, 9)] {
                let context = format!("{format:?} chunk {chunk} batch {batch_size}");
                let mut spec = source(file.to_str().unwrap(), format);
                spec.schema = small_schema();
                spec.on_error = pb::OnError::Skip as i32;
                let mut first = open(&spec, 0, 1, batch_size, chunk).await;
                let mut before = Vec::new();
                for _ in 0..batches {
                    let b = first.next_batch().await.unwrap().unwrap();
                    before.extend(super::tests::ids_of(&[b]));
                }
                let skipped = first.counters().skipped as usize;
                assert!(skipped >= 1 && skipped < bad.len(), "{context}: {skipped}");
                let positions: HashMap<_, _> = first.positions().unwrap().into_iter().collect();

                // fail: the first bad record not yet handled, at its line in the file.
                spec.on_error = pb::OnError::Fail as i32;
                let mut resumed = open(&spec, 0, 1, batch_size, chunk).await;
                resumed.restore(&positions).unwrap();
                let mut after = Vec::new();
                let err = loop {
                    match resumed.next_batch().await {
                        Ok(Some(b)) => after.extend(super::tests::ids_of(&[b])),
                        Ok(None) => panic!("{context}: no error"),
                        Err(e) => break e,
                    }
                };
                match err {
                    Error::BadRecord { location, .. } => assert_eq!(
                        location,
                        format!("{}:{}", file.display(), bad[skipped].0),
                        "{context}"
                    ),
                    other => panic!("{context}: {other}"),
                }
                let read: Vec<i64> = before.iter().chain(&after).copied().collect();
                assert!(good.starts_with(&read), "{context}: {read:?}");

                // skip: the rest of the good records, each bad one counted once overall.
                spec.on_error = pb::OnError::Skip as i32;
                let mut resumed = open(&spec, 0, 1, batch_size, chunk).await;
                resumed.restore(&positions).unwrap();
                let mut after = Vec::new();
                while let Some(b) = resumed.next_batch().await.unwrap() {
                    after.extend(super::tests::ids_of(&[b]));
                }
                let read: Vec<i64> = before.iter().chain(&after).copied().collect();
                assert_eq!(read, good, "{context}");
                assert_eq!(
                    skipped + resumed.counters().skipped as usize,
                    bad.len(),
                    "{context}"
                );
            }
        }
    }
}

#[tokio::test]
async fn resuming_over_changed_files_names_what_changed() {
    let dir = write_files(pb::FileFormat::Csv);
    let spec = spec_of(&dir, pb::FileFormat::Csv);
    let mut reader = open(&spec, 0, 1, 3, HUGE_CHUNK).await;
    read_batches(&mut reader, 6, &mut Rows::new()).await;
    let positions: HashMap<String, Bytes> = reader.positions().unwrap().into_iter().collect();
    assert_eq!(
        names(&reader),
        ["a.csv", "b.csv", "c.csv", "d.csv", "e.csv"]
    );

    // A file gone from the listing: every subtask refuses, naming it.
    std::fs::remove_file(dir.path().join("c.csv")).unwrap();
    for index in 0..2 {
        let err = open(&spec, index, 2, 3, HUGE_CHUNK)
            .await
            .restore(&positions)
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Plan(_)), "{msg}");
        assert!(
            msg.contains("the source's files changed since the checkpoint: `c.csv` is gone"),
            "{msg}"
        );
    }

    // A file shorter than its position: the reader that owns it says so.
    let mut rest = positions.clone();
    rest.remove("c.csv");
    std::fs::write(dir.path().join("a.csv"), "id,name,at\n").unwrap();
    let mut reader = open(&spec, 0, 1, 3, HUGE_CHUNK).await;
    reader.restore(&rest).unwrap();
    let msg = reader.next_batch().await.unwrap_err().to_string();
    assert!(
        msg.contains("files changed since the checkpoint") && msg.contains("a.csv has 11 bytes"),
        "{msg}"
    );

    // Malformed bytes, and a position of another format, name the split.
    for (bytes, expected) in [
        (Bytes::from_static(b"12"), "2 bytes"),
        (
            Position::Parquet {
                row_group: 1,
                row: 0,
            }
            .encode(),
            "one of Parquet",
        ),
    ] {
        let bad = HashMap::from([("d.csv".to_string(), bytes)]);
        let msg = open(&spec, 0, 1, 3, HUGE_CHUNK)
            .await
            .restore(&bad)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`d.csv`") && msg.contains(expected), "{msg}");
    }
}

#[tokio::test]
async fn a_parquet_position_beyond_the_file_is_refused() {
    let dir = write_files(pb::FileFormat::Parquet);
    let spec = spec_of(&dir, pb::FileFormat::Parquet);
    // `c` has 40 rows: row groups of 7, 7, 7, 7, 7 and 5.
    for (row_group, row, ok) in [(5, 4, true), (6, 0, true), (5, 5, false), (7, 0, false)] {
        let position = Position::Parquet { row_group, row }.encode();
        let positions = HashMap::from([("c.parquet".to_string(), position)]);
        let mut reader = open(&spec, 0, 1, 3, HUGE_CHUNK).await;
        reader.restore(&positions).unwrap();
        let mut rows = Rows::new();
        let mut result = Ok(());
        while result.is_ok() {
            match reader.next_batch().await {
                Ok(Some(b)) => {
                    let names = names(&reader);
                    rows.entry(names[b.split].clone())
                        .or_default()
                        .extend((0..b.batch.num_rows()).map(|r| r.to_string()));
                }
                Ok(None) => break,
                Err(e) => result = Err(e),
            }
        }
        match (ok, result) {
            (true, Ok(())) => {
                let c = rows.get("c.parquet").map_or(0, Vec::len);
                assert_eq!(c, if row_group == 5 { 1 } else { 0 });
            }
            (false, Err(e)) => {
                let msg = e.to_string();
                assert!(msg.contains("has 6 row groups"), "{msg}");
            }
            (ok, result) => panic!("({row_group}, {row}): expected ok={ok}, got {result:?}"),
        }
    }
}

#[tokio::test]
async fn a_restored_file_behind_the_others_is_not_behind_the_watermark() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b"] {
        std::fs::write(dir.path().join(format!("{name}.csv")), awkward_csv(60)).unwrap();
    }
    let spec = spec_of(&dir, pb::FileFormat::Csv);
    // At parallelism 2 `a` is read 45 records further than `b`; both are then restored
    // into one subtask, which reads `a` first.
    let mut positions = HashMap::new();
    for (index, batches) in [(0, 15), (1, 1)] {
        let mut reader = open(&spec, index, 2, 3, HUGE_CHUNK).await;
        read_batches(&mut reader, batches, &mut Rows::new()).await;
        positions.extend(reader.positions().unwrap());
    }
    let mut reader = open(&spec, 0, 1, 3, HUGE_CHUNK).await;
    reader.restore(&positions).unwrap();
    // `id` is the event time.
    let (batches, watermark) =
        crate::watermark_tests::read_behind_no_watermark(&mut reader, "id", 0).await;
    assert!(
        batches > 20 && watermark > i64::MIN,
        "{batches} {watermark}"
    );
}
