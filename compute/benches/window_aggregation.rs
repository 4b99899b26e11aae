//! The window operator over successive 8192-row Nexmark bid batches, with in-memory
//! keyed state: tumbling, sliding and session windows.
//!
//! Each iteration feeds [`BATCHES`] pre-generated batches to a freshly built operator,
//! each followed by the watermark a source would send after it (the batch's largest
//! event time minus the out-of-orderness bound), which fires the windows it closes; then
//! `close` fires the rest. Throughput counts input rows.
//!
//! Run with `cargo bench -p sluice-compute --bench window_aggregation`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::AsArray;
use arrow::datatypes::TimestampMillisecondType;
use arrow::record_batch::RecordBatch;
use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use sluice_common::DEFAULT_MAX_PARALLELISM;
use sluice_common::pb;
use sluice_common::state::MemoryStateStore;
use sluice_compute::connector::{SourceReader, SubtaskInfo};
use sluice_compute::element::Timestamp;
use sluice_compute::expr::ExprCompiler;
use sluice_compute::keyed::OperatorState;
use sluice_compute::operator::window::{WindowCounters, WindowOperator};
use sluice_compute::operator::{Operator, OperatorContext, Output};
use sluice_connectors::nexmark::NexmarkReader;
use tokio::runtime::Runtime;

mod support;
use support::{ROWS, expr};

/// Batches per iteration: about 80 s of event time at the default 10,000 events/s.
const BATCHES: usize = 100;
const OUT_OF_ORDERNESS_MS: u64 = 1_000;

/// Pre-generated bid batches, each with the watermark that follows it.
fn bid_batches(rt: &Runtime) -> Vec<(RecordBatch, Timestamp)> {
    let spec = pb::NexmarkSource {
        stream: pb::NexmarkStream::Bid as i32,
        seed: 42,
        max_out_of_orderness_ms: OUT_OF_ORDERNESS_MS,
        ..Default::default()
    };
    let subtask = SubtaskInfo {
        index: 0,
        parallelism: 1,
        fence: 0,
    };
    let mut reader = NexmarkReader::new(&spec, subtask, ROWS).expect("nexmark reader");
    rt.block_on(async {
        let mut out = Vec::with_capacity(BATCHES);
        for _ in 0..BATCHES {
            let batch = reader
                .next_batch()
                .await
                .expect("generate")
                .expect("an unbounded stream")
                .batch;
            let times = batch
                .column_by_name("date_time")
                .expect("date_time")
                .as_primitive::<TimestampMillisecondType>();
            let max = times.values().iter().copied().max().expect("rows");
            out.push((batch, max - OUT_OF_ORDERNESS_MS as i64));
        }
        out
    })
}

fn window_specs() -> Vec<(&'static str, pb::WindowSpec)> {
    use pb::window_spec::Kind;
    let aggregates = vec![expr("count(*) AS bids"), expr("sum(price) AS volume")];
    vec![
        (
            "tumbling_10s_by_auction",
            pb::WindowSpec {
                kind: Some(Kind::Tumbling(pb::TumblingWindow { size_ms: 10_000 })),
                key_columns: vec!["auction".into()],
                aggregates: aggregates.clone(),
                time_column: "date_time".into(),
                ..Default::default()
            },
        ),
        (
            "sliding_10s_2s_by_auction",
            pb::WindowSpec {
                kind: Some(Kind::Sliding(pb::SlidingWindow {
                    size_ms: 10_000,
                    slide_ms: 2_000,
                })),
                key_columns: vec!["auction".into()],
                aggregates: aggregates.clone(),
                time_column: "date_time".into(),
                ..Default::default()
            },
        ),
        (
            "session_10s_by_bidder",
            pb::WindowSpec {
                kind: Some(Kind::Session(pb::SessionWindow { gap_ms: 10_000 })),
                key_columns: vec!["bidder".into()],
                aggregates,
                time_column: "date_time".into(),
                ..Default::default()
            },
        ),
    ]
}

/// A freshly built and opened operator with empty in-memory state.
fn operator(rt: &Runtime, spec: &pb::WindowSpec, input: &RecordBatch) -> WindowOperator {
    let compiler = ExprCompiler::new();
    let mut op = WindowOperator::build(
        spec,
        &input.schema(),
        &compiler,
        Arc::new(WindowCounters::default()),
    )
    .expect("window operator");
    let store = Arc::new(MemoryStateStore::new(false));
    let state = OperatorState::new(store, 1, 0..DEFAULT_MAX_PARALLELISM, 1, false);
    let ctx = OperatorContext {
        node_id: 1,
        node_name: "window".into(),
        subtask: 0,
        parallelism: 1,
        max_parallelism: DEFAULT_MAX_PARALLELISM,
        state: Some(state),
    };
    rt.block_on(op.open(&ctx)).expect("open");
    op
}

/// Feeds every batch and its watermark, then closes; returns the result rows.
async fn run(mut op: WindowOperator, batches: &[(RecordBatch, Timestamp)]) -> usize {
    let mut out = Output::default();
    let mut results = 0;
    let mut count = |out: &mut Output| {
        results += out.main.iter().map(|e| e.num_rows()).sum::<usize>();
        out.main.clear();
        out.side.clear();
    };
    for (batch, watermark) in batches {
        op.process_batch(batch.clone(), &mut out)
            .await
            .expect("process");
        op.on_watermark(*watermark, &mut out)
            .await
            .expect("watermark");
        count(&mut out);
    }
    op.close(&mut out).await.expect("close");
    count(&mut out);
    results
}

fn windows(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let batches = bid_batches(&rt);
    let rows: usize = batches.iter().map(|(b, _)| b.num_rows()).sum();
    let mut group = c.benchmark_group("window");
    group.throughput(Throughput::Elements(rows as u64));
    group.sampling_mode(SamplingMode::Flat);
    for (name, spec) in window_specs() {
        let results = rt.block_on(run(operator(&rt, &spec, &batches[0].0), &batches));
        assert!(results > 0, "{name} fired no window");
        group.bench_function(name, |b| {
            b.iter_batched(
                || operator(&rt, &spec, &batches[0].0),
                |op| black_box(rt.block_on(run(op, &batches))),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
}

criterion_group! {
    name = benches;
    config = config();
    targets = windows
}
criterion_main!(benches);
