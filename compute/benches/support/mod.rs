//! Inputs shared by the criterion benches (each bench file is its own crate and uses
//! what it needs).
#![allow(dead_code)]

use arrow::record_batch::RecordBatch;
use sluice_common::pb;
use sluice_compute::connector::SubtaskInfo;
use sluice_connectors::nexmark::NexmarkReader;

/// Rows per benchmark batch, the runtime's default batch size.
pub const ROWS: usize = 8192;

/// One 8192-row batch of the Nexmark bid stream.
pub fn bids() -> RecordBatch {
    let spec = pb::NexmarkSource {
        stream: pb::NexmarkStream::Bid as i32,
        seed: 42,
        max_out_of_orderness_ms: 1_000,
        ..Default::default()
    };
    let subtask = SubtaskInfo {
        index: 0,
        parallelism: 1,
        fence: 0,
    };
    let mut reader = NexmarkReader::new(&spec, subtask, ROWS).expect("nexmark reader");
    let batch = reader.next_batch_sync().expect("an unbounded stream").batch;
    assert_eq!(batch.num_rows(), ROWS);
    batch
}

/// A job-graph expression without a position.
pub fn expr(sql: &str) -> pb::Expr {
    pb::Expr {
        sql: sql.into(),
        location: None,
    }
}
