//! Job files in, graphs or positioned errors out.

use super::{JobSpecError, parse_job};
use sluice_common::pb;
use sluice_common::pb::node::Kind;

const FULL_EXAMPLE: &str = r#"name: bids-per-auction
parallelism: 2
max_parallelism: 128
state: { backend: remote }
source:
  nexmark: { stream: bid, events: 10000000, seed: 42, max_out_of_orderness: 2s, events_per_second: 10000, splits: 4, max_events_per_second: 50000 }
  batch_size: 8192
watermark: { column: date_time, max_out_of_orderness: 4s, idleness: 1m }
pipeline:
  - filter: "price > 100"
  - select: ["auction", "price * 0.908 AS price_eur", "date_time"]
  - key_by: [auction]
  - window: { tumbling: 10s, allowed_lateness: 5s }
    aggregate: ["count(*) AS bids", "sum(price_eur) AS volume"]
    late: { sink: { file: { path: out/late, format: csv } } }
sink:
  stdout: { format: jsonl }
"#;

fn parse(text: &str) -> pb::JobGraph {
    parse_job("job.yaml", text).unwrap_or_else(|e| panic!("{e}"))
}

fn parse_err(text: &str) -> JobSpecError {
    match parse_job("bids.yaml", text) {
        Ok(graph) => panic!("expected an error, got {graph:?}"),
        Err(err) => err,
    }
}

/// Asserts the error is at `line:column` and its message contains every part.
#[track_caller]
fn assert_err(text: &str, line: u32, column: u32, parts: &[&str]) {
    let err = parse_err(text);
    assert_eq!((err.line, err.column), (line, column), "{err}");
    for part in parts {
        assert!(err.message.contains(part), "`{part}` not in: {err}");
    }
}

fn loc(line: u32, column: u32) -> Option<pb::Location> {
    Some(pb::Location { line, column })
}

fn edge(source: u32, target: u32, partitioning: pb::Partitioning, keys: &[&str]) -> pb::Edge {
    pb::Edge {
        target_input: 0,
        source,
        target,
        partitioning: partitioning as i32,
        key_columns: keys.iter().map(|k| (*k).to_owned()).collect(),
        side_output: String::new(),
    }
}

fn window_of(graph: &pb::JobGraph, name: &str) -> pb::WindowSpec {
    let node = graph.nodes.iter().find(|n| n.name == name).expect(name);
    match &node.kind {
        Some(Kind::Window(window)) => window.clone(),
        other => panic!("{name} is not a window: {other:?}"),
    }
}

/// A job around `pipeline` (which starts on line 6).
fn with_pipeline(pipeline: &str) -> String {
    format!(
        "name: t\nparallelism: 3\nsource: {{ nexmark: {{}} }}\n\
         watermark: {{ column: date_time }}\npipeline:\n{pipeline}sink: {{ blackhole: }}\n"
    )
}

#[test]
fn full_example_becomes_the_expected_graph() {
    let graph = parse(FULL_EXAMPLE);
    assert_eq!(graph.name, "bids-per-auction");
    assert_eq!(graph.origin_file, "job.yaml");
    assert_eq!(graph.max_parallelism, 128);
    assert_eq!(
        graph.state,
        Some(pb::StateConfig {
            backend: pb::StateBackend::Remote as i32,
            shards: 0,
            cache_bytes: 0,
        })
    );

    let names: Vec<(&str, u32, u32)> = graph
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.id, n.parallelism))
        .collect();
    assert_eq!(
        names,
        [
            ("source", 0, 2),
            ("filter", 1, 2),
            ("select", 2, 2),
            ("window", 3, 2),
            ("sink", 4, 2),
            ("late-sink", 5, 2),
        ]
    );
    let locations: Vec<_> = graph.nodes.iter().map(|n| n.location).collect();
    assert_eq!(
        locations,
        [
            loc(5, 1),
            loc(10, 5),
            loc(11, 5),
            loc(13, 5),
            loc(16, 1),
            loc(15, 13)
        ]
    );

    let Some(Kind::Source(source)) = &graph.nodes[0].kind else {
        panic!("node 0 is not a source")
    };
    assert_eq!(source.batch_size, 8192);
    assert_eq!(
        source.kind,
        Some(pb::source_spec::Kind::Nexmark(pb::NexmarkSource {
            stream: pb::NexmarkStream::Bid as i32,
            events: 10_000_000,
            seed: 42,
            max_out_of_orderness_ms: 2_000,
            events_per_second: 10_000,
            splits: 4,
            max_events_per_second: 50_000,
            repeat_batches: 0,
        }))
    );
    assert_eq!(
        source.watermark,
        Some(pb::WatermarkSpec {
            column: "date_time".into(),
            max_out_of_orderness_ms: 4_000,
            idleness_ms: 60_000,
            alignment: None,
        })
    );

    let Some(Kind::Filter(filter)) = &graph.nodes[1].kind else {
        panic!("node 1 is not a filter")
    };
    assert_eq!(
        filter.predicate,
        Some(pb::Expr {
            sql: "price > 100".into(),
            location: loc(10, 13)
        })
    );
    let Some(Kind::Select(select)) = &graph.nodes[2].kind else {
        panic!("node 2 is not a select")
    };
    let exprs: Vec<(&str, _)> = select
        .exprs
        .iter()
        .map(|e| (e.sql.as_str(), e.location))
        .collect();
    assert_eq!(
        exprs,
        [
            ("auction", loc(11, 14)),
            ("price * 0.908 AS price_eur", loc(11, 25)),
            ("date_time", loc(11, 55)),
        ]
    );

    let window = window_of(&graph, "window");
    assert_eq!(
        window.kind,
        Some(pb::window_spec::Kind::Tumbling(pb::TumblingWindow {
            size_ms: 10_000
        }))
    );
    assert_eq!(window.key_columns, ["auction"]);
    assert_eq!(window.allowed_lateness_ms, 5_000);
    assert_eq!(window.late, pb::LatePolicy::SideOutput as i32);
    assert_eq!(window.time, pb::TimeCharacteristic::TimeEvent as i32);
    assert_eq!(window.time_column, "date_time");
    let aggregates: Vec<_> = window.aggregates.iter().map(|e| e.sql.as_str()).collect();
    assert_eq!(aggregates, ["count(*) AS bids", "sum(price_eur) AS volume"]);
    assert_eq!(window.aggregates[1].location, loc(14, 37));

    assert_eq!(
        graph.nodes[4].kind,
        Some(Kind::Sink(pb::SinkSpec {
            kind: Some(pb::sink_spec::Kind::Stdout(pb::StdoutSink {
                format: pb::FileFormat::Jsonl as i32
            })),
            parallelism: 0,
        }))
    );
    assert_eq!(
        graph.nodes[5].kind,
        Some(Kind::Sink(pb::SinkSpec {
            kind: Some(pb::sink_spec::Kind::File(pb::FileSink {
                path: "out/late".into(),
                format: pb::FileFormat::Csv as i32,
                store: None,
                delay_per_batch_ms: 0,
                partition_by: Vec::new(),
            })),
            parallelism: 0,
        }))
    );

    let mut late = edge(3, 5, pb::Partitioning::Forward, &[]);
    late.side_output = "late".into();
    assert_eq!(
        graph.edges,
        [
            edge(0, 1, pb::Partitioning::Forward, &[]),
            edge(1, 2, pb::Partitioning::Forward, &[]),
            edge(2, 3, pb::Partitioning::Hash, &["auction"]),
            edge(3, 4, pb::Partitioning::Forward, &[]),
            late,
        ]
    );
}

