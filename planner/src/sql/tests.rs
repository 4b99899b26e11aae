//! SQL jobs plan into the graph their YAML twins plan into, and mistakes point at their
//! line and column.

use sluice_common::pb;

use super::parse_sql_job;
use crate::job_spec::parse_job;

/// The graph without positions and file name, which differ between the two texts.
fn shape(mut g: pb::JobGraph) -> pb::JobGraph {
    g.origin_file.clear();
    for n in &mut g.nodes {
        n.location = None;
        match n.kind.as_mut() {
            Some(pb::node::Kind::Filter(f)) => {
                if let Some(p) = f.predicate.as_mut() {
                    p.location = None;
                }
            }
            Some(pb::node::Kind::Select(s)) => {
                for e in &mut s.exprs {
                    e.location = None;
                }
            }
            Some(pb::node::Kind::Window(w)) => {
                for e in &mut w.aggregates {
                    e.location = None;
                }
            }
            _ => {}
        }
    }
    g
}

fn sql(text: &str) -> pb::JobGraph {
    parse_sql_job("job.sql", text).unwrap_or_else(|e| panic!("{e}"))
}

fn yaml(text: &str) -> pb::JobGraph {
    parse_job("job.yaml", text).unwrap_or_else(|e| panic!("{e}"))
}

fn error(text: &str) -> String {
    parse_sql_job("job.sql", text)
        .expect_err("the job must be refused")
        .to_string()
}

const BIDS: &str = "CREATE TABLE bid WITH ('connector' = 'nexmark', 'stream' = 'bid', \
                    'events' = '1000', 'seed' = '42');\n";

#[test]
fn a_projection_with_a_filter_plans_like_its_job_file() {
    let g = sql(&format!(
        "SET 'pipeline.name' = 'q2';\nSET 'parallelism.default' = '2';\n{BIDS}\
         CREATE TABLE out WITH ('connector' = 'file', 'path' = 'out/q2', 'format' = 'jsonl');\n\
         INSERT INTO out SELECT auction, price * 0.908 AS price_eur FROM bid WHERE auction % 123 = 0;\n"
    ));
    let y = yaml(
        "name: q2\nparallelism: 2\n\
         source: { nexmark: { stream: bid, events: 1000, seed: 42 } }\n\
         pipeline:\n  - filter: \"auction % 123 = 0\"\n  - select: [\"auction\", \"price * 0.908 AS price_eur\"]\n\
         sink: { file: { path: out/q2, format: jsonl } }\n",
    );
    assert_eq!(shape(g), shape(y));
}

#[test]
fn select_star_into_print_is_a_pass_through() {
    let g = sql(&format!(
        "{BIDS}CREATE TABLE out WITH ('connector' = 'print');\nINSERT INTO out SELECT * FROM bid;"
    ));
    let y = yaml(
        "name: job\nsource: { nexmark: { stream: bid, events: 1000, seed: 42 } }\n\
         sink: { stdout: {} }\n",
    );
    assert_eq!(shape(g), shape(y));
}

#[test]
fn a_hop_window_aggregate_plans_like_the_q5_job_file() {
    let g = sql(
        "SET 'pipeline.name' = 'q5';\nSET 'parallelism.default' = '2';\n\
         CREATE TABLE bid (\n  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND\n) \
         WITH ('connector' = 'nexmark', 'stream' = 'bid', 'events' = '1000', \
         'max_out_of_orderness' = '2s');\n\
         CREATE TABLE out WITH ('connector' = 'blackhole');\n\
         INSERT INTO out\nSELECT auction, window_start, window_end, COUNT(*) AS bids\n\
         FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))\n\
         GROUP BY auction, window_start, window_end;\n",
    );
    let y = yaml(
        "name: q5\nparallelism: 2\n\
         source: { nexmark: { stream: bid, events: 1000, max_out_of_orderness: 2s } }\n\
         watermark: { column: date_time, max_out_of_orderness: 4s }\n\
         pipeline:\n  - key_by: [auction]\n  - window: { sliding: 10s, slide: 2s }\n    \
         aggregate: [\"COUNT(*) AS bids\"]\n\
         sink: { blackhole: {} }\n",
    );
    assert_eq!(shape(g), shape(y));
}

