//! # Checkpoints as metadata commits
//!
//! Keyed state lives in the state service, so a checkpoint is a small commit: once every
//! task acknowledged barrier N (with its state-shard handles and source positions), the
//! coordinator writes `jobs/<job>/checkpoints/<N>/_metadata` with create-if-absent. That
//! write IS checkpoint N; only then are tasks notified and shards told `Commit(N)`.
//!
//! - [`ack`]: what a task reports at a barrier (task id, shard handles, source positions,
//!   channel state, figures).
//! - [`protocol`]: the coordinator's decisions as a state machine without I/O: when to
//!   trigger, collecting acks, abort on decline or timeout, the commit, fencing,
//!   savepoints and retention, as [`Action`]s for a driver.
//! - [`metadata`]: the `_metadata` object (protobuf in a checksummed, versioned frame).
//! - [`store`]: the [`MetadataStore`] trait (create if absent, get, list), its
//!   object-store (local directory, S3) and in-memory implementations, the object
//!   layout, and [`latest_valid`] for recovery.
//!
//! This module must not know compute internals (operators, channels, Arrow) or how the
//! state service stores anything (RocksDB, deltas): handles and positions are opaque.

pub mod ack;
pub mod metadata;
pub mod protocol;
pub mod store;
pub(crate) mod trace;

pub use ack::{ShardHandle, ShardRange, SourcePosition, TaskAck, TaskFigures, TaskId};
pub use metadata::{CheckpointMetadata, MetadataError, ShardState, TaskCheckpoint};
pub use protocol::{
    AbortReason, Action, BarrierMode, CheckpointConfig, CheckpointKind, CheckpointProtocol,
    JobInfo, RecordsBefore, SavepointFailure,
};
pub use store::{
    CreateOutcome, MemoryMetadataStore, MetadataStore, ObjectMetadataStore, latest_valid,
    read_metadata,
};