#[test]
fn defaults_fill_in_what_is_left_out() {
    let graph = parse("name: x\nsource: { nexmark: }\nsink: { stdout: }\n");
    assert_eq!(
        graph.max_parallelism,
        sluice_common::DEFAULT_MAX_PARALLELISM
    );
    assert_eq!(
        graph.state,
        Some(pb::StateConfig {
            backend: pb::StateBackend::Memory as i32,
            shards: 0,
            cache_bytes: 0,
        })
    );
    assert_eq!(graph.nodes.len(), 2);
    assert_eq!(graph.nodes[0].parallelism, 1);
    let Some(Kind::Source(source)) = &graph.nodes[0].kind else {
        panic!("not a source")
    };
    assert_eq!(source.watermark, None);
    assert_eq!(source.batch_size, 0);
    assert_eq!(
        source.kind,
        Some(pb::source_spec::Kind::Nexmark(pb::NexmarkSource::default()))
    );
    assert_eq!(graph.edges, [edge(0, 1, pb::Partitioning::Forward, &[])]);

    // A large parallelism gets room to grow.
    let graph = parse("name: x\nparallelism: 100\nsource: { nexmark: }\nsink: { blackhole: {} }\n");
    assert_eq!(graph.max_parallelism, 256);
}

#[test]
fn file_source_and_sink_with_object_store_settings() {
    let graph = parse(
        r#"name: files
source:
  file:
    path: s3://bucket/bids
    format: csv
    on_error: dead_letter
    dead_letter: out/bad
    schema: { auction: int64, price: int64, date_time: timestamp, ok: boolean }
    endpoint: "http://127.0.0.1:8333"
    region: us-east-1
    allow_http: true
sink:
  file: { path: s3://bucket/out, format: parquet, access_key_id: k, secret_access_key: s }
"#,
    );
    let Some(Kind::Source(source)) = &graph.nodes[0].kind else {
        panic!("not a source")
    };
    let Some(pb::source_spec::Kind::File(file)) = &source.kind else {
        panic!("not a file source")
    };
    assert_eq!(file.path, "s3://bucket/bids");
    assert_eq!(file.format, pb::FileFormat::Csv as i32);
    assert_eq!(file.on_error, pb::OnError::DeadLetter as i32);
    assert_eq!(file.dead_letter_path, "out/bad");
    let schema: Vec<(&str, &str, bool)> = file
        .schema
        .iter()
        .map(|f| (f.name.as_str(), f.data_type.as_str(), f.nullable))
        .collect();
    assert_eq!(
        schema,
        [
            ("auction", "int64", true),
            ("price", "int64", true),
            ("date_time", "timestamp", true),
            ("ok", "boolean", true),
        ]
    );
    assert_eq!(
        file.store,
        Some(pb::ObjectStoreConfig {
            endpoint: "http://127.0.0.1:8333".into(),
            region: "us-east-1".into(),
            access_key_id: String::new(),
            secret_access_key: String::new(),
            allow_http: true,
        })
    );
    let Some(Kind::Sink(pb::SinkSpec {
        kind: Some(pb::sink_spec::Kind::File(sink)),
        ..
    })) = &graph.nodes[1].kind
    else {
        panic!("not a file sink")
    };
    assert_eq!(sink.format, pb::FileFormat::Parquet as i32);
    let store = sink.store.as_ref().expect("store");
    assert_eq!(
        (
            store.access_key_id.as_str(),
            store.secret_access_key.as_str()
        ),
        ("k", "s")
    );
}

#[test]
fn sliding_window() {
    let graph = parse(&with_pipeline(
        "  - key_by: auction\n  - window: { sliding: 10s, slide: 2s }\n    aggregate: [\"count(*) AS n\"]\n",
    ));
    let window = window_of(&graph, "window");
    assert_eq!(
        window.kind,
        Some(pb::window_spec::Kind::Sliding(pb::SlidingWindow {
            size_ms: 10_000,
            slide_ms: 2_000
        }))
    );
    assert_eq!(window.key_columns, ["auction"]);
    assert_eq!(window.late, pb::LatePolicy::Drop as i32);
    assert_eq!(graph.nodes[1].parallelism, 3);
    assert_eq!(graph.nodes[1].location, loc(7, 5));
}

#[test]
fn cumulate_window_reads_its_size_and_step() {
    let graph = parse(&with_pipeline(
        "  - key_by: auction\n  - window: { cumulate: 1m, step: 10s }\n    aggregate: [\"count(*) AS n\"]\n",
    ));
    let window = window_of(&graph, "window");
    assert_eq!(
        window.kind,
        Some(pb::window_spec::Kind::Cumulate(pb::CumulateWindow {
            size_ms: 60_000,
            step_ms: 10_000
        }))
    );
    assert_err(
        &with_pipeline("  - window: { cumulate: 10s, step: 3s }\n    aggregate: [x]\n"),
        6,
        36,
        &["the window size (10s) must be a whole number of steps (`step`: 3s)"],
    );
    assert_err(
        &with_pipeline("  - window: { cumulate: 10s }\n    aggregate: [x]\n"),
        6,
        13,
        &["missing `step` in pipeline[0].window"],
    );
    assert_err(
        &with_pipeline("  - window: { tumbling: 10s, step: 2s }\n    aggregate: [x]\n"),
        6,
        30,
        &["`step` only applies to cumulate windows, not `tumbling` ones"],
    );
}

#[test]
fn session_window_without_key_runs_as_one_subtask() {
    let graph = parse(&with_pipeline(
        "  - window: { session: 30s, column: event_time }\n    aggregate: [\"count(*) AS n\"]\n  - filter: n > 1\n",
    ));
    let window = window_of(&graph, "window");
    assert_eq!(
        window.kind,
        Some(pb::window_spec::Kind::Session(pb::SessionWindow {
            gap_ms: 30_000
        }))
    );
    assert!(window.key_columns.is_empty());
    assert_eq!(window.time_column, "event_time");
    let parallelism: Vec<u32> = graph.nodes.iter().map(|n| n.parallelism).collect();
    assert_eq!(parallelism, [3, 1, 1, 1]);
    assert_eq!(
        graph.edges,
        [
            edge(0, 1, pb::Partitioning::Hash, &[]),
            edge(1, 2, pb::Partitioning::Forward, &[]),
            edge(2, 3, pb::Partitioning::Forward, &[]),
        ]
    );
}

#[test]
fn group_by_is_a_keyed_aggregate_and_an_empty_one_runs_as_one_subtask() {
    let graph = parse(&with_pipeline(
        "  - group_by: [auction]\n    aggregate: [\"count(*) AS n\"]\n  - group_by: []\n    aggregate: [\"max(n) AS top\"]\n",
    ));
    let aggregates: Vec<&pb::AggregateSpec> = graph
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            Some(Kind::Aggregate(a)) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(aggregates.len(), 2);
    assert_eq!(aggregates[0].key_columns, ["auction"]);
    assert_eq!(aggregates[0].aggregates[0].sql, "count(*) AS n");
    assert!(aggregates[1].key_columns.is_empty());
    let parallelism: Vec<u32> = graph.nodes.iter().map(|n| n.parallelism).collect();
    assert_eq!(parallelism, [3, 3, 1, 1]);
    assert_eq!(
        graph.edges[..2],
        [
            edge(0, 1, pb::Partitioning::Hash, &["auction"]),
            edge(1, 2, pb::Partitioning::Hash, &[]),
        ]
    );
}

#[test]
fn top_n_reads_its_order_and_limit() {
    let graph = parse(&with_pipeline(
        "  - top_n: { partition_by: [auction], order_by: [\"price DESC\", \"bidder asc nulls last\"], limit: 3, rank_column: rn }\n",
    ));
    let Some(Kind::TopN(top)) = &graph.nodes[1].kind else {
        panic!("{:?}", graph.nodes[1]);
    };
    assert_eq!(top.partition_columns, ["auction"]);
    assert_eq!(
        top.order_by,
        [
            pb::SortKey {
                column: "price".into(),
                descending: true,
                nulls_first: false
            },
            pb::SortKey {
                column: "bidder".into(),
                descending: false,
                nulls_first: false
            }
        ]
    );
    assert_eq!((top.limit, top.rank_column.as_str()), (3, "rn"));
    assert_eq!(
        graph.edges[0],
        edge(0, 1, pb::Partitioning::Hash, &["auction"])
    );
    assert_err(
        &with_pipeline("  - top_n: { order_by: [\"price DOWN\"], limit: 3 }\n"),
        6,
        25,
        &[
            "expected `column [ASC | DESC] [NULLS FIRST | NULLS LAST]`",
            "price DOWN",
        ],
    );
    assert_err(
        &with_pipeline("  - top_n: { order_by: [price], limit: 0 }\n"),
        6,
        40,
        &["limit` must be between 1 and 100000, found 0"],
    );
}

#[test]
fn over_reads_its_partition_order_and_frame() {
    let graph = parse(&with_pipeline(
        "  - over: { partition_by: [auction], rows: 9 }\n    aggregate: [\"avg(price) AS mean10\"]\n",
    ));
    let Some(Kind::Over(over)) = &graph.nodes[1].kind else {
        panic!("{:?}", graph.nodes[1]);
    };
    assert_eq!(over.partition_columns, ["auction"]);
    // The order defaults to the watermark's column.
    assert_eq!(over.time_column, "date_time");
    assert_eq!(
        (over.unit(), over.unbounded, over.preceding),
        (pb::OverFrameUnit::Rows, false, 9)
    );
    assert_eq!(over.aggregates[0].sql, "avg(price) AS mean10");
    assert_eq!(graph.nodes[1].parallelism, 3);
    assert_eq!(
        graph.edges[0],
        edge(0, 1, pb::Partitioning::Hash, &["auction"])
    );
    let frame = |item: &str| {
        let graph = parse(&with_pipeline(&format!(
            "  - over: {item}\n    aggregate: [\"count(*) AS n\"]\n"
        )));
        let Some(Kind::Over(over)) = &graph.nodes[1].kind else {
            panic!("{:?}", graph.nodes[1]);
        };
        (
            over.unit(),
            over.unbounded,
            over.preceding,
            graph.nodes[1].parallelism,
        )
    };
    assert_eq!(
        frame("{ order_by: date_time, range: 10s }"),
        (pb::OverFrameUnit::Range, false, 10_000, 1)
    );
    assert_eq!(
        frame("{ rows: unbounded }"),
        (pb::OverFrameUnit::Rows, true, 0, 1)
    );
    assert_eq!(frame("{}"), (pb::OverFrameUnit::Range, true, 0, 1));
    assert_err(
        &with_pipeline("  - over: { rows: 1, range: 1s }\n    aggregate: [\"count(*) AS n\"]\n"),
        6,
        29,
        &["has both `rows` and `range`"],
    );
    assert_err(
        &with_pipeline("  - over: { rows: 100001 }\n    aggregate: [\"count(*) AS n\"]\n"),
        6,
        19,
        &["rows` must be between 0 and 100000"],
    );
    assert_err(
        &with_pipeline("  - over: { rows: 3 }\n"),
        6,
        5,
        &["aggregate", "avg(price) AS avg_price"],
    );
    assert_err(
        "name: t\nsource: { nexmark: {} }\npipeline:\n  - over: { rows: 3 }\n    aggregate: [\"count(*) AS n\"]\nsink: { blackhole: }\n",
        4,
        11,
        &["needs a `watermark:` section"],
    );
}

#[test]
fn group_by_needs_its_aggregates() {
    assert_err(
        &with_pipeline("  - group_by: [auction]\n"),
        6,
        5,
        &["aggregate", "count(*) AS n"],
    );
    assert_err(
        &with_pipeline("  - filter: a > 1\n    aggregate: [\"count(*) AS n\"]\n"),
        7,
        5,
        &["unknown"],
    );
}

#[test]
fn processing_time_window_needs_no_watermark() {
    let graph = parse(
        "name: t\nsource: { nexmark: {} }\npipeline:\n  - window: { tumbling: 1m, time: processing }\n    aggregate: [\"count(*) AS n\"]\nsink: { stdout: }\n",
    );
    let window = window_of(&graph, "window");
    assert_eq!(window.time, pb::TimeCharacteristic::TimeProcessing as i32);
    assert_eq!(window.time_column, "");
    assert_eq!(
        window.kind,
        Some(pb::window_spec::Kind::Tumbling(pb::TumblingWindow {
            size_ms: 60_000
        }))
    );
}

#[test]
fn repeated_operators_get_numbered_names_and_rebalance_after_a_global_window() {
    let graph = parse(&with_pipeline(
        "  - filter: a > 1\n  - filter: b > 1\n  - window: { tumbling: 1s }\n    aggregate: [\"count(*) AS n\"]\n  - key_by: [k]\n  - window: { tumbling: 1s }\n    aggregate: [\"count(*) AS n\"]\n",
    ));
    let names: Vec<&str> = graph.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        ["source", "filter", "filter-2", "window", "window-2", "sink"]
    );
    let parallelism: Vec<u32> = graph.nodes.iter().map(|n| n.parallelism).collect();
    assert_eq!(parallelism, [3, 3, 3, 1, 3, 3]);
    assert_eq!(graph.edges[3], edge(3, 4, pb::Partitioning::Hash, &["k"]));
}

