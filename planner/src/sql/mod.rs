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
//! # What is accepted (the first slice of the SQL front end)
//!
//! - `SET 'key' = 'value'` for the job's settings ([`SETTINGS`]).
//! - `CREATE TABLE name [(WATERMARK FOR col AS col - INTERVAL 'n' UNIT)] WITH (...)`: a
//!   table is a connector; `'connector'` names it (`nexmark`, `file`, `kafka`; sinks also
//!   `print`, `blackhole`) and every other option is that connector's option as a job
//!   file spells it. The connector's own schema is the table's: column definitions are
//!   refused rather than ignored.
//! - One `INSERT INTO sink SELECT [DISTINCT] ...` reading one table: a projection and a `WHERE`, or
//!   a window aggregate over `TABLE(TUMBLE | HOP | SESSION(TABLE t, DESCRIPTOR(col),
//!   ...))` grouped by columns and `window_start, window_end`.
//!
//! - `CREATE VIEW v AS SELECT ...` and subqueries in FROM, each of the shapes above: a
//!   query over a view stacks its operators after the view's.
//!
//! Anything else (joins, unbounded GROUP BY, several INSERTs, ORDER BY, ...) is refused
//! at its position, named as not supported yet. DataFusion's logical optimizer does not
//! plan these jobs yet: the shapes above map one to one onto Sluice's operators.
//!
//! This module owns the SQL surface and its error messages; like the YAML front end it
//! must not know Arrow or the runtime.

mod lower;
mod text;

pub use lower::Defined;

use sluice_common::pb;

use crate::job_spec::{JobSpecError, at, check_size, graph_from_tree};

/// Job settings a `SET` statement may change: the key, where it goes in the job file's
/// tree, and what it sets.
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
    let root = lower::job_tree(file, text).map_err(|e| at(file, e))?;
    graph_from_tree(file, &root)
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
