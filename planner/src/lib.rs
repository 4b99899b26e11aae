//! # sluice-planner
//!
//! Sluice's front end: what users write a job in, planned into the
//! [`JobGraph`](sluice_common::pb::JobGraph) that the coordinator deploys and every worker
//! runs: the YAML job format ([`job_spec`]) and SQL ([`sql`]), which lowers to the
//! same graph through the same checks; and the cluster file `sluice deploy` reads
//! ([`cluster_file`]), with the same parser and messages.
//!
//! This crate owns languages and their error messages (`file:line:column`); it must not
//! know about Arrow, the runtime, connectors' implementations, the network or state.
//! Expressions are kept as SQL text with their position; the runtime compiles them and
//! reports SQL errors at those positions.

pub mod cluster_file;
pub mod job_spec;
pub mod sql;

pub use job_spec::parse_job;

/// Parses a job file by its name: SQL for `.sql` ([`sql::parse_sql_job`]), the YAML
/// format otherwise ([`parse_job`]).
///
/// # Errors
/// The first mistake found, at its line and column.
pub fn parse_job_file(
    file: &str,
    text: &str,
) -> Result<sluice_common::pb::JobGraph, job_spec::JobSpecError> {
    if sql::is_sql_file(std::path::Path::new(file)) {
        sql::parse_sql_job(file, text)
    } else {
        parse_job(file, text)
    }
}