#[test]
fn malformed_yaml_reports_the_scanner_position() {
    assert_err(
        "name: x\nsource: { nexmark: {} }\npipeline: [ { filter: a > 1 }\nsink: { stdout: }\n",
        4,
        1,
        &["invalid YAML", "`[` opened at 3:11"],
    );
    assert_err("name: x\n  bad: indentation\n", 2, 6, &["invalid YAML"]);
}

#[test]
fn watermark_alignment_takes_a_drift_and_defaults_its_group_and_interval() {
    let job = |alignment: &str| {
        format!(
            "name: x\nsource: {{ nexmark: {{}} }}\nwatermark: {{ column: date_time, alignment: {alignment} }}\nsink: {{ stdout: }}\n"
        )
    };
    let graph = parse(&job("{ max_drift: 10s }"));
    let Some(Kind::Source(source)) = &graph.nodes[0].kind else {
        panic!("node 0 is not a source")
    };
    let wm = source.watermark.clone().unwrap();
    assert_eq!(
        wm.alignment,
        Some(pb::WatermarkAlignment {
            group: "default".into(),
            max_drift_ms: 10_000,
            update_interval_ms: 1_000,
        })
    );
    let graph = parse(&job(
        "{ max_drift: 2s, group: bids, update_interval: 200ms }",
    ));
    let Some(Kind::Source(source)) = &graph.nodes[0].kind else {
        panic!("node 0 is not a source")
    };
    let a = source.watermark.clone().unwrap().alignment.unwrap();
    assert_eq!(
        (a.group.as_str(), a.max_drift_ms, a.update_interval_ms),
        ("bids", 2_000, 200)
    );
    assert_err(
        &job("{ group: bids }"),
        3,
        44,
        &["max_drift", "e.g. `max_drift: 10s`"],
    );
    assert_err(&job("{ max_drift: 0s }"), 3, 57, &["max_drift"]);
}

