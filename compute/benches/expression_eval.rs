//! Compiled DataFusion expressions and the filter / select operators on an 8192-row bid
//! batch.
//!
//! Run with `cargo bench -p sluice-compute --bench expression_eval`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_common::pb;
use sluice_compute::expr::ExprCompiler;
use sluice_compute::operator::filter::FilterOperator;
use sluice_compute::operator::select::SelectOperator;
use sluice_compute::operator::{Operator, Output};

mod support;
use support::{ROWS, bids, expr};

fn evaluate(c: &mut Criterion) {
    let batch = bids();
    let compiler = ExprCompiler::new();
    let mut group = c.benchmark_group("expr_evaluate");
    group.throughput(Throughput::Elements(ROWS as u64));
    for (name, sql) in [
        ("price_times_0.908", "price * 0.908"),
        ("auction_mod_123_eq_0", "auction % 123 = 0"),
    ] {
        let compiled = compiler.compile(sql, &batch.schema()).expect("compile");
        group.bench_function(name, |b| {
            b.iter(|| black_box(compiled.evaluate(black_box(&batch)).expect("evaluate")))
        });
    }
    group.finish();
}

fn operators(c: &mut Criterion) {
    let batch = bids();
    let schema = batch.schema();
    let compiler = ExprCompiler::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("operator_process_batch");
    group.throughput(Throughput::Elements(ROWS as u64));

    let filters = [
        // Nexmark q2's predicate: keeps about one row in 123.
        ("filter/auction_mod_123_eq_0", "auction % 123 = 0"),
        // Keeps about half of the rows, so the copy dominates.
        ("filter/price_gt_10000", "price > 10000"),
    ];
    for (name, sql) in filters {
        let spec = pb::FilterSpec {
            predicate: Some(expr(sql)),
        };
        let mut op = FilterOperator::build(&spec, &schema, &compiler).expect("filter");
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut out = Output::default();
                rt.block_on(op.process_batch(batch.clone(), &mut out))
                    .expect("process");
                black_box(out)
            })
        });
    }

    // Nexmark q1: currency conversion, keeping the other bid columns.
    let spec = pb::SelectSpec {
        exprs: vec![
            expr("auction"),
            expr("bidder"),
            expr("price * 0.908 AS price_eur"),
            expr("date_time"),
        ],
    };
    let mut op = SelectOperator::build(&spec, &schema, &compiler).expect("select");
    group.bench_function("select/q1_price_eur", |b| {
        b.iter(|| {
            let mut out = Output::default();
            rt.block_on(op.process_batch(batch.clone(), &mut out))
                .expect("process");
            black_box(out)
        })
    });
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
    targets = evaluate, operators
}
criterion_main!(benches);
