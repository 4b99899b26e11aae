//! The Nexmark generator: rows per second of 8192-row batches, through the source reader.
//!
//! Run with `cargo bench -p sluice-compute --bench nexmark_generator`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_common::pb;
use sluice_compute::connector::{SourceReader, SubtaskInfo};
use sluice_connectors::nexmark::NexmarkReader;

const ROWS: usize = 8192;

fn generate(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("nexmark_generate");
    group.throughput(Throughput::Elements(ROWS as u64));
    for (name, stream) in [
        ("bid", pb::NexmarkStream::Bid),
        ("auction", pb::NexmarkStream::Auction),
        ("person", pb::NexmarkStream::Person),
    ] {
        let spec = pb::NexmarkSource {
            stream: stream as i32,
            seed: 42,
            max_out_of_orderness_ms: 1_000,
            ..Default::default()
        };
        let subtask = SubtaskInfo {
            index: 0,
            parallelism: 1,
            fence: 0,
        };
        // Unbounded, so each iteration generates the next 8192 rows of the stream.
        let mut reader = NexmarkReader::new(&spec, subtask, ROWS).expect("nexmark reader");
        group.bench_function(name, |b| {
            b.iter(|| {
                let batch = rt
                    .block_on(reader.next_batch())
                    .expect("generate")
                    .expect("an unbounded stream");
                debug_assert_eq!(batch.batch.num_rows(), ROWS);
                black_box(batch)
            })
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = generate
}
criterion_main!(benches);