#[test]
fn unknown_top_level_key() {
    assert_err(
        "name: x\nsource: { nexmark: {} }\nsinks: { stdout: }\n",
        3,
        1,
        &[
            "unknown key `sinks` at the top level; expected one of name, parallelism",
            "did you mean `sink`?",
        ],
    );
}

#[test]
fn unknown_operator() {
    assert_err(
        &with_pipeline("  - filter: a > 1\n  - flter: a > 2\n"),
        7,
        5,
        &[
            "unknown operator `flter` in pipeline[1]; expected one of filter, select, key_by, window, dedup, group_by, top_n",
            "did you mean `filter`?",
        ],
    );
}

#[test]
fn unknown_source_connector() {
    assert_err(
        "name: x\nsource:\n  pulsar: { topic: bids }\nsink: { stdout: }\n",
        3,
        3,
        &["unknown source connector `pulsar` in source; expected one of nexmark, file, kafka"],
    );
}

#[test]
fn wrong_type() {
    assert_err(
        "name: x\nparallelism: \"two\"\nsource: { nexmark: {} }\nsink: { stdout: }\n",
        2,
        14,
        &["expected a non-negative integer for `parallelism`, found the string \"two\""],
    );
    assert_err(
        "name: x\nparallelism: 0\nsource: { nexmark: {} }\nsink: { stdout: }\n",
        2,
        14,
        &["`parallelism` must be between 1 and 32768, found 0"],
    );
    assert_err(
        "name: x\nparallelism: 4\nmax_parallelism: 2\nsource: { nexmark: {} }\nsink: { stdout: }\n",
        3,
        18,
        &["`max_parallelism` (2) must be at least `parallelism` (4)"],
    );
    assert_err(
        "name: [x]\nsource: { nexmark: {} }\nsink: { stdout: }\n",
        1,
        7,
        &["expected a non-empty string for `name`, found a list"],
    );
}

#[test]
fn bad_duration() {
    assert_err(
        &with_pipeline("  - window: { tumbling: 10 parsecs }\n    aggregate: [\"count(*)\"]\n"),
        6,
        25,
        &[
            "bad duration for `pipeline[0].window.tumbling`",
            "unknown unit `parsecs`",
        ],
    );
    assert_err(
        "name: x\nsource: { nexmark: { max_out_of_orderness: 5 } }\nsink: { stdout: }\n",
        2,
        44,
        &["has no unit", "`5s`"],
    );
}

