//! # sluice-coordinator
//!
//! The JobManager: jobs, their checkpoints, failover, rescaling, savepoints, and the
//! APIs around them (REST for users, gRPC for workers).
//!
//! - [`job`]: the job lifecycle as a typed state machine ([`job::JobState::next`] is the
//!   one place transitions are decided), the restart policy (exponential back-off with a
//!   limit), the job driver ([`job::driver::Driver`]: deploy, failover, restart, rescale,
//!   savepoint, stop and cancel as a pure state machine) and, per job, one actor that
//!   carries the driver's actions out ([`job::master`] starts it).
//! - [`checkpoint`]: the checkpoint commit protocol as a pure state machine
//!   ([`checkpoint::CheckpointProtocol`]) that returns actions for the job driver, the
//!   `_metadata` format, and the metadata store whose one write primitive is "create if
//!   absent", which fences two coordinators racing to commit one checkpoint.
//! - [`cluster`]: the workers' gRPC `Attach` service and the registry of attached
//!   workers, their slots and heartbeats.
//! - [`ha`]: leader election among coordinators through etcd (`--ha`): one leads,
//!   the others stand by and refuse with the leader's address.
//! - [`service`]: the coordinator itself: submission, job records in the store, resuming
//!   jobs after a restart, the operations behind [`rest`], the REST API, and
//!   [`prometheus`], its `GET /metrics`.
//!
//! Decisions never do I/O; I/O never decides: a job's actor feeds events to its driver
//! (which owns the job's lifecycle and checkpoint protocol) and carries out what it
//! returns.
//!
//! ## What this crate must not know
//!
//! Compute internals (operators, Arrow, the network stack) and the state service's
//! storage (RocksDB, deltas, manifests): shard handles and source positions are opaque
//! strings and bytes here, the state service is reached through
//! [`job::master::StateStore`], and worker processes are started (when at all)
//! through [`job::master::WorkerLauncher`]. It talks to the object store only through
//! [`checkpoint::store`].

pub mod auth;
pub mod checkpoint;
pub mod cluster;
pub mod error;
pub mod ha;
pub mod job;
pub mod prometheus;
pub mod rest;
pub mod service;

pub use error::{Error, Result};
