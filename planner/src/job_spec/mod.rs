//! # Job files
//!
//! The YAML format users write a job in, parsed into a [`pb::JobGraph`]. Every mistake is
//! reported as `file:line:column: what was wrong; what was expected`, for example
//!
//! ```text
//! bids.yaml:7:5: unknown operator `flter` in pipeline[0]; expected one of filter, select, key_by, window (did you mean `filter`?)
//! ```
//!
//! This module owns the format and its checks, and nothing else: it must not know about
//! Arrow or DataFusion. Expressions (`filter`, `select`, `aggregate`) are kept as SQL text
//! with their position; the compute crate compiles them and reports SQL errors at those
//! positions.
//!
//! # The format
//!
//! ```yaml
//! name: bids-per-auction            # required
//! parallelism: 2                    # default 1
//! max_parallelism: 128              # key groups; default 128 (more for parallelism > 85)
//! state: { backend: memory }        # memory (default) | remote [, shards: 4] [, cache: 256MiB]
//! source:                           # exactly one connector, plus optional batch_size
//!   nexmark: { stream: bid, events: 1000000, seed: 42, max_out_of_orderness: 2s }
//!   # file: { path: data/bids, format: csv, on_error: fail, schema: { price: int64 } }
//!   batch_size: 8192
//! watermark: { column: date_time, max_out_of_orderness: 4s, idleness: 1m }
//!   # alignment: { max_drift: 10s, group: bids, update_interval: 1s }  # pause sources ahead
//! pipeline:                         # optional; one operator per item
//!   - filter: "price > 100"
//!   - select: ["auction", "price * 0.908 AS price_eur", "date_time"]
//!   - key_by: [auction]             # must be followed by a window item
//!   - window: { sliding: 10s, slide: 2s }   # or tumbling: 10s, session: 30s, or
//!                                           # cumulate: 1m, step: 10s
//!     aggregate: ["count(*) AS bids"]
//!     late: { sink: { file: { path: out/late } } }   # default `drop`
//!   - dedup: [bidder, auction]      # the first record of every distinct key
//!   - join:                         # a regular join with another input
//!       type: inner                 # or left, right, full (outer: an updating result)
//!       right: { source: { nexmark: { stream: auction } }, pipeline: [...] }
//!       left_keys: [auction]        # equal to right_keys, position by position
//!       right_keys: [id]
//!       left_alias: b               # how expressions name each side (default l, r)
//!       right_alias: a
//!       condition: "b.price > a.reserve"    # optional, on each matching pair
//!       select: [b.auction, b.price, a.seller]   # optional; default every column
//!       ttl: 1h                     # optional: rows stop joining after this long
//!       interval:                   # optional: an interval join on event time, a
//!         left: date_time           # left row kept until the watermark passes its
//!         right: date_time          # `left` minus `lower`, a right row its `right`
//!         lower: -10s               # plus `upper` (b.date_time BETWEEN a.date_time +
//!         upper: 0s                 # lower AND a.date_time + upper; the condition
//!                                   # checks that; see operator/join.rs)
//! sink:                             # exactly one of stdout, blackhole, file
//!   stdout: { format: jsonl }
//! ```
//!
//! Durations are a number and a unit (`500ms`, `10s`, `1.5m`, `2h`, `1d`; see
//! [`parse_duration_ms`]). A window item may also set `allowed_lateness`, `time: event |
//! processing` (event time needs the `watermark:` section) and `column` (the time column;
//! by default the watermark's). The source file connector accepts `on_error: fail | skip |
//! dead_letter` (the last with a `dead_letter:` path); file connectors take `endpoint`,
//! `region`, `allow_http`, `access_key_id` and `secret_access_key` for object stores.
//!
//! # How the parts fit
//!
//! 1. `marked_yaml` turns the text into a small YAML tree whose every node knows its line
//!    and column (anchors, aliases and tags are rejected).
//! 2. `decode` reads that tree into a checked `JobSpec` (`spec`), with `fields` for
//!    typed access, `connector` for sources and sinks, `pipeline` for operators and
//!    `duration` for `10s`-style values.
//! 3. `graph` lays the spec out as nodes and edges; it cannot fail.

mod connector;
mod decode;
mod duration;
pub(crate) mod fields;
mod graph;
mod kafka;
pub(crate) mod marked_yaml;
mod pipeline;
mod spec;

#[cfg(test)]
mod tests;

pub use duration::parse_duration_ms;
pub(crate) use marked_yaml::{Node, Pos, PosError, Value};

use sluice_common::pb;

/// A mistake in a job file, at a 1-based line and column.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct JobSpecError {
    pub file: String,
    pub line: u32,
    pub column: u32,
    pub message: String,
}

/// The largest job file accepted (4 MiB). A job is a few hundred lines; a file far
/// larger is a mistake, and parsing it first would cost its size many times over in
/// memory and time before the error at its first line.
pub const MAX_JOB_FILE_BYTES: usize = 4 << 20;

/// Why a job file of `bytes` bytes is refused, if it is: larger than
/// [`MAX_JOB_FILE_BYTES`].
pub fn job_file_too_large(file: &str, bytes: u64) -> Option<String> {
    (bytes > MAX_JOB_FILE_BYTES as u64).then(|| {
        format!(
            "job file {file} is {:.1} MiB; job files are limited to {} MiB",
            bytes as f64 / (1 << 20) as f64,
            MAX_JOB_FILE_BYTES >> 20
        )
    })
}

/// Refuses a job file larger than [`MAX_JOB_FILE_BYTES`] before it is parsed, at its
/// first line.
pub(crate) fn check_size(file: &str, text: &str) -> Result<(), JobSpecError> {
    match job_file_too_large(file, text.len() as u64) {
        Some(message) => Err(JobSpecError {
            file: file.to_owned(),
            line: 1,
            column: 1,
            message,
        }),
        None => Ok(()),
    }
}

/// Parses the job file `text`; `file` names it in errors and in `JobGraph.origin_file`.
///
/// # Errors
/// The first mistake found, with its position: a file larger than
/// [`MAX_JOB_FILE_BYTES`] (refused before it is parsed), YAML syntax, an unknown or
/// missing key, a value of the wrong type or out of range, or an inconsistent pipeline.
pub fn parse_job(file: &str, text: &str) -> Result<pb::JobGraph, JobSpecError> {
    check_size(file, text)?;
    let root = marked_yaml::parse(text).map_err(|error| at(file, error))?;
    graph_from_tree(file, &root)
}

/// Plans the job a tree describes, with every check a job file gets: the SQL front end
/// (`crate::sql`) builds the tree a job file would parse into, positioned in its text.
pub(crate) fn graph_from_tree(file: &str, root: &Node) -> Result<pb::JobGraph, JobSpecError> {
    let spec = decode::job(root).map_err(|error| at(file, error))?;
    Ok(graph::job_graph(file, spec))
}

/// `error` in `file`.
pub(crate) fn at(file: &str, error: PosError) -> JobSpecError {
    JobSpecError {
        file: file.to_owned(),
        line: error.pos.line,
        column: error.pos.column,
        message: error.message,
    }
}
