//! Keyed state: the tables operators hold, the byte-level backend and the job-level
//! store under them, the in-memory store, and the conformance suite every store must
//! pass (DESIGN §7).
//!
//! # What it owns
//! - The byte layout of state keys ([`key`], DESIGN §4): key group first, so every
//!   key-group range is one byte range; then operator, state name, key and namespace,
//!   length-prefixed so that one key's namespaces are one prefix.
//! - [`StateTable`]: what an operator holds, one per named state: rows keyed by (key
//!   group, key, namespace), read and written in batches, scanned per key group.
//! - [`KeyedStateBackend`]: one subtask's state as bytes: batched reads (`get_many`),
//!   ordered atomic write batches (`write` of [`WriteOp`]s, including `Merge` and
//!   `DeleteRange`), ordered range scans, and its epochs (`seal_epoch`,
//!   `notify_committed`).
//! - [`StateStore`]: one job's state as a whole: a backend per subtask over the key
//!   groups it owns, and going back to a completed checkpoint at any parallelism.
//! - [`MemoryStateStore`] (and its [`MemoryStateBackend`]s), and [`conformance`]: the
//!   shared test suite, byte-level and epochs.
//! - [`net_writes`]: the net effect of a run of writes (latest operation per key,
//!   merged deleted ranges), what the remote client buffers and the state service holds
//!   per uncommitted epoch.
//! - [`placement`]: which registered state node holds each shard of a job.
//! - [`ttl`]: the expiry header a value may carry, which the state service's compaction
//!   drops expired values by (no operator writes one yet; SQL joins will).
//!
//! # Who drives epochs
//! An operator declares the tables it uses and reads and writes them; it never sees
//! which store holds them or when an epoch ends. The task runtime seals a subtask's
//! epoch when a checkpoint barrier has passed the operator, and passes on completed
//! checkpoints; the coordinator (or a one-process run) restores and commits the job's
//! store. Timers are rows of a table too (the runtime's timer service), so a restore
//! brings them back with the state they belong to.
//!
//! # What it must not know
//! RocksDB, foyer, S3, Arrow, the network, barriers. The remote store (a gRPC client of
//! the state service with an epoch write buffer and read cache) lives with the code that
//! runs jobs and proves itself by running [`conformance::run_all`] and
//! [`conformance::run_epochs`].

mod backend;
pub mod conformance;
mod error;
pub mod key;
mod memory;
pub mod net_writes;
pub mod placement;
mod store;
mod table;
pub mod ttl;

pub use backend::{KeyedStateBackend, WriteOp};
pub use error::{StateError, StateResult};
pub use key::{
    DecodedKey, decode_key, encode_key, encode_key_into, key_group_range_bounds, key_prefix,
    prefix_end,
};
pub use memory::{MemoryStateBackend, MemoryStateStore};
pub use store::{PlacementHints, StateConnector, StateStore};
pub use table::{Row, StateTable};
pub use ttl::{TtlConfig, TtlUpdate};
