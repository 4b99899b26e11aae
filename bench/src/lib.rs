//! # sluice-bench
//!
//! The benchmarks behind `sluice bench …`. Each measures real processes on this machine
//! and prints lines that people read and scripts parse; each file opens with what it
//! measures, how, and what it compares against.
//!
//! - [`nexmark`]: a Nexmark query end to end, in one process or across worker processes.
//! - [`state`]: state-service operations per second over gRPC on loopback.
//! - [`checkpoint`]: epoch commit latency, memory and shard open time of state-service
//!   nodes run as child processes.
//! - [`cluster`]: checkpoint, rescale and recovery times of a job under the coordinator.
//! - [`scale`]: the coordinator with hundreds of simulated workers and state nodes
//!   speaking the real protocols: checkpoint coordination time, re-placement after a
//!   node loss.
//! - [`exchange`]: data-plane throughput between two worker processes next to raw TCP
//!   on the same loopback in the same run, and producer memory under a slow consumer.
//! - [`kafka`]: the Kafka source's throughput next to a plain librdkafka consumer
//!   reading the same topic in the same run.
//! - [`harness`]: what they share: child processes of this binary, memory and CPU from
//!   `/proc`, percentiles and bounded waits, result lines.
//! - [`state_workload`]: keys and values in the real key layout, written and checkpointed
//!   straight through the state service's gRPC API (`checkpoint` and `cluster`).
//!
//! # What this crate must not know
//!
//! The `sluice` binary (`cli/`) is the composition root: it parses the command line and
//! wires the roles together. This crate does not import it. What a benchmark needs of
//! that wiring (running a job as `sluice run` does, an embedded state-service node, the
//! coordinator's connection to the state service, a job master's settings) it asks of a
//! [`Host`], which `cli` implements. A benchmark that needs other processes starts this
//! same binary through its public commands (`sluice state-service`, `sluice worker
//! --coordinator URL`): nothing in the binary exists only for benchmarks.
//!
//! # Errors
//!
//! [`Error`] tells a mistake on the command line (exit code 2) from a failed run (1).
//! Inside, benchmarks use `anyhow` as the CLI does: their errors are printed, never
//! matched.

pub mod checkpoint;
pub mod cluster;
mod error;
pub mod exchange;
pub mod harness;
mod host;
pub mod kafka;
pub mod nexmark;
pub mod scale;
pub mod state;
pub mod state_workload;
pub mod telemetry;

pub use error::{Error, Result};
pub use host::{Host, JobSummary};
