//! # sluice-compute
//!
//! What a Sluice worker runs: the operators and windows of a job, and the runtime that
//! executes them as parallel tasks.
//!
//! A job arrives as a `JobGraph` ([`sluice_common::pb`]). [`plan`] checks and types it
//! and cuts it into chains; [`runtime`] runs each chain's subtasks as tasks
//! joined by byte-bounded queues. Records flow as Arrow batches inside
//! [`element::StreamElement`]s together with watermarks, barriers and end-of-partition
//! markers. Expressions are DataFusion's ([`expr`]); keyed state goes through the
//! backend-neutral API of [`sluice_common::state`].
//!
//! - [`connector`]: the connector API; the connectors are the `sluice-connectors` crate.
//! - [`changelog`]: how an updating result (`+I -U +U -D`) is marked and recognized.
//! - [`keyed`]: keyed state as operators see it, and the timers kept with it.
//! - [`operator`]: filter, select, window, dedup, aggregate, top_n, sink; one
//!   file each.
//! - [`window`]: window assignment, accumulators, sessions, timers.
//! - [`time`]: per-split watermark generation at the sources.
//! - [`keys`]: canonical key bytes for hashing and keyed state.
//! - [`state_client`]: the remote keyed-state backend (gRPC client of the state service
//!   with an epoch write buffer and a read cache).
//! - [`queue`]: byte-bounded channels in front of a task's input gate, fed locally or
//!   by the data plane.
//! - [`network`]: the credit-based data plane between worker processes.
//! - [`cluster`]: a worker process's side of a deployment (control protocol, run, report).
//!
//! This crate must not know about the coordinator, any particular connector, or the
//! storage engine behind remote state: it sees state only through `StateStore` and
//! `KeyedStateBackend`, and sources and sinks through `connector::Connectors`.

pub mod changelog;
pub mod cluster;
pub mod connector;
pub mod element;
pub mod error;
pub mod expr;
pub mod keyed;
pub mod keys;
pub mod network;
pub mod operator;
pub mod plan;
pub mod queue;
pub mod runtime;
pub mod state_client;
pub mod time;
pub mod window;

pub use error::{Error, Result};