#[test]
fn missing_sink_points_at_the_top_level_mapping() {
    assert_err(
        "name: x\nsource: { nexmark: {} }\n",
        1,
        1,
        &["missing `sink` at the top level"],
    );
    assert_err(
        "source: { nexmark: {} }\nsink: { stdout: }\n",
        1,
        1,
        &["missing `name`"],
    );
}

#[test]
fn key_by_must_be_followed_by_a_window() {
    assert_err(
        &with_pipeline("  - key_by: [auction]\n  - filter: a > 1\n"),
        6,
        5,
        &[
            "`key_by` in pipeline[0] must be followed by a `window` item, found `filter` in pipeline[1]",
        ],
    );
    assert_err(
        &with_pipeline("  - filter: a > 1\n  - key_by: auction\n"),
        7,
        5,
        &["must be followed by a `window` item, found the end of the pipeline"],
    );
}

#[test]
fn dead_letter_without_path() {
    assert_err(
        "name: x\nsource:\n  file: { path: in, format: jsonl, on_error: dead_letter }\nsink: { stdout: }\n",
        3,
        46,
        &["`on_error: dead_letter` needs a `dead_letter:` path in source.file"],
    );
}

#[test]
fn event_time_window_without_watermark() {
    assert_err(
        "name: x\nsource: { nexmark: {} }\npipeline:\n  - aggregate: [\"count(*) AS n\"]\n    window: { tumbling: 10s }\nsink: { stdout: }\n",
        5,
        5,
        &[
            "event-time windows need a `watermark:` section",
            "time: processing",
        ],
    );
}

#[test]
fn more_mistakes_point_at_the_right_place() {
    // Missing keys point at the mapping that should hold them.
    assert_err(
        &with_pipeline("  - window: { tumbling: 10s }\n"),
        6,
        5,
        &["missing `aggregate` in pipeline[0]"],
    );
    assert_err(
        &with_pipeline("  - window: { sliding: 10s }\n    aggregate: [x]\n"),
        6,
        13,
        &["missing `slide` in pipeline[0].window"],
    );
    assert_err(
        &with_pipeline("  - window: { sliding: 10s, slide: 20s }\n    aggregate: [x]\n"),
        6,
        36,
        &["`slide` (20s) must not be longer than the window size (10s)"],
    );
    assert_err(
        &with_pipeline("  - window: { tumbling: 10s, session: 5s }\n    aggregate: [x]\n"),
        6,
        30,
        &["two kinds (`tumbling` and `session`)"],
    );
    assert_err(
        &with_pipeline("  - window: { tumbling: 0s }\n    aggregate: [x]\n"),
        6,
        25,
        &["must be longer than zero"],
    );
    assert_err(
        &with_pipeline("  - window: { tumbling: 1s, aggregate: [x] }\n"),
        6,
        29,
        &["`aggregate` goes next to `window:`"],
    );
    assert_err(
        &with_pipeline("  - aggregate: [x]\n"),
        6,
        5,
        &["`aggregate` in pipeline[0] belongs in a `window` or `group_by` item"],
    );
    assert_err(
        &with_pipeline("  - filter: a\n    select: [b]\n"),
        7,
        5,
        &["two operators (`filter` and `select`)"],
    );
    assert_err(
        &with_pipeline("  - select: []\n"),
        6,
        13,
        &["expected a non-empty list of strings for `pipeline[0].select`"],
    );
    assert_err(
        &with_pipeline("  - filter price > 1\n"),
        6,
        5,
        &["expected pipeline[0] to be a mapping with one operator key"],
    );
    assert_err(
        "name: x\nname: y\nsource: { nexmark: {} }\nsink: { stdout: }\n",
        2,
        1,
        &["duplicate key `name` (first written at 1:1)"],
    );
    assert_err(
        "name: x\nsource: { nexmark: {}, file: { path: a, format: csv } }\nsink: { stdout: }\n",
        2,
        24,
        &["two connectors (`nexmark` and `file`)"],
    );
    assert_err(
        "name: x\nsource: { nexmark: { max_events_per_second: fast } }\nsink: { stdout: }\n",
        2,
        45,
        &[
            "`source.nexmark.max_events_per_second`",
            "a non-negative integer",
        ],
    );
    assert_err(
        "name: x\nsource: { nexmark: { stream: bids } }\nsink: { stdout: }\n",
        2,
        30,
        &["unknown value `bids` for `source.nexmark.stream`; expected one of bid, auction, person"],
    );
    assert_err(
        "name: x\nsource: { file: { path: a } }\nsink: { stdout: }\n",
        2,
        17,
        &["missing `format` in source.file"],
    );
    assert_err(
        "name: x\nsource: { nexmark: {} }\nsink: {}\n",
        3,
        7,
        &["`sink` names no connector; expected one of stdout, blackhole, file"],
    );
    assert_err(
        "name: x\nsource: { nexmark: {} }\nsink: { stdout: { format: parquet } }\n",
        3,
        27,
        &["expected one of csv, jsonl"],
    );
    assert_err(
        "name: x\nsource: { nexmark: &a {} }\nsink: { stdout: }\n",
        2,
        23,
        &["anchors (`&name`) are not supported"],
    );
    assert_err("", 1, 1, &["the job file is empty"]);
    assert_err("- a\n", 1, 1, &["expected the job file to be a mapping"]);
}

#[test]
fn error_display_names_file_line_and_column() {
    let err = parse_err(&with_pipeline("  - flter: x\n"));
    assert!(
        err.to_string()
            .starts_with("bids.yaml:6:5: unknown operator `flter` in pipeline[0]"),
        "{err}"
    );
}

