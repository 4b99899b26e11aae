//! The file sink's two-phase commit on local directories: barrier → pending, commit →
//! visible, crashes and recovery, in JSON lines and Parquet. After every step the visible
//! parts are read back whole, so a partial or duplicated part would show.
//! (`integration-tests/tests/exactly_once_sink.rs` runs the same steps against S3.)

use std::path::Path;
use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_common::pb;

use super::*;
use sluice_compute::connector::{SinkWriter, SourceReader, SubtaskInfo};

const FORMATS: [pb::FileFormat; 3] = [
    pb::FileFormat::Jsonl,
    pb::FileFormat::Parquet,
    pb::FileFormat::Csv,
];

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
    ]))
}

/// Records `ids`, named after their id.
fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
    let names: Vec<String> = ids.clone().map(|i| format!("n{i}")).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids)),
            Arc::new(StringArray::from(names)),
        ],
    )
    .unwrap()
}

fn spec(dir: &Path, format: pb::FileFormat) -> pb::FileSink {
    pb::FileSink {
        path: dir.to_str().unwrap().into(),
        format: format as i32,
        store: None,
        delay_per_batch_ms: 0,
        partition_by: Vec::new(),
    }
}

async fn writer(
    dir: &Path,
    format: pb::FileFormat,
    index: usize,
    parallelism: usize,
) -> FileWriter {
    FileWriter::create(
        &spec(dir, format),
        schema(),
        SubtaskInfo {
            index,
            parallelism,
            fence: 0,
        },
    )
    .await
    .unwrap()
}

/// File names in `dir`, sorted: `(visible, hidden)`.
fn names(dir: &Path) -> (Vec<String>, Vec<String>) {
    let mut all: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    all.sort();
    all.into_iter().partition(|n| !n.starts_with('.'))
}

/// The ids in the visible parts, sorted; every part is read whole and checked.
async fn visible_ids(dir: &Path, format: pb::FileFormat) -> Vec<i64> {
    let (visible, _) = names(dir);
    let mut ids = Vec::new();
    for name in visible {
        let source = pb::FileSource {
            path: dir.join(&name).to_str().unwrap().into(),
            format: format as i32,
            schema: vec![
                pb::Field {
                    name: "id".into(),
                    data_type: "int64".into(),
                    nullable: false,
                },
                pb::Field {
                    name: "name".into(),
                    data_type: "string".into(),
                    nullable: false,
                },
            ],
            ..Default::default()
        };
        let sub = SubtaskInfo {
            index: 0,
            parallelism: 1,
            fence: 0,
        };
        let mut reader = FileReader::open(&source, &[], sub, 1024)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        while let Some(b) = reader.next_batch().await.unwrap() {
            let col = b.batch.column(0).as_primitive::<Int64Type>();
            let names = b.batch.column(1).as_string::<i32>();
            for (i, id) in col.values().iter().enumerate() {
                assert_eq!(names.value(i), format!("n{id}"), "{name}");
                ids.push(*id);
            }
        }
    }
    ids.sort();
    ids
}

fn range(ids: std::ops::Range<i64>) -> Vec<i64> {
    ids.collect()
}

#[tokio::test]
async fn a_barrier_makes_a_pending_part_and_the_commit_makes_it_visible() {
    for format in FORMATS {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let ext = sink::extension(format);
        let mut w = writer(dir, format, 0, 1).await;

        w.write(&batch(0..10)).await.unwrap();
        assert_eq!(visible_ids(dir, format).await, range(0..0));
        let pending = w.pre_commit(1).await.unwrap();
        assert_eq!(
            pending,
            [dir.join(format!(".part-0-0.{ext}.pending-1"))
                .display()
                .to_string()]
        );
        assert_eq!(
            names(dir),
            (vec![], vec![format!(".part-0-0.{ext}.pending-1")])
        );

        // The next part starts with the next record; checkpoint 2's barrier comes before
        // checkpoint 1 completes.
        w.write(&batch(10..15)).await.unwrap();
        w.write(&batch(15..20)).await.unwrap();
        assert_eq!(
            names(dir).1,
            [
                format!(".part-0-0.{ext}.pending-1"),
                format!(".part-0-1.{ext}.inprogress")
            ]
        );
        assert_eq!(w.pre_commit(2).await.unwrap().len(), 2, "1 and 2 wait");
        assert_eq!(visible_ids(dir, format).await, range(0..0));

        w.commit(1).await.unwrap();
        assert_eq!(names(dir).0, [format!("part-0-0.{ext}")]);
        assert_eq!(visible_ids(dir, format).await, range(0..10));
        // Committing again is harmless.
        w.commit(1).await.unwrap();
        assert_eq!(w.pending().len(), 1);

        w.write(&batch(20..25)).await.unwrap();
        w.commit(2).await.unwrap();
        assert_eq!(visible_ids(dir, format).await, range(0..20));
        assert!(w.pending().is_empty());

        // The end of the input commits the open part directly.
        w.finish().await.unwrap();
        assert_eq!(
            names(dir),
            (
                vec![
                    format!("part-0-0.{ext}"),
                    format!("part-0-1.{ext}"),
                    format!("part-0-2.{ext}")
                ],
                vec![]
            )
        );
        assert_eq!(visible_ids(dir, format).await, range(0..25));
    }
}

