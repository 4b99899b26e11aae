//! Keyed state: the API operators use, the byte-level backend trait under it, the
//! in-memory backend, and the conformance suite every backend must pass (DESIGN §7).
//!
//! # What it owns
//! - The byte layout of state keys ([`key`], DESIGN §4): key group first, so every
//!   key-group range is one byte range; then operator, state name, key and namespace,
//!   length-prefixed so that one key's namespaces are one prefix.
//! - The value formats: codecs ([`StateCodec`]), the TTL header on every value ([`ttl`]),
//!   the framed elements of list state and the nested layout of map entries.
//! - The typed handles operators hold: [`ValueState`], [`MapState`], [`ListState`],
//!   [`ReducingState`], [`AggregatingState`]. All are async, all are scoped to a
//!   [`KeyScope`] (key group, key, namespace), and most have batched forms (`get_many`,
//!   `set_many`, `add_many`, ...) that cost one backend call per batch.
//! - [`KeyedStateBackend`]: byte keys and values, batched reads (`get_many`), ordered
//!   atomic write batches (`write` of [`WriteOp`]s, including `Merge` and `DeleteRange`),
//!   and ordered range scans.
//! - [`MemoryStateBackend`], and [`conformance`]: the shared test suite.
//!
//! # What it must not know
//! RocksDB, foyer, S3, Arrow, the network, checkpoints. The remote backend (a gRPC client
//! of the state service with an epoch write buffer and read cache) lives with the code
//! that runs jobs and implements [`KeyedStateBackend`]; it proves itself by running
//! [`conformance::run_all`]. Epochs and barriers stay below the trait: to a handle, a
//! `write` is simply visible to every later read.
//!
//! # How the parts fit
//! A handle holds an `Arc<dyn KeyedStateBackend>`, its [`StateDescriptor`] (operator id,
//! name, TTL) and an `Arc<dyn StateClock>`. Each call builds keys from the scope (one
//! buffer for a batch of reads), makes one backend call, and decodes the answer; TTL
//! bookkeeping discovered while reading (expired values to delete, `OnReadAndWrite`
//! expiry to restart) goes back in one follow-up `write`. Handles assume that accesses to
//! one key are serial, as the async execution model of DESIGN §7 guarantees.

mod aggregating;
mod backend;
mod clock;
mod codec;
pub mod conformance;
mod descriptor;
mod error;
mod handle;
pub mod key;
mod list;
mod map;
mod memory;
mod reducing;
mod scope;
pub mod ttl;
mod value;

pub use aggregating::{AggregateFunction, AggregatingState};
pub use backend::{KeyedStateBackend, WriteOp};
pub use clock::{ManualClock, StateClock, SystemClock};
pub use codec::StateCodec;
pub use descriptor::StateDescriptor;
pub use error::{StateError, StateResult};
pub use key::{
    DecodedKey, decode_key, encode_key, encode_key_into, key_group_range_bounds, key_prefix,
    prefix_end,
};
pub use list::ListState;
pub use map::MapState;
pub use memory::MemoryStateBackend;
pub use reducing::ReducingState;
pub use scope::KeyScope;
pub use ttl::{TtlConfig, TtlUpdate};
pub use value::ValueState;