#[test]
fn garbage_never_panics() {
    let garbage = [
        "",
        " ",
        "\t",
        "\0\u{1}\u{2}",
        "---",
        "...",
        "--- |\n  x",
        "[",
        "{",
        "]]]",
        "}",
        ":",
        "? ",
        "? [a]\n: b",
        "&a",
        "*a",
        "!!",
        "!!map {}",
        "%YAML 1.2\n---\nname: x",
        "%TAG ! tag:x:\n--- !a b",
        "\"unterminated",
        "'",
        "a:\n\t- b",
        "\u{feff}name: x",
        "- - - - -",
        "key: |\n  block\n more",
        "a: b: c",
        "name: 🦀\nsource: 🦀\nsink: 🦀",
        "name: x\nsource: { nexmark: { events: 99999999999999999999999 } }\nsink: { stdout: }",
        "name: x\nparallelism: -1\nsource: { nexmark: {} }\nsink: { stdout: }",
        "name: x\nsource: {}\nsink: { stdout: }",
        "name: x\nsource: { file: null }\nsink: { stdout: }",
        "name: x\nsource: { nexmark: {} }\npipeline: [[], {}, ~, 1]\nsink: { stdout: }",
        "name: x\nsource: { nexmark: {} }\npipeline:\n  - window: ~\nsink: { stdout: }",
        "name: x\nsource: { nexmark: {} }\npipeline:\n  - window: { tumbling: 1s }\n    aggregate: [x]\n    late: { sink: {} }\nsink: { stdout: }",
        "{[: ]}: {",
        "[{]}",
    ];
    for text in garbage {
        check_no_panic(text);
    }
    check_no_panic(&"[".repeat(10_000));
    check_no_panic(&"{a: ".repeat(10_000));
    check_no_panic(&"- ".repeat(10_000));

    // Every prefix of a full job, and seeded random edits of it and of the examples.
    for (end, _) in FULL_EXAMPLE.char_indices() {
        check_no_panic(&FULL_EXAMPLE[..end]);
    }
    let mut rng = sluice_common::rng::Rng::new(0x5eed);
    let alphabet: Vec<char> = "[]{}:-,?&*!|>'\"#% \n\t\\ax0~@`".chars().collect();
    for round in 0..2_000 {
        let mut text: Vec<char> = FULL_EXAMPLE.chars().collect();
        for _ in 0..1 + round % 4 {
            let at = rng.below(text.len() as u64 + 1) as usize;
            let c = alphabet[rng.below(alphabet.len() as u64) as usize];
            match rng.below(3) {
                0 => text.insert(at, c),
                1 if at < text.len() => {
                    text.remove(at);
                }
                _ if at < text.len() => text[at] = c,
                _ => {}
            }
        }
        check_no_panic(&text.into_iter().collect::<String>());
    }
}

fn check_no_panic(text: &str) {
    if let Err(err) = parse_job("garbage.yaml", text) {
        assert!(err.line >= 1 && err.column >= 1, "{err} for {text:?}");
        assert!(!err.message.is_empty());
    }
}

#[test]
fn every_example_parses() {
    // The directory `cargo test` names when it runs the test: a binary built from another
    // copy of the tree is fresh to cargo and would look in that copy.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let dir = manifest.join("../examples");
    let mut parsed = Vec::new();
    let entries = std::fs::read_dir(&dir)
        .expect("examples/ exists")
        .chain(std::fs::read_dir(dir.join("labs")).expect("examples/labs/ exists"));
    for entry in entries {
        let path = entry.expect("readable entry").path();
        if path
            .extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml")
        {
            let text = std::fs::read_to_string(&path).expect("readable example");
            let file = path.file_name().unwrap_or_default().to_string_lossy();
            match parse_job(&file, &text) {
                Ok(graph) => parsed.push(graph.name),
                Err(err) => panic!("{err}"),
            }
            // A lab's fix is a commented line: it must parse once uncommented too.
            let fixed = text
                .replace("# idleness:", "idleness:")
                .replace("# alignment:", "alignment:");
            if fixed != text {
                parse_job(&file, &fixed).unwrap_or_else(|e| panic!("the fix of {e}"));
            }
        }
    }
    parsed.sort();
    for name in [
        "q0-passthrough",
        "q1-currency",
        "q11-user-sessions",
        "q2-filter",
        "q5-hot-items",
        "q7-highest-bid",
    ] {
        assert!(
            parsed.iter().any(|p| p == name),
            "{name} missing: {parsed:?}"
        );
    }
}

#[test]
fn exactly_once_kafka_sinks_fit_their_transactions_to_the_checkpoints() {
    let job = |checkpoint: &str, sink: &str| {
        format!(
            "name: eos job\ncheckpoint: {{ {checkpoint} }}\nsource: {{ nexmark: {{}} }}\n\
             sink:\n  kafka: {{ brokers: b, topic: t, delivery: exactly_once{sink} }}\n"
        )
    };
    let graph = parse(&job("interval: 10s", ""));
    let Some(pb::node::Kind::Sink(pb::SinkSpec {
        kind: Some(pb::sink_spec::Kind::Kafka(k)),
        ..
    })) = &graph.nodes.last().unwrap().kind
    else {
        panic!("no Kafka sink: {graph:?}");
    };
    assert_eq!(k.delivery(), pb::KafkaDelivery::ExactlyOnce);
    // Named after the job (its space made a dash), unless the file names them.
    assert_eq!(k.transactional_id_prefix, "sluice-eos-job-sink");
    assert_eq!(k.transaction_timeout_ms, 0);
    let graph = parse(&job(
        "interval: 10s",
        ", transactional_id_prefix: orders-out, transaction_timeout: 5m",
    ));
    let Some(pb::node::Kind::Sink(pb::SinkSpec {
        kind: Some(pb::sink_spec::Kind::Kafka(k)),
        ..
    })) = &graph.nodes.last().unwrap().kind
    else {
        panic!("no Kafka sink: {graph:?}");
    };
    assert_eq!(k.transactional_id_prefix, "orders-out");
    assert_eq!(k.transaction_timeout_ms, 300_000);

    // A transaction may stay open two intervals plus a checkpoint's timeout.
    assert_err(
        &job("interval: 1m, timeout: 2m", ", transaction_timeout: 3m"),
        4,
        1,
        &[
            "`transaction_timeout` (180s) is too short for checkpoints every 60s that may \
             take 120s",
            "(240s)",
        ],
    );
    parse(&job(
        "interval: 1m, timeout: 2m",
        ", transaction_timeout: 4m",
    ));
    // The default 15 minutes against the default checkpoint timeout of 120 s.
    assert_err(&job("interval: 7m", ""), 4, 1, &["(900s) is too short"]);
    assert_err(
        &job("interval: 1s", ", transactional_id_prefix: \"a b\""),
        5,
        83,
        &["only letters, digits", "`a b`"],
    );
    assert_err(
        &job("interval: 1s", ", properties: { acks: all }"),
        5,
        58,
        &["`properties` configure librdkafka"],
    );
}