#[tokio::test]
async fn the_end_of_input_commits_every_pending_part() {
    // With `checkpoint:` set but no coordinator, no commit ever comes.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let format = pb::FileFormat::Jsonl;
    let mut w = writer(dir, format, 1, 2).await;
    for (cp, ids) in [(1, 0..3), (2, 3..7), (3, 7..8)] {
        w.write(&batch(ids)).await.unwrap();
        w.pre_commit(cp).await.unwrap();
    }
    // Barriers without records make no part.
    w.pre_commit(4).await.unwrap();
    w.pre_commit(5).await.unwrap();
    assert_eq!(names(dir).1.len(), 3);
    assert_eq!(visible_ids(dir, format).await, range(0..0));
    w.finish().await.unwrap();
    assert_eq!(
        names(dir),
        (
            vec![
                "part-1-0.jsonl".to_string(),
                "part-1-1.jsonl".to_string(),
                "part-1-2.jsonl".to_string()
            ],
            vec![]
        )
    );
    assert_eq!(visible_ids(dir, format).await, range(0..8));
}

#[tokio::test]
async fn without_barriers_the_one_part_keeps_its_old_name() {
    for format in FORMATS {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let ext = sink::extension(format);
        let mut w = writer(dir, format, 3, 4).await;
        assert_eq!(names(dir).1, [format!(".part-3.{ext}.inprogress")]);
        w.write(&batch(0..5)).await.unwrap();
        w.finish().await.unwrap();
        assert_eq!(names(dir), (vec![format!("part-3.{ext}")], vec![]));
        assert_eq!(visible_ids(dir, format).await, range(0..5));

        // An empty input still makes its (empty) part, as before.
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(tmp.path(), format, 0, 1).await;
        w.finish().await.unwrap();
        assert_eq!(names(tmp.path()), (vec![format!("part-0.{ext}")], vec![]));
    }
}

/// What a subtask leaves when it dies: checkpoint 1 committed and notified (0..10),
/// checkpoint 2 pre-committed (10..20), 20..25 in progress; then the writer is dropped
/// without finishing, as a killed process would.
async fn crash(dir: &Path, format: pb::FileFormat) {
    let mut w = writer(dir, format, 0, 1).await;
    w.write(&batch(0..10)).await.unwrap();
    w.pre_commit(1).await.unwrap();
    w.commit(1).await.unwrap();
    w.write(&batch(10..20)).await.unwrap();
    w.pre_commit(2).await.unwrap();
    w.write(&batch(20..25)).await.unwrap();
    drop(w);
    let ext = sink::extension(format);
    assert_eq!(
        names(dir),
        (
            vec![format!("part-0-0.{ext}")],
            vec![
                format!(".part-0-1.{ext}.pending-2"),
                format!(".part-0-2.{ext}.inprogress")
            ]
        )
    );
    assert_eq!(visible_ids(dir, format).await, range(0..10));
}

#[tokio::test]
async fn recovery_commits_what_the_last_checkpoint_covers_and_drops_the_rest() {
    for format in FORMATS {
        let ext = sink::extension(format);
        // Checkpoint 2 was committed, but the crash came before the notification: its
        // part becomes visible; the sources rewind to after 20.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        crash(dir, format).await;
        let mut w = writer(dir, format, 0, 1).await;
        w.recover(2, &[]).await.unwrap();
        assert_eq!(
            names(dir),
            (
                vec![format!("part-0-0.{ext}"), format!("part-0-1.{ext}")],
                vec![]
            )
        );
        assert_eq!(visible_ids(dir, format).await, range(0..20));
        // Replay from the checkpoint: numbers continue after the highest one used (2,
        // the part that was discarded), so nothing is overwritten.
        w.write(&batch(20..25)).await.unwrap();
        w.pre_commit(3).await.unwrap();
        assert_eq!(names(dir).1, [format!(".part-0-3.{ext}.pending-3")]);
        w.write(&batch(25..30)).await.unwrap();
        w.finish().await.unwrap();
        assert_eq!(
            visible_ids(dir, format).await,
            range(0..30),
            "{format:?} C=2"
        );

        // Checkpoint 2 did not complete: its part goes; the sources rewind to after 10.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        crash(dir, format).await;
        let mut w = writer(dir, format, 0, 1).await;
        w.recover(1, &[]).await.unwrap();
        assert_eq!(names(dir), (vec![format!("part-0-0.{ext}")], vec![]));
        w.write(&batch(10..25)).await.unwrap();
        w.pre_commit(2).await.unwrap();
        w.commit(2).await.unwrap();
        w.finish().await.unwrap();
        assert_eq!(
            visible_ids(dir, format).await,
            range(0..25),
            "{format:?} C=1"
        );

        // Recovering twice (a crash during recovery) changes nothing more.
        let mut again = writer(dir, format, 0, 1).await;
        again.recover(2, &[]).await.unwrap();
        assert_eq!(visible_ids(dir, format).await, range(0..25));
    }
}