#[test]
fn a_select_list_in_another_order_adds_a_projection_after_the_window() {
    let g = sql("CREATE TABLE bid (WATERMARK FOR date_time AS date_time) \
         WITH ('connector' = 'nexmark', 'events' = '1000');\n\
         CREATE TABLE out WITH ('connector' = 'print', 'format' = 'csv');\n\
         INSERT INTO out SELECT COUNT(*) AS n, MAX(price) AS top, window_end AS ends\n\
         FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10 seconds'))\n\
         GROUP BY window_start, window_end;\n");
    let y = yaml(
        "name: job\nsource: { nexmark: { events: 1000 } }\n\
         watermark: { column: date_time, max_out_of_orderness: 0ms }\n\
         pipeline:\n  - window: { tumbling: 10s }\n    \
         aggregate: [\"COUNT(*) AS n\", \"MAX(price) AS top\"]\n  \
         - select: [n, top, \"window_end AS ends\"]\n\
         sink: { stdout: { format: csv } }\n",
    );
    assert_eq!(shape(g), shape(y));
}

#[test]
fn select_distinct_is_a_dedup_on_every_column() {
    let g = sql(&format!(
        "{BIDS}CREATE TABLE out WITH ('connector' = 'print');\n\
         INSERT INTO out SELECT DISTINCT bidder, auction % 10 AS bucket FROM bid;"
    ));
    let y = yaml(
        "name: job\nsource: { nexmark: { stream: bid, events: 1000, seed: 42 } }\n\
         pipeline:\n  - select: [bidder, \"auction % 10 AS bucket\"]\n  - dedup: [bidder, bucket]\n\
         sink: { stdout: {} }\n",
    );
    assert_eq!(shape(g), shape(y));
    let e = error(&format!(
        "{BIDS}CREATE TABLE out WITH ('connector' = 'print');\n\
         INSERT INTO out SELECT DISTINCT bidder, auction + 1 FROM bid;"
    ));
    assert!(
        e.contains("job.sql:3:41: name this column of SELECT DISTINCT"),
        "{e}"
    );
}

#[test]
fn views_and_subqueries_stack_their_operators() {
    let g = sql(
        "CREATE TABLE bid (WATERMARK FOR date_time AS date_time - INTERVAL '1' SECOND) \
         WITH ('connector' = 'nexmark', 'events' = '1000');\n\
         CREATE TABLE out WITH ('connector' = 'print');\n\
         CREATE VIEW cheap AS SELECT auction, date_time FROM bid WHERE price < 100;\n\
         INSERT INTO out SELECT auction, window_start, window_end, COUNT(*) AS n\n\
         FROM TABLE(TUMBLE(TABLE cheap, DESCRIPTOR(date_time), INTERVAL '10' SECOND))\n\
         GROUP BY auction, window_start, window_end;",
    );
    let y = yaml(
        "name: job\nsource: { nexmark: { events: 1000 } }\n\
         watermark: { column: date_time, max_out_of_orderness: 1s }\n\
         pipeline:\n  - filter: \"price < 100\"\n  - select: [auction, date_time]\n  \
         - key_by: [auction]\n  - window: { tumbling: 10s }\n    aggregate: [\"COUNT(*) AS n\"]\n\
         sink: { stdout: {} }\n",
    );
    assert_eq!(shape(g), shape(y));
    let g = sql(&format!(
        "{BIDS}CREATE TABLE out WITH ('connector' = 'print');\n\
         INSERT INTO out SELECT auction FROM (SELECT * FROM bid WHERE price > 5) AS b WHERE auction > 3;"
    ));
    let y = yaml(
        "name: job\nsource: { nexmark: { stream: bid, events: 1000, seed: 42 } }\n\
         pipeline:\n  - filter: \"price > 5\"\n  - filter: \"auction > 3\"\n  - select: [auction]\n\
         sink: { stdout: {} }\n",
    );
    assert_eq!(shape(g), shape(y));
    let e = error(&format!(
        "{BIDS}CREATE TABLE out WITH ('connector' = 'print');\n\
         CREATE VIEW loop AS SELECT * FROM loop;\nINSERT INTO out SELECT * FROM loop;"
    ));
    assert!(e.contains("nest deeper than 16"), "{e}");
}

