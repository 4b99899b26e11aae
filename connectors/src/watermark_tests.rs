//! A reader's splits against the per-split watermarks of the source task that reads them.

use arrow::array::AsArray;
use arrow::datatypes::{DataType, Int64Type};
use sluice_common::pb;
use sluice_compute::connector::SourceReader;
use sluice_compute::element::StreamElement;
use sluice_compute::time::watermark::WatermarkGenerator;

/// Reads `reader` to its end as a source task does, with watermarks on `column` that
/// allow `out_of_orderness_ms`, and fails when a batch starts at or behind a watermark
/// emitted before it; returns the batches read and the last watermark.
pub(crate) async fn read_behind_no_watermark(
    reader: &mut dyn SourceReader,
    column: &str,
    out_of_orderness_ms: u64,
) -> (usize, i64) {
    let spec = pb::WatermarkSpec {
        column: column.into(),
        max_out_of_orderness_ms: out_of_orderness_ms,
        idleness_ms: 0,
        alignment: None,
    };
    let mut g = WatermarkGenerator::new(
        &spec,
        &reader.schema(),
        reader.num_splits(),
        reader.splits_read_concurrently(),
    )
    .unwrap();
    let mut watermark = i64::MIN;
    let mut batches = 0;
    while let Some(b) = reader.next_batch().await.unwrap() {
        let times = arrow::compute::cast(b.batch.column_by_name(column).unwrap(), &DataType::Int64)
            .unwrap();
        let first = arrow::compute::min(times.as_primitive::<Int64Type>()).unwrap();
        assert!(
            first > watermark,
            "batch {batches} of split {} starts at {first}, behind the watermark {watermark}",
            b.split
        );
        for split in reader.take_opened_splits() {
            g.on_split_opened(split);
        }
        let mut emitted = vec![g.on_batch(b.split, &b.batch).unwrap()];
        for split in reader.take_finished_splits() {
            emitted.push(g.on_split_finished(split));
        }
        for e in emitted.into_iter().flatten() {
            if let StreamElement::Watermark(w) = e {
                watermark = w;
            }
        }
        batches += 1;
    }
    (batches, watermark)
}
