//! # sluice-planner
//!
//! Sluice's front end: what users write a job in, planned into the
//! [`JobGraph`](sluice_common::pb::JobGraph) that the coordinator deploys and every worker
//! runs. Today that is the YAML job format ([`job_spec`]); the SQL front end joins it
//! here and lowers to the same graph.
//!
//! This crate owns languages and their error messages (`file:line:column`); it must not
//! know about Arrow, the runtime, connectors' implementations, the network or state.
//! Expressions are kept as SQL text with their position; the runtime compiles them and
//! reports SQL errors at those positions.

pub mod job_spec;

pub use job_spec::parse_job;
