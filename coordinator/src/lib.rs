//! # sluice-coordinator
//!
//! The coordinator's core, as a library: what a job's life is and how a checkpoint is
//! committed. The processes around it (the `sluice coordinator` role with its REST and
//! gRPC APIs, the scheduler, heartbeats) are not built yet; they will drive these types.
//!
//! - [`job`]: the job lifecycle as a typed state machine ([`job::JobState::next`] is the
//!   one place transitions are decided) and the restart policy (exponential back-off
//!   with a limit).
//! - [`checkpoint`]: the checkpoint commit protocol as a pure state machine
//!   ([`checkpoint::CheckpointProtocol`]) that returns actions for a driver, the
//!   `_metadata` format, and the metadata store whose one write primitive is
//!   "create if absent", which fences two coordinators racing to commit one checkpoint.
//!
//! ## How the parts fit
//!
//! A driver (one actor per job, to come) owns a [`job::JobState`] and a
//! [`checkpoint::CheckpointProtocol`]; it feeds them events (task acks, timer ticks,
//! failures), executes the returned [`checkpoint::Action`]s (barriers to sources,
//! `create_if_absent` on the [`checkpoint::MetadataStore`], `Commit` to the state
//! shards) and reports their outcomes back. Decisions never do I/O; I/O never decides.
//!
//! ## What this crate must not know
//!
//! Compute internals (operators, Arrow, the network stack) and the state service's
//! storage (RocksDB, deltas, manifests): shard handles and source positions are opaque
//! strings and bytes here. It talks to the object store only through
//! [`checkpoint::store`].

pub mod checkpoint;
pub mod cluster;
pub mod error;
pub mod job;
pub mod rest;
pub mod service;

pub use error::{Error, Result};
