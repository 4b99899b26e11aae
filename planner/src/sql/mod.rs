//! # Jobs written in SQL
//!
//! A SQL job file (`.sql`) says what a YAML job file says, in the statements a Flink SQL
//! user writes. It is parsed with DataFusion's SQL parser (`sqlparser`) and lowered into
//! the tree a job file parses into, positioned in the SQL text, which then gets every
//! check and the same [`pb::JobGraph`] a YAML job gets. Expressions stay SQL text; the
//! runtime compiles them (DataFusion) and reports their errors at their line and column.
//!
//! ```sql
//! SET 'pipeline.name' = 'q5-hot-items';
//! SET 'parallelism.default' = '2';
//! CREATE TABLE bid (
//!   WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND
//! ) WITH ('connector' = 'nexmark', 'stream' = 'bid', 'events' = '1000000');
//! CREATE TABLE hot WITH ('connector' = 'file', 'path' = 'out/q5', 'format' = 'jsonl');
//! INSERT INTO hot
//! SELECT auction, COUNT(*) AS bids, window_start, window_end
//! FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
//! GROUP BY auction, window_start, window_end;
//! ```
//!
//! # What is accepted
//!
//! - `SET 'key' = 'value'` for the job's settings ([`SETTINGS`]).
//! - `CREATE TABLE name [(WATERMARK FOR col AS col - INTERVAL 'n' UNIT)] WITH (...)`: a
//!   table is a connector; `'connector'` names it (`nexmark`, `file`, `kafka`; sinks also
//!   `print`, `blackhole`) and every other option is that connector's option as a job
//!   file spells it. The connector's own schema is the table's: column definitions are
//!   refused rather than ignored.
//! - `INSERT INTO sink SELECT [DISTINCT] ...` reading one table: a projection and a
//!   `WHERE`, a window aggregate over `TABLE(TUMBLE | HOP | CUMULATE | SESSION(TABLE t,
//!   DESCRIPTOR(col), ...))` grouped by columns and `window_start, window_end`, a `GROUP
//!   BY` without a window (a changelog), or Top-N (`ROW_NUMBER() OVER (...)` bounded by
//!   the enclosing `WHERE`). Several INSERTs of one job read the same table, once: its
//!   source node feeds each INSERT's pipeline and sink.
//!
//! - `CREATE VIEW v AS SELECT ...` and subqueries in FROM, each of the shapes above: a
//!   query over a view stacks its operators after the view's.
//! - `SELECT ... FROM a [AS x] [INNER] JOIN b [AS y] ON x.k = y.k [AND ...] [WHERE ...]`,
//!   each side a table, view or named subquery: a regular join, both sides kept in
//!   keyed state (for `'table.exec.state.ttl'` if set). The equalities between a column
//!   of each side are its keys; a WHERE conjunct naming one side's columns only filters
//!   that side before the join; the rest is checked on each pair. `FROM a, b WHERE ...`
//!   is the same join. `LEFT`, `RIGHT` and `FULL [OUTER] JOIN` keep unmatched rows padded
//!   with nulls, an updating result: their ON holds the keys and conditions on the side
//!   they pad (which filter it first), their WHERE filters the result (conjuncts on a
//!   side they keep filter it first).
//! - A join whose conditions bound each side's event time by a column of the
//!   other (`b.t BETWEEN a.t AND a.t + INTERVAL '10' SECOND`, `b.t BETWEEN a.t AND
//!   a.expires`, or `>=`/`<` pairs) is an interval join: each row leaves state once the
//!   watermark passes the last time it can match. A side's event time is its table's
//!   WATERMARK column, passed on by a view's or subquery's filters and projections, or
//!   the `window_end` of a window aggregate over it; equal event times as a key (a window
//!   join) bound it at 0. An outer join whose ON so bounds the event times is an outer
//!   interval join: a row its interval passed without a pair passing ON is padded with
//!   nulls then, so the result is append-only (as Flink's), and ON may hold any
//!   condition.
//! - A `GROUP BY` over such a `window_end` (under any name) of a window aggregate's
//!   results is Flink's cascading window aggregation: a window per end that fires when
//!   the watermark reaches it, append-only, its end still an event time (Nexmark q5's
//!   maximum per window). With `COUNT(DISTINCT ...)` it stays an unbounded aggregate.
//! - `COUNT(DISTINCT x)` in a HOP, TUMBLE or CUMULATE window aggregate is two: the window
//!   grouped also by `x`, then a cascade counting its rows per key and window
//!   (`distinct_window_stages`).
//!
//! Anything else (temporal joins in event time,
//! ORDER BY, ...) is refused at its position, named as not supported yet. DataFusion's logical optimizer does not
//! plan these jobs yet: the shapes above map one to one onto Sluice's operators.
//!
//! This module owns the SQL surface and its error messages; like the YAML front end it
//! must not know Arrow or the runtime.

mod lower;
mod text;

pub use lower::Defined;

use sluice_common::pb;

use crate::job_spec::{JobSpecError, Pos, PosError, at, check_size, graph_from_tree};