#[tokio::test]
async fn a_part_committed_before_the_crash_is_not_committed_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let format = pb::FileFormat::Jsonl;
    crash(dir, format).await;
    // As if the commit of 2 had copied but not deleted (S3): both names exist.
    std::fs::copy(
        dir.join(".part-0-1.jsonl.pending-2"),
        dir.join("part-0-1.jsonl"),
    )
    .unwrap();
    let mut w = writer(dir, format, 0, 1).await;
    w.recover(2, &[]).await.unwrap();
    assert_eq!(
        names(dir),
        (
            vec!["part-0-0.jsonl".to_string(), "part-0-1.jsonl".to_string()],
            vec![]
        )
    );
    assert_eq!(visible_ids(dir, format).await, range(0..20));
}

#[tokio::test]
async fn after_scaling_in_a_survivor_recovers_the_parts_of_a_gone_subtask() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let format = pb::FileFormat::Parquet;
    // Two subtasks each commit checkpoint 1 and pre-commit 2, then die.
    for (index, base) in [(0, 0), (1, 100)] {
        let mut w = writer(dir, format, index, 2).await;
        w.write(&batch(base..base + 5)).await.unwrap();
        w.pre_commit(1).await.unwrap();
        w.commit(1).await.unwrap();
        w.write(&batch(base + 5..base + 10)).await.unwrap();
        w.pre_commit(2).await.unwrap();
    }
    // The job restarts from checkpoint 2 with one subtask.
    let mut w = writer(dir, format, 0, 1).await;
    w.recover(2, &[]).await.unwrap();
    let (_, hidden) = names(dir);
    assert!(hidden.is_empty(), "{hidden:?}");
    let mut expected = range(0..10);
    expected.extend(100..110);
    assert_eq!(visible_ids(dir, format).await, expected);
}

#[tokio::test]
async fn a_pending_part_that_vanished_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut w = writer(dir, pb::FileFormat::Jsonl, 0, 1).await;
    w.write(&batch(0..3)).await.unwrap();
    w.pre_commit(1).await.unwrap();
    std::fs::remove_file(dir.join(".part-0-0.jsonl.pending-1")).unwrap();
    let err = w.commit(1).await.unwrap_err().to_string();
    assert!(err.contains(".part-0-0.jsonl.pending-1"), "{err}");
    assert!(err.contains("part-0-0.jsonl does not exist"), "{err}");
}

#[tokio::test]
async fn recovery_after_records_were_written_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = writer(tmp.path(), pb::FileFormat::Jsonl, 0, 1).await;
    w.write(&batch(0..3)).await.unwrap();
    let err = w.recover(0, &[]).await.unwrap_err();
    assert!(
        matches!(err, sluice_compute::error::Error::Internal(_)),
        "{err}"
    );
}

#[tokio::test]
async fn a_finished_writer_takes_later_barriers_with_nothing_to_pre_commit() {
    // A task that finished its input passes a completed checkpoint on (the sink commits
    // and finishes) and then still takes part in the job's next checkpoints.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let format = pb::FileFormat::Jsonl;
    let mut w = writer(dir, format, 0, 1).await;
    w.write(&batch(0..10)).await.unwrap();
    w.pre_commit(1).await.unwrap();
    w.commit(1).await.unwrap();
    w.finish().await.unwrap();
    assert_eq!(visible_ids(dir, format).await, range(0..10));
    assert!(w.pre_commit(2).await.unwrap().is_empty());
    w.commit(2).await.unwrap();
    w.finish().await.unwrap();
    assert!(
        w.write(&batch(10..11)).await.is_err(),
        "no write after finish"
    );
    assert_eq!(visible_ids(dir, format).await, range(0..10));
    assert!(names(dir).1.is_empty(), "nothing hidden: {:?}", names(dir));
}