#[test]
fn settings_and_dotted_options_reach_their_sections() {
    let g = sql(
        "SET 'state.backend' = 'remote';\nSET 'execution.checkpointing.interval' = '1s';\n\
         SET 'execution.checkpointing.mode' = 'unaligned';\n\
         CREATE TABLE bids WITH ('connector' = 'file', 'path' = 'data/bids', 'format' = 'csv', \
         'schema.price' = 'int64');\n\
         CREATE TABLE out WITH ('connector' = 'blackhole', 'parallelism' = '1');\n\
         INSERT INTO out SELECT * FROM bids;",
    );
    let y = yaml(
        "name: job\nstate: { backend: remote }\ncheckpoint: { interval: 1s, mode: unaligned }\n\
         source: { file: { path: data/bids, format: csv, schema: { price: int64 } } }\n\
         sink: { blackhole: {}, parallelism: 1 }\n",
    );
    assert_eq!(shape(g), shape(y));
}

#[test]
fn expressions_keep_their_position_in_the_sql_text() {
    let g = sql(&format!(
        "{BIDS}CREATE TABLE out WITH ('connector' = 'print');\n\
         INSERT INTO out SELECT auction\nFROM bid\nWHERE   price > 10;"
    ));
    let filter = g
        .nodes
        .iter()
        .find_map(|n| match &n.kind {
            Some(pb::node::Kind::Filter(f)) => f.predicate.clone(),
            _ => None,
        })
        .expect("a filter");
    let at = filter.location.expect("a location");
    assert_eq!((at.line, at.column), (5, 9));
}

// Refused jobs and their messages are cases in integration-tests/sql/errors.test, run
// through the binary by integration-tests/tests/sql_cases.rs.

#[test]
fn every_sql_example_plans_like_its_job_file() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = 0;
    // The SQL examples with a YAML twin; the others are checked against DuckDB instead
    // (q7's SQL is Flink's join form, its YAML the window alone).
    for (sql, yaml) in [
        ("nexmark/q0", "q0-passthrough"),
        ("nexmark/q1", "q1-currency"),
        ("nexmark/q2", "q2-filter"),
        ("nexmark/q11", "q11-user-sessions"),
        ("sql/q5-hot-items", "q5-hot-items"),
    ] {
        let path = dir.join(sql).with_extension("sql");
        let twin = dir.join(yaml).with_extension("yaml");
        let g = parse_sql_job("q.sql", &std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let y = parse_job("q.yaml", &std::fs::read_to_string(&twin).unwrap()).unwrap();
        // Function names keep the case they were written in (`COUNT(*)`, `count(*)`).
        let lower = |g: pb::JobGraph| {
            let mut g = shape(g);
            for n in &mut g.nodes {
                if let Some(pb::node::Kind::Window(w)) = n.kind.as_mut() {
                    for e in &mut w.aggregates {
                        e.sql = e.sql.to_lowercase();
                    }
                }
            }
            g
        };
        assert_eq!(
            lower(g),
            lower(y),
            "{} against {}",
            path.display(),
            twin.display()
        );
        checked += 1;
    }
    assert_eq!(checked, 5);
}

