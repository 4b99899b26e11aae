//! Sluice's telemetry: what every role (coordinator, worker, state node, `sluice run`)
//! publishes, and the two ways it leaves the process.
//!
//! A role describes its metrics once, as a static list of [`Metric`]s (OpenTelemetry
//! name, unit, kind, help), and fills a [`Snapshot`] of their current values on demand
//! ([`Collect`]). The same snapshot is rendered as Prometheus text on `GET /metrics`
//! ([`prometheus`]) and observed by OpenTelemetry instruments exported over OTLP
//! ([`otlp`]), so the two can never disagree on names or values. `docs/metrics.md`
//! lists every metric. [`http`] is how every role's HTTP endpoints take connections.
//!
//! This crate must not know about jobs, tasks or shards: roles bring their figures.

pub mod family;
pub mod http;
pub mod logs;
pub mod otlp;
pub mod prometheus;
pub mod receiver;
pub mod trace;

pub use family::{Collect, Kind, Metric, Snapshot};