#[test]
fn checkpoint_settings_parse_with_positions() {
    let ok = parse(
        "name: t\ncheckpoint: { interval: 1s, mode: aligned, timeout: 30s }\nsource:\n  nexmark: { stream: bid }\nsink:\n  blackhole: { delay_per_batch: 5ms }\n  parallelism: 1\n",
    );
    let cp = ok.checkpoint.expect("checkpoint");
    assert_eq!(cp.interval_ms, 1000);
    assert_eq!(cp.timeout_ms, 30_000);
    assert_eq!(cp.mode(), pb::CheckpointMode::Aligned);
    let Some(Kind::Sink(sink)) = &ok.nodes[1].kind else {
        panic!("not a sink")
    };
    assert_eq!(sink.parallelism, 1);
    assert_eq!(ok.nodes[1].parallelism, 1);
    let err = crate::job_spec::parse_job(
        "job.yaml",
        "name: t\ncheckpoint: { interval: 1s, mode: sometimes }\nsource:\n  nexmark: { stream: bid }\nsink:\n  stdout: {}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("job.yaml:2:"), "{err}");
    assert!(err.contains("sometimes"), "{err}");
    let job = crate::job_spec::parse_job(
        "job.yaml",
        "name: t\ncheckpoint: { interval: 1s, mode: unaligned }\nsource:\n  nexmark: { stream: bid }\nsink:\n  stdout: {}\n",
    )
    .unwrap();
    assert_eq!(
        job.checkpoint.unwrap().mode(),
        pb::CheckpointMode::Unaligned
    );
}

#[test]
fn an_aligned_timeout_switches_aligned_checkpoints_and_is_refused_with_unaligned() {
    let job = parse_job(
        "job.yaml",
        "name: t\ncheckpoint: { interval: 1s, aligned_timeout: 200ms }\nsource:\n  nexmark: { stream: bid }\nsink:\n  stdout: {}\n",
    )
    .unwrap();
    assert_eq!(job.checkpoint.unwrap().aligned_timeout_ms, 200);
    let err = parse_job(
        "job.yaml",
        "name: t\ncheckpoint: { interval: 1s, mode: unaligned, aligned_timeout: 200ms }\nsource:\n  nexmark: { stream: bid }\nsink:\n  stdout: {}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("job.yaml:2:46:"), "{err}");
    assert!(
        err.contains("`checkpoint.aligned_timeout` applies to aligned checkpoints"),
        "{err}"
    );
}

#[test]
fn buffer_debloating_is_on_with_a_target_off_or_refused_with_what_it_takes() {
    let job = |network: &str| {
        parse_job(
            "job.yaml",
            &format!(
                "name: t\n{network}source:\n  nexmark: {{ stream: bid }}\nsink:\n  stdout: {{}}\n"
            ),
        )
    };
    let target = |network: &str| job(network).unwrap().network.map(|n| n.debloat_target_ms);
    assert_eq!(target(""), None);
    assert_eq!(target("network: { debloat: true }\n"), Some(1000));
    assert_eq!(target("network: { debloat: 250ms }\n"), Some(250));
    assert_eq!(target("network: { debloat: false }\n"), Some(0));
    let err = job("network: { debloat: soon }\n").unwrap_err().to_string();
    assert!(err.starts_with("job.yaml:2:21:"), "{err}");
    assert!(err.contains("`network.debloat` is true"), "{err}");
    let err = job("network: { debloat: 0s }\n").unwrap_err().to_string();
    assert!(err.contains("must be longer than zero"), "{err}");
    let err = job("network: { buffers: 4 }\n").unwrap_err().to_string();
    assert!(err.contains("buffers"), "{err}");
}

#[test]
fn a_job_file_over_the_limit_is_refused_before_it_is_parsed() {
    // Unique junk keys: parsing this would build a map of every one of them first.
    let mut text = String::from("name: t\n");
    let mut i = 0u64;
    while text.len() <= crate::job_spec::MAX_JOB_FILE_BYTES {
        text.push_str(&format!("junk_key_{i}: {i}\n"));
        i += 1;
    }
    let err = crate::job_spec::parse_job("big.yaml", &text).unwrap_err();
    assert_eq!((err.line, err.column), (1, 1));
    let message = err.to_string();
    assert!(
        message.starts_with("big.yaml:1:1: job file big.yaml is 4.0 MiB")
            && message.contains("limited to 4 MiB"),
        "{message}"
    );
}

#[test]
fn state_cache_takes_a_byte_size() {
    let job = "name: t\nstate: { backend: memory, cache: 1MiB }\nsource:\n  nexmark: { stream: bid }\nsink:\n  stdout: {}\n";
    let graph = parse_job("job.yaml", job).unwrap();
    assert_eq!(graph.state.unwrap().cache_bytes, 1 << 20);
    let bad = job.replace("1MiB", "lots");
    let err = parse_job("job.yaml", &bad).unwrap_err().to_string();
    assert!(err.starts_with("job.yaml:2:"), "{err}");
    assert!(err.contains("state.cache"), "{err}");
}

#[test]
fn kafka_source_and_sink_decode() {
    let graph = parse(
        r#"name: k
source:
  kafka:
    brokers: [127.0.0.1:9092, 127.0.0.1:9093]
    topics: [bids, bids2]
    format: csv
    schema: { auction: int64, date_time: timestamp }
    start: { timestamp: 2026-01-01T00:00:00Z }
    bounded: latest
    on_error: skip
    discovery_interval: 30s
    properties: { fetch.min.bytes: 1, client.rack: a }
sink:
  kafka: { brokers: 127.0.0.1:9092, topic: out, format: json, key: [auction], delivery: at_least_once }
"#,
    );
    let Some(Kind::Source(source)) = &graph.nodes[0].kind else {
        panic!("not a source")
    };
    let Some(pb::source_spec::Kind::Kafka(k)) = &source.kind else {
        panic!("not a kafka source")
    };
    assert_eq!(k.brokers, "127.0.0.1:9092,127.0.0.1:9093");
    assert_eq!(k.topics, ["bids", "bids2"]);
    assert_eq!(k.format(), pb::KafkaFormat::Csv);
    assert_eq!(k.start(), pb::KafkaStart::Timestamp);
    assert_eq!(k.start_timestamp_ms, 1_767_225_600_000);
    assert!(k.bounded_latest);
    assert_eq!(k.on_error(), pb::OnError::Skip);
    assert_eq!(k.discovery_interval_ms, 30_000);
    assert_eq!(k.properties["fetch.min.bytes"], "1");
    assert_eq!(k.schema.len(), 2);
    let Some(Kind::Sink(sink)) = &graph.nodes.last().unwrap().kind else {
        panic!("not a sink")
    };
    let Some(pb::sink_spec::Kind::Kafka(s)) = &sink.kind else {
        panic!("not a kafka sink")
    };
    assert_eq!(
        (s.topic.as_str(), s.key_columns.as_slice()),
        ("out", &["auction".to_owned()][..])
    );
}

#[test]
fn kafka_mistakes_are_named_where_they_are() {
    let head = "name: k\nsource:\n  kafka:\n    brokers: b:9092\n";
    let sink = "sink: { stdout: {} }\n";
    assert_err(
        &format!("{head}    format: raw\n{sink}"),
        4,
        5,
        &["names no topic"],
    );
    assert_err(
        &format!("{head}    topic: t\n    topic_pattern: t.*\n{sink}"),
        6,
        5,
        &["both `topic` and `topic_pattern`"],
    );
    assert_err(
        &format!("{head}    topic: t\n{sink}"),
        4,
        5,
        &["needs a `schema:`", "json"],
    );
    assert_err(
        &format!("{head}    topic: t\n    format: raw\n    schema: {{ a: int64 }}\n{sink}"),
        7,
        5,
        &["`format: raw`", "remove `schema`"],
    );
    assert_err(
        &format!("{head}    topic: t\n    format: raw\n    start: group_offsets\n{sink}"),
        7,
        12,
        &["needs `group_id`"],
    );
    assert_err(
        &format!(
            "{head}    topic: t\n    format: raw\n    start: {{ timestamp: yesterday }}\n{sink}"
        ),
        7,
        25,
        &["bad timestamp `yesterday`", "RFC 3339"],
    );
    let source = "name: k\nsource: { nexmark: {} }\n";
    assert_err(
        &format!("{source}sink:\n  kafka: {{ brokers: b, topic: t, delivery: exactly_once }}\n"),
        3,
        1,
        &[
            "commits one Kafka transaction per checkpoint",
            "checkpoint: { interval: 10s }",
        ],
    );
    assert_err(
        &format!("{source}sink:\n  kafka: {{ brokers: b, topic: t, transaction_timeout: 1m }}\n"),
        4,
        34,
        &["`transaction_timeout` applies to `delivery: exactly_once` only"],
    );
    assert_err(
        &format!("{source}sink:\n  kafka: {{ brokers: b, topic: t, format: raw }}\n"),
        4,
        42,
        &["unknown value", "json, csv"],
    );
}

/// A join item of `with_pipeline` whose `interval:` is `interval`.
fn interval_join(interval: &str) -> String {
    with_pipeline(&format!(
        "  - join:\n      right: {{ source: {{ nexmark: {{ stream: auction }} }} }}\n      \
         left_keys: [auction]\n      right_keys: [id]\n      left_alias: b\n      \
         right_alias: a\n      interval: {interval}\n"
    ))
}

#[test]
fn a_join_interval_takes_signed_bounds() {
    let graph = parse(&interval_join(
        "{ left: date_time, right: date_time, lower: -10s, upper: 500ms }",
    ));
    let join = graph
        .nodes
        .iter()
        .find_map(|n| match &n.kind {
            Some(Kind::Join(j)) => Some(j.clone()),
            _ => None,
        })
        .expect("a join node");
    assert_eq!(
        join.interval,
        Some(pb::JoinInterval {
            left_time: "date_time".into(),
            right_time: "date_time".into(),
            lower_ms: -10_000,
            upper_ms: 500,
        })
    );
}

#[test]
fn a_join_interval_names_what_is_wrong() {
    assert_err(
        &interval_join("{ left: date_time, right: date_time, lower: 1s, upper: -1s }"),
        12,
        17,
        &["lower (1000 ms) is after upper (-1000 ms)"],
    );
    assert_err(
        &interval_join("{ left: date_time, right: date_time, lower: -x, upper: 0s }"),
        12,
        61,
        &["bad duration", "interval.lower"],
    );
    assert_err(
        &interval_join("{ left: date_time, lower: 0s, upper: 0s }"),
        12,
        17,
        &["right"],
    );
}

#[test]
fn a_cascade_window_aggregates_upstream_windows_by_their_end() {
    let graph = parse(&with_pipeline(
        "  - key_by: [auction]\n  - window: { tumbling: 10s }\n    aggregate: [\"count(*) AS n\"]\n  \
         - key_by: [window_end]\n  - window: { cascade: window_end }\n    aggregate: [\"max(n) AS top\"]\n",
    ));
    let window = window_of(&graph, "window-2");
    assert_eq!(
        window.kind,
        Some(pb::window_spec::Kind::Cascade(pb::CascadeWindow {}))
    );
    assert_eq!(window.key_columns, ["window_end"]);
    assert_eq!(window.time_column, "window_end");
    assert_eq!(window.time, pb::TimeCharacteristic::TimeEvent as i32);
    let cascade = "  - key_by: [window_end]\n  - window: { cascade: window_end, time: processing }\n    \
                   aggregate: [\"count(*) AS n\"]\n";
    assert_err(
        &with_pipeline(cascade),
        7,
        36,
        &["`time` does not apply to a cascade window"],
    );
}

#[test]
fn a_union_item_reads_the_other_input_into_a_node_with_two_inputs() {
    let graph = parse(&with_pipeline(
        "  - union:\n      source: { nexmark: { stream: bid } }\n      pipeline:\n        \
         - filter: \"price > 10\"\n",
    ));
    let union = graph
        .nodes
        .iter()
        .find(|n| matches!(n.kind, Some(Kind::Union(_))))
        .expect("a union node");
    let mut inputs: Vec<u32> = graph
        .edges
        .iter()
        .filter(|e| e.target == union.id)
        .map(|e| e.target_input)
        .collect();
    inputs.sort_unstable();
    assert_eq!(inputs, [0, 1]);
    assert_err(
        &with_pipeline("  - union:\n      pipeline: []\n"),
        7,
        7,
        &["missing `source` in pipeline[0].union"],
    );
}