/// Job settings a `SET` statement may change: the key, where it goes in the job file's
/// tree (empty: into each join), and what it sets.
pub const SETTINGS: &[(&str, &[&str], &str)] = &[
    (
        "pipeline.name",
        &["name"],
        "the job's name (default: the file's name)",
    ),
    (
        "parallelism.default",
        &["parallelism"],
        "the job's parallelism",
    ),
    (
        "pipeline.max-parallelism",
        &["max_parallelism"],
        "the number of key groups",
    ),
    ("state.backend", &["state", "backend"], "memory or remote"),
    (
        "state.shards",
        &["state", "shards"],
        "remote state's shards",
    ),
    (
        "state.cache",
        &["state", "cache"],
        "remote state's cache size, e.g. 256MiB",
    ),
    (
        "execution.checkpointing.interval",
        &["checkpoint", "interval"],
        "e.g. 10s",
    ),
    (
        "execution.checkpointing.mode",
        &["checkpoint", "mode"],
        "aligned or unaligned",
    ),
    (
        "execution.checkpointing.timeout",
        &["checkpoint", "timeout"],
        "e.g. 2m",
    ),
    (
        "table.exec.state.ttl",
        &[],
        "how long a join keeps each row after it arrived, e.g. 1h (processing time; \
         an interval join keeps rows until the watermark passes them instead, and other \
         operators' state does not expire)",
    ),
    (
        "execution.checkpointing.aligned-checkpoint-timeout",
        &["checkpoint", "aligned_timeout"],
        "how long an aligned barrier waits before it goes on unaligned",
    ),
];

/// Parses the SQL job `text`; `file` names it in errors and in `JobGraph.origin_file`.
///
/// # Errors
/// The first mistake found, at its line and column: SQL syntax, a statement or
/// construct not supported, an unknown table, setting or connector option, or anything
/// the job file checks would refuse.
pub fn parse_sql_job(file: &str, text: &str) -> Result<pb::JobGraph, JobSpecError> {
    check_size(file, text)?;
    let inserts = lower::job_trees(file, text).map_err(|e| at(file, e))?;
    for (i, insert) in inserts.iter().enumerate() {
        if inserts[..i]
            .iter()
            .any(|earlier| earlier.sink == insert.sink)
        {
            return Err(at(
                file,
                PosError::new(
                    insert.at,
                    format!(
                        "table `{}` is written by an earlier INSERT too; give each INSERT a \
                         table of its own",
                        insert.sink
                    ),
                ),
            ));
        }
    }
    // `job_trees` refuses a job without an INSERT.
    let Some((first, rest)) = inserts.split_first() else {
        return Err(at(file, PosError::new(Pos::START, "no INSERT")));
    };
    let mut graph = graph_from_tree(file, &first.tree)?;
    for insert in rest {
        share_sources(&mut graph, graph_from_tree(file, &insert.tree)?);
    }
    Ok(graph)
}

/// Adds the graph of a later INSERT to `merged`, the graph of those before it. Each of
/// its sources that reads what a source of `merged` reads (the same table, the same
/// way) is that node: one source node feeds every pipeline reading the table (its
/// records go to each), so the table is read once. Its other nodes, and sources of
/// tables no earlier INSERT reads, are added: ids follow on, and a name already taken
/// gets the next free number (`sink-2`).
fn share_sources(merged: &mut pb::JobGraph, graph: pb::JobGraph) {
    let sources: Vec<(u32, Option<pb::node::Kind>, u32)> = merged
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, Some(pb::node::Kind::Source(_))))
        .map(|n| (n.id, n.kind.clone(), n.parallelism))
        .collect();
    let mut next = merged.nodes.iter().map(|n| n.id + 1).max().unwrap_or(0);
    let mut ids = std::collections::HashMap::new();
    let mut shared = std::collections::HashSet::new();
    for n in &graph.nodes {
        let same = matches!(n.kind, Some(pb::node::Kind::Source(_)))
            .then(|| {
                sources
                    .iter()
                    .find(|(_, kind, p)| *kind == n.kind && *p == n.parallelism)
            })
            .flatten();
        match same {
            Some((id, _, _)) => {
                ids.insert(n.id, *id);
                shared.insert(n.id);
            }
            None => {
                ids.insert(n.id, next);
                next += 1;
            }
        }
    }
    let id = |n: u32| ids.get(&n).copied().unwrap_or(n);
    let mut names: std::collections::HashSet<String> =
        merged.nodes.iter().map(|n| n.name.clone()).collect();
    for mut node in graph.nodes {
        if shared.contains(&node.id) {
            continue;
        }
        node.id = id(node.id);
        node.name = free_name(&names, &node.name);
        names.insert(node.name.clone());
        merged.nodes.push(node);
    }
    for mut edge in graph.edges {
        edge.source = id(edge.source);
        edge.target = id(edge.target);
        merged.edges.push(edge);
    }
}

/// `name`, or when taken its base (without a `-N` suffix) with the next free number.
fn free_name(taken: &std::collections::HashSet<String>, name: &str) -> String {
    if !taken.contains(name) {
        return name.to_owned();
    }
    let base = match name.rsplit_once('-') {
        Some((base, n)) if n.parse::<u32>().is_ok() => base,
        _ => name,
    };
    (2..)
        .map(|n| format!("{base}-{n}"))
        .find(|candidate| !taken.contains(candidate))
        .unwrap_or_else(|| name.to_owned())
}

/// The tables and views the SQL `text` creates, in order, checked (`SET`, `CREATE TABLE`
/// and `CREATE VIEW` only: what a SQL shell keeps between queries).
///
/// # Errors
/// The first mistake, at its line and column, as [`parse_sql_job`] reports it.
pub fn sql_definitions(file: &str, text: &str) -> Result<Vec<Defined>, JobSpecError> {
    check_size(file, text)?;
    lower::defined(text).map_err(|e| at(file, e))
}

/// Whether `path` names a SQL job file (by its extension).
pub fn is_sql_file(path: &std::path::Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("sql"))
}

#[cfg(test)]
mod tests;
