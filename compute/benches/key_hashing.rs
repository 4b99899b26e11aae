//! Key encoding, key-group hashing and hash partitioning of one 8192-row bid batch.
//!
//! Run with `cargo bench -p sluice-compute --bench key_hashing`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_common::DEFAULT_MAX_PARALLELISM;
use sluice_common::key_group::key_group_of;
use sluice_compute::element::StreamElement;
use sluice_compute::keys::{EncodedKeys, KeyEncoder};
use sluice_compute::queue::{QueueReceiver, input_queue};
use sluice_compute::runtime::router::{OutputEdge, Partitioner};

mod support;
use support::{ROWS, bids};

fn key_sets() -> [(&'static str, Vec<String>); 2] {
    [
        ("int64", vec!["auction".into()]),
        ("int64_utf8", vec!["auction".into(), "channel".into()]),
    ]
}

fn encode(c: &mut Criterion) {
    let batch = bids();
    let mut group = c.benchmark_group("key_encode");
    group.throughput(Throughput::Elements(ROWS as u64));
    for (name, columns) in key_sets() {
        let encoder = KeyEncoder::new(&batch.schema(), &columns).expect("key encoder");
        let mut keys = EncodedKeys::default();
        group.bench_function(name, |b| {
            b.iter(|| {
                encoder
                    .encode(black_box(&batch), &mut keys)
                    .expect("encode");
                black_box(keys.len())
            })
        });
    }
    group.finish();
}

fn key_groups(c: &mut Criterion) {
    let batch = bids();
    let mut group = c.benchmark_group("key_group_of");
    group.throughput(Throughput::Elements(ROWS as u64));
    for (name, columns) in key_sets() {
        let encoder = KeyEncoder::new(&batch.schema(), &columns).expect("key encoder");
        let mut keys = EncodedKeys::default();
        encoder.encode(&batch, &mut keys).expect("encode");
        // Hashing alone, on keys encoded once.
        group.bench_function(format!("{name}/hash_only"), |b| {
            b.iter(|| {
                let mut acc = 0u64;
                for row in 0..keys.len() {
                    acc += u64::from(key_group_of(
                        black_box(keys.row(row)),
                        DEFAULT_MAX_PARALLELISM,
                    ));
                }
                black_box(acc)
            })
        });
        // Encoding plus hashing: what a keyed operator does per batch.
        let mut scratch = EncodedKeys::default();
        group.bench_function(format!("{name}/encode_and_hash"), |b| {
            b.iter(|| {
                encoder
                    .encode(black_box(&batch), &mut scratch)
                    .expect("encode");
                let mut acc = 0u64;
                for row in 0..scratch.len() {
                    acc += u64::from(key_group_of(scratch.row(row), DEFAULT_MAX_PARALLELISM));
                }
                black_box(acc)
            })
        });
    }
    group.finish();
}

/// Takes everything already queued on `rx` without waiting; returns the rows received.
fn drain(rx: &mut QueueReceiver) -> usize {
    let mut rows = 0;
    while let Some(env) = rx.try_recv() {
        if let Ok(element) = env.item {
            rows += element.num_rows();
            drop(black_box(element));
        }
    }
    rows
}

fn hash_partition(c: &mut Criterion) {
    let batch = bids();
    let element = StreamElement::Batch(batch.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("hash_partition");
    group.throughput(Throughput::Elements(ROWS as u64));
    for channels in [2usize, 4] {
        for (name, columns) in key_sets() {
            let encoder = KeyEncoder::new(&batch.schema(), &columns).expect("key encoder");
            let mut senders = Vec::with_capacity(channels);
            let mut receivers = Vec::with_capacity(channels);
            for _ in 0..channels {
                // One consumer subtask per channel, each with one input channel from us.
                let (mut s, r) = input_queue(1, 1 << 30);
                senders.push(s.remove(0));
                receivers.push(r);
            }
            let mut edge = OutputEdge::new(
                Partitioner::Hash {
                    encoder,
                    max_parallelism: DEFAULT_MAX_PARALLELISM,
                },
                senders,
            );
            let run = |edge: &mut OutputEdge, receivers: &mut [QueueReceiver]| {
                rt.block_on(async {
                    edge.emit(&element).await.expect("emit");
                    receivers.iter_mut().map(drain).sum::<usize>()
                })
            };
            assert_eq!(
                run(&mut edge, &mut receivers),
                ROWS,
                "every row arrives once"
            );
            group.bench_function(format!("{channels}ch/{name}"), |b| {
                b.iter(|| black_box(run(&mut edge, &mut receivers)))
            });
        }
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
    targets = encode, key_groups, hash_partition
}
criterion_main!(benches);