#[test]
fn no_input_panics_the_front_end() {
    // Cut a valid job at every character: each prefix is planned or refused, never a
    // panic (the prefixes end inside strings, clauses and multi-byte characters).
    let text = "SET 'pipeline.name' = 'é';\nCREATE TABLE bid (WATERMARK FOR date_time AS \
                date_time - INTERVAL '4' SECOND) WITH ('connector' = 'nexmark');\n\
                CREATE TABLE out WITH ('connector' = 'print');\nINSERT INTO out SELECT \
                auction, COUNT(*) AS n, window_start, window_end FROM TABLE(HOP(TABLE bid, \
                DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) GROUP BY \
                auction, window_start, window_end;";
    for (i, _) in text.char_indices() {
        let _ = parse_sql_job("job.sql", &text[..i]);
    }
    assert!(parse_sql_job("job.sql", text).is_ok());
    // Deep nesting is refused by the parser's recursion limit, not a stack overflow.
    let deep = format!(
        "{BIDS}CREATE TABLE out WITH ('connector' = 'print');\nINSERT INTO out SELECT {}1{} AS x FROM bid;",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    assert!(error(&deep).contains("recursion limit"), "{}", error(&deep));
}

#[test]
fn a_session_lists_what_it_defines_and_refuses_what_would_run() {
    let text = "SET 'parallelism.default' = '2';\n\
                CREATE TABLE bid WITH ('connector' = 'nexmark', 'stream' = 'bid');\n\
                CREATE VIEW pricey AS SELECT auction, price FROM bid WHERE price > 10;\n";
    let defined = super::sql_definitions("s.sql", text).unwrap_or_else(|e| panic!("{e}"));
    let listed: Vec<(&str, Option<&str>)> = defined
        .iter()
        .map(|d| (d.name.as_str(), d.connector.as_deref()))
        .collect();
    assert_eq!(listed, [("bid", Some("nexmark")), ("pricey", None)]);
    let insert = format!("{text}INSERT INTO bid SELECT * FROM bid;\n");
    let e = super::sql_definitions("s.sql", &insert).unwrap_err();
    assert_eq!((e.line, e.column), (4, 1), "{e}");
    assert!(e.message.contains("an INSERT runs a job"), "{e}");
    let e = super::sql_definitions(
        "s.sql",
        "CREATE TABLE t WITH ('connector' = 'nexmark');\nDROP TABLE t;",
    )
    .unwrap_err();
    assert!(
        e.message.contains("`DROP TABLE ...` is not supported"),
        "{e}"
    );
}

#[test]
fn several_inserts_read_their_table_through_one_source() {
    let g = sql(&format!(
        "{BIDS}CREATE TABLE a WITH ('connector' = 'print');\n\
         CREATE TABLE b WITH ('connector' = 'blackhole');\n\
         INSERT INTO a SELECT auction FROM bid WHERE price > 10;\n\
         INSERT INTO b SELECT bidder FROM bid WHERE price < 10;\n"
    ));
    let names: Vec<(u32, &str)> = g.nodes.iter().map(|n| (n.id, n.name.as_str())).collect();
    assert_eq!(
        names,
        [
            (0, "source"),
            (1, "filter"),
            (2, "select"),
            (3, "sink"),
            (4, "filter-2"),
            (5, "select-2"),
            (6, "sink-2"),
        ]
    );
    let edges: Vec<(u32, u32)> = g.edges.iter().map(|e| (e.source, e.target)).collect();
    assert_eq!(edges, [(0, 1), (1, 2), (2, 3), (0, 4), (4, 5), (5, 6)]);
    // INSERTs of different tables: each its own source, side by side in one job.
    let two = parse_sql_job(
        "job.sql",
        &format!(
            "{BIDS}CREATE TABLE person WITH ('connector' = 'nexmark', 'stream' = 'person');\n\
             CREATE TABLE a WITH ('connector' = 'print');\n\
             CREATE TABLE b WITH ('connector' = 'print');\n\
             INSERT INTO a SELECT * FROM bid;\nINSERT INTO b SELECT * FROM person;\n"
        ),
    )
    .unwrap();
    let names: Vec<(u32, &str)> = two.nodes.iter().map(|n| (n.id, n.name.as_str())).collect();
    assert_eq!(
        names,
        [(0, "source"), (1, "sink"), (2, "source-2"), (3, "sink-2")]
    );
    let edges: Vec<(u32, u32)> = two.edges.iter().map(|e| (e.source, e.target)).collect();
    assert_eq!(edges, [(0, 1), (2, 3)]);
    let twice = error(&format!(
        "{BIDS}CREATE TABLE a WITH ('connector' = 'print');\n\
         INSERT INTO a SELECT * FROM bid;\nINSERT INTO a SELECT * FROM bid;\n"
    ));
    assert!(
        twice.starts_with("job.sql:4:1: table `a` is written by an earlier INSERT too"),
        "{twice}"
    );
}
